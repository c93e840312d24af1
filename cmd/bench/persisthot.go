package main

// Persist on one hot SKU with the template's settings (issue 25): the
// PersistFunction event source's BatchSize and MaximumConcurrency, read from
// template.yaml, a backlog of 4 batches per consumer (at least -m), run
// hotRuns times on fresh SKUs. The figure is the median run; the spread is
// the lowest and highest.

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/holdfast/holdfast/internal/samtemplate"
	"github.com/holdfast/holdfast/shared/reservation"
)

// hotRuns is how many times the hot part settles its backlog.
const hotRuns = 3

// modeHot names the hot part's median run.
const modeHot = "persist, one hot SKU, template settings"

// persistHot settles hotRuns backlogs on a fresh hot SKU each, with the
// template's BatchSize × MaximumConcurrency, and records the median run;
// then as many with the event bus a no-op (modeHotNoBus).
func (b *bench) persistHot(ctx context.Context) error {
	tpl, err := samtemplate.Load("template.yaml")
	if err != nil {
		return err
	}
	ev := tpl.Functions()["PersistFunction"].SQS["Reservations"]
	size, consumers := max(1, ev.BatchSize), max(1, ev.MaximumConcurrency)
	n := max(b.o.backlog, 4*consumers*size)
	for _, series := range []struct {
		name, prefix string
		bus          reservation.Notifier
	}{{modeHot, "hot", nil}, {modeHotNoBus, "hotnobus", nopBus{}}} {
		var runs []result
		var falseCancel int64
		cpu := map[string]time.Duration{} // each process's CPU over every run's timed part
		for i := range hotRuns {
			r, _, cancelled, err := b.holdfastPersist(ctx, n, consumers, size, fmt.Sprintf("%s%d", series.prefix, i), series.bus)
			if err != nil {
				return err
			}
			for name, d := range r.cpu {
				cpu[name] += d
			}
			falseCancel += cancelled
			runs = append(runs, r)
		}
		sort.Slice(runs, func(i, j int) bool { return runs[i].rate() < runs[j].rate() })
		med := runs[len(runs)/2]
		med.name = series.name
		med.extra["batching"] = fmt.Sprintf("BatchSize %d, %d consumers, %d messages, %d runs %.0f–%.0f/s", size, consumers, n, len(runs), runs[0].rate(), runs[len(runs)-1].rate())
		med.extra["false cancellations"] = fmt.Sprint(falseCancel)
		if len(cpu) == len(persistProcs) {
			per := func(d time.Duration) string {
				return fmt.Sprintf("%.1f µs", float64(d.Nanoseconds())/1e3/float64(hotRuns*n))
			}
			var total time.Duration
			var parts []string
			for _, name := range persistProcs {
				total += cpu[name]
				parts = append(parts, name+" "+per(cpu[name]))
			}
			med.extra["CPU"] = fmt.Sprintf("CPU per order %s: %s", per(total), strings.Join(parts, ", "))
			// One core of MariaDB at its CPU per order: the rate the database
			// alone allows when nothing else shares its cores, as in AWS.
			med.extra["MariaDB ceiling"] = fmt.Sprintf("%.0f/s", float64(hotRuns*n)/cpu["mariadb"].Seconds())
		}
		b.results = append(b.results, med)
		b.checks = append(b.checks, fmt.Sprintf("%s (%d × %d): %d runs of %d confirmed, MySQL available 0, %d false cancellations",
			series.name, size, consumers, len(runs), n, falseCancel))
	}
	return nil
}

// modeHotNoBus names the hot part's runs with the event bus a no-op: in
// AWS the bus (EventBridge) takes no CPU of these cores, where goaws, its
// local stand-in, does. The outbox is written and marked as ever.
const modeHotNoBus = "persist, one hot SKU, no-op event bus"

// nopBus is an event bus that takes every event at once and does nothing.
type nopBus struct{}

func (nopBus) Publish(_ context.Context, evs []reservation.Event) []error {
	return make([]error, len(evs))
}

// hotLines is the hot part's summary line (none when it did not run).
func (b *bench) hotLines() []string {
	r, ok := b.find(modeHot)
	if !ok {
		return nil
	}
	line := fmt.Sprintf("%s = %.0f orders/s (goal ≥ 50k/s); %s, false cancellations %s; batches handed to PersistBatch in memory (no SQS receive, delete or event decode), a SKU without a pay window or a per-user limit",
		modeHot, r.rate(), r.extra["batching"], r.extra["false cancellations"])
	if c := r.extra["CPU"]; c != "" {
		line += "; " + c + "; one core of MariaDB at its CPU per order: " + r.extra["MariaDB ceiling"]
	}
	if nb, ok := b.find(modeHotNoBus); ok {
		line += fmt.Sprintf("; the event bus off these cores (a no-op, as EventBridge is in AWS): %.0f orders/s, %s", nb.rate(), nb.extra["CPU"])
	}
	return []string{line}
}

// persistProcs name the processes whose CPU the persist parts read: the
// bench's own (the persist consumers, and the hold setup's none: it runs
// before the timed part), and the servers it uses.
var persistProcs = []string{"persist", "mariadb", "goaws", "redis"}

// persistCPU is each of persistProcs' CPU time so far; the servers are
// found once, by the port they listen on.
func (b *bench) persistCPU() (map[string]time.Duration, error) {
	if b.serverPids == nil {
		pids := map[string]int{}
		for name, addr := range map[string]string{"redis": b.cfg.RedisAddr, "goaws": b.cfg.AWSEndpoint, "mariadb": dsnAddr(b.getenv("HOLDFAST_DB_DSN"))} {
			pid, err := listener(addr)
			if err != nil {
				return nil, fmt.Errorf("persist CPU: %s: %w", name, err)
			}
			pids[name] = pid
		}
		b.serverPids = pids
	}
	out, err := cpuOf(b.serverPids)
	if err != nil {
		return nil, err
	}
	out["persist"] = processCPU()
	return out, nil
}
