package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/holdfast/holdfast/shared/app"
	"github.com/holdfast/holdfast/shared/reservation"
)

// groupsFigure is the groups part's measurement.
type groupsFigure struct {
	empty    int           // empty groups due before the honest one (one buyer's)
	sweep    time.Duration // the one sweep that ended them all
	ended    bool          // the honest group ended in that sweep
	failed   int           // groups the sweep failed
	period   time.Duration // the template's sweep period
	oldSweep int           // sweeps the honest group waited before (one batch of due groups per sweep)
}

// spamGroups is the number of empty due groups one buyer keeps ahead of an
// honest group (issue 20: 10,000).
const spamGroups = 10_000

// groups measures how soon an honest group ends behind one buyer's 10,000
// empty groups due before it: one sweep ends every due group, so the honest
// group ends within the sweep period + that sweep's time of its deadline
// (goal ≤ 65 s with the template's 60 s period). Before, a sweep
// ended one batch (500) of due groups, earliest deadline first.
func (b *bench) groups(ctx context.Context) error {
	svc, err := b.service(ctx, b.cfg, app.Options{Enqueuer: func(reservation.Enqueuer) reservation.Enqueuer { return nopQueue{} }})
	if err != nil {
		return err
	}
	run := b.fmtRun()
	honest, spam := "bench-groups-"+run, "bench-groups-spam-"+run
	for _, sku := range []string{honest, spam} {
		if _, err := svc.ChangeStock(ctx, reservation.SetTo(sku, 100)); err != nil {
			return err
		}
	}
	// The empty groups, written as CreateGroup writes them (its metering
	// would stop one buyer long before 10,000: this is the worst case of
	// many buyers, or of groups left from before the cap).
	now := time.Now().UTC()
	past := now.Add(-time.Minute).Truncate(time.Millisecond)
	rdb := b.app.Redis
	for i := 0; i < spamGroups; i += 1000 {
		var q strings.Builder
		var args []any
		q.WriteString(`INSERT INTO group_buys (group_id, sku, capacity, members, status, deadline, created_at, updated_at) VALUES `)
		pipe := rdb.Pipeline()
		for j := i; j < min(i+1000, spamGroups); j++ {
			if j > i {
				q.WriteString(",")
			}
			id := fmt.Sprintf("g-spam-%s-%05d", run, j)
			q.WriteString("(?, ?, 2, 0, 'OPEN', ?, ?, ?)")
			args = append(args, id, spam, past, now, now)
			key := "hf:{" + spam + "}:g:" + id
			pipe.HSet(ctx, key, "capacity", 2, "remaining", 2, "status", "OPEN", "deadline", past.UnixMilli())
			pipe.PExpire(ctx, key, time.Hour)
		}
		if _, err := b.app.DB.ExecContext(ctx, q.String(), args...); err != nil {
			return fmt.Errorf("groups: seed: %w", err)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return fmt.Errorf("groups: seed redis: %w", err)
		}
	}
	g, err := svc.CreateGroup(ctx, "groups-u0", honest, 3, time.Second)
	if err != nil {
		return err
	}
	if _, _, err := svc.Reserve(ctx, reservation.ReserveRequest{SKU: honest, Qty: 1, UserID: "groups-u1", GroupID: g.ID}); err != nil {
		return err
	}
	// Wait for the honest group's deadline to pass.
	time.Sleep(time.Until(g.Deadline.Add(100 * time.Millisecond)))
	sctx, cancel := context.WithTimeout(ctx, 60*time.Second) // the sweeper's timeout
	defer cancel()
	start := time.Now()
	rep, err := svc.Sweep(sctx)
	if err != nil {
		return err
	}
	f := groupsFigure{empty: spamGroups, sweep: time.Since(start), failed: rep.GroupsFailed, period: time.Minute,
		oldSweep: (spamGroups + b.cfg.Protocol.SweepBatch) / b.cfg.Protocol.SweepBatch}
	var status string
	if err := b.app.DB.QueryRowContext(ctx, `SELECT status FROM group_buys WHERE group_id = ?`, g.ID).Scan(&status); err != nil {
		return err
	}
	f.ended = status == "FAILED"
	b.groupRuns = append(b.groupRuns, f)
	_, _ = b.app.DB.ExecContext(ctx, `DELETE FROM group_buys WHERE sku IN (?, ?)`, honest, spam)
	return nil
}

// groupLines are the groups part's report lines.
func (b *bench) groupLines() []string {
	var out []string
	for _, f := range b.groupRuns {
		worst := f.period + f.sweep
		out = append(out,
			fmt.Sprintf("groups: one buyer's %d empty groups due before an honest one: one sweep ended %d groups in %v; the honest group ended in it: %v",
				f.empty, f.failed, f.sweep.Round(time.Millisecond), f.ended),
			fmt.Sprintf("  an honest group ends within sweep period %v + that sweep = %v of its deadline (goal ≤ 65 s); before: %d sweeps (one batch of %d due groups each) ≈ %v",
				f.period, worst.Round(100*time.Millisecond), f.oldSweep, b.cfg.Protocol.SweepBatch, time.Duration(f.oldSweep)*f.period))
	}
	return out
}
