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
	for i := range hotRuns {
		r, _, cancelled, err := b.holdfastPersist(ctx, n, consumers, size, fmt.Sprintf("hot%d", i))
		if err != nil {
			return err
		}
		falseCancel += cancelled
		runs = append(runs, r)
	}
	sort.Slice(runs, func(i, j int) bool { return runs[i].rate() < runs[j].rate() })
	med := runs[len(runs)/2]
	med.name = modeHot
	med.extra["batching"] = fmt.Sprintf("BatchSize %d, %d consumers, %d messages, %d runs %.0f–%.0f/s", size, consumers, n, len(runs), runs[0].rate(), runs[len(runs)-1].rate())
	med.extra["false cancellations"] = fmt.Sprint(falseCancel)
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
	return []string{fmt.Sprintf("%s = %.0f orders/s (goal ≥ 50k/s); %s, false cancellations %s",
		modeHot, r.rate(), r.extra["batching"], r.extra["false cancellations"])}
}
