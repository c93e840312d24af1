package main

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"
)

// machineCPU is the CPU time every core of the machine has spent busy so
// far: /proc/stat's user, nice, system, irq and softirq (not idle or
// iowait; not steal, which another machine ran; not guest and guest_nice,
// which user and nice hold already).
func machineCPU() (time.Duration, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0, errors.New("/proc/stat: no cpu line")
	}
	var busy int64
	for _, i := range []int{1, 2, 3, 6, 7} { // user nice system idle iowait irq softirq …
		n, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/stat: %w", err)
		}
		busy += n
	}
	return time.Duration(busy) * (time.Second / 100), nil // USER_HZ = 100 on Linux
}

// quietBusy is how busy the machine may be, over a second, for a part
// that reads one process's CPU to start: the servers' work left from the
// part before (MariaDB's purge and flushing, goaws's) would run inside the
// measured window and slow the measured process's peers.
const quietBusy = 100 * time.Millisecond

// awaitQuiet waits, at most a minute, until the machine was busy for
// less than quietBusy over a second, and says how long it waited.
func (b *bench) awaitQuiet(ctx context.Context, what string) error {
	start := time.Now()
	for {
		c0, err := machineCPU()
		if err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
		c1, err := machineCPU()
		if err != nil {
			return err
		}
		if busy := c1 - c0; busy < quietBusy || time.Since(start) > time.Minute {
			b.log("%s: the machine was busy %v over the last second, after %v", what, busy, time.Since(start).Round(time.Second))
			return nil
		}
	}
}

// hostReference is the host's speed over half a second of an otherwise
// idle bench (hostSampler's two computations).
func hostReference() hostSpeed {
	h := startHostSampler()
	time.Sleep(500 * time.Millisecond)
	return h.Stop()
}

// hostSampler takes the host's speed through a timed run, not once
// before it: a sample every hostSampleEvery on a thread of its own, each
// two fixed computations timed by that thread's CPU time — SHA-256 of
// 64 KiB (in a core's cache) and a walk of random links through 64 MiB
// outside the Go heap (memory-bound, as holdfast's work mostly is). Its
// own CPU is counted, so a figure can leave it out.
type hostSampler struct {
	stop, done chan struct{}
	mu         sync.Mutex      // guards sha, walk and own until done
	sha, walk  []time.Duration // per sample: per SHA-256 of 64 KiB, per link
	own        time.Duration   // the samples' CPU
}

const (
	hostSampleEvery = 25 * time.Millisecond
	hostSampleSHAs  = 4
	hostSampleLinks = 1000
)

// hostLinks is the walk's table: a random cycle through 16 Mi int32
// links, mapped outside the Go heap so the collector neither scans it nor
// counts it toward its goal (it would change the measured process's GC).
var hostLinks = sync.OnceValue(func() []int32 {
	const n = 16 << 20
	mem, err := syscall.Mmap(-1, 0, 4*n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return nil
	}
	links := unsafe.Slice((*int32)(unsafe.Pointer(&mem[0])), n)
	perm := rand.New(rand.NewPCG(1, 2)).Perm(n)
	for i := range perm {
		links[perm[i]] = int32(perm[(i+1)%n])
	}
	return links
})

// startHostSampler starts sampling until stop.
func startHostSampler() *hostSampler {
	links := hostLinks()
	h := &hostSampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(h.done)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		var buf [64 << 10]byte
		p := int32(0)
		t := time.NewTicker(hostSampleEvery)
		defer t.Stop()
		for {
			select {
			case <-h.stop:
				return
			case <-t.C:
			}
			c0 := threadCPU()
			for i := range hostSampleSHAs {
				buf[0] = byte(i)
				sum := sha256.Sum256(buf[:])
				buf[1] = sum[0]
			}
			c1 := threadCPU()
			if len(links) > 0 {
				for range hostSampleLinks {
					p = links[p]
				}
			}
			c2 := threadCPU()
			buf[2] = byte(p)
			h.mu.Lock()
			h.sha = append(h.sha, (c1-c0)/hostSampleSHAs)
			h.walk = append(h.walk, (c2-c1)/hostSampleLinks)
			h.own += c2 - c0
			h.mu.Unlock()
		}
	}()
	return h
}

// hostSpeed is what a sampler saw: the median of each computation.
type hostSpeed struct {
	sha, walk time.Duration
	samples   int
	own       time.Duration
}

func (s hostSpeed) String() string {
	return fmt.Sprintf("SHA %.1f µs, walk %.0f ns", float64(s.sha.Nanoseconds())/1e3, float64(s.walk.Nanoseconds()))
}

// Stop ends the sampling and returns the medians.
func (h *hostSampler) Stop() hostSpeed {
	close(h.stop)
	<-h.done
	med := func(d []time.Duration) time.Duration {
		if len(d) == 0 {
			return 0
		}
		d = slices.Clone(d)
		slices.Sort(d)
		return d[len(d)/2]
	}
	return hostSpeed{sha: med(h.sha), walk: med(h.walk), samples: len(h.sha), own: h.own}
}
