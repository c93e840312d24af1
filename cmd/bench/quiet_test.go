package main

import (
	"crypto/sha256"
	"runtime"
	"testing"
	"time"
)

// The thread clock moves with every few microseconds of work: a clock
// that moved only at scheduler ticks (getrusage's RUSAGE_THREAD, 4 ms
// here) gives one or two distinct readings over 100 readings a few µs of
// work apart. The process clock counts at least the thread's work.
func TestThreadCPUMovesWithWorkShorterThanATick(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := checkClocks(); err != nil {
		t.Fatal(err)
	}
	p0, t0 := processCPU(), threadCPU()
	prev, distinct := t0, 1
	var sum [32]byte
	for range 100 {
		for range 20 { // a few µs of work
			sum = sha256.Sum256(sum[:])
		}
		now := threadCPU()
		if now < prev {
			t.Fatalf("the thread clock went back: %v after %v", now, prev)
		}
		if now > prev {
			distinct++
		}
		prev = now
	}
	if distinct < 50 {
		t.Fatalf("the thread clock moved %d times over 100 readings a few µs of work apart (%d)", distinct, sum[0])
	}
	if dt, dp := prev-t0, processCPU()-p0; dp < dt {
		t.Fatalf("the process clock counted %v where this thread alone counted %v", dp, dt)
	}
}

// The sampler times both computations, and its own CPU is its thread's
// whole time: at least the computations it timed.
func TestHostSamplerTimesBothComputationsAndCountsItsThread(t *testing.T) {
	h, err := startHostSampler()
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		h.mu.Lock()
		n := len(h.sha)
		h.mu.Unlock()
		if n >= 3 || time.Now().After(deadline) {
			break
		}
		time.Sleep(hostSampleEvery) // the sampler's own period: nothing to await sooner
	}
	s := h.Stop()
	if s.samples < 3 {
		t.Fatalf("%d samples in 30 s", s.samples)
	}
	timed := time.Duration(s.samples) * (hostSampleSHAs*s.sha + hostSampleLinks*s.walk)
	if s.sha <= 0 || s.walk <= 0 || s.own < timed/2 {
		t.Fatalf("speed %+v: each computation timed; the thread's CPU %v, at least about the %v its samples timed", s, s.own, timed)
	}
	if again := h.Stop(); again != s {
		t.Fatalf("a second Stop returned %+v, the first %+v", again, s)
	}
}
