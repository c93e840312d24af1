package reservation

import (
	"context"
	"sort"
)

// Tally mirrors mysqlstore's Tally (admin_delta, the buyers' rows grouped, the transfers not yet credited).
func (l *memLedger) Tally(_ context.Context, sku string) (Tally, error) {
	err := l.enter("Tally")
	defer l.mu.Unlock()
	if err != nil {
		return Tally{}, err
	}
	st, ok := l.stock[sku]
	if !ok {
		return Tally{SKU: sku}, ErrUnknownSKU
	}
	t := Tally{SKU: sku, PutIn: st.AdminDelta, Available: st.Available}
	groups := map[RowTally]*RowTally{}
	for _, row := range l.rows {
		r := row.r
		if r.SKU != sku {
			continue
		}
		if r.Transfer {
			if r.Status == StatusConfirmed && r.Release == ReleaseOwed {
				t.InTransfer += int64(r.Qty)
			}
			continue
		}
		k := RowTally{Status: r.Shown(), Reason: r.Reason, Refunded: r.Cancellation == Refunded}
		g, ok := groups[k]
		if !ok {
			g = &RowTally{Status: k.Status, Reason: k.Reason, Refunded: k.Refunded}
			groups[k] = g
		}
		g.Count++
		g.Units += int64(r.Qty)
	}
	for _, g := range groups {
		t.Rows = append(t.Rows, *g)
	}
	sort.Slice(t.Rows, func(i, j int) bool {
		a, b := t.Rows[i], t.Rows[j]
		if a.Status != b.Status {
			return a.Status < b.Status
		}
		if a.Reason != b.Reason {
			return a.Reason < b.Reason
		}
		return !a.Refunded && b.Refunded
	})
	return t, nil
}

// RecordAudit mirrors mysqlstore's RecordAudit (one stock_audits row per SKU).
func (l *memLedger) RecordAudit(_ context.Context, a AuditResult) error {
	err := l.enter("RecordAudit")
	defer l.mu.Unlock()
	if err != nil {
		return err
	}
	if l.audits == nil {
		l.audits = map[string]AuditResult{}
	}
	a.At = msUTC(a.At)
	l.audits[a.SKU] = a
	return nil
}

// LastAudit mirrors mysqlstore's LastAudit.
func (l *memLedger) LastAudit(_ context.Context, sku string) (AuditResult, error) {
	err := l.enter("LastAudit")
	defer l.mu.Unlock()
	if err != nil {
		return AuditResult{}, err
	}
	a, ok := l.audits[sku]
	if !ok {
		return AuditResult{SKU: sku}, ErrNotFound
	}
	return a, nil
}
