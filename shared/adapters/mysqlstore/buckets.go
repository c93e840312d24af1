package mysqlstore

// Buckets: each bucket's share of a SKU's available units, and the transfers that move units between them.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/holdfast/holdfast/shared/reservation"
)

// moveShares adds delta[b] to bucket b's share of sku for each bucket b ≥ 1
// (bucket 0's share is the rest of available, so it moves with available),
// in one statement, buckets in order (one lock order for every writer). Lock
// order: after product_stock, before user_units and the group tables.
func moveShares(ctx context.Context, tx *sql.Tx, sku string, delta map[int]int64) error {
	var buckets []int
	for b, d := range delta {
		if b > 0 && d != 0 {
			buckets = append(buckets, b)
		}
	}
	if len(buckets) == 0 {
		return nil
	}
	sort.Ints(buckets)
	args := make([]any, 0, 3*len(buckets))
	for _, b := range buckets {
		args = append(args, sku, b, delta[b])
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO stock_buckets (sku, bucket, available) VALUES `+
		strings.TrimSuffix(strings.Repeat(`(?, ?, ?),`, len(buckets)), ",")+
		` ON DUPLICATE KEY UPDATE available = available + VALUES(available)`, args...)
	if err != nil {
		return translate("move bucket shares", err)
	}
	return nil
}

// inBuckets reports whether r's bucket is one of the SKU's k: a message of
// another (forged, or of a K that was never the SKU's) takes nothing.
func inBuckets(r reservation.Reservation, k int) bool {
	return r.Bucket >= 0 && r.Bucket < max(k, 1)
}

// intoBucket is a row's into_bucket: the receiving bucket of a transfer.
func intoBucket(r reservation.Reservation) sql.NullInt64 {
	return sql.NullInt64{Int64: int64(r.Into), Valid: r.Transfer}
}

// Transfer implements reservation.Ledger. Lock order as Apply's:
// reservations, product_stock, stock_buckets.
func (s *Store) Transfer(ctx context.Context, t reservation.Reservation, now time.Time) (row reservation.Reservation, recorded bool, err error) {
	err = retryDeadlocks(ctx, func() error {
		row, recorded, err = s.transfer(ctx, t, now)
		return err
	})
	return row, recorded, err
}

func (s *Store) transfer(ctx context.Context, t reservation.Reservation, now time.Time) (reservation.Reservation, bool, error) {
	if !t.Transfer || t.Bucket == t.Into || t.Qty < 1 || t.Bucket < 0 || t.Into < 0 {
		return reservation.Reservation{}, false, fmt.Errorf("transfer %s: %w", t.ID, reservation.ErrNotATransfer)
	}
	if t.CreatedAt.IsZero() {
		// Recorded from its receiving bucket's credit (the giving bucket
		// lost the hold): the mark keeps no creation time, and MySQL
		// refuses a zero date.
		t.CreatedAt = now
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return reservation.Reservation{}, false, translate("transfer begin", err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit

	_, err = tx.ExecContext(ctx, `INSERT INTO reservations
		(reservation_id, sku, qty, user_id, bucket, into_bucket, hold_token, status, released, notified, expires_at, created_at, updated_at)
		VALUES (?, ?, ?, '', ?, ?, ?, 'CONFIRMED', 0, 1, ?, ?, ?)`,
		t.ID, t.SKU, t.Qty, t.Bucket, t.Into, nullString(t.Token), nullTime(t.ExpiresAt), utc(t.CreatedAt), utc(now))
	if isDuplicate(err) {
		_ = tx.Rollback()
		row, err := s.Reservation(ctx, t.ID) // recorded before (a redelivery, or the sweeper's completion)
		return row, false, err
	}
	if err != nil {
		return reservation.Reservation{}, false, translate("transfer insert", err)
	}
	var version int64
	var k int
	err = tx.QueryRowContext(ctx, `SELECT version + 1, buckets FROM product_stock WHERE sku = ? FOR UPDATE`, t.SKU).Scan(&version, &k)
	if errors.Is(err, sql.ErrNoRows) {
		return reservation.Reservation{}, false, reservation.ErrUnknownSKU
	}
	if err != nil {
		return reservation.Reservation{}, false, translate("transfer read version", err)
	}
	if !inBuckets(t, k) || t.Into >= max(k, 1) {
		return reservation.Reservation{}, false, fmt.Errorf("transfer %s between buckets %d and %d of %d: %w", t.ID, t.Bucket, t.Into, k, reservation.ErrNotATransfer)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE product_stock SET version = ? WHERE sku = ?`, version, t.SKU); err != nil {
		return reservation.Reservation{}, false, translate("transfer version", err)
	}
	if err := moveShares(ctx, tx, t.SKU, map[int]int64{t.Bucket: -int64(t.Qty), t.Into: int64(t.Qty)}); err != nil {
		return reservation.Reservation{}, false, err
	}
	if _, err := tx.ExecContext(ctx, `UPDATE reservations SET refund_version = ? WHERE reservation_id = ?`, version, t.ID); err != nil {
		return reservation.Reservation{}, false, translate("transfer version", err)
	}
	if err := tx.Commit(); err != nil {
		return reservation.Reservation{}, false, translate("transfer commit", err)
	}
	row := t
	row.UserID, row.GroupID, row.Status, row.Release, row.TransferVersion = "", "", reservation.StatusConfirmed, reservation.ReleaseOwed, version
	return row, true, nil
}

// withShares fills in the bucket shares of the levels of SKUs with more
// than one bucket, read through q (a transaction's snapshot, or the pool).
func withShares(ctx context.Context, q querier, levels []reservation.StockLevel) error {
	at := map[string]int{}
	var skus []string
	for i, l := range levels {
		if l.Buckets > 1 {
			at[l.SKU] = i
			skus = append(skus, l.SKU)
			levels[i].BucketAvailable = make([]int64, l.Buckets-1)
		}
	}
	type share struct {
		sku       string
		bucket    int
		available int64
	}
	return inChunks(len(skus), func(lo, hi int) error {
		shares, err := queryAll(ctx, q, "read bucket shares", func(row interface{ Scan(...any) error }) (share, error) {
			var sh share
			err := row.Scan(&sh.sku, &sh.bucket, &sh.available)
			return sh, err
		}, `SELECT sku, bucket, available FROM stock_buckets WHERE sku IN (?`+strings.Repeat(",?", hi-lo-1)+`)`, anys(skus[lo:hi])...)
		for _, sh := range shares {
			l := &levels[at[sh.sku]]
			if sh.bucket >= 1 && sh.bucket < l.Buckets {
				l.BucketAvailable[sh.bucket-1] = sh.available
			}
		}
		return err
	})
}

// errFewerBuckets: K can be raised, never lowered (a bucket dropped would
// strand its units and its holds).
var errFewerBuckets = errors.New("buckets can be raised, not lowered")
