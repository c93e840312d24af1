package reservation

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// SweepReport says what one sweep did.
type SweepReport struct {
	SKUs         int              `json:"skus"`
	Warmed       int              `json:"warmed"`
	Expired      int              `json:"expired"`       // holds past their deadline that the sweep decided
	Released     int              `json:"released"`      // of those, cancelled with their stock returned
	Confirmed    int              `json:"confirmed"`     // of those, found CONFIRMED in MySQL (the hold is marked)
	GroupsFailed int              `json:"groups_failed"` // groups past their deadline, now FAILED and settled
	Notified     int              `json:"events_resent"` // cancellation events resent from the outbox
	Healed       int              `json:"healed"`        // SKUs whose persistent drift was corrected in Redis
	Drift        map[string]int64 `json:"drift"`         // per SKU: MySQL available − (Redis available + held)
	Errors       int              `json:"errors"`
}

// Sweep is the scheduled pass that bounds how long anything stays undecided:
// it warms SKUs Redis lost, decides holds past their deadline (plus the skew
// grace) through the same fenced decision as compensate, fails groups that
// did not form by their deadline and returns all their stock, resends
// cancellation events a crash left unsent, and measures Redis–MySQL drift.
// Every step is idempotent, so two sweeps at once do no harm. An error in
// one item is logged and counted; the sweep goes on and the next one retries.
func (s *Service) Sweep(ctx context.Context) (SweepReport, error) {
	now := s.clock.Now()
	cutoff := now.Add(-s.cfg.SweepGrace)
	rep := SweepReport{Drift: map[string]int64{}}

	levels, err := s.ledger.Stocks(ctx)
	if err != nil {
		return rep, fmt.Errorf("sweep: list skus: %w", err)
	}
	rep.SKUs = len(levels)
	for _, level := range levels {
		if ctx.Err() != nil {
			return rep, ctx.Err()
		}
		s.sweepSKU(ctx, level, cutoff, &rep)
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
			s.log.ErrorContext(ctx, "sweep: fail group", "group_id", g.ID, "error", err)
			continue
		}
		if failed {
			rep.GroupsFailed++
		}
	}

	pending, err := s.ledger.Unnotified(ctx, cutoff, s.cfg.SweepBatch)
	if err != nil {
		rep.Errors++
		s.log.ErrorContext(ctx, "sweep: list unsent events", "error", err)
	}
	for _, row := range pending {
		if err := s.notify(ctx, row); err != nil {
			rep.Errors++
			s.log.ErrorContext(ctx, "sweep: resend event", "reservation_id", row.ID, "error", err)
			continue
		}
		rep.Notified++
	}

	var drift int64
	for _, d := range rep.Drift {
		drift += max(d, -d)
	}
	s.metrics.Count("drift_units", int(drift))
	s.metrics.Count("swept_expired", rep.Expired)
	s.metrics.Count("swept_released", rep.Released)
	s.metrics.Count("groups_failed", rep.GroupsFailed)
	s.metrics.Count("sweep_errors", rep.Errors)
	return rep, nil
}

func (s *Service) sweepSKU(ctx context.Context, level StockLevel, cutoff time.Time, rep *SweepReport) {
	available, held, err := s.holds.Stock(ctx, level.SKU)
	if errors.Is(err, ErrUnknownSKU) {
		warmed, werr := s.holds.Warm(ctx, level)
		if werr != nil {
			rep.Errors++
			s.log.ErrorContext(ctx, "sweep: warm", "sku", level.SKU, "error", werr)
			return
		}
		if warmed {
			rep.Warmed++
			s.metrics.Count("warmed", 1)
		}
		available, held, err = s.holds.Stock(ctx, level.SKU)
	}
	if err != nil {
		rep.Errors++
		s.log.ErrorContext(ctx, "sweep: read redis stock", "sku", level.SKU, "error", err)
		return
	}

	expired, err := s.holds.Expired(ctx, level.SKU, cutoff, s.cfg.SweepBatch)
	if err != nil {
		rep.Errors++
		s.log.ErrorContext(ctx, "sweep: list expired holds", "sku", level.SKU, "error", err)
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
	if len(expired) > 0 {
		return // holds are being decided right now: measure next time
	}
	drift := level.Available - (available + held)
	rep.Drift[level.SKU] = drift
	s.reconcile(ctx, level, available, held, drift, rep)
}

// reconcile heals Redis when a drift is real: the same value across sweeps
// (ReconcileAfter apart), no live hold, MySQL unchanged since the
// measurement, and Redis unchanged up to the moment of the fix (heal.lua
// compares). A transient drift — a persist committed between the two reads —
// changes value or vanishes and is never "healed". MySQL stays the arbiter:
// a heal only moves the figure buyers see.
func (s *Service) reconcile(ctx context.Context, level StockLevel, available, held, drift int64, rep *SweepReport) {
	if drift != 0 && held != 0 {
		return // live holds may be mid-decision; only report
	}
	if drift != 0 {
		now, err := s.ledger.Stock(ctx, level.SKU)
		if err != nil || now.Available != level.Available {
			return // MySQL moved: not a stable measurement
		}
	}
	healed, err := s.holds.Heal(ctx, level.SKU, available, held, drift, s.clock.Now(), s.cfg.ReconcileAfter)
	if err != nil {
		rep.Errors++
		s.log.ErrorContext(ctx, "sweep: heal", "sku", level.SKU, "error", err)
		return
	}
	if healed {
		rep.Healed++
		s.metrics.Count("drift_healed", 1)
		s.log.WarnContext(ctx, "healed redis drift", "sku", level.SKU, "drift", drift)
	}
}

// failGroup fails a group that did not form by its deadline: MySQL first
// (the arbiter; a group that formed in time stays FORMED), then Redis (no
// more joins), then every member from both stores is cancelled with its
// stock returned. It reports whether the group is FAILED.
func (s *Service) failGroup(ctx context.Context, g Group) (bool, error) {
	g, err := s.ledger.FailGroup(ctx, g.ID, s.clock.Now())
	if err != nil {
		return false, err
	}
	if g.Status != GroupFailed {
		return false, nil
	}
	ids, err := s.holds.CloseGroup(ctx, g)
	if err != nil {
		return true, err
	}
	rows, err := s.ledger.GroupMembers(ctx, g.ID)
	if err != nil {
		return true, err
	}
	seen := map[string]bool{}
	for _, r := range rows {
		seen[r.ID] = true
		if _, err := s.refund(ctx, r.ID, ReasonGroupFailed); err != nil {
			return true, err
		}
	}
	for _, id := range ids {
		if seen[id] {
			continue
		}
		if err := s.cancelMember(ctx, id); err != nil {
			return true, err
		}
	}
	if err := s.ledger.GroupSettled(ctx, g.ID); err != nil {
		return true, err
	}
	s.log.InfoContext(ctx, "group failed", "group_id", g.ID, "sku", g.SKU, "members", len(rows), "holds", len(ids))
	return true, nil
}

// cancelMember cancels a member of a failed group known to Redis.
func (s *Service) cancelMember(ctx context.Context, id string) error {
	h, err := s.holds.Hold(ctx, id)
	if errors.Is(err, ErrNotFound) {
		return nil // nothing held in Redis; MySQL has no row either
	}
	if err != nil {
		return err
	}
	row, err := s.settle(ctx, h, ReasonGroupFailed)
	if err != nil {
		return err
	}
	if row.Status == StatusConfirmed {
		_, err = s.refund(ctx, id, ReasonGroupFailed)
	}
	return err
}
