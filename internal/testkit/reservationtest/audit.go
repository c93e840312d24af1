package reservationtest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/holdfast/holdfast/shared/reservation"
)

// Audit is the contract of reservation.Books (the ledger audit's tally and
// record), part of Ledger's.
func Audit(t *testing.T, newLedger LedgerFactory) {
	t.Run("the books balance through sales, refunds, cancellations, transfers and admin changes", func(t *testing.T) {
		ctx := context.Background()
		s := newLedger(t)
		if _, err := s.Tally(ctx, "s"); !errors.Is(err, reservation.ErrUnknownSKU) {
			t.Fatalf("Tally of a missing sku = %v, want ErrUnknownSKU", err)
		}
		if _, err := s.ChangeStock(ctx, reservation.StockChange{SKU: "s", Set: ptr(int64(10)), Buckets: ptr(2)}); err != nil {
			t.Fatal(err)
		}
		for id, qty := range map[string]int{"a": 2, "b": 3, "c": 1} {
			if out, err := apply(ctx, s, res(id, "s", qty)); err != nil || out != reservation.Applied {
				t.Fatalf("apply %s = %v %v", id, out, err)
			}
		}
		if _, ok, err := s.Refund(ctx, "b", reservation.ReasonBuyer, "", now); err != nil || !ok {
			t.Fatalf("refund = %v %v", ok, err)
		}
		if _, _, err := s.Fence(ctx, res("d", "s", 4), reservation.ReasonExpired, now); err != nil {
			t.Fatal(err)
		}
		move := reservation.Reservation{ID: "t", SKU: "s", Qty: 2, Bucket: 0, Into: 1, Transfer: true, Token: "t-t",
			Status: reservation.StatusHeld, CreatedAt: now, ExpiresAt: now.Add(time.Minute)}
		if _, _, err := s.Transfer(ctx, move, now); err != nil {
			t.Fatal(err)
		}
		if _, err := s.ChangeStock(ctx, reservation.StockChange{SKU: "s", Add: ptr(int64(-1))}); err != nil {
			t.Fatal(err)
		}
		tally, err := s.Tally(ctx, "s")
		if err != nil {
			t.Fatal(err)
		}
		// Put in 10 − 1; sold a (2) and c (1); b (3) refunded; d never took stock.
		if tally.PutIn != 9 || tally.Available != 6 || tally.Taken() != 3 || tally.Returned() != 3 || tally.Mismatch() != 0 || tally.InTransfer != 2 {
			t.Errorf("tally = %+v (taken %d, returned %d, mismatch %d), want put in 9, available 6, taken 3, returned 3, mismatch 0, 2 in transfer",
				tally, tally.Taken(), tally.Returned(), tally.Mismatch())
		}
		want := map[reservation.RowTally]bool{
			{Status: reservation.StatusConfirmed, Count: 2, Units: 3}:                                                     true,
			{Status: reservation.StatusCancelled, Reason: reservation.ReasonBuyer, Refunded: true, Count: 1, Units: 3}:    true,
			{Status: reservation.StatusCancelled, Reason: reservation.ReasonExpired, Refunded: false, Count: 1, Units: 4}: true,
		}
		for _, r := range tally.Rows {
			if !want[r] {
				t.Errorf("row tally %+v not expected", r)
			}
			delete(want, r)
		}
		for r := range want {
			t.Errorf("row tally %+v missing (a transfer is not a buyer's row)", r)
		}
	})

	t.Run("the last audit is kept per sku and read back", func(t *testing.T) {
		ctx := context.Background()
		s := newLedger(t)
		if _, err := s.LastAudit(ctx, "s"); !errors.Is(err, reservation.ErrNotFound) {
			t.Fatalf("LastAudit before any = %v, want ErrNotFound", err)
		}
		first := reservation.AuditResult{SKU: "s", At: now, PutIn: 10, Available: 9, Taken: 0, Mismatch: 1, Drift: 2}
		second := reservation.AuditResult{SKU: "s", At: now.Add(time.Minute + time.Millisecond), PutIn: 10, Available: 10}
		other := reservation.AuditResult{SKU: "S", At: now, PutIn: 1, Available: 1}
		for _, a := range []reservation.AuditResult{first, other, second} {
			if err := s.RecordAudit(ctx, a); err != nil {
				t.Fatal(err)
			}
		}
		for _, want := range []reservation.AuditResult{second, other} {
			got, err := s.LastAudit(ctx, want.SKU)
			if err != nil || !got.At.Equal(want.At) || got.At.Location() != time.UTC {
				t.Errorf("LastAudit(%s) = %+v %v, want %+v", want.SKU, got, err, want)
			}
			got.At = want.At
			if got != want {
				t.Errorf("LastAudit(%s) = %+v, want %+v", want.SKU, got, want)
			}
		}
	})
}
