// Package mysqlstore is the MySQL adapter of the reservation protocol, the
// arbiter: the reservations table decides each reservation's fate, and stock
// is taken with a version-checked (optimistic) update. It runs on MySQL 8 and
// MariaDB 10.11 alike, and translates driver errors into the reservation
// package's errors.
package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/holdfast/holdfast/shared/reservation"
)

var _ reservation.Ledger = (*Store)(nil)

// Store is the ledger on a *sql.DB.
type Store struct {
	db *sql.DB
}

// New returns a Store on db.
func New(db *sql.DB) *Store { return &Store{db: db} }

// querier is what both *sql.DB and *sql.Tx offer.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

const (
	errDuplicate   = 1062
	errLockTimeout = 1205
	errDeadlock    = 1213
)

func isDuplicate(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == errDuplicate
}

// translate maps a driver error to the protocol's meaning: deadlocks and
// lock timeouts are optimistic conflicts (retry in a fresh transaction);
// anything else is the database being unavailable.
func translate(op string, err error) error {
	var me *mysql.MySQLError
	if errors.As(err, &me) && (me.Number == errDeadlock || me.Number == errLockTimeout) {
		return fmt.Errorf("%s: %w: %w", op, reservation.ErrVersionConflict, err)
	}
	return reservation.Unavailable(op, err)
}

type stmt struct {
	q    string
	args []any
}

// retryDeadlocks runs fn again, a bounded number of times with a short
// jittered pause, when InnoDB picked it as a deadlock victim (concurrent
// inserts of one key — a fence racing a persist and another fence — do
// that). Each run is a fresh statement or transaction, so a retry is safe.
func retryDeadlocks(ctx context.Context, fn func() error) error {
	var err error
	for attempt := range 6 {
		if err = fn(); !errors.Is(err, reservation.ErrVersionConflict) {
			return err
		}
		t := time.NewTimer(reservation.Backoff(attempt + 1))
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
	return err
}

func nullString(s string) sql.NullString { return sql.NullString{String: s, Valid: s != ""} }

func utc(t time.Time) time.Time { return t.UTC().Truncate(time.Millisecond) }

func nullTime(t time.Time) sql.NullTime { return sql.NullTime{Time: utc(t), Valid: !t.IsZero()} }

const reservationColumns = `reservation_id, sku, qty, user_id, group_id, hold_token, status, reason, refunded, released, refund_version, notified, expires_at, created_at`

func scanReservation(row interface{ Scan(...any) error }) (reservation.Reservation, error) {
	var r reservation.Reservation
	var group, token, reason sql.NullString
	var expires sql.NullTime
	var refundVersion sql.NullInt64
	var status string
	if err := row.Scan(&r.ID, &r.SKU, &r.Qty, &r.UserID, &group, &token, &status, &reason, &r.Refunded, &r.Released, &refundVersion, &r.Notified, &expires, &r.CreatedAt); err != nil {
		return r, err
	}
	r.RefundVersion = refundVersion.Int64
	r.GroupID, r.Token, r.Reason, r.Status = group.String, token.String, reservation.Reason(reason.String), reservation.Status(status)
	if expires.Valid {
		r.ExpiresAt = expires.Time
	}
	return r, nil
}

// Apply implements reservation.Ledger.
func (s *Store) Apply(ctx context.Context, r reservation.Reservation, lock reservation.Locking, now time.Time) (reservation.BatchResult, error) {
	out := reservation.BatchResult{Row: r}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return out, translate("apply begin", err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit

	_, err = tx.ExecContext(ctx, `INSERT INTO reservations
		(reservation_id, sku, qty, user_id, group_id, hold_token, status, expires_at, created_at, updated_at)
		VALUES (?, ?, ?, ?, ?, ?, 'CONFIRMED', ?, ?, ?)`,
		r.ID, r.SKU, r.Qty, r.UserID, nullString(r.GroupID), nullString(r.Token), nullTime(r.ExpiresAt), utc(r.CreatedAt), utc(now))
	if isDuplicate(err) {
		_ = tx.Rollback()
		row, err := s.Reservation(ctx, r.ID)
		if err != nil {
			return out, err
		}
		if row.Status == reservation.StatusConfirmed {
			return reservation.BatchResult{Result: reservation.AlreadyConfirmed, Row: row}, nil
		}
		return reservation.BatchResult{Result: reservation.AlreadyCancelled, Row: row}, nil
	}
	if err != nil {
		return out, translate("apply insert", err)
	}

	read := `SELECT available, version, per_user_limit FROM product_stock WHERE sku = ?`
	if lock == reservation.Pessimistic {
		read += ` FOR UPDATE`
	}
	var available, version int64
	var limit int
	err = tx.QueryRowContext(ctx, read, r.SKU).Scan(&available, &version, &limit)
	if errors.Is(err, sql.ErrNoRows) {
		out.Result = reservation.NoSuchSKU
		return out, nil
	}
	if err != nil {
		return out, translate("apply read stock", err)
	}
	if available < int64(r.Qty) {
		out.Result = reservation.Insufficient
		return out, nil
	}
	res, err := tx.ExecContext(ctx, `UPDATE product_stock SET available = available - ?, version = version + 1
		WHERE sku = ? AND version = ? AND available >= ?`, r.Qty, r.SKU, version, r.Qty)
	if err != nil {
		return out, translate("apply update stock", err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return out, translate("apply update stock", err)
	} else if n == 0 {
		return out, fmt.Errorf("apply %s: %w", r.ID, reservation.ErrVersionConflict)
	}
	if limit > 0 {
		have, err := userUnits(ctx, tx, r.SKU, []any{r.UserID})
		if err != nil {
			return out, err
		}
		if have[r.UserID]+int64(r.Qty) > int64(limit) {
			out.Result = reservation.OverLimit
			return out, nil
		}
		if err := addUserUnits(ctx, tx, r.SKU, map[string]int64{r.UserID: int64(r.Qty)}); err != nil {
			return out, err
		}
	}

	if r.GroupID != "" {
		result, err := joinGroup(ctx, tx, r, now)
		if err != nil || result != reservation.Applied {
			out.Result = result
			return out, err
		}
	}
	if err := tx.Commit(); err != nil {
		return out, translate("apply commit", err)
	}
	out.Result, out.Version = reservation.Applied, version+1
	return out, nil
}

// userUnits reads the confirmed units of users of a SKU with a per-user
// limit, locking their rows (lock order: after product_stock).
func userUnits(ctx context.Context, tx *sql.Tx, sku string, users []any) (map[string]int64, error) {
	type uu struct {
		user  string
		units int64
	}
	rows, err := queryAll(ctx, tx, "read user units", func(row interface{ Scan(...any) error }) (uu, error) {
		var u uu
		err := row.Scan(&u.user, &u.units)
		return u, err
	}, `SELECT user_id, units FROM user_units WHERE sku = ? AND user_id IN (?`+strings.Repeat(",?", len(users)-1)+`) FOR UPDATE`,
		append([]any{sku}, users...)...)
	if err != nil {
		return nil, err
	}
	have := make(map[string]int64, len(rows))
	for _, u := range rows {
		have[u.user] = u.units
	}
	return have, nil
}

// addUserUnits adds confirmed units to users of a SKU in one statement.
func addUserUnits(ctx context.Context, tx *sql.Tx, sku string, add map[string]int64) error {
	if len(add) == 0 {
		return nil
	}
	args := make([]any, 0, 3*len(add))
	for user, n := range add {
		args = append(args, sku, user, n)
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO user_units (sku, user_id, units) VALUES `+
		strings.TrimSuffix(strings.Repeat(`(?, ?, ?),`, len(add)), ",")+
		` ON DUPLICATE KEY UPDATE units = units + VALUES(units)`, args...)
	if err != nil {
		return translate("add user units", err)
	}
	return nil
}

// ApplyBatch implements reservation.Ledger: the hot-SKU path of persist.
// One transaction: the rows of ids not yet present are inserted in one
// statement, then the stock row is read FOR UPDATE (after the inserts, so the
// lock order stays reservations → product_stock, as everywhere), the
// reservations that fit are kept — the rows of those that do not are deleted
// again — and their summed quantity is taken with one version-checked update.
// Reading under the lock means concurrent batches queue on the hot row instead
// of wasting optimistic attempts; the version check still guards the update.
func (s *Store) ApplyBatch(ctx context.Context, sku string, rs []reservation.Reservation, now time.Time) ([]reservation.BatchResult, error) {
	out := make([]reservation.BatchResult, len(rs))
	if len(rs) == 0 {
		return out, nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, translate("batch begin", err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit

	ids := make([]any, len(rs))
	for i, r := range rs {
		ids[i] = r.ID
	}
	existing, err := queryAll(ctx, tx, "batch read rows", scanReservation,
		`SELECT `+reservationColumns+` FROM reservations WHERE reservation_id IN (?`+strings.Repeat(",?", len(ids)-1)+`)`, ids...)
	if err != nil {
		return nil, err
	}
	have := map[string]reservation.Reservation{}
	for _, row := range existing {
		have[row.ID] = row
	}
	var fresh []int // indexes of reservations to insert, each id once
	seen := map[string]bool{}
	for i, r := range rs {
		switch row, ok := have[r.ID]; {
		case ok && row.Status == reservation.StatusConfirmed:
			out[i] = reservation.BatchResult{Result: reservation.AlreadyConfirmed, Row: row}
		case ok:
			out[i] = reservation.BatchResult{Result: reservation.AlreadyCancelled, Row: row}
		case seen[r.ID]: // the same message twice in one batch: decided with its twin below
			out[i] = reservation.BatchResult{Result: reservation.AlreadyConfirmed, Row: r}
		default:
			seen[r.ID] = true
			fresh = append(fresh, i)
		}
	}
	if len(fresh) == 0 {
		return out, nil
	}
	args := make([]any, 0, len(fresh)*8)
	for _, i := range fresh {
		r := rs[i]
		args = append(args, r.ID, r.SKU, r.Qty, r.UserID, nullString(r.Token), nullTime(r.ExpiresAt), utc(r.CreatedAt), utc(now))
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO reservations
		(reservation_id, sku, qty, user_id, hold_token, status, expires_at, created_at, updated_at) VALUES `+
		strings.TrimSuffix(strings.Repeat(`(?, ?, ?, ?, ?, 'CONFIRMED', ?, ?, ?),`, len(fresh)), ","), args...)
	if isDuplicate(err) {
		// A fence (or another persist) wrote one of these rows since the read.
		return nil, fmt.Errorf("batch %s: %w", sku, reservation.ErrVersionConflict)
	}
	if err != nil {
		return nil, translate("batch insert", err)
	}
	var available, version int64
	var limit int
	err = tx.QueryRowContext(ctx, `SELECT available, version, per_user_limit FROM product_stock WHERE sku = ? FOR UPDATE`, sku).Scan(&available, &version, &limit)
	if errors.Is(err, sql.ErrNoRows) {
		for i := range out {
			out[i].Result = reservation.NoSuchSKU
		}
		return out, nil // rolled back
	}
	if err != nil {
		return nil, translate("batch read stock", err)
	}
	var units map[string]int64 // confirmed units per user, when the SKU has a limit
	if limit > 0 {
		users := make([]any, 0, len(fresh))
		listed := map[string]bool{}
		for _, i := range fresh {
			if u := rs[i].UserID; !listed[u] {
				listed[u] = true
				users = append(users, u)
			}
		}
		if units, err = userUnits(ctx, tx, sku, users); err != nil {
			return nil, err
		}
	}
	var sum int64
	var refused []any
	added := map[string]int64{}
	for _, i := range fresh {
		r := rs[i]
		switch {
		case sum+int64(r.Qty) > available:
			out[i] = reservation.BatchResult{Result: reservation.Insufficient, Row: r}
		case limit > 0 && units[r.UserID]+added[r.UserID]+int64(r.Qty) > int64(limit):
			out[i] = reservation.BatchResult{Result: reservation.OverLimit, Row: r}
		default:
			sum += int64(r.Qty)
			if limit > 0 {
				added[r.UserID] += int64(r.Qty)
			}
			out[i] = reservation.BatchResult{Result: reservation.Applied, Row: r, Version: version + 1}
			continue
		}
		refused = append(refused, r.ID)
	}
	for i, r := range rs { // a twin follows its first copy
		if out[i].Result == reservation.AlreadyConfirmed && !have[r.ID].Status.Final() {
			for _, j := range fresh {
				if rs[j].ID == r.ID {
					out[i] = out[j]
				}
			}
		}
	}
	if len(refused) > 0 {
		if _, err := tx.ExecContext(ctx, `DELETE FROM reservations WHERE reservation_id IN (?`+strings.Repeat(",?", len(refused)-1)+`)`, refused...); err != nil {
			return nil, translate("batch drop refused", err)
		}
	}
	if sum > 0 {
		res, err := tx.ExecContext(ctx, `UPDATE product_stock SET available = available - ?, version = version + 1
			WHERE sku = ? AND version = ? AND available >= ?`, sum, sku, version, sum)
		if err != nil {
			return nil, translate("batch update stock", err)
		}
		if n, err := res.RowsAffected(); err != nil {
			return nil, translate("batch update stock", err)
		} else if n == 0 {
			return nil, fmt.Errorf("batch %s: %w", sku, reservation.ErrVersionConflict)
		}
	}
	if err := addUserUnits(ctx, tx, sku, added); err != nil {
		return nil, err
	}
	if err := tx.Commit(); err != nil {
		return nil, translate("batch commit", err)
	}
	return out, nil
}

// joinGroup takes a slot of r's group inside the persist transaction. A
// FORMED group still admits the members whose slots Redis gave before the
// deadline and whose messages arrive late (members < capacity bounds them).
// The status assignment comes first so that it reads members before the increment.
func joinGroup(ctx context.Context, tx *sql.Tx, r reservation.Reservation, now time.Time) (reservation.ApplyResult, error) {
	_, err := tx.ExecContext(ctx, `INSERT INTO group_members (group_id, user_id, reservation_id) VALUES (?, ?, ?)`,
		r.GroupID, r.UserID, r.ID)
	if isDuplicate(err) {
		return reservation.GroupDuplicate, nil
	}
	if err != nil {
		return 0, translate("apply join group", err)
	}
	res, err := tx.ExecContext(ctx, `UPDATE group_buys
		SET status = IF(members + 1 >= capacity, 'FORMED', status), members = members + 1, updated_at = ?
		WHERE group_id = ? AND sku = ? AND status IN ('OPEN', 'FORMED') AND members < capacity`, utc(now), r.GroupID, r.SKU)
	if err != nil {
		return 0, translate("apply take slot", err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return 0, translate("apply take slot", err)
	} else if n == 1 {
		return reservation.Applied, nil
	}
	var status string
	err = tx.QueryRowContext(ctx, `SELECT status FROM group_buys WHERE group_id = ? AND sku = ?`, r.GroupID, r.SKU).Scan(&status)
	if errors.Is(err, sql.ErrNoRows) || (err == nil && status == string(reservation.GroupFailed)) {
		return reservation.GroupNotOpen, nil
	}
	if err != nil {
		return 0, translate("apply read group", err)
	}
	return reservation.GroupNoSlot, nil
}

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
	res, err := s.db.ExecContext(ctx, `INSERT INTO reservations
		(reservation_id, sku, qty, user_id, group_id, hold_token, status, reason, released, notified, expires_at, created_at, updated_at)
		VALUES (?, ?, ?, ?, ?, ?, 'CANCELLED', ?, 0, 0, ?, ?, ?)
		ON DUPLICATE KEY UPDATE reservation_id = reservation_id`,
		r.ID, r.SKU, r.Qty, r.UserID, nullString(r.GroupID), nullString(r.Token), string(reason), nullTime(r.ExpiresAt), utc(r.CreatedAt), utc(now))
	if err != nil {
		return r, false, translate("fence", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return r, false, translate("fence", err)
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
	var version int64
	if err := tx.QueryRowContext(ctx, `SELECT version FROM product_stock WHERE sku = ?`, row.SKU).Scan(&version); err != nil {
		return reservation.Reservation{}, false, translate("refund read version", err)
	}
	stmts := []stmt{
		{`UPDATE reservations SET status = 'CANCELLED', reason = ?, refunded = 1, released = 0, refund_version = ?, notified = 0, updated_at = ?
			WHERE reservation_id = ?`, []any{string(reason), version, utc(now), id}},
		{`UPDATE user_units SET units = GREATEST(units - ?, 0) WHERE sku = ? AND user_id = ?`, []any{row.Qty, row.SKU, row.UserID}},
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
	if err := tx.Commit(); err != nil {
		return reservation.Reservation{}, false, translate("refund commit", err)
	}
	row.Status, row.Reason, row.Refunded, row.Released, row.Notified = reservation.StatusCancelled, reason, true, false, false
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

// MarkNotified implements reservation.Ledger.
func (s *Store) MarkNotified(ctx context.Context, id string) error {
	if _, err := s.db.ExecContext(ctx, `UPDATE reservations SET notified = 1 WHERE reservation_id = ? AND notified = 0`, id); err != nil {
		return translate("mark notified", err)
	}
	return nil
}

// MarkReleased implements reservation.Ledger.
func (s *Store) MarkReleased(ctx context.Context, id string) error {
	if _, err := s.db.ExecContext(ctx, `UPDATE reservations SET released = 1 WHERE reservation_id = ? AND released = 0`, id); err != nil {
		return translate("mark released", err)
	}
	return nil
}

// Outbox implements reservation.Ledger: two index range reads, merged.
func (s *Store) Outbox(ctx context.Context, t time.Time, limit int) ([]reservation.Reservation, error) {
	unreleased, err := s.reservations(ctx, "release outbox", `SELECT `+reservationColumns+` FROM reservations
		WHERE released = 0 AND updated_at < ? AND status = 'CANCELLED' LIMIT ?`, utc(t), limit)
	if err != nil {
		return nil, err
	}
	unnotified, err := s.reservations(ctx, "event outbox", `SELECT `+reservationColumns+` FROM reservations
		WHERE notified = 0 AND updated_at < ? AND status = 'CANCELLED' LIMIT ?`, utc(t), limit)
	if err != nil {
		return nil, err
	}
	seen := make(map[string]bool, len(unreleased))
	for _, r := range unreleased {
		seen[r.ID] = true
	}
	for _, r := range unnotified {
		if !seen[r.ID] {
			unreleased = append(unreleased, r)
		}
	}
	return unreleased, nil
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

// ChangeStock implements reservation.Ledger. The row is read FOR UPDATE,
// so the precondition, the new figure and admin_delta are one decision.
// Turning a per-user limit on rebuilds user_units from the confirmed rows
// under the same lock (no persist can commit in between: each takes it).
func (s *Store) ChangeStock(ctx context.Context, c reservation.StockChange) (level reservation.StockLevel, err error) {
	// Two first changes of one new SKU both take the gap lock of the missing
	// row and deadlock on the insert: InnoDB rolls one back; run it again.
	err = retryDeadlocks(ctx, func() error {
		level, err = s.changeStock(ctx, c)
		return err
	})
	return level, err
}

// maxStock bounds a SKU's available units (an INT column).
const maxStock = 1_000_000_000

func (s *Store) changeStock(ctx context.Context, c reservation.StockChange) (reservation.StockLevel, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return reservation.StockLevel{}, translate("change stock begin", err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit

	level := reservation.StockLevel{SKU: c.SKU}
	err = tx.QueryRowContext(ctx, `SELECT available, version, per_user_limit, admin_delta, user_rate, user_burst FROM product_stock WHERE sku = ? FOR UPDATE`, c.SKU).
		Scan(&level.Available, &level.Version, &level.PerUserLimit, &level.AdminDelta, &level.UserRate, &level.UserBurst)
	exists := err == nil
	if c.Key != "" && (exists || errors.Is(err, sql.ErrNoRows)) {
		// A retried change (the same key) is answered before its
		// precondition: the first one moved the version it was based on.
		_, err := tx.ExecContext(ctx, `INSERT INTO stock_change_keys (sku, change_key, set_to, add_by, limit_to, rate_to, burst_to, if_version)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
			c.SKU, c.Key, nullInt(c.Set), nullInt(c.Add), nullInt(c.Limit), nullInt(c.Rate), nullInt(c.Burst), ifVersion(c))
		if isDuplicate(err) {
			return s.replayChange(ctx, tx, c)
		}
		if err != nil {
			return reservation.StockLevel{}, translate("change stock key", err)
		}
	}
	switch {
	case errors.Is(err, sql.ErrNoRows):
		if c.Set == nil {
			return reservation.StockLevel{}, reservation.ErrUnknownSKU
		}
		if c.IfVersion != nil && *c.IfVersion != 0 || c.IfExists {
			return reservation.StockLevel{}, fmt.Errorf("change stock %s: no such sku: %w", c.SKU, reservation.ErrPreconditionFailed)
		}
	case err != nil:
		return reservation.StockLevel{}, translate("change stock read", err)
	case c.Set != nil && c.IfVersion == nil && !c.IfExists:
		return reservation.StockLevel{}, reservation.ErrPreconditionRequired
	case c.IfVersion != nil && *c.IfVersion != level.Version:
		return reservation.StockLevel{}, fmt.Errorf("change stock %s: version is %d, not %d: %w", c.SKU, level.Version, *c.IfVersion, reservation.ErrPreconditionFailed)
	}
	var delta int64
	switch {
	case c.Set != nil:
		delta = *c.Set - level.Available
	case c.Add != nil:
		delta = *c.Add
	}
	if level.Available+delta < 0 {
		return reservation.StockLevel{}, fmt.Errorf("change stock %s: %d available, cannot remove %d: %w", c.SKU, level.Available, -delta, reservation.ErrInsufficient)
	}
	if level.Available+delta > maxStock {
		return reservation.StockLevel{}, &reservation.InvalidError{Field: "add",
			Msg: fmt.Sprintf("%d available: adding %d passes the most a sku can hold (%d)", level.Available, delta, maxStock)}
	}
	oldLimit := level.PerUserLimit
	if c.Limit != nil {
		level.PerUserLimit = *c.Limit
	}
	if c.Rate != nil {
		level.UserRate = *c.Rate
	}
	if c.Burst != nil {
		level.UserBurst = *c.Burst
	}
	level.Available += delta
	level.AdminDelta += delta
	level.Version++
	if exists {
		_, err = tx.ExecContext(ctx, `UPDATE product_stock SET available = ?, version = ?, per_user_limit = ?, admin_delta = ?,
			user_rate = ?, user_burst = ? WHERE sku = ?`,
			level.Available, level.Version, level.PerUserLimit, level.AdminDelta, level.UserRate, level.UserBurst, c.SKU)
	} else {
		_, err = tx.ExecContext(ctx, `INSERT INTO product_stock (sku, available, version, per_user_limit, admin_delta, user_rate, user_burst)
			VALUES (?, ?, ?, ?, ?, ?, ?)`,
			c.SKU, level.Available, level.Version, level.PerUserLimit, level.AdminDelta, level.UserRate, level.UserBurst)
		if isDuplicate(err) {
			return reservation.StockLevel{}, fmt.Errorf("change stock %s: created concurrently: %w", c.SKU, reservation.ErrPreconditionFailed)
		}
	}
	if err != nil {
		return reservation.StockLevel{}, translate("change stock write", err)
	}
	if exists && oldLimit == 0 && level.PerUserLimit > 0 {
		for _, st := range []stmt{
			{`DELETE FROM user_units WHERE sku = ?`, []any{c.SKU}},
			{`INSERT INTO user_units (sku, user_id, units) SELECT sku, user_id, SUM(qty) FROM reservations
				WHERE sku = ? AND status = 'CONFIRMED' GROUP BY sku, user_id`, []any{c.SKU}},
		} {
			if _, err := tx.ExecContext(ctx, st.q, st.args...); err != nil {
				return reservation.StockLevel{}, translate("rebuild user units", err)
			}
		}
	}
	if err := tx.Commit(); err != nil {
		return reservation.StockLevel{}, translate("change stock commit", err)
	}
	return level, nil
}

// replayChange answers a change whose key was used before: the same change
// is the level as it stands (applied once already); another change under
// the key is refused.
func (s *Store) replayChange(ctx context.Context, tx *sql.Tx, c reservation.StockChange) (reservation.StockLevel, error) {
	var set, add, limit, rate, burst, version sql.NullInt64
	err := tx.QueryRowContext(ctx, `SELECT set_to, add_by, limit_to, rate_to, burst_to, if_version FROM stock_change_keys WHERE sku = ? AND change_key = ?`, c.SKU, c.Key).
		Scan(&set, &add, &limit, &rate, &burst, &version)
	if err != nil {
		return reservation.StockLevel{}, translate("change stock replay", err)
	}
	_ = tx.Rollback()
	if set != nullInt(c.Set) || add != nullInt(c.Add) || limit != nullInt(c.Limit) ||
		rate != nullInt(c.Rate) || burst != nullInt(c.Burst) || version != ifVersion(c) {
		return reservation.StockLevel{}, fmt.Errorf("change stock %s: key %q: %w", c.SKU, c.Key, reservation.ErrIdempotencyMismatch)
	}
	return s.Stock(ctx, c.SKU)
}

// ifVersion is the precondition a keyed change was based on: its version,
// -1 for If-Match: *, none.
func ifVersion(c reservation.StockChange) sql.NullInt64 {
	if c.IfExists {
		return sql.NullInt64{Int64: -1, Valid: true}
	}
	return nullInt(c.IfVersion)
}

func nullInt[T int | int64](p *T) sql.NullInt64 {
	if p == nil {
		return sql.NullInt64{}
	}
	return sql.NullInt64{Int64: int64(*p), Valid: true}
}

// Stock implements reservation.Ledger.
func (s *Store) Stock(ctx context.Context, sku string) (reservation.StockLevel, error) {
	level := reservation.StockLevel{SKU: sku}
	err := s.db.QueryRowContext(ctx, `SELECT available, version, per_user_limit, admin_delta, user_rate, user_burst FROM product_stock WHERE sku = ?`, sku).
		Scan(&level.Available, &level.Version, &level.PerUserLimit, &level.AdminDelta, &level.UserRate, &level.UserBurst)
	if errors.Is(err, sql.ErrNoRows) {
		return level, reservation.ErrUnknownSKU
	}
	if err != nil {
		return level, translate("read stock", err)
	}
	return level, nil
}

// Snapshot implements reservation.Ledger: one consistent read.
func (s *Store) Snapshot(ctx context.Context, sku string, held []string) (reservation.StockLevel, []reservation.Reservation, error) {
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return reservation.StockLevel{}, nil, translate("snapshot begin", err)
	}
	defer tx.Rollback() //nolint:errcheck // read-only
	level := reservation.StockLevel{SKU: sku}
	err = tx.QueryRowContext(ctx, `SELECT available, version, per_user_limit, admin_delta, user_rate, user_burst FROM product_stock WHERE sku = ?`, sku).
		Scan(&level.Available, &level.Version, &level.PerUserLimit, &level.AdminDelta, &level.UserRate, &level.UserBurst)
	if errors.Is(err, sql.ErrNoRows) {
		return level, nil, reservation.ErrUnknownSKU
	}
	if err != nil {
		return level, nil, translate("snapshot stock", err)
	}
	var confirmed []reservation.Reservation
	for len(held) > 0 {
		chunk := held[:min(len(held), 500)]
		held = held[len(chunk):]
		args := make([]any, len(chunk))
		for i, id := range chunk {
			args[i] = id
		}
		rows, err := queryAll(ctx, tx, "snapshot confirmed", scanReservation, `SELECT `+reservationColumns+` FROM reservations
			WHERE reservation_id IN (?`+strings.Repeat(",?", len(chunk)-1)+`) AND status = 'CONFIRMED'`, args...)
		if err != nil {
			return level, nil, err
		}
		confirmed = append(confirmed, rows...)
	}
	return level, confirmed, nil
}

// Stocks implements reservation.Ledger.
func (s *Store) Stocks(ctx context.Context) ([]reservation.StockLevel, error) {
	return queryAll(ctx, s.db, "list stock", func(row interface{ Scan(...any) error }) (reservation.StockLevel, error) {
		var l reservation.StockLevel
		err := row.Scan(&l.SKU, &l.Available, &l.Version, &l.PerUserLimit, &l.AdminDelta, &l.UserRate, &l.UserBurst)
		return l, err
	}, `SELECT sku, available, version, per_user_limit, admin_delta, user_rate, user_burst FROM product_stock ORDER BY sku`)
}

// CreateGroup implements reservation.Ledger.
func (s *Store) CreateGroup(ctx context.Context, g reservation.Group) error {
	res, err := s.db.ExecContext(ctx, `INSERT INTO group_buys (group_id, sku, capacity, members, status, deadline, created_at, updated_at)
		SELECT ?, sku, ?, 0, 'OPEN', ?, ?, ? FROM product_stock WHERE sku = ?`,
		g.ID, g.Capacity, utc(g.Deadline), utc(g.CreatedAt), utc(g.CreatedAt), g.SKU)
	if err != nil {
		return translate("create group", err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return translate("create group", err)
	} else if n == 0 {
		return reservation.ErrUnknownSKU
	}
	return nil
}

const groupColumns = `group_id, sku, capacity, members, status, deadline, formed_at, created_at`

func scanGroup(row interface{ Scan(...any) error }) (reservation.Group, error) {
	var g reservation.Group
	var status string
	var formed sql.NullTime
	err := row.Scan(&g.ID, &g.SKU, &g.Capacity, &g.Members, &status, &g.Deadline, &formed, &g.CreatedAt)
	g.Status, g.FormedAt = reservation.GroupStatus(status), formed.Time
	return g, err
}

// Group implements reservation.Ledger.
func (s *Store) Group(ctx context.Context, id string) (reservation.Group, error) {
	g, err := scanGroup(s.db.QueryRowContext(ctx, `SELECT `+groupColumns+` FROM group_buys WHERE group_id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return g, reservation.ErrUnknownGroup
	}
	if err != nil {
		return g, translate("read group", err)
	}
	return g, nil
}

// DueGroups implements reservation.Ledger.
func (s *Store) DueGroups(ctx context.Context, t time.Time, limit int) ([]reservation.Group, error) {
	return queryAll(ctx, s.db, "due groups", scanGroup, `SELECT `+groupColumns+` FROM group_buys
		WHERE (status = 'OPEN' AND deadline <= ?) OR (status = 'FAILED' AND settled_at IS NULL)
		ORDER BY deadline LIMIT ?`, utc(t), limit)
}

// FormGroup implements reservation.Ledger.
func (s *Store) FormGroup(ctx context.Context, id string, formedAt time.Time) (bool, error) {
	if _, err := s.db.ExecContext(ctx, `UPDATE group_buys g SET status = 'FORMED', formed_at = ?, updated_at = ?
		WHERE group_id = ? AND status = 'OPEN' AND NOT EXISTS (SELECT 1 FROM reservations r
			WHERE r.group_id = g.group_id AND r.status = 'CANCELLED' AND r.released = 0)`,
		utc(formedAt), utc(formedAt), id); err != nil {
		return false, translate("form group", err)
	}
	var status string
	if err := s.db.QueryRowContext(ctx, `SELECT status FROM group_buys WHERE group_id = ?`, id).Scan(&status); err != nil {
		return false, translate("form group read", err)
	}
	return status == string(reservation.GroupFormed), nil
}

// FailGroup implements reservation.Ledger.
func (s *Store) FailGroup(ctx context.Context, id string, now time.Time) (reservation.Group, error) {
	if _, err := s.db.ExecContext(ctx, `UPDATE group_buys SET status = 'FAILED', updated_at = ?
		WHERE group_id = ? AND status = 'OPEN' AND deadline <= ?`, utc(now), id, utc(now)); err != nil {
		return reservation.Group{}, translate("fail group", err)
	}
	return s.Group(ctx, id)
}

// GroupSettled implements reservation.Ledger.
func (s *Store) GroupSettled(ctx context.Context, id string) error {
	if _, err := s.db.ExecContext(ctx, `UPDATE group_buys SET settled_at = CURRENT_TIMESTAMP(3)
		WHERE group_id = ? AND status = 'FAILED' AND settled_at IS NULL`, id); err != nil {
		return translate("settle group", err)
	}
	return nil
}
