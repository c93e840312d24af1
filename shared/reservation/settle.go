package reservation

import (
	"context"
	"errors"
	"fmt"
)

// Compensate decides a reservation whose message reached the dead-letter
// queue. MySQL first: a CONFIRMED row (persist committed after all) only
// marks the hold confirmed; otherwise the reservation is fenced CANCELLED,
// its hold released once, and the cancellation published. A transfer
// between buckets is completed forward instead (its units are in the
// receiving bucket already), as persist does; one nothing backs (forged)
// is dropped, nothing moved. Idempotent, also days later: a
// decided row moves nothing a second time.
func (s *Service) Compensate(ctx context.Context, r Reservation) (Reservation, error) {
	if r.Transfer {
		row, err := s.persistTransfer(ctx, r)
		if errors.Is(err, ErrNotATransfer) || errors.Is(err, ErrUnknownSKU) {
			s.metrics.Count("poison_messages", 1)
			s.log.ErrorContext(ctx, "compensate: a transfer MySQL refuses; dropped, nothing moved", "transfer_id", r.ID, "error", err)
			return r, nil
		}
		return row, err
	}
	return s.fence(ctx, r, ReasonDeadLetter)
}

// Cancel is user's cancel of one of their reservations (another user's is
// ErrNotFound, like an unknown id). It is an attempt of user's on the id's
// SKU, charged before MySQL is read (meterCancel): past the rate
// *RateLimitedError, nothing read or changed. A HELD reservation is fenced and
// released; a CONFIRMED one is refunded in MySQL and then in Redis; a PAID
// one is ErrPaid, nothing changed. Idempotent: a repeat finds the decided
// row and moves nothing, however long afterwards. Once MySQL has decided,
// the answer is the row; Redis follows through the release outbox if it
// cannot follow now.
func (s *Service) Cancel(ctx context.Context, id, user string) (Reservation, error) {
	if !ValidReservationID(id, "") {
		return Reservation{}, ErrNotFound
	}
	if err := s.meterCancel(ctx, id, user); err != nil {
		return Reservation{}, err
	}
	return s.cancel(ctx, id, &user, ReasonBuyer, "")
}

// OrderCancel is the order service's cancel of a HELD or CONFIRMED
// reservation, for its own reason note (ValidNote), with the same
// exactly-once give-back as a buyer's (Cancel): ReasonOrderCancelled, the
// note recorded and published. A PAID reservation is ErrPaid; a CANCELLED
// one is answered as it stands (idempotent, whoever cancelled it: the row
// and its event say who). The route is IAM's, not metered.
func (s *Service) OrderCancel(ctx context.Context, id, note string) (Reservation, error) {
	if !ValidNote(note) {
		return Reservation{}, invalid("reason", "must be 1-64 characters of letters, digits and ._:-")
	}
	if !ValidReservationID(id, "") || s.unknownSKUOf(ctx, id) {
		return Reservation{}, ErrNotFound
	}
	return s.cancel(ctx, id, nil, ReasonOrderCancelled, note)
}

// cancel is Cancel and OrderCancel: the buyer's (owner names them: another
// user's id is ErrNotFound) or the order service's (owner nil).
func (s *Service) cancel(ctx context.Context, id string, owner *string, reason Reason, note string) (Reservation, error) {
	mine := func(r Reservation) error {
		if owner == nil {
			return nil
		}
		_, err := owned(r, *owner)
		return err
	}
	var user string
	if owner != nil {
		user = *owner
	}
	row, err := s.ledger.Reservation(ctx, id)
	if err == nil && row.Transfer {
		return Reservation{}, ErrNotFound // a transfer between buckets is nobody's to cancel
	}
	if err == nil {
		if err := mine(row); err != nil {
			return Reservation{}, err
		}
	}
	if errors.Is(err, ErrNotFound) {
		h, herr := s.holdOf(ctx, id, user)
		if herr != nil {
			return Reservation{}, herr
		}
		if h.Transfer {
			return Reservation{}, ErrNotFound
		}
		if err := mine(h); err != nil {
			return Reservation{}, err
		}
		h.Note = note
		if row, err = s.fence(ctx, h, reason); err != nil {
			return Reservation{}, err
		}
		if row.Status != StatusConfirmed {
			return row, nil
		}
		// persist won the race to the row: the cancel is a refund.
	}
	if err != nil {
		return Reservation{}, err
	}
	if row.Status == StatusConfirmed {
		if !row.PaidAt.IsZero() {
			return row, fmt.Errorf("cancel %s: %w", id, ErrPaid)
		}
		s.formBeforeLeaving(ctx, row)
		row, _, err := s.refund(ctx, id, reason, note)
		return row, err
	}
	row = s.carryOut(ctx, row, 0)
	s.publish(ctx, row.ID) // a repeat: what the outbox still owes of the row
	return row, nil
}

// Pay is the order service's record that a CONFIRMED reservation is paid:
// PAID, final (no cancel, refund or payment timeout moves it again), its
// ReservationPaid published. Idempotent: a PAID one is answered as it
// stands. Errors, nothing changed: ErrNotFound (no such reservation),
// ErrNotConfirmed (still HELD: MySQL has not confirmed it yet),
// *CancelledError (cancelled first: a payment timeout, the buyer, …),
// ErrGroupNotFormed (a join whose group has not formed). Once MySQL has it
// paid, Pay succeeds even if Redis does not hear that its units can no
// longer return: a repeat tells it, and so does the sweep.
func (s *Service) Pay(ctx context.Context, id string) (Reservation, error) {
	if !ValidReservationID(id, "") || s.unknownSKUOf(ctx, id) {
		return Reservation{}, ErrNotFound
	}
	row, paid, err := s.ledger.Pay(ctx, id, s.clock.Now())
	if errors.Is(err, ErrNotFound) {
		if h, herr := s.holdOf(ctx, id, ""); herr == nil && !h.Transfer {
			return Reservation{}, fmt.Errorf("pay %s: %w", id, ErrNotConfirmed)
		} else if herr != nil && !errors.Is(herr, ErrNotFound) {
			return Reservation{}, herr
		}
		return Reservation{}, ErrNotFound
	}
	if err != nil {
		return Reservation{}, err // the ledger's, naming the id
	}
	if row.Status == StatusCancelled {
		return row, fmt.Errorf("pay %s: %w", id, &CancelledError{Reason: row.Reason})
	}
	if paid {
		s.metrics.Count("paid", 1)
	}
	s.publish(ctx, row.ID) // its ReservationPaid, or what a repeat finds still owed
	// Redis stops counting its units as ones that may return (the waiting
	// room's), if it counted them: only a row with a pay window. MySQL has
	// decided, so Redis's failure fails no payment: a repeat follows again,
	// and the sweep checks a room's unpaid units against MySQL.
	if !row.PayBy.IsZero() {
		if _, err := s.holds.Follow(ctx, row, 0); err != nil {
			s.metrics.Count("paid_redis_behind", 1)
			s.log.WarnContext(ctx, "paid in mysql; redis still counts its units as unpaid until the sweep or a repeat",
				"reservation_id", row.ID, "error", err)
		}
	}
	return row, nil
}

// fence is the one decision every cancelling path shares: write the
// CANCELLED row unless MySQL already decided (Ledger.Fence), then carry out
// the row as it stands, CANCELLED or CONFIRMED. An error means MySQL
// could not decide; nothing was released.
func (s *Service) fence(ctx context.Context, r Reservation, reason Reason) (Reservation, error) {
	if reason.CountsInGroup() && (reason != ReasonExpired || r.Sent) { // the group filled with this join in it: it forms first
		s.formBeforeLeaving(ctx, r)
	}
	row, inserted, err := s.ledger.Fence(ctx, r, reason, s.clock.Now())
	if err != nil {
		return r, fmt.Errorf("fence %s: %w", r.ID, err)
	}
	if inserted {
		s.metrics.Count("cancelled_"+string(row.Reason), 1)
	}
	s.followStray(ctx, row, r.Bucket)
	row = s.carryOut(ctx, row, 0)
	if !row.Transfer {
		// Its ReservationCancelled, or what the outbox still owes of the row
		// the fence found (its decider may have died before publishing).
		s.publish(ctx, row.ID)
	}
	return row, nil
}

// refund cancels a CONFIRMED reservation: stock back to MySQL, then Redis.
// refunded reports that this call did it (not a concurrent one). ErrPaid
// if it was paid first (the row is returned with it).
func (s *Service) refund(ctx context.Context, id string, reason Reason, note string) (row Reservation, refunded bool, err error) {
	row, refunded, err = s.ledger.Refund(ctx, id, reason, note, s.clock.Now())
	if err != nil {
		return Reservation{}, false, fmt.Errorf("refund %s: %w", id, err)
	}
	if !refunded && row.Shown() == StatusPaid {
		return row, false, fmt.Errorf("refund %s: %w", id, ErrPaid)
	}
	if refunded {
		s.metrics.Count("cancelled_"+string(reason), 1)
	}
	row = s.carryOut(ctx, row, 0)
	if refunded {
		s.publish(ctx, row.ID) // the refund wrote its ReservationCancelled
	}
	return row, refunded, nil
}

// carryOut carries out MySQL's decided row in Redis. Redis follows the row
// (Holds.Follow: the hold is confirmed or released, a give-back at most
// once), and the row is marked released once Redis acknowledged (the release
// outbox). What fails here is left to the sweeper, which drains the outbox;
// MySQL's decision stands either way, so carryOut reports no error. version
// is the stock row's version after a confirm's commit (0 when unknown). The
// decision's event is not carryOut's: the deciding path publishes it
// (publish), and the sweeper drains what that left (drainEvents).
func (s *Service) carryOut(ctx context.Context, row Reservation, version int64) Reservation {
	if err := s.carryOutNow(ctx, row, version); err != nil {
		s.metrics.Count("follow_failed", 1)
		s.log.WarnContext(ctx, "redis did not follow mysql yet; the sweeper retries",
			"reservation_id", row.ID, "status", row.Status, "error", err)
	}
	return row
}

// carryOutNow is carryOut, reporting what failed.
func (s *Service) carryOutNow(ctx context.Context, row Reservation, version int64) error {
	if row.Transfer {
		return s.carryOutTransfer(ctx, row, 0)
	}
	if row.GroupID != "" && row.Status == StatusCancelled && row.Release == ReleaseOwed {
		if err := s.groupFollowsMySQL(ctx, row); err != nil {
			return fmt.Errorf("follow %s: %w", row.ID, err) // nothing released: the outbox keeps it
		}
	}
	var errs []error
	returned, err := s.holds.Follow(ctx, row, version)
	if errors.Is(err, ErrUnknownSKU) {
		// A refund while Redis has no stock for the bucket: warm it (from a
		// level that may already count the refund: wver says so), then follow.
		if _, err = s.warm(ctx, row.SKU, row.Bucket); err == nil {
			returned, err = s.holds.Follow(ctx, row, version)
		}
	}
	switch {
	case err != nil:
		errs = append(errs, fmt.Errorf("follow %s: %w", row.ID, err))
	case row.Release == ReleaseOwed:
		if err := s.ledger.MarkReleased(ctx, row.ID); err != nil {
			errs = append(errs, fmt.Errorf("mark released %s: %w", row.ID, err))
		}
	}
	if returned {
		s.soldOut.Delete(row.SKU) // stock came back: ask Redis again
		s.metrics.Count("released", 1)
		s.coverAfterReturn(ctx, row.SKU)
	}
	return errors.Join(errs...)
}
