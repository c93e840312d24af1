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
// idle bench (hostSampler's two computations): the speed with nothing
// else loading the cores, where a run's own figure is under its load.
func hostReference() (hostSpeed, error) {
	h, err := startHostSampler()
	if err != nil {
		return hostSpeed{}, err
	}
	time.Sleep(500 * time.Millisecond)
	return h.Stop(), nil
}

// hostSampler takes the host's speed through a timed run, under the
// run's own load, not once before it: a sample every hostSampleEvery on
// a thread of its own, each two fixed computations timed by that thread's
// CPU clock — SHA-256 of 64 KiB (in a core's cache) and a walk of random
// links through 64 MiB outside the Go heap (memory-bound, as holdfast's
// work mostly is). own is the whole thread's CPU, waits and wake-ups
// included, so a figure can leave the sampler out. A sample's SHA-256s
// are assembly calls of some 30 µs the scheduler cannot preempt; at
// about 1% of a core that is the sampler's mark on a run's latencies.
type hostSampler struct {
	stop, done chan struct{}
	once       sync.Once
	mu         sync.Mutex      // guards sha, walk and own until done
	sha, walk  []time.Duration // per sample: per SHA-256 of 64 KiB, per link
	own        time.Duration   // the sampler thread's CPU, start to end
	speed      hostSpeed       // what Stop returns
}

const (
	hostSampleEvery = 25 * time.Millisecond
	hostSampleSHAs  = 4
	hostSampleLinks = 1000
)

// hostLinks is the walk's table: one random cycle through 16 Mi int32
// links (Sattolo's shuffle, built in place), mapped outside the Go heap
// so the collector neither scans it nor counts it toward its goal (it
// would change the measured process's GC).
var hostLinks = sync.OnceValues(func() ([]int32, error) {
	const n = 16 << 20
	mem, err := syscall.Mmap(-1, 0, 4*n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("host sampler: map its walk's table: %w", err)
	}
	links := unsafe.Slice((*int32)(unsafe.Pointer(&mem[0])), n)
	for i := range links {
		links[i] = int32(i)
	}
	r := rand.New(rand.NewPCG(1, 2))
	for i := n - 1; i > 0; i-- {
		j := r.IntN(i)
		links[i], links[j] = links[j], links[i]
	}
	return links, nil
})

// startHostSampler starts sampling until Stop. Each sampler starts its
// walk at a link of its own, not where the last one's left lines in cache.
func startHostSampler() (*hostSampler, error) {
	links, err := hostLinks()
	if err != nil {
		return nil, err
	}
	h := &hostSampler{stop: make(chan struct{}), done: make(chan struct{})}
	p := rand.Int32N(int32(len(links)))
	go func() {
		defer close(h.done)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		start := threadCPU()
		defer func() {
			h.mu.Lock()
			h.own = threadCPU() - start
			h.mu.Unlock()
		}()
		var buf [64 << 10]byte
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
			for range hostSampleLinks {
				p = links[p]
			}
			c2 := threadCPU()
			buf[2] = byte(p)
			h.mu.Lock()
			h.sha = append(h.sha, (c1-c0)/hostSampleSHAs)
			h.walk = append(h.walk, (c2-c1)/hostSampleLinks)
			h.mu.Unlock()
		}
	}()
	return h, nil
}

// hostSpeed is what a sampler saw: the median, over its samples, of each
// computation's thread CPU (so a larger figure is a slower host).
type hostSpeed struct {
	sha, walk time.Duration
	samples   int
	own       time.Duration
}

func (s hostSpeed) String() string {
	return fmt.Sprintf("SHA %.1f µs · walk %.0f ns", float64(s.sha.Nanoseconds())/1e3, float64(s.walk.Nanoseconds()))
}

// Stop ends the sampling (once; a later call returns the same) and
// returns the medians and the sampler thread's CPU.
func (h *hostSampler) Stop() hostSpeed {
	h.once.Do(func() {
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
		h.speed = hostSpeed{sha: med(h.sha), walk: med(h.walk), samples: len(h.sha), own: h.own}
	})
	return h.speed
}
