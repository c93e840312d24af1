package reservation

import (
	"context"
	"fmt"
)

// SweepReport says what one sweep did.
type SweepReport struct {
	SKUs         int `json:"skus"`
	Warmed       int `json:"warmed"`
	Adjusted     int `json:"adjusted"`      // SKUs whose missed admin changes reached Redis
	Expired      int `json:"expired"`       // holds past their deadline that the sweep decided
	Released     int `json:"released"`      // holds cancelled with their stock returned, and outbox releases
	Confirmed    int `json:"confirmed"`     // of those, found CONFIRMED in MySQL (the hold is marked)
	GroupsFailed int `json:"groups_failed"` // groups past their deadline, now FAILED and settled
	Notified     int `json:"events_resent"` // cancellation events sent from the outbox
	Healed       int `json:"healed"`        // SKUs whose persistent drift was corrected in Redis
	// Drift (MySQL available − (Redis available + held)) over the SKUs the
	// sweep visited: the total of its sizes, how many SKUs drift, and the
	// worst of them by name — never a map of the whole catalog.
	DriftUnits int64      `json:"drift_units"`
	Drifting   int        `json:"drifting_skus"`
	WorstDrift []SKUDrift `json:"worst_drift,omitempty"`
	Errors     int        `json:"errors"`
}

// SKUDrift is one SKU's drift.
type SKUDrift struct {
	SKU   string `json:"sku"`
	Drift int64  `json:"drift"`
}

// worstDrifts is how many drifting SKUs a report names.
const worstDrifts = 10

// addDrift counts one SKU's drift, keeping the worst by size.
func (r *SweepReport) addDrift(sku string, d int64) {
	if d == 0 {
		return
	}
	size := max(d, -d)
	r.DriftUnits += size
	r.Drifting++
	i := len(r.WorstDrift)
	for i > 0 && max(r.WorstDrift[i-1].Drift, -r.WorstDrift[i-1].Drift) < size {
		i--
	}
	if i >= worstDrifts {
		return
	}
	r.WorstDrift = append(r.WorstDrift, SKUDrift{})
	copy(r.WorstDrift[i+1:], r.WorstDrift[i:])
	r.WorstDrift[i] = SKUDrift{SKU: sku, Drift: d}
	if len(r.WorstDrift) > worstDrifts {
		r.WorstDrift = r.WorstDrift[:worstDrifts]
	}
}

// Sweep is the scheduled pass that bounds how long anything stays undecided:
// per SKU it brings Redis in line with MySQL's level (warms a SKU Redis lost,
// applies admin changes Redis missed), decides holds past their deadline
// (plus the skew grace, by Redis's clock) through the same fenced decision as
// compensate; it ends groups past their deadline (FORMED if their last slot
// went in time, else FAILED with all their stock returned), drains the
// outboxes (Redis releases and cancellation events a failure left pending)
// and measures Redis–MySQL drift. Every step is idempotent, so two sweeps at
// once do no harm. An error in one item is logged and counted; the sweep goes
// on and the next one retries.
func (s *Service) Sweep(ctx context.Context) (SweepReport, error) {
	cutoff := s.clock.Now().Add(-s.cfg.SweepGrace)
	var rep SweepReport

	// The outbox first: a release that reaches Redis now is one the drift
	// measurement below does not have to wait for.
	pending, err := s.ledger.Outbox(ctx, cutoff, s.cfg.SweepBatch)
	if err != nil {
		rep.Errors++
		s.log.ErrorContext(ctx, "sweep: list outbox", "error", err)
	}
	for _, row := range pending {
		if err := s.followNow(ctx, row, 0); err != nil {
			rep.Errors++
			s.log.ErrorContext(ctx, "sweep: drain outbox", "reservation_id", row.ID, "error", err)
			continue
		}
		if !row.Released {
			rep.Released++
		}
		if !row.Notified {
			rep.Notified++
		}
	}

	levels, err := s.ledger.Stocks(ctx)
	if err != nil {
		return rep, fmt.Errorf("sweep: list skus: %w", err)
	}
	rep.SKUs = len(levels)
	for _, level := range levels {
		if ctx.Err() != nil {
			return rep, ctx.Err()
		}
		s.sweepSKU(ctx, level, &rep)
	}

	groups, err := s.ledger.DueGroups(ctx, cutoff, s.cfg.SweepBatch)
	if err != nil {
		rep.Errors++
		s.log.ErrorContext(ctx, "sweep: list due groups", "error", err)
	}
	for _, g := range groups {
		failed, err := s.failGroup(ctx, g)
		if err != nil {
			rep.Errors++
			s.log.ErrorContext(ctx, "sweep: end group", "group_id", g.ID, "error", err)
			continue
		}
		if failed {
			rep.GroupsFailed++
		}
	}

	s.metrics.Count("drift_units", int(rep.DriftUnits))
	s.metrics.Count("swept_expired", rep.Expired)
	s.metrics.Count("swept_released", rep.Released)
	s.metrics.Count("groups_failed", rep.GroupsFailed)
	s.metrics.Count("sweep_errors", rep.Errors)
	return rep, nil
}

// sweepSKU works on one SKU with the level the sweep listed: Sync applies
// only levels newer than Redis has, and reconcile needs MySQL read before
// Redis, which a level listed earlier is.
func (s *Service) sweepSKU(ctx context.Context, level StockLevel, rep *SweepReport) {
	sku := level.SKU
	res, err := s.holds.Sync(ctx, level)
	switch {
	case err != nil:
	case res == SyncAdjusted:
		rep.Adjusted++
	case res == SyncMissing:
		var warmed bool
		if warmed, err = s.warm(ctx, sku); warmed {
			rep.Warmed++
		}
	}
	synced := err == nil
	if !synced {
		// Expired holds are still decided: their release needs no stock
		// figure, and one of them may be what keeps the warm-up from
		// settling (a stray). Only the measurement waits.
		rep.Errors++
		s.log.ErrorContext(ctx, "sweep: sync stock", "sku", sku, "error", err)
	}

	expired, err := s.holds.Expired(ctx, sku, s.cfg.SweepGrace, s.cfg.SweepBatch)
	if err != nil {
		rep.Errors++
		s.log.ErrorContext(ctx, "sweep: list expired holds", "sku", sku, "error", err)
		return
	}
	for _, h := range expired {
		row, err := s.settle(ctx, h, ReasonExpired)
		if err != nil {
			rep.Errors++
			s.log.ErrorContext(ctx, "sweep: decide expired hold", "reservation_id", h.ID, "error", err)
			continue
		}
		rep.Expired++
		if row.Status == StatusConfirmed {
			rep.Confirmed++
		} else {
			rep.Released++
		}
	}
	if len(expired) > 0 || !synced {
		return // holds are being decided right now, or Redis lacks the level: measure next time
	}
	s.reconcile(ctx, level, rep)
}

// reconcile heals Redis when a drift is real: the same value across sweeps
// (ReconcileAfter apart), no live hold, no MySQL-first write still on its way
// to Redis (an unreleased cancellation, an admin change Redis has not
// applied), MySQL unchanged across the measurement, and Redis unchanged up
// to the moment of the fix (heal.lua compares). The order of the reads is
// what makes it sound: MySQL, then Redis, then the outbox and MySQL again —
// a write that reached MySQL first is either still pending at the last read
// or reached Redis after the measurement, which heal.lua sees. A transient
// drift — a persist committed between the reads — changes value or vanishes
// and is never "healed". MySQL stays the arbiter: a heal only moves the
// figure buyers see.
func (s *Service) reconcile(ctx context.Context, level StockLevel, rep *SweepReport) {
	sku := level.SKU
	rs, err := s.holds.Stock(ctx, sku)
	if err != nil {
		rep.Errors++
		s.log.ErrorContext(ctx, "sweep: read redis stock", "sku", sku, "error", err)
		return
	}
	drift := level.Available - (rs.Available + rs.Held)
	rep.addDrift(sku, drift)
	if drift != 0 {
		if rs.Held != 0 || rs.AdminDelta != level.AdminDelta {
			return // live holds may be mid-decision, or an admin change is on its way
		}
		n, err := s.ledger.Unreleased(ctx, sku)
		if err != nil || n > 0 {
			return // a release is on its way to Redis
		}
		again, err := s.ledger.Stock(ctx, sku)
		if err != nil || again.Available != level.Available {
			return // MySQL moved: not a stable measurement
		}
	}
	healed, err := s.holds.Heal(ctx, rs, drift, s.cfg.ReconcileAfter)
	if err != nil {
		rep.Errors++
		s.log.ErrorContext(ctx, "sweep: heal", "sku", sku, "error", err)
		return
	}
	if healed {
		rep.Healed++
		s.metrics.Count("drift_healed", 1)
		s.log.WarnContext(ctx, "healed redis drift", "sku", sku, "drift", drift)
	}
}
