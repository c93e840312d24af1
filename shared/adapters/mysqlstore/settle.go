package mysqlstore

// Cancellations and their release outbox: the fence, the refund, the released flag, the rows read back.

import (
	"context"
	"database/sql"
	"errors"
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
		(reservation_id, sku, qty, user_id, group_id, bucket, into_bucket, hold_token, status, reason, released, expires_at, created_at, updated_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'CANCELLED', ?, 0, ?, ?, ?)
		ON DUPLICATE KEY UPDATE reservation_id = reservation_id`,
		r.ID, r.SKU, r.Qty, r.UserID, nullString(r.GroupID), r.Bucket, intoBucket(r), nullString(r.Token), string(reason),
		nullTime(r.ExpiresAt), utc(created), utc(now))
	if err != nil {
		return r, false, translate("fence", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return r, false, translate("fence", err)
	}
	if n == 1 && !r.Transfer {
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
func (s *Store) Refund(ctx context.Context, id string, reason reservation.Reason, now time.Time) (row reservation.Reservation, refunded bool, err error) {
	err = retryDeadlocks(ctx, func() error {
		row, refunded, err = s.refund(ctx, id, reason, now)
		return err
	})
	return row, refunded, err
}

func (s *Store) refund(ctx context.Context, id string, reason reservation.Reason, now time.Time) (reservation.Reservation, bool, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return reservation.Reservation{}, false, translate("refund begin", err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit

	row, err := scanReservation(tx.QueryRowContext(ctx, `SELECT `+reservationColumns+`
		FROM reservations WHERE reservation_id = ? FOR UPDATE`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return reservation.Reservation{}, false, reservation.ErrNotFound
	}
	if err != nil {
		return reservation.Reservation{}, false, translate("refund read", err)
	}
	if row.Status != reservation.StatusConfirmed {
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
		{`UPDATE reservations SET status = 'CANCELLED', reason = ?, refunded = 1, released = 0, refund_version = ?, updated_at = ?
			WHERE reservation_id = ?`, []any{string(reason), version, utc(now), id}},
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
