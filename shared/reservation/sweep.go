package reservation

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// SweepReport says what one sweep did.
type SweepReport struct {
	SKUs            int  `json:"skus"`              // SKUs visited: live ones and the catalog pass's
	LiveSKUs        int  `json:"live_skus"`         // of those, marked live
	OpeningSKUs     int  `json:"opening_skus"`      // of those, opening within Config.WarmLead (warmed ahead)
	CatalogSKUs     int  `json:"catalog_skus"`      // SKUs the catalog pass reached this sweep
	CatalogPassDone bool `json:"catalog_pass_done"` // the pass reached the end of the catalog
	Unmarked        int  `json:"unmarked"`          // live SKUs found quiet, whose marks ended
	Warmed          int  `json:"warmed"`
	Adjusted        int  `json:"adjusted"`      // SKUs whose missed admin changes reached Redis
	Expired         int  `json:"expired"`       // holds past their deadline that the sweep decided
	Released        int  `json:"released"`      // holds cancelled with their stock returned, and outbox releases
	Confirmed       int  `json:"confirmed"`     // of those, found CONFIRMED in MySQL (the hold is marked)
	GroupsFailed    int  `json:"groups_failed"` // groups past their deadline, now FAILED and settled
	// PaymentsTimedOut is the CONFIRMED reservations not paid by their
	// PayBy that the sweep cancelled (payment_timeout), their stock back.
	PaymentsTimedOut int `json:"payments_timed_out"`
	// UnpaidSettled is the reservations Redis still counted as unpaid, so as
	// ones that may return, though MySQL has them paid or cancelled (a
	// payment's Redis call that failed and was never retried).
	UnpaidSettled int `json:"unpaid_settled"`
	EventsResent  int `json:"events_resent"` // events the sweep published from the event outbox
	// OutboxLagSeconds is how long ago the oldest event still unpublished
	// after the drain occurred (0: none left).
	OutboxLagSeconds int `json:"outbox_lag_seconds"`
	Healed           int `json:"healed"` // SKUs whose persistent drift was corrected in Redis
	// Drift (MySQL available − (Redis available + held)) over the SKUs the
	// sweep visited: the total of its sizes, how many SKUs drift, and the
	// worst of them by name — never a map of the whole catalog.
	DriftUnits int64      `json:"drift_units"`
	Drifting   int        `json:"drifting_skus"`
	WorstDrift []SKUDrift `json:"worst_drift,omitempty"`
	// The ledger audit of the live SKUs (stock put in = available + taken,
	// in MySQL): how many were audited, the total of the mismatches' sizes,
	// how many SKUs mismatch, and the worst of them by name.
	Audited       int        `json:"audited_skus"`
	MismatchUnits int64      `json:"ledger_mismatch_units"`
	Mismatched    int        `json:"mismatched_skus"`
	WorstMismatch []SKUDrift `json:"worst_mismatch,omitempty"`
	Errors        int        `json:"errors"`
}

// SKUDrift is one SKU's drift.
type SKUDrift struct {
	SKU   string `json:"sku"`
	Drift int64  `json:"drift"`
}

// sweepReserve is the time a sweep keeps for itself before its deadline:
// past it, it stops taking on more work, so that it reports what it did and
// moves its cursor instead of being cut off by the function's timeout.
const sweepReserve = 10 * time.Second

// nearDeadline reports whether ctx ends within sweepReserve.
func nearDeadline(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	dl, ok := ctx.Deadline()
	return ok && time.Until(dl) < sweepReserve
}

// maxExpiredRounds bounds the rounds of SweepBatch expired holds one sweep
// decides per SKU (20 × 500 = 10,000 by default).
const maxExpiredRounds = 20

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

// Sweep is the scheduled pass that bounds how long anything stays undecided.
// Its cost follows the sale, not the catalog: it visits
//   - the live SKUs, those a reserve or a stock change marked (LiveMarks.Touch)
//     and whose holds are not all decided yet, every sweep;
//   - the SKUs whose sale window opens within Config.WarmLead (an indexed
//     read), so each is warm in Redis before its first buyer;
//   - a slice of the catalog (Config.SweepCatalog SKUs after a cursor kept in
//     Redis), so that any SKU, marked or not, is visited once per pass of
//     the catalog — the backstop for a mark that failed or that Redis lost;
//   - the outboxes and the due groups MySQL lists (indexed, bounded).
//
// Per SKU it brings Redis in line with MySQL's level (warms a SKU Redis lost,
// applies admin changes Redis missed), decides holds past their deadline
// (plus the skew grace, by Redis's clock) through the same fenced decision as
// compensate, and measures Redis–MySQL drift. It ends groups past their
// deadline (FORMED if their last slot went in time, else FAILED with all
// their stock returned) and drains the outboxes (Redis releases and
// events a failure left unpublished). Every step is idempotent, so
// two sweeps at once do no harm. An error in one item is logged and counted;
// the sweep goes on and the next one retries.
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
		if err := s.carryOutNow(ctx, row, 0); err != nil {
			rep.Errors++
			s.log.ErrorContext(ctx, "sweep: drain outbox", "reservation_id", row.ID, "error", err)
			continue
		}
		if row.Release == ReleaseOwed {
			rep.Released++
		}
	}
	s.drainEvents(ctx, cutoff, &rep)
	s.timeOutPayments(ctx, cutoff, &rep)

	visited := s.sweepLive(ctx, &rep)
	s.sweepOpening(ctx, visited, &rep)

	// Due groups before the catalog pass: they are live activity. Every due
	// group, however many (bounded by the sweep's time, not by a count).
	// Listed at their deadline, without the grace: group_close.lua judges
	// by Redis's clock whether one is due (a sweeper whose clock runs ahead
	// hears "not due" and the next sweep ends it), so an honest group ends
	// within one sweep period of its deadline.
	s.endGroups(ctx, s.clock.Now(), &rep)

	if err := s.sweepCatalog(ctx, visited, &rep); err != nil {
		return rep, err
	}

	s.metrics.Count("drift_units", int(rep.DriftUnits))
	s.metrics.Count("swept_expired", rep.Expired)
	s.metrics.Count("swept_released", rep.Released)
	s.metrics.Count("groups_failed", rep.GroupsFailed)
	s.metrics.Count("payments_timed_out", rep.PaymentsTimedOut)
	s.metrics.Count("sweep_errors", rep.Errors)
	return rep, nil
}

// timeOutPayments cancels the CONFIRMED reservations whose payment was due
// by cutoff (their PayBy, plus the skew grace) and has not been recorded:
// each is refunded ReasonPaymentTimeout, as a buyer's cancel refunds, so
// its units go back to the sale exactly once. A payment that MySQL
// records first wins (Refund returns a PAID row untouched). An indexed
// read, SweepBatch rows at a time, for at most maxExpiredRounds rounds.
func (s *Service) timeOutPayments(ctx context.Context, cutoff time.Time, rep *SweepReport) {
	for range maxExpiredRounds {
		if nearDeadline(ctx) {
			return
		}
		due, err := s.ledger.PaymentsDue(ctx, cutoff, s.cfg.SweepBatch)
		if err != nil {
			rep.Errors++
			s.log.ErrorContext(ctx, "sweep: list payments due", "error", err)
			return
		}
		done := 0
		for _, r := range due {
			_, refunded, err := s.refund(ctx, r.ID, ReasonPaymentTimeout, "")
			switch {
			case errors.Is(err, ErrPaid): // paid at the last moment: final
			case err != nil:
				rep.Errors++
				s.log.ErrorContext(ctx, "sweep: payment timeout", "reservation_id", r.ID, "error", err)
			case refunded: // not a concurrent sweep's (or cancel's)
				done++
			}
		}
		rep.PaymentsTimedOut += done
		if len(due) < s.cfg.SweepBatch || done == 0 {
			return
		}
	}
}

// sweepLive visits the live SKUs and ends the marks of those that are quiet
// (no hold left undecided) once the marks have passed. It returns the SKUs
// it visited.
func (s *Service) sweepLive(ctx context.Context, rep *SweepReport) map[string]bool {
	visited := map[string]bool{}
	live, err := s.marks.Live(ctx, s.cfg.SweepLive)
	if err != nil {
		rep.Errors++
		s.log.ErrorContext(ctx, "sweep: list live skus", "error", err)
		return visited
	}
	if len(live) == 0 {
		return visited
	}
	if len(live) >= s.cfg.SweepLive {
		// More SKUs are live than one sweep visits: the latest marks (the
		// SKUs selling right now) wait for the catalog pass. Raise
		// HOLDFAST_SWEEP_LIVE above the SKUs on sale at once.
		s.metrics.Count("live_skus_capped", 1)
		s.log.WarnContext(ctx, "sweep: more live skus than HOLDFAST_SWEEP_LIVE; the rest wait for the catalog pass", "limit", s.cfg.SweepLive)
	}
	names := make([]string, len(live))
	for i, m := range live {
		names[i] = m.SKU
	}
	levels, err := s.ledger.Levels(ctx, names)
	if err != nil {
		rep.Errors++
		s.log.ErrorContext(ctx, "sweep: read live levels", "error", err)
		return visited
	}
	byName := make(map[string]StockLevel, len(levels))
	for _, l := range levels {
		byName[l.SKU] = l
	}
	for _, m := range live {
		if nearDeadline(ctx) {
			return visited
		}
		level, known := byName[m.SKU]
		quiet := !known // a SKU MySQL does not have takes no hold (reserve asks MySQL to warm it)
		if known {
			visited[m.SKU] = true
			rep.SKUs++
			rep.LiveSKUs++
			drifted := rep.DriftUnits
			quiet = s.sweepSKU(ctx, level, rep)
			s.audit(ctx, m.SKU, rep.DriftUnits-drifted, rep)
		}
		if !quiet {
			continue
		}
		ended, err := s.marks.Unmark(ctx, m)
		if err != nil {
			rep.Errors++
			s.log.ErrorContext(ctx, "sweep: unmark", "sku", m.SKU, "error", err)
		} else if ended {
			rep.Unmarked++
		}
	}
	return visited
}

// sweepOpening visits the SKUs whose sale opens within Config.WarmLead by
// the sweeper's clock (at most Config.SweepLive, the earliest first) that
// it has not visited as live: Redis lost nothing of a SKU about to open, or
// has warmed it again (every bucket) by the end of the sweep.
func (s *Service) sweepOpening(ctx context.Context, visited map[string]bool, rep *SweepReport) {
	if s.cfg.WarmLead <= 0 {
		return
	}
	now := s.clock.Now()
	levels, err := s.ledger.Opening(ctx, now, now.Add(s.cfg.WarmLead), s.cfg.SweepLive)
	if err != nil {
		rep.Errors++
		s.log.ErrorContext(ctx, "sweep: list skus about to open", "error", err)
		return
	}
	for _, level := range levels {
		if nearDeadline(ctx) {
			return
		}
		if visited[level.SKU] {
			continue
		}
		visited[level.SKU] = true
		rep.SKUs++
		rep.OpeningSKUs++
		s.sweepSKU(ctx, level, rep)
	}
}

// sweepCatalog visits the next Config.SweepCatalog SKUs of the catalog
// after the cursor (skipping those visited as live) and moves the cursor on;
// past the last SKU the pass starts again from the first.
func (s *Service) sweepCatalog(ctx context.Context, visited map[string]bool, rep *SweepReport) error {
	after, err := s.marks.Cursor(ctx)
	if err != nil {
		rep.Errors++
		s.log.ErrorContext(ctx, "sweep: read catalog cursor", "error", err)
		after = ""
	}
	// One more than the slice: whether the pass goes on after it.
	levels, err := s.ledger.StocksAfter(ctx, after, s.cfg.SweepCatalog+1)
	if err != nil {
		return fmt.Errorf("sweep: list skus after %q: %w", after, err)
	}
	more := len(levels) > s.cfg.SweepCatalog
	levels = levels[:min(len(levels), s.cfg.SweepCatalog)]
	for i, level := range levels {
		if nearDeadline(ctx) {
			levels, more = levels[:i], true // the next sweep goes on from here
			break
		}
		rep.CatalogSKUs++
		if visited[level.SKU] {
			continue
		}
		rep.SKUs++
		s.sweepSKU(ctx, level, rep)
	}
	next := ""
	switch {
	case more && len(levels) > 0:
		next = levels[len(levels)-1].SKU
	case more:
		next = after // out of time before the first: the next sweep starts here
	default:
		rep.CatalogPassDone = true
	}
	if err := s.marks.SetCursor(ctx, next); err != nil {
		rep.Errors++
		s.log.ErrorContext(ctx, "sweep: move catalog cursor", "error", err)
	}
	return nil
}

// sweepSKU works on each bucket of one SKU with the level the sweep
// listed. It reports whether the SKU is quiet: every bucket is.
func (s *Service) sweepSKU(ctx context.Context, level StockLevel, rep *SweepReport) (quiet bool) {
	quiet = true
	for b := range level.BucketCount() {
		if !s.sweepBucket(ctx, level, b, rep) {
			quiet = false
		}
	}
	if level.BucketCount() > 1 {
		s.cover(ctx, level.SKU, level.BucketCount())
	}
	if level.WaitingRoom() {
		// The backstop of the waiters' looks, which admit: units that came
		// back (a hold released above) admit the next in line even if
		// nobody looks for a while.
		q, err := s.lookQueue(ctx, level.SKU, "", QueueOp{AdmitFor: s.cfg.AdmitFor}, true)
		if err != nil && !errors.Is(err, ErrNoWaitingRoom) {
			rep.Errors++
			s.log.ErrorContext(ctx, "sweep: admit from the waiting room", "sku", level.SKU, "error", err)
		}
		if err == nil && (level.PayWithin > 0 || q.Unpaid > 0) {
			s.settleUnpaid(ctx, level.SKU, rep)
		}
	}
	return quiet
}

// maxUnpaidCheck is how many unpaid ids one sweep checks per room SKU.
const maxUnpaidCheck = 1000

// settleUnpaid holds a room's unpaid units in Redis to MySQL's, every sweep
// of a room SKU with a pay window (or units counted unpaid): each one Redis
// counts that MySQL has paid or cancelled (a payment or cancel whose Redis
// call failed) follows its row, so Redis stops counting it as one that may
// return; each one MySQL has unpaid that Redis does not count follows its
// row too, and is counted. One MySQL read per such SKU and sweep.
func (s *Service) settleUnpaid(ctx context.Context, sku string, rep *SweepReport) {
	ids, err := s.figures.UnpaidIDs(ctx, BucketName(sku, 0), maxUnpaidCheck)
	if err != nil {
		rep.Errors++
		s.log.ErrorContext(ctx, "sweep: unpaid ids", "sku", sku, "error", err)
		return
	}
	_, rows, err := s.ledger.Snapshot(ctx, sku, ids)
	if err != nil {
		rep.Errors++
		s.log.ErrorContext(ctx, "sweep: unpaid rows", "sku", sku, "error", err)
		return
	}
	confirmed := make(map[string]Reservation, len(rows))
	for _, r := range rows {
		confirmed[r.ID] = r
	}
	// Rows MySQL has unpaid that Redis does not count (confirmed by a
	// release before Redis counted unpaid units, or while its call failed):
	// following them adds each once.
	counted := make(map[string]bool, len(ids))
	for _, id := range ids {
		counted[id] = true
	}
	if len(ids) < maxUnpaidCheck { // all of Redis's ids are known
		for _, r := range rows {
			if counted[r.ID] || r.PayBy.IsZero() || !r.PaidAt.IsZero() || r.Bucket != 0 {
				continue
			}
			if _, err := s.holds.Follow(ctx, r, 0); err != nil {
				rep.Errors++
				s.log.ErrorContext(ctx, "sweep: count unpaid", "id", r.ID, "error", err)
				continue
			}
			rep.UnpaidSettled++
		}
	}
	for _, id := range ids {
		row, ok := confirmed[id]
		if ok && !row.PayBy.IsZero() && row.PaidAt.IsZero() {
			continue // unpaid: it may return
		}
		if !ok { // not CONFIRMED: cancelled, so read it
			if row, err = s.ledger.Reservation(ctx, id); err != nil {
				if !errors.Is(err, ErrNotFound) {
					rep.Errors++
					s.log.ErrorContext(ctx, "sweep: unpaid row", "id", id, "error", err)
				}
				continue
			}
		}
		if _, err := s.holds.Follow(ctx, row, 0); err != nil {
			rep.Errors++
			s.log.ErrorContext(ctx, "sweep: settle unpaid", "id", id, "error", err)
			continue
		}
		rep.UnpaidSettled++
	}
}

// sweepBucket works on bucket b of a SKU with the level the sweep listed:
// Sync applies only levels newer than Redis has, and reconcile needs MySQL
// read before Redis, which a level listed earlier is. It reports whether
// the bucket is quiet: Redis in line with MySQL's level and no hold HELD.
func (s *Service) sweepBucket(ctx context.Context, level StockLevel, b int, rep *SweepReport) (quiet bool) {
	share := level.Bucket(b)
	sku := share.SKU // the bucket's name
	res, err := s.figures.Sync(ctx, share)
	switch {
	case err != nil:
	case res == SyncAdjusted:
		rep.Adjusted++
	case res == SyncMissing:
		var warmed bool
		if warmed, err = s.warm(ctx, level.SKU, b); warmed {
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

	// Expired holds, SweepBatch at a time, until none is left (a sale's
	// abandoned holds all expire in the same minute) or maxExpiredRounds.
	decided := 0
	for round := 0; round < maxExpiredRounds && !nearDeadline(ctx); round++ {
		expired, err := s.holds.Expired(ctx, sku, s.cfg.SweepGrace, s.cfg.SweepBatch)
		if err != nil {
			rep.Errors++
			s.log.ErrorContext(ctx, "sweep: list expired holds", "sku", sku, "error", err)
			return false
		}
		failed := 0
		for _, h := range expired {
			row, err := s.decideExpired(ctx, h)
			if err != nil {
				failed++
				rep.Errors++
				s.log.ErrorContext(ctx, "sweep: decide expired hold", "reservation_id", h.ID, "error", err)
				continue
			}
			decided++
			rep.Expired++
			if row.Status == StatusConfirmed {
				rep.Confirmed++
			} else {
				rep.Released++
			}
		}
		if len(expired) < s.cfg.SweepBatch || failed > 0 {
			break // all listed, or failing: the next sweep goes on
		}
	}
	if level.BucketCount() > 1 { // only a SKU over buckets moves units between them
		decided += s.recordCreditsAhead(ctx, sku, rep)
	}
	if decided > 0 || !synced {
		return false // holds are being decided right now, or Redis lacks the level: measure next time
	}
	return s.reconcile(ctx, level, b, rep)
}

// recordCreditsAhead records the transfers credited to bucket (a bucket
// name) ahead of MySQL's record whose deadline passed: persist has not
// recorded them (their message was lost, or its send failed with MySQL),
// and their giving bucket may have lost its hold, so the receiving side
// completes them. It returns how many it recorded.
func (s *Service) recordCreditsAhead(ctx context.Context, bucket string, rep *SweepReport) int {
	ahead, err := s.holds.CreditsAhead(ctx, bucket, s.cfg.SweepGrace, s.cfg.SweepBatch)
	if err != nil {
		rep.Errors++
		s.log.ErrorContext(ctx, "sweep: list credits ahead of their record", "sku", bucket, "error", err)
		return 0
	}
	n := 0
	for _, t := range ahead {
		row, err := s.completeTransfer(ctx, t)
		if err != nil {
			rep.Errors++
			s.log.ErrorContext(ctx, "sweep: record a transfer credited ahead", "transfer_id", t.ID, "error", err)
			continue
		}
		if row.Status == StatusConfirmed && row.Release == ReleaseDone {
			// Recorded and released, yet this bucket's mark is still ahead:
			// a failover brought back a copy from before the record's
			// credit. The record's credit again turns the mark (counting its
			// units once, or again after a warm-up without them).
			if _, err := s.credit(ctx, row); err != nil {
				rep.Errors++
				s.log.ErrorContext(ctx, "sweep: credit a recorded transfer again", "transfer_id", t.ID, "error", err)
				continue
			}
		}
		n++
	}
	return n
}

// decideExpired decides a hold whose deadline passed: a buyer's is fenced
// (expired), a transfer's is completed forward (persist has not recorded it
// yet: its message was lost, or its send failed with MySQL).
func (s *Service) decideExpired(ctx context.Context, h Reservation) (Reservation, error) {
	if h.Transfer {
		return s.completeTransfer(ctx, h)
	}
	return s.fence(ctx, h, ReasonExpired)
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
// It reports whether Redis showed no hold HELD.
func (s *Service) reconcile(ctx context.Context, whole StockLevel, b int, rep *SweepReport) (quiet bool) {
	level := whole.Bucket(b)
	sku := level.SKU // the bucket's name
	rs, err := s.figures.Stock(ctx, sku)
	if err != nil {
		rep.Errors++
		s.log.ErrorContext(ctx, "sweep: read redis stock", "sku", sku, "error", err)
		return false
	}
	quiet = rs.Held == 0
	// Units credited ahead of a transfer's record are not in MySQL's share
	// yet, and are held in the giving bucket: an in-flight transfer is no drift.
	drift := level.Available - (rs.Available - rs.Ahead + rs.Held)
	rep.addDrift(sku, drift)
	if drift != 0 {
		if rs.Held != 0 || rs.AdminDelta != level.AdminDelta {
			return quiet // live holds may be mid-decision, or an admin change is on its way
		}
		if rs.Ahead != 0 {
			return quiet // a transfer credited here waits for its record
		}
		n, err := s.ledger.Unreleased(ctx, whole.SKU)
		if err != nil || n > 0 {
			return quiet // a release or a transfer's credit is on its way to Redis
		}
		again, err := s.ledger.Stock(ctx, whole.SKU)
		if err != nil || again.Version != whole.Version || again.Bucket(b).Available != level.Available {
			return quiet // MySQL moved: not a stable measurement
		}
	}
	healed, err := s.figures.Heal(ctx, rs, drift, s.cfg.ReconcileAfter)
	if err != nil {
		rep.Errors++
		s.log.ErrorContext(ctx, "sweep: heal", "sku", sku, "error", err)
		return quiet
	}
	if healed {
		rep.Healed++
		s.metrics.Count("drift_healed", 1)
		s.log.WarnContext(ctx, "healed redis drift", "sku", sku, "drift", drift)
	}
	return quiet
}
