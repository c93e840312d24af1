package reservation

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// racedHolds is the fake Redis with one race: the first TakeOut finds its
// donor drained (another refill, or the donor's own buyers, got there first)
// although it still has units.
type racedHolds struct {
	*memHolds
	raced bool
}

func (h *racedHolds) TakeOut(ctx context.Context, t Reservation, ttl time.Duration) (Reservation, error) {
	if !h.raced {
		h.raced = true
		return Reservation{}, ErrSoldOut
	}
	return h.memHolds.TakeOut(ctx, t, ttl)
}

// userIn returns a user whose home bucket of k is b.
func userIn(b, k int) string {
	for i := 0; ; i++ {
		if u := fmt.Sprintf("user-%d", i); HomeBucket(u, "", k) == b {
			return u
		}
	}
}

func TestRefillReadsADrainedDonorAgain(t *testing.T) {
	f := newFixture(t)
	h := &racedHolds{memHolds: f.holds}
	f.svc.holds = h
	if _, err := f.svc.ChangeStock(bg, StockChange{SKU: "hot", Set: ptr(int64(10)), Buckets: ptr(3)}); err != nil {
		t.Fatal(err)
	}
	r, _, err := f.svc.Reserve(bg, ReserveRequest{SKU: "hot", Qty: 1, UserID: userIn(1, 3)})
	if err != nil {
		t.Fatalf("a buyer of an empty bucket while bucket 0 has 10 units: %v", err)
	}
	if !h.raced || r.Bucket != 1 {
		t.Fatalf("raced %v, held in bucket %d: want the race, and the hold in bucket 1", h.raced, r.Bucket)
	}
	if n, _ := f.svc.Available(bg, "hot"); n != 9 {
		t.Errorf("available %d after one reserve of 10, want 9", n)
	}
}

func TestSoldOutOnlyWhenEveryBucketIsEmpty(t *testing.T) {
	f := newFixture(t)
	if _, err := f.svc.ChangeStock(bg, StockChange{SKU: "hot", Set: ptr(int64(5)), Buckets: ptr(3)}); err != nil {
		t.Fatal(err)
	}
	// Every unit starts in bucket 0; buyers of buckets 1 and 2 take them all.
	buyers := []string{userIn(1, 3), userIn(2, 3)}
	for i := range 5 {
		if _, _, err := f.svc.Reserve(bg, ReserveRequest{SKU: "hot", Qty: 1, UserID: buyers[i%2]}); err != nil {
			t.Fatalf("unit %d of 5: %v", i+1, err)
		}
	}
	for _, b := range []int{0, 1, 2} {
		_, _, err := f.svc.Reserve(bg, ReserveRequest{SKU: "hot", Qty: 1, UserID: userIn(b, 3)})
		if !errors.Is(err, ErrSoldOut) {
			t.Fatalf("every bucket empty, a buyer of bucket %d: %v, want sold out", b, err)
		}
	}
	if n := f.metrics.get("transfers"); n == 0 {
		t.Error("no transfer counted")
	}
}

// A bucket owes units (an admin removed units that sat in other buckets, and
// more than came back since): a unit returned to another bucket pays the debt
// first, even when it cannot pay all of it, so no bucket sells a unit the
// SKU does not have.
func TestAReturnedUnitPaysWhatABucketOwesFirst(t *testing.T) {
	f := newFixture(t)
	if _, err := f.svc.ChangeStock(bg, StockChange{SKU: "hot", Set: ptr(int64(2)), Buckets: ptr(3)}); err != nil {
		t.Fatal(err)
	}
	a, _, err := f.svc.Reserve(bg, ReserveRequest{SKU: "hot", Qty: 1, UserID: userIn(1, 3)})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.svc.Reserve(bg, ReserveRequest{SKU: "hot", Qty: 1, UserID: userIn(2, 3)}); err != nil {
		t.Fatal(err)
	}
	// Both units are held; the admin takes both away in MySQL: Redis's
	// bucket 0 owes 2, and the SKU offers −2.
	if _, err := f.svc.ChangeStock(bg, StockChange{SKU: "hot", Add: ptr(int64(-2))}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.svc.Cancel(bg, a.ID, a.UserID); err != nil { // one unit back, into bucket 1
		t.Fatal(err)
	}
	if n, _ := f.svc.Available(bg, "hot"); n != -1 {
		t.Fatalf("available %d, want -1 (2 owed, 1 back)", n)
	}
	_, _, err = f.svc.Reserve(bg, ReserveRequest{SKU: "hot", Qty: 1, UserID: userIn(1, 3)})
	if !errors.Is(err, ErrSoldOut) {
		t.Fatalf("a buyer of bucket 1 after the unit came back: %v, want sold out (the SKU has none)", err)
	}
}
