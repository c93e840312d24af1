package reservation

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"time"
)

// Persist settles one reservation message in MySQL, exactly once per id.
// Attempts are optimistic (version-checked update, retried in a fresh
// transaction on a conflict); the last one locks the stock row first, so
// contention alone cannot exhaust them. It returns the decided reservation.
// An error means the message must be redelivered (MySQL unreachable, or
// even the locking attempt deadlocked); it is never a reason to cancel.
func (s *Service) Persist(ctx context.Context, r Reservation) (Reservation, error) {
	if r.Transfer {
		return s.persistTransfer(ctx, r)
	}
	for attempt := 1; ; attempt++ {
		lock := Optimistic
		if attempt == s.cfg.PersistAttempts {
			lock = Pessimistic
		}
		res, err := s.ledger.Apply(ctx, r, lock, s.clock.Now())
		if errors.Is(err, ErrVersionConflict) {
			s.metrics.Count("persist_retries", 1)
			if attempt >= s.cfg.PersistAttempts {
				return r, fmt.Errorf("persist %s after %d attempts: %w", r.ID, attempt, ErrContended)
			}
			s.sleep(ctx, Backoff(attempt))
			if ctx.Err() != nil {
				return r, fmt.Errorf("persist %s: %w", r.ID, ctx.Err())
			}
			continue
		}
		if err != nil {
			return r, fmt.Errorf("persist %s: %w", r.ID, err)
		}
		return s.decided(ctx, r, res)
	}
}

// PersistBatch settles a batch of reservation messages: the hot-SKU path.
// Messages without a group are grouped by SKU and each group is settled with
// ApplyBatch — one transaction, one version-checked update for the summed
// quantity under the row lock — retried on a conflict; exactly the
// reservations that fit (stock and per-user limits, in message order) are
// confirmed and the rest are cancelled through the fence. Group joins,
// transfers between buckets, and a batch that keeps conflicting, go through
// Persist one by one. It returns
// one error per message: nil once decided, else the message must be
// redelivered.
func (s *Service) PersistBatch(ctx context.Context, rs []Reservation) []error {
	errs := make([]error, len(rs))
	bySKU := map[string][]int{}
	var order []string
	for i, r := range rs {
		if r.GroupID != "" || r.Transfer {
			_, errs[i] = s.Persist(ctx, r)
			continue
		}
		if _, ok := bySKU[r.SKU]; !ok {
			order = append(order, r.SKU)
		}
		bySKU[r.SKU] = append(bySKU[r.SKU], i)
	}
	for _, sku := range order {
		idx := bySKU[sku]
		batch := make([]Reservation, len(idx))
		for j, i := range idx {
			batch[j] = rs[i]
		}
		results, now, err := s.applyBatch(ctx, sku, batch)
		if errors.Is(err, ErrVersionConflict) {
			for _, i := range idx { // still contended: one by one, the last attempt locking
				_, errs[i] = s.Persist(ctx, rs[i])
			}
			continue
		}
		if err != nil {
			for _, i := range idx {
				errs[i] = fmt.Errorf("persist %s: %w", rs[i].ID, err)
			}
			continue
		}
		var confirmed []Reservation // Applied: Redis follows them in one round trip
		var version int64
		followed := map[string]bool{}
		for j, i := range idx {
			if results[j].Result != Applied {
				_, errs[i] = s.decided(ctx, rs[i], results[j])
				continue
			}
			// Redis follows the row MySQL inserted: for a twin (the same id
			// twice in the batch, perhaps under another token: a hold Redis
			// took again) that is its first copy, followed once.
			r := results[j].Row
			if followed[r.ID] {
				// A twin held in another bucket: it follows the row MySQL
				// confirmed (its hold returned, its tombstone CONFIRMED, so a
				// keyed retry there is answered the row, not a cancel).
				r.Status = StatusConfirmed
				s.followStray(ctx, r, rs[i].Bucket)
				continue
			}
			followed[r.ID] = true
			s.metrics.Count("confirmed", 1)
			if h := s.hooks.AfterCommit; h != nil {
				if errs[i] = h(r); errs[i] != nil {
					continue
				}
			}
			r.Status = StatusConfirmed
			confirmed = append(confirmed, r)
			version = results[j].Version
		}
		s.followAll(ctx, confirmed, version)
		// Their ReservationConfirmed events, exactly as the commit wrote
		// them (the same rows, the same now): sent without reading them
		// back. A confirmation is its row's first event, so none of theirs
		// can be waiting before it.
		evs := make([]Event, len(confirmed))
		for i, r := range confirmed {
			evs[i] = ConfirmedEvent(r, now)
		}
		s.sendWritten(ctx, evs)
	}
	return errs
}

// followAll makes Redis follow rows MySQL confirmed in one commit (version
// is the stock row's after it), like carryOut on each: a failure is counted,
// logged and left to the sweeper.
func (s *Service) followAll(ctx context.Context, rows []Reservation, version int64) {
	if len(rows) == 0 {
		return
	}
	returned, errs := s.holds.FollowAll(ctx, rows, version)
	for i, row := range rows {
		if errors.Is(errs[i], ErrUnknownSKU) {
			s.carryOut(ctx, row, version) // the warm-up path, one by one
			continue
		}
		if errs[i] != nil {
			s.metrics.Count("follow_failed", 1)
			s.log.WarnContext(ctx, "redis did not follow mysql yet; the sweeper retries",
				"reservation_id", row.ID, "status", row.Status, "error", errs[i])
		}
		if returned[i] {
			s.soldOut.Delete(row.SKU)
			s.metrics.Count("released", 1)
			s.coverAfterReturn(ctx, row.SKU)
		}
	}
}

// applyBatch runs the batch attempts for one SKU; now is the time the
// deciding attempt passed to the ledger (its events' time).
func (s *Service) applyBatch(ctx context.Context, sku string, batch []Reservation) (results []BatchResult, now time.Time, err error) {
	for attempt := 1; attempt < max(2, s.cfg.PersistAttempts); attempt++ {
		now = s.clock.Now()
		results, err = s.ledger.ApplyBatch(ctx, sku, batch, now)
		if !errors.Is(err, ErrVersionConflict) {
			return results, now, err
		}
		s.metrics.Count("persist_retries", 1)
		s.sleep(ctx, Backoff(attempt))
		if ctx.Err() != nil {
			return nil, now, ctx.Err()
		}
	}
	return nil, now, err
}

// decided acts on what MySQL decided for one message. Redis follows the
// row, whatever it says: a message whose hold is not the one MySQL decided
// (another token: a stray) has that hold returned, never confirmed.
func (s *Service) decided(ctx context.Context, r Reservation, res BatchResult) (Reservation, error) {
	switch res.Result {
	case Applied:
		s.metrics.Count("confirmed", 1)
		if h := s.hooks.AfterCommit; h != nil {
			if err := h(r); err != nil {
				return r, err
			}
		}
		r.Status = StatusConfirmed
		r.PayBy = res.Row.PayBy // Redis counts a unit with a pay window as one that may return
		r = s.carryOut(ctx, r, res.Version)
		if r.GroupID != "" {
			// This join was sent, so it was accepted: if its group's slots
			// are all taken, it formed (the reserve that sent the last join
			// may have died before recording it).
			s.formGroup(ctx, Group{ID: r.GroupID, SKU: r.SKU}, time.Time{}, false)
		}
		// Its ReservationConfirmed, and the GroupFormed of a join that took
		// the group's last slot in MySQL: both written by the commit.
		s.publish(ctx, r.ID, r.GroupID)
		return r, nil
	case AlreadyConfirmed, AlreadyCancelled:
		// A redelivery, a fenced reservation, or a stray: take nothing and
		// bring Redis in line with the row (the fencer may have crashed
		// before it released).
		if res.Row.Token != r.Token && r.Token != "" {
			s.metrics.Count("strays", 1)
		}
		s.followStray(ctx, res.Row, r.Bucket)
		row := s.carryOut(ctx, res.Row, 0)
		s.publish(ctx, row.ID) // what the outbox still owes of the row (its decider may have died before publishing)
		return row, nil
	default:
		return s.fence(ctx, r, reasonOf(res.Result))
	}
}

func reasonOf(res ApplyResult) Reason {
	switch res {
	case NoSuchSKU:
		return ReasonUnknownSKU
	case GroupNotOpen:
		return ReasonGroupClosed
	case GroupNoSlot:
		return ReasonGroupFull
	case GroupDuplicate:
		return ReasonAlreadyJoined
	case OverLimit:
		return ReasonLimit
	default:
		return ReasonInsufficient
	}
}

// Backoff is full jitter over an exponential ceiling (1ms, 2ms, 4ms, …
// capped at 100ms): the pause before retry attempt+1 of a contended write,
// here and in the adapters.
func Backoff(attempt int) time.Duration {
	ceiling := min(time.Duration(1<<attempt)*time.Millisecond, 100*time.Millisecond)
	return time.Duration(mrand.Int64N(int64(ceiling)) + 1)
}
