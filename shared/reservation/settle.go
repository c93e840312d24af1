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
// released; a CONFIRMED one is refunded in MySQL and then in Redis.
// Idempotent: a repeat finds the decided row and moves nothing, however long
// afterwards. Once MySQL has decided, the answer is the row; Redis follows
// through the release outbox if it cannot follow now.
func (s *Service) Cancel(ctx context.Context, id, user string) (Reservation, error) {
	if !ValidReservationID(id, "") {
		return Reservation{}, ErrNotFound
	}
	if err := s.meterCancel(ctx, id, user); err != nil {
		return Reservation{}, err
	}
	row, err := s.ledger.Reservation(ctx, id)
	if err == nil {
		if _, err := owned(row, user); err != nil {
			return Reservation{}, err
		}
	}
	if errors.Is(err, ErrNotFound) {
		h, herr := s.holdOf(ctx, id, user)
		if herr != nil {
			return Reservation{}, herr
		}
		if _, err := owned(h, user); err != nil {
			return Reservation{}, err
		}
		if row, err = s.fence(ctx, h, ReasonBuyer); err != nil {
			return Reservation{}, err
		}
		if row.Status != StatusConfirmed {
			return row, nil
		}
		// persist won the race to the row: the buyer's cancel is a refund.
	}
	if err != nil {
		return Reservation{}, err
	}
	if row.Status == StatusConfirmed {
		s.formBeforeLeaving(ctx, row)
		return s.refund(ctx, id, ReasonBuyer)
	}
	row = s.carryOut(ctx, row, 0)
	s.publish(ctx, row.ID) // a repeat: what the outbox still owes of the row
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
func (s *Service) refund(ctx context.Context, id string, reason Reason) (Reservation, error) {
	row, refunded, err := s.ledger.Refund(ctx, id, reason, s.clock.Now())
	if err != nil {
		return Reservation{}, fmt.Errorf("refund %s: %w", id, err)
	}
	if refunded {
		s.metrics.Count("cancelled_"+string(reason), 1)
	}
	row = s.carryOut(ctx, row, 0)
	if refunded {
		s.publish(ctx, row.ID) // the refund wrote its ReservationCancelled
	}
	return row, nil
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
