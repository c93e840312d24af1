package mysqlstore

// The ledger audit's reads and record (reservation.Books).

import (
	"context"
	"database/sql"
	"errors"

	"github.com/holdfast/holdfast/shared/reservation"
)

// Tally implements reservation.Ledger: the stock row, the buyers' rows by
// status (PAID apart from CONFIRMED), reason and refund, and the transfers not yet credited, in one
// read-only transaction (one snapshot: a persist's rows and its stock
// update are seen together or not at all).
func (s *Store) Tally(ctx context.Context, sku string) (reservation.Tally, error) {
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return reservation.Tally{}, translate("tally begin", err)
	}
	defer tx.Rollback() //nolint:errcheck // read-only
	t := reservation.Tally{SKU: sku}
	err = tx.QueryRowContext(ctx, `SELECT admin_delta, available FROM product_stock WHERE sku = ?`, sku).Scan(&t.PutIn, &t.Available)
	if errors.Is(err, sql.ErrNoRows) {
		return t, reservation.ErrUnknownSKU
	}
	if err != nil {
		return t, translate("tally stock", err)
	}
	t.Rows, err = queryAll(ctx, tx, "tally rows", func(row interface{ Scan(...any) error }) (reservation.RowTally, error) {
		var r reservation.RowTally
		err := row.Scan(&r.Status, &r.Reason, &r.Refunded, &r.Count, &r.Units)
		return r, err
	}, `SELECT IF(status = 'CONFIRMED' AND paid_at IS NOT NULL, 'PAID', status) AS shown, COALESCE(reason, ''), refunded, COUNT(*), SUM(qty)
		FROM reservations WHERE sku = ? AND into_bucket IS NULL GROUP BY shown, reason, refunded ORDER BY shown, reason, refunded`, sku)
	if err != nil {
		return t, err
	}
	err = tx.QueryRowContext(ctx, `SELECT COALESCE(SUM(qty), 0) FROM reservations
		WHERE sku = ? AND status = 'CONFIRMED' AND into_bucket IS NOT NULL AND released = 0`, sku).Scan(&t.InTransfer)
	if err != nil {
		return t, translate("tally transfers", err)
	}
	return t, nil
}

// RecordAudit implements reservation.Ledger: the SKU's row of stock_audits.
func (s *Store) RecordAudit(ctx context.Context, a reservation.AuditResult) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO stock_audits (sku, audited_at, put_in, available, taken, mismatch, drift)
		VALUES (?, ?, ?, ?, ?, ?, ?) ON DUPLICATE KEY UPDATE audited_at = VALUES(audited_at), put_in = VALUES(put_in),
		available = VALUES(available), taken = VALUES(taken), mismatch = VALUES(mismatch), drift = VALUES(drift)`,
		a.SKU, utc(a.At), a.PutIn, a.Available, a.Taken, a.Mismatch, a.Drift)
	if err != nil {
		return translate("record audit", err)
	}
	return nil
}

// LastAudit implements reservation.Ledger.
func (s *Store) LastAudit(ctx context.Context, sku string) (reservation.AuditResult, error) {
	a := reservation.AuditResult{SKU: sku}
	err := s.db.QueryRowContext(ctx, `SELECT audited_at, put_in, available, taken, mismatch, drift FROM stock_audits WHERE sku = ?`, sku).
		Scan(&a.At, &a.PutIn, &a.Available, &a.Taken, &a.Mismatch, &a.Drift)
	if errors.Is(err, sql.ErrNoRows) {
		return a, reservation.ErrNotFound
	}
	if err != nil {
		return a, translate("last audit", err)
	}
	a.At = utc(a.At)
	return a, nil
}
