package mysqlstore

// Cancellations and their release outbox: the fence, the refund, the released flag, the rows read back.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/holdfast/holdfast/shared/reservation"
)

// Fence implements reservation.Ledger. The insert waits on the row lock of
// an in-flight persist of the same id, so exactly one of the two writes the row.
func (s *Store) Fence(ctx context.Context, r reservation.Reservation, reason reservation.Reason, now time.Time) (row reservation.Reservation, inserted bool, err error) {
	err = retryDeadlocks(ctx, func() error {
		row, inserted, err = s.fence(ctx, r, reason, now)
		return err
	})
	return row, inserted, err
}

func (s *Store) fence(ctx context.Context, r reservation.Reservation, reason reservation.Reason, now time.Time) (reservation.Reservation, bool, error) {
	created := r.CreatedAt
	if created.IsZero() {
		// A request fenced before Redis answered (abandon: its hold may or may
		// not exist) was never created anywhere: MySQL refuses a zero date.
		created = now
	}
	// A fence's row is Fenced, its release owed; its ReservationCancelled is
	// written with it — but a transfer's, which has no event.
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return r, false, translate("fence begin", err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	res, err := tx.ExecContext(ctx, `INSERT INTO reservations
		(reservation_id, sku, qty, user_id, group_id, bucket, into_bucket, hold_token, status, reason, cancel_note, released, expires_at, created_at, updated_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'CANCELLED', ?, ?, 0, ?, ?, ?)
		ON DUPLICATE KEY UPDATE reservation_id = reservation_id`,
		r.ID, r.SKU, r.Qty, r.UserID, nullString(r.GroupID), r.Bucket, intoBucket(r), nullString(r.Token), string(reason), nullString(noteOf(reason, r.Note)),
		nullTime(r.ExpiresAt), utc(created), utc(now))
	if err != nil {
		return r, false, translate("fence", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return r, false, translate("fence", err)
	}
	if n == 1 && !r.Transfer {
		r.Note = noteOf(reason, r.Note)
		if err := writeEvents(ctx, tx, []reservation.Event{reservation.CancelledEvent(r, reason, false, now)}); err != nil {
			return r, false, err
		}
	}
	if err := tx.Commit(); err != nil {
		return r, false, translate("fence commit", err)
	}
	row, err := s.Reservation(ctx, r.ID)
	if err != nil {
		return r, false, err
	}
	return row, n == 1, nil
}

// Refund implements reservation.Ledger. Lock order (reservations,
// product_stock, group_members, group_buys) matches Apply's.
func (s *Store) Refund(ctx context.Context, id string, reason reservation.Reason, note string, now time.Time) (row reservation.Reservation, refunded bool, err error) {
	err = retryDeadlocks(ctx, func() error {
		row, refunded, err = s.refund(ctx, id, reason, noteOf(reason, note), now)
		return err
	})
	return row, refunded, err
}

func (s *Store) refund(ctx context.Context, id string, reason reservation.Reason, note string, now time.Time) (reservation.Reservation, bool, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return reservation.Reservation{}, false, translate("refund begin", err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit

	row, err := scanReservation(tx.QueryRowContext(ctx, `SELECT `+reservationColumns+`
		FROM reservations WHERE reservation_id = ? FOR UPDATE`, id))
	if errors.Is(err, sql.ErrNoRows) || (err == nil && row.Transfer) { // a transfer is no buyer's: nothing to refund
		return reservation.Reservation{}, false, reservation.ErrNotFound
	}
	if err != nil {
		return reservation.Reservation{}, false, translate("refund read", err)
	}
	if row.Status != reservation.StatusConfirmed || !row.PaidAt.IsZero() { // decided, or PAID: final
		return row, false, nil
	}
	if _, err := tx.ExecContext(ctx, `UPDATE product_stock SET available = available + ?, version = version + 1 WHERE sku = ?`, row.Qty, row.SKU); err != nil {
		return reservation.Reservation{}, false, translate("refund stock", err)
	}
	if err := moveShares(ctx, tx, row.SKU, map[int]int64{row.Bucket: int64(row.Qty)}); err != nil {
		return reservation.Reservation{}, false, err
	}
	var version int64
	var limit int
	if err := tx.QueryRowContext(ctx, `SELECT version, per_user_limit FROM product_stock WHERE sku = ?`, row.SKU).Scan(&version, &limit); err != nil {
		return reservation.Reservation{}, false, translate("refund read version", err)
	}
	stmts := []stmt{
		{`UPDATE reservations SET status = 'CANCELLED', reason = ?, cancel_note = ?, refunded = 1, released = 0, refund_version = ?, updated_at = ?
			WHERE reservation_id = ?`, []any{string(reason), nullString(note), version, utc(now), id}},
	}
	if limit > 0 {
		// Only a SKU with a limit keeps figures (turning one on rebuilds
		// them), and then the buyer of a confirmed row has one: the update
		// finds its record by primary key. An update of a row that is not
		// there would lock the gap before the next key, which another SKU's
		// persist may be inserting into (design.md, "Stock changes").
		stmts = append(stmts, stmt{`UPDATE user_units SET units = GREATEST(units - ?, 0) WHERE sku = ? AND user_id = ?`,
			[]any{row.Qty, row.SKU, row.UserID}})
	}
	if row.GroupID != "" {
		// A FORMED group stays FORMED (final): the member leaves, the group
		// does not reopen. An OPEN one gets its slot back.
		stmts = append(stmts,
			stmt{`DELETE FROM group_members WHERE group_id = ? AND reservation_id = ?`, []any{row.GroupID, id}},
			stmt{`UPDATE group_buys SET members = members - 1, updated_at = ? WHERE group_id = ? AND members > 0`,
				[]any{utc(now), row.GroupID}},
		)
	}
	for _, st := range stmts {
		if _, err := tx.ExecContext(ctx, st.q, st.args...); err != nil {
			return reservation.Reservation{}, false, translate("refund", err)
		}
	}
	row.Note = note
	if err := writeEvents(ctx, tx, []reservation.Event{reservation.CancelledEvent(row, reason, true, now)}); err != nil {
		return reservation.Reservation{}, false, err
	}
	if err := tx.Commit(); err != nil {
		return reservation.Reservation{}, false, translate("refund commit", err)
	}
	row.Status, row.Reason, row.Cancellation, row.Release = reservation.StatusCancelled, reason, reservation.Refunded, reservation.ReleaseOwed
	row.RefundVersion = version
	return row, true, nil
}

// noteOf is the note a cancellation keeps: the order service's, on its
// own cancel only.
func noteOf(reason reservation.Reason, note string) string {
	if reason != reservation.ReasonOrderCancelled {
		return ""
	}
	return note
}

// Pay implements reservation.Ledger: the row's lock decides between a
// payment and a cancel (Refund takes the same lock first), so exactly one
// of them happens.
func (s *Store) Pay(ctx context.Context, id string, now time.Time) (row reservation.Reservation, paid bool, err error) {
	err = retryDeadlocks(ctx, func() error {
		row, paid, err = s.pay(ctx, id, now)
		return err
	})
	return row, paid, err
}

func (s *Store) pay(ctx context.Context, id string, now time.Time) (reservation.Reservation, bool, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return reservation.Reservation{}, false, translate("pay begin", err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	row, err := scanReservation(tx.QueryRowContext(ctx, `SELECT `+reservationColumns+`
		FROM reservations WHERE reservation_id = ? FOR UPDATE`, id))
	if errors.Is(err, sql.ErrNoRows) || (err == nil && row.Transfer) {
		return reservation.Reservation{}, false, reservation.ErrNotFound
	}
	if err != nil {
		return reservation.Reservation{}, false, translate("pay read", err)
	}
	if row.Status != reservation.StatusConfirmed || !row.PaidAt.IsZero() {
		return row, false, nil
	}
	if row.GroupID != "" {
		// FORMED is final: a plain read cannot be overtaken by a FAILED.
		var status string
		err := tx.QueryRowContext(ctx, `SELECT status FROM group_buys WHERE group_id = ?`, row.GroupID).Scan(&status)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return reservation.Reservation{}, false, translate("pay read group", err)
		}
		if status != string(reservation.GroupFormed) {
			return row, false, fmt.Errorf("pay %s: group %s is %q: %w", id, row.GroupID, status, reservation.ErrGroupNotFormed)
		}
	}
	if _, err := tx.ExecContext(ctx, `UPDATE reservations SET paid_at = ?, updated_at = ? WHERE reservation_id = ?`, utc(now), utc(now), id); err != nil {
		return reservation.Reservation{}, false, translate("pay", err)
	}
	if err := writeEvents(ctx, tx, []reservation.Event{reservation.PaidEvent(row, now)}); err != nil {
		return reservation.Reservation{}, false, err
	}
	if err := tx.Commit(); err != nil {
		return reservation.Reservation{}, false, translate("pay commit", err)
	}
	row.PaidAt = utc(now)
	return row, true, nil
}

// PaymentsDue implements reservation.Ledger: a range of the payment-due
// index (status, paid_at, pay_by).
func (s *Store) PaymentsDue(ctx context.Context, t time.Time, limit int) ([]reservation.Reservation, error) {
	return s.reservations(ctx, "payments due", `SELECT `+reservationColumns+` FROM reservations
		WHERE status = 'CONFIRMED' AND paid_at IS NULL AND pay_by <= ? ORDER BY pay_by LIMIT ?`, utc(t), limit)
}

// Reservation implements reservation.Ledger.
func (s *Store) Reservation(ctx context.Context, id string) (reservation.Reservation, error) {
	return s.reservation(ctx, s.db, id)
}

func (s *Store) reservation(ctx context.Context, q querier, id string) (reservation.Reservation, error) {
	r, err := scanReservation(q.QueryRowContext(ctx, `SELECT `+reservationColumns+` FROM reservations WHERE reservation_id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return r, reservation.ErrNotFound
	}
	if err != nil {
		return r, translate("read reservation", err)
	}
	return r, nil
}

// MarkReleased implements reservation.Ledger.
func (s *Store) MarkReleased(ctx context.Context, id string) error {
	if _, err := s.db.ExecContext(ctx, `UPDATE reservations SET released = 1 WHERE reservation_id = ? AND released = 0`, id); err != nil {
		return translate("mark released", err)
	}
	return nil
}

// Outbox implements reservation.Ledger: an index range read.
func (s *Store) Outbox(ctx context.Context, t time.Time, limit int) ([]reservation.Reservation, error) {
	// released = 0: a cancellation, or a transfer whose credit is owed.
	return s.reservations(ctx, "release outbox", `SELECT `+reservationColumns+` FROM reservations
		WHERE released = 0 AND updated_at < ? LIMIT ?`, utc(t), limit)
}

// Unreleased implements reservation.Ledger.
func (s *Store) Unreleased(ctx context.Context, sku string) (int, error) {
	var n int
	if err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM reservations WHERE released = 0 AND sku = ?`, sku).Scan(&n); err != nil {
		return 0, translate("count unreleased", err)
	}
	return n, nil
}

// GroupMembers implements reservation.Ledger.
func (s *Store) GroupMembers(ctx context.Context, id string) ([]reservation.Reservation, error) {
	return s.reservations(ctx, "group members", `SELECT `+reservationColumns+` FROM reservations
		WHERE group_id = ? AND status = 'CONFIRMED'`, id)
}

// GroupLeaving implements reservation.Ledger.
func (s *Store) GroupLeaving(ctx context.Context, id string) ([]reservation.Reservation, error) {
	return s.reservations(ctx, "group leaving", `SELECT `+reservationColumns+` FROM reservations
		WHERE group_id = ? AND status = 'CANCELLED' AND released = 0`, id)
}

func (s *Store) reservations(ctx context.Context, op, q string, args ...any) ([]reservation.Reservation, error) {
	return queryAll(ctx, s.db, op, scanReservation, q, args...)
}

// queryAll runs q and scans every row with scan.
func queryAll[T any](ctx context.Context, q querier, op string, scan func(interface{ Scan(...any) error }) (T, error), query string, args ...any) ([]T, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, translate(op, err)
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, translate(op, err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, translate(op, err)
	}
	return out, nil
}
