package main

import (
	"runtime"
	"testing"
	"time"
)

// The thread clock reads CPU to well under a scheduler tick (getrusage's
// stopped at the thread's last tick, 4 ms, and read 0 for short samples).
func TestThreadCPUSeesWorkShorterThanATick(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	c0 := threadCPU()
	for start := time.Now(); time.Since(start) < 500*time.Microsecond; {
	}
	if d := threadCPU() - c0; d < 250*time.Microsecond || d > 100*time.Millisecond {
		t.Fatalf("half a millisecond of busy work read as %v of thread CPU", d)
	}
}

func TestHostSamplerTimesBothComputationsAndCountsItsOwnCPU(t *testing.T) {
	h := startHostSampler()
	deadline := time.Now().Add(10 * time.Second)
	for {
		h.mu.Lock()
		n := len(h.sha)
		h.mu.Unlock()
		if n >= 3 || time.Now().After(deadline) {
			break
		}
		runtime.Gosched()
	}
	s := h.Stop()
	if s.samples < 3 {
		t.Fatalf("%d samples in 10 s", s.samples)
	}
	if s.sha <= 0 || s.walk <= 0 || s.own < time.Duration(s.samples)*hostSampleSHAs*s.sha/2 {
		t.Fatalf("speed %+v: each computation timed, its own CPU at least its SHAs'", s)
	}
}
