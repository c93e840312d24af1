package reservation

// The ledger audit: each sweep checks, per live SKU, that MySQL's books
// balance (every unit put in is available or taken) and records the result;
// the admin's report reads it back with the tally and both stores' figures.

import (
	"context"
	"errors"
	"sort"
	"time"
)

// Tally is one consistent read of a SKU's books in MySQL.
type Tally struct {
	SKU string
	// PutIn is the stock put in: the initial stock plus every admin change
	// (product_stock.admin_delta, which the creating change sets).
	PutIn     int64
	Available int64
	// Rows is the buyers' rows by status as shown (PAID apart from
	// CONFIRMED), cancellation reason and refund
	// (transfers between buckets are not here: they move units between
	// bucket shares, not out of the SKU).
	Rows []RowTally
	// InTransfer is the units of recorded transfers Redis has not credited
	// to their receiving bucket yet.
	InTransfer int64
}

// RowTally is how many rows of one kind a SKU has, and their units.
type RowTally struct {
	Status   Status
	Reason   Reason // "" for a row that is not cancelled
	Refunded bool   // CANCELLED after CONFIRMED: its units went back to available
	Count    int64
	Units    int64
}

// takesStock reports whether a row shown s holds its units out of
// available: CONFIRMED, or PAID.
func takesStock(s Status) bool { return s == StatusConfirmed || s == StatusPaid }

// Paid is the units of PAID rows (part of Taken: sold for good).
func (t Tally) Paid() int64 {
	var n int64
	for _, r := range t.Rows {
		if r.Status == StatusPaid {
			n += r.Units
		}
	}
	return n
}

// Taken is the units the buyers' rows hold out of available.
func (t Tally) Taken() int64 {
	var n int64
	for _, r := range t.Rows {
		if takesStock(r.Status) {
			n += r.Units
		}
	}
	return n
}

// Returned is the units of refunded rows (taken, then given back).
func (t Tally) Returned() int64 {
	var n int64
	for _, r := range t.Rows {
		if r.Refunded {
			n += r.Units
		}
	}
	return n
}

// Mismatch is PutIn − (Available + Taken): 0 when MySQL's books balance.
func (t Tally) Mismatch() int64 { return t.PutIn - (t.Available + t.Taken()) }

// AuditResult is one audit of a SKU: MySQL's books and the Redis drift the
// sweep measured with them.
type AuditResult struct {
	SKU       string
	At        time.Time
	PutIn     int64
	Available int64
	Taken     int64
	Mismatch  int64 // PutIn − (Available + Taken)
	// Drift is the sum over the SKU's buckets of |MySQL share − (Redis
	// available + held)| as the sweep measured it (0 where a bucket was
	// busy and not measured).
	Drift int64
}

// Clean reports whether the audit found nothing amiss.
func (a AuditResult) Clean() bool { return a.Mismatch == 0 && a.Drift == 0 }

// Books is the part of the Ledger the audit reads and records.
type Books interface {
	// Tally reads the SKU's books in one consistent read; ErrUnknownSKU.
	Tally(ctx context.Context, sku string) (Tally, error)
	// RecordAudit keeps a as the SKU's last audit.
	RecordAudit(ctx context.Context, a AuditResult) error
	// LastAudit returns the SKU's last audit, or ErrNotFound.
	LastAudit(ctx context.Context, sku string) (AuditResult, error)
}

// audit checks a live SKU's books after the sweep worked on it, records
// the result and counts a mismatch (ledger_mismatch, in units). drift is
// what the sweep measured of the SKU's buckets.
func (s *Service) audit(ctx context.Context, sku string, drift int64, rep *SweepReport) {
	t, err := s.ledger.Tally(ctx, sku)
	if err != nil {
		rep.Errors++
		s.log.ErrorContext(ctx, "sweep: audit: tally", "sku", sku, "error", err)
		return
	}
	a := AuditResult{SKU: sku, At: s.clock.Now(), PutIn: t.PutIn, Available: t.Available, Taken: t.Taken(),
		Mismatch: t.Mismatch(), Drift: drift}
	rep.Audited++
	if a.Mismatch != 0 {
		rep.addMismatch(sku, a.Mismatch)
		s.metrics.Count("ledger_mismatch", int(max(a.Mismatch, -a.Mismatch)))
		s.log.ErrorContext(ctx, "ledger mismatch: stock put in is not available + taken", "sku", sku,
			"mismatch", a.Mismatch, "put_in", a.PutIn, "available", a.Available, "taken", a.Taken)
	}
	if err := s.ledger.RecordAudit(ctx, a); err != nil {
		rep.Errors++
		s.log.ErrorContext(ctx, "sweep: audit: record", "sku", sku, "error", err)
	}
}

// addMismatch counts one SKU's ledger mismatch, naming the worst by size.
func (r *SweepReport) addMismatch(sku string, m int64) {
	size := max(m, -m)
	r.MismatchUnits += size
	r.Mismatched++
	i := len(r.WorstMismatch)
	for i > 0 && max(r.WorstMismatch[i-1].Drift, -r.WorstMismatch[i-1].Drift) < size {
		i--
	}
	if i >= worstDrifts {
		return
	}
	r.WorstMismatch = append(r.WorstMismatch, SKUDrift{})
	copy(r.WorstMismatch[i+1:], r.WorstMismatch[i:])
	r.WorstMismatch[i] = SKUDrift{SKU: sku, Drift: m}
	if len(r.WorstMismatch) > worstDrifts {
		r.WorstMismatch = r.WorstMismatch[:worstDrifts]
	}
}

// SKUAccount is the admin's report of one SKU: MySQL's books, both stores'
// figures, and the last audit.
type SKUAccount struct {
	Tally Tally
	Stock StockReport
	// LastAudit is the sweep's last audit of the SKU; Audited is false if
	// none was recorded yet.
	LastAudit AuditResult
	Audited   bool
}

// Account reads a SKU's report: its books, its stock in both stores (as
// InspectStock does) and its last audit.
func (s *Service) Account(ctx context.Context, sku string) (SKUAccount, error) {
	if !ValidID(sku) {
		return SKUAccount{}, ErrUnknownSKU
	}
	t, err := s.ledger.Tally(ctx, sku)
	if err != nil {
		return SKUAccount{}, err
	}
	st, err := s.InspectStock(ctx, sku)
	if err != nil {
		return SKUAccount{}, err
	}
	acc := SKUAccount{Tally: t, Stock: st}
	acc.LastAudit, err = s.ledger.LastAudit(ctx, sku)
	switch {
	case err == nil:
		acc.Audited = true
	case !errors.Is(err, ErrNotFound):
		return SKUAccount{}, err
	}
	return acc, nil
}

// ByStatus is the buyers' rows summed by status, in status order.
func (t Tally) ByStatus() []RowTally {
	return t.sum(func(r RowTally) RowTally { return RowTally{Status: r.Status} })
}

// ByReason is the cancelled rows summed by reason, in reason order.
func (t Tally) ByReason() []RowTally {
	var cancelled Tally
	for _, r := range t.Rows {
		if r.Status == StatusCancelled {
			cancelled.Rows = append(cancelled.Rows, r)
		}
	}
	return cancelled.sum(func(r RowTally) RowTally { return RowTally{Status: r.Status, Reason: r.Reason} })
}

// sum adds up the rows of each key.
func (t Tally) sum(key func(RowTally) RowTally) []RowTally {
	var out []RowTally
	at := map[RowTally]int{}
	for _, r := range t.Rows {
		k := key(r)
		i, ok := at[k]
		if !ok {
			i = len(out)
			at[k] = i
			out = append(out, k)
		}
		out[i].Count += r.Count
		out[i].Units += r.Units
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Status != out[j].Status {
			return out[i].Status < out[j].Status
		}
		return out[i].Reason < out[j].Reason
	})
	return out
}
