package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/holdfast/holdfast/shared/app"
	"github.com/holdfast/holdfast/shared/reservation"
)

// sweepFigure is one catalog size's sweep times.
type sweepFigure struct {
	skus          int           // SKUs in MySQL
	live, visited int           // SKUs a sweep visited: live ones, and all
	now           time.Duration // one sweep: live SKUs + the catalog slice (median of 5)
	every         time.Duration // one sweep visiting every SKU, as before (warm Redis)
}

// Sweep sizes: the catalog grows to each in turn.
var sweepSizes = []int{1_000, 10_000, 100_000}

const (
	sweepHoldSKUs = 100 // SKUs with live holds
	sweepHolds    = 10  // live holds per such SKU
)

// sweep measures one sweep at 1k, 10k and 100k SKUs with a fixed number of
// live holds (1,000 on 100 SKUs, not yet due): the sweep as it is (the live
// SKUs and a slice of the catalog) and as it was (every SKU, every sweep).
func (b *bench) sweep(ctx context.Context) error {
	long := b.cfg
	long.Protocol.HoldTTL = benchHoldTTL // the holds stay live through the measurement
	buyers, err := b.service(ctx, long, app.Options{Enqueuer: func(reservation.Enqueuer) reservation.Enqueuer { return nopQueue{} }})
	if err != nil {
		return err
	}
	run := b.fmtRun()
	name := func(i int) string { return fmt.Sprintf("bench-sweep-%s-%06d", run, i) }
	for i := range sweepHoldSKUs {
		if _, err := buyers.ChangeStock(ctx, reservation.SetTo(name(i), 1000)); err != nil {
			return err
		}
		for j := range sweepHolds {
			if _, _, err := buyers.Reserve(ctx, reservation.ReserveRequest{SKU: name(i), Qty: 1, UserID: fmt.Sprintf("sweep-u%d", j)}); err != nil {
				return fmt.Errorf("sweep: live hold: %w", err)
			}
		}
	}
	seeded := sweepHoldSKUs
	for _, size := range sweepSizes {
		var total int
		if err := b.app.DB.QueryRowContext(ctx, `SELECT COUNT(*) FROM product_stock`).Scan(&total); err != nil {
			return err
		}
		for total < size {
			n := min(1000, size-total)
			var q strings.Builder
			args := make([]any, 0, 2*n)
			q.WriteString("INSERT INTO product_stock (sku, available) VALUES ")
			for k := range n {
				if k > 0 {
					q.WriteString(",")
				}
				q.WriteString("(?,?)")
				args = append(args, name(seeded), 100)
				seeded++
			}
			if _, err := b.app.DB.ExecContext(ctx, q.String(), args...); err != nil {
				return fmt.Errorf("sweep: seed catalog: %w", err)
			}
			total += n
		}
		f := sweepFigure{skus: total}

		// As it was: every SKU, every sweep. The first pass warms the SKUs
		// Redis lacks; the second is the steady state measured.
		every := b.cfg
		every.Protocol.SweepCatalog = total + 1
		old, err := b.service(ctx, every, app.Options{})
		if err != nil {
			return err
		}
		b.log("sweep: %d SKUs, visiting every SKU …", total)
		// Passes until nothing is left to decide (the first pass warms the
		// SKUs Redis lacks), then the steady state is measured.
		for pass := 0; ; pass++ {
			rep, err := old.Sweep(ctx)
			if err != nil {
				return err
			}
			if rep.Expired+rep.Released+rep.Warmed == 0 {
				break
			}
			if pass == 50 {
				return fmt.Errorf("sweep (every SKU): still deciding after 50 passes: %+v", rep)
			}
		}
		start := time.Now()
		rep, err := old.Sweep(ctx)
		if err != nil {
			return err
		}
		f.every = time.Since(start)
		if rep.Errors != 0 {
			return fmt.Errorf("sweep (every SKU): %+v", rep)
		}

		// As it is: the live SKUs and a slice of the catalog.
		cur, err := b.service(ctx, b.cfg, app.Options{})
		if err != nil {
			return err
		}
		b.log("sweep: %d SKUs, live SKUs and a slice of %d …", total, b.cfg.Protocol.SweepCatalog)
		var times []time.Duration
		for range 5 {
			start := time.Now()
			rep, err := cur.Sweep(ctx)
			if err != nil {
				return err
			}
			times = append(times, time.Since(start))
			if rep.LiveSKUs < sweepHoldSKUs || rep.Errors != 0 {
				return fmt.Errorf("sweep: %d live SKUs visited (want ≥ %d), report %+v", rep.LiveSKUs, sweepHoldSKUs, rep)
			}
			f.live, f.visited = rep.LiveSKUs, rep.SKUs
		}
		slices.Sort(times)
		f.now = times[len(times)/2]
		b.sweeps = append(b.sweeps, f)
	}
	return nil
}

// fmtRun names this run's SKUs apart from earlier runs'.
func (b *bench) fmtRun() string { return fmt.Sprintf("%x", time.Now().Unix()) }

// sweepLines are the sweep part's report lines.
func (b *bench) sweepLines() []string {
	if len(b.sweeps) == 0 {
		return nil
	}
	out := []string{fmt.Sprintf("sweep, %d live holds on %d SKUs (not due), a catalog slice of %d:",
		sweepHoldSKUs*sweepHolds, sweepHoldSKUs, b.cfg.Protocol.SweepCatalog)}
	out = append(out, fmt.Sprintf("  %9s %14s %10s %22s", "SKUs", "one sweep", "visited", "every SKU (before)"))
	for _, f := range b.sweeps {
		out = append(out, fmt.Sprintf("  %9d %14v %10d %22v", f.skus, f.now.Round(100*time.Microsecond), f.visited, f.every.Round(time.Millisecond)))
	}
	first, last := b.sweeps[0], b.sweeps[len(b.sweeps)-1]
	out = append(out, fmt.Sprintf("  one sweep at %d SKUs / at %d SKUs = %.2f× (goal ≤ 2×); visiting every SKU: %.0f×",
		last.skus, first.skus, last.now.Seconds()/first.now.Seconds(), last.every.Seconds()/first.every.Seconds()))
	return out
}
