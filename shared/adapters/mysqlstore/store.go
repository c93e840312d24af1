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
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/holdfast/holdfast/shared/reservation"
)

var _ reservation.Ledger = (*Store)(nil)

// Store is the ledger on a *sql.DB.
type Store struct {
	db *sql.DB
	// payWithin is each SKU's pay window as the last ApplyBatch here read
	// it (seconds, an int): a batch inserts its rows already due by it, and
	// sets them again only when its own read under the lock differs.
	payWithin sync.Map
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

const reservationColumns = `reservation_id, sku, qty, user_id, group_id, hold_token, status, reason, refunded, released, refund_version, expires_at, created_at, bucket, into_bucket,
	pay_by, paid_at, cancel_note`

func scanReservation(row interface{ Scan(...any) error }) (reservation.Reservation, error) {
	var r reservation.Reservation
	var group, token, reason, note sql.NullString
	var expires, payBy, paidAt sql.NullTime
	var refundVersion, into sql.NullInt64
	var status string
	var refunded, released bool
	if err := row.Scan(&r.ID, &r.SKU, &r.Qty, &r.UserID, &group, &token, &status, &reason, &refunded, &released, &refundVersion, &expires, &r.CreatedAt,
		&r.Bucket, &into, &payBy, &paidAt, &note); err != nil {
		return r, err
	}
	r.Transfer, r.Into = into.Valid, int(into.Int64)
	if r.Transfer { // one column, two versions: a row is a refund or a transfer
		r.TransferVersion = refundVersion.Int64
	} else {
		r.RefundVersion = refundVersion.Int64
	}
	r.GroupID, r.Token, r.Reason, r.Status = group.String, token.String, reservation.Reason(reason.String), reservation.Status(status)
	r.Cancellation, r.Release = subStates(r.Status, r.Transfer, refunded, released)
	if expires.Valid {
		r.ExpiresAt = expires.Time
	}
	if payBy.Valid {
		r.PayBy = utc(payBy.Time)
	}
	if paidAt.Valid {
		r.PaidAt = utc(paidAt.Time)
	}
	r.Note = note.String
	return r, nil
}

// subStates maps a row's refunded and released columns (MySQL's flags,
// unchanged since the first migrations) to the row's sub-states: the one
// place that reads them. The statements that write them move them as the
// states move (Fence, Refund, Transfer, MarkReleased). The notified column
// was the cancellations' event outbox until migration 0010 moved it to the
// events table; it is no longer read.
//
//	column    0                               1 (the column's default)
//	refunded  Fenced on a CANCELLED row       Refunded
//	released  ReleaseOwed                     ReleaseDone on a CANCELLED row or a transfer's, else ReleaseNone
func subStates(status reservation.Status, transfer, refunded, released bool) (reservation.Cancellation, reservation.ReleaseState) {
	cancelled := status == reservation.StatusCancelled
	c := reservation.NotCancelled
	switch {
	case cancelled && refunded:
		c = reservation.Refunded
	case cancelled:
		c = reservation.Fenced
	}
	rel := reservation.ReleaseNone
	switch {
	case !released:
		rel = reservation.ReleaseOwed
	case cancelled || transfer:
		rel = reservation.ReleaseDone
	}
	return c, rel
}
