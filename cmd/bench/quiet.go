package main

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
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

// hostReference is this host's speed just now: the CPU of a fixed
// computation that allocates nothing (SHA-256 of 64 KiB), on one thread,
// by that thread's own CPU time, so neither the bench's heap, its
// collector nor its other goroutines move it. The code is the same in
// every run, so it shows how unsteady the host's speed is (a virtual
// machine's cores are shared with others). It does not predict a run's
// figure well: it fits in a core's cache, and holdfast's work does not.
func hostReference() time.Duration {
	const n = 200
	const rusageThread = 1 // RUSAGE_THREAD, Linux
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var buf [64 << 10]byte
	c0 := rusageCPU(rusageThread)
	for i := range n {
		buf[0] = byte(i)
		sum := sha256.Sum256(buf[:])
		buf[1] = sum[0]
	}
	return (rusageCPU(rusageThread) - c0) / n
}
