package main

// Persist on one hot SKU with the template's settings (issue 25): the
// PersistFunction event source's BatchSize and MaximumConcurrency, read from
// template.yaml, a backlog of 4 batches per consumer (at least -m), run
// hotRuns times on fresh SKUs. The figure is the median run; the spread is
// the lowest and highest.

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/holdfast/holdfast/internal/samtemplate"
)

// hotRuns is how many times the hot part settles its backlog.
const hotRuns = 3

// modeHot names the hot part's median run.
const modeHot = "persist, one hot SKU, template settings"

// persistHot settles hotRuns backlogs on a fresh hot SKU each, with the
// template's BatchSize × MaximumConcurrency, and records the median run.
func (b *bench) persistHot(ctx context.Context) error {
	tpl, err := samtemplate.Load("template.yaml")
	if err != nil {
		return err
	}
	ev := tpl.Functions()["PersistFunction"].SQS["Reservations"]
	size, consumers := max(1, ev.BatchSize), max(1, ev.MaximumConcurrency)
	n := max(b.o.backlog, 4*consumers*size)
	var runs []result
	var falseCancel int64
	var dbCPU time.Duration // MariaDB's CPU over every run (zero when it cannot be read)
	for i := range hotRuns {
		before, cerr := b.dbCPU(ctx)
		r, _, cancelled, err := b.holdfastPersist(ctx, n, consumers, size, fmt.Sprintf("hot%d", i))
		if err != nil {
			return err
		}
		if after, aerr := b.dbCPU(ctx); cerr == nil && aerr == nil {
			dbCPU += after - before
		}
		falseCancel += cancelled
		runs = append(runs, r)
	}
	sort.Slice(runs, func(i, j int) bool { return runs[i].rate() < runs[j].rate() })
	med := runs[len(runs)/2]
	med.name = modeHot
	med.extra["batching"] = fmt.Sprintf("BatchSize %d, %d consumers, %d messages, %d runs %.0f–%.0f/s", size, consumers, n, len(runs), runs[0].rate(), runs[len(runs)-1].rate())
	med.extra["false cancellations"] = fmt.Sprint(falseCancel)
	if dbCPU > 0 {
		med.extra["MariaDB CPU"] = fmt.Sprintf("%.1f µs/order", float64(dbCPU.Microseconds())/float64(hotRuns*n))
	}
	b.results = append(b.results, med)
	b.checks = append(b.checks, fmt.Sprintf("persist hot SKU, template settings (%d × %d): %d runs of %d confirmed, MySQL available 0, %d false cancellations",
		size, consumers, len(runs), n, falseCancel))
	return nil
}

// hotLines is the hot part's summary line (none when it did not run).
func (b *bench) hotLines() []string {
	r, ok := b.find(modeHot)
	if !ok {
		return nil
	}
	line := fmt.Sprintf("%s = %.0f orders/s (goal ≥ 50k/s); %s, false cancellations %s",
		modeHot, r.rate(), r.extra["batching"], r.extra["false cancellations"])
	if c := r.extra["MariaDB CPU"]; c != "" {
		line += ", MariaDB CPU " + c
	}
	return []string{line}
}

// dbCPU is the MariaDB server's CPU time so far (user + system, every
// thread), read from /proc through the pid file it names: the bench's
// services run on this machine.
func (b *bench) dbCPU(ctx context.Context) (time.Duration, error) {
	var pidFile string
	if err := b.app.DB.QueryRowContext(ctx, `SELECT @@pid_file`).Scan(&pidFile); err != nil {
		return 0, err
	}
	raw, err := os.ReadFile(pidFile)
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		return 0, err
	}
	return pidCPU(pid)
}
