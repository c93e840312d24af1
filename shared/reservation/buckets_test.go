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

// A keyed replay is answered by Redis alone when it finds a final hold its
// bucket took itself (K unchanged: no MySQL read), and by MySQL when it
// finds a tombstone of the row in a bucket that held no hold of it: after K
// was raised, the buyer's new home keeps a CONFIRMED copy of the row that
// the refund (followed in the row's own bucket) does not reach. MySQL
// unreachable: 503, not the stale copy. (The system test is
// TestBucketKeyedRetries.)
func TestKeyedReplayOfATombstoneAsksMySQL(t *testing.T) {
	f := newFixture(t)
	f.stock(t, "hot", 10)
	user := userIn(2, 3)
	req := ReserveRequest{SKU: "hot", Qty: 1, UserID: user, IdempotencyKey: "k"}
	replay := func(step string) (Reservation, int, error) {
		t.Helper()
		before := f.ledger.calls["Reservation"]
		got, replayed, err := f.svc.Reserve(bg, req)
		if err == nil && !replayed {
			t.Fatalf("%s: Reserve = %+v, not a replay", step, got)
		}
		return got, f.ledger.calls["Reservation"] - before, err
	}
	r, _, err := f.svc.Reserve(bg, req)
	if err != nil {
		t.Fatal(err)
	}
	f.persist(t, r)
	if got, reads, err := replay("K = 1"); err != nil || got.Status != StatusConfirmed || reads != 0 {
		t.Errorf("replay at K = 1 = %v %v with %d MySQL reads, want CONFIRMED from Redis alone", got.Status, err, reads)
	}
	l, err := f.ledger.Stock(bg, "hot")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.svc.ChangeStock(bg, StockChange{SKU: "hot", Add: ptr(int64(0)), Buckets: ptr(3), IfVersion: ptr(l.Version)}); err != nil {
		t.Fatal(err)
	}
	if got, _, err := replay("K raised"); err != nil || got.Status != StatusConfirmed {
		t.Fatalf("replay after K raised = %v %v, want CONFIRMED", got.Status, err)
	}
	if h, err := f.holds.Hold(bg, r.ID, 2); err != nil || h.Status != StatusConfirmed {
		t.Fatalf("bucket 2's copy of the row = %+v %v, want a CONFIRMED tombstone", h, err)
	}
	if _, err := f.svc.Cancel(bg, r.ID, user); err != nil {
		t.Fatal(err)
	}
	if got, reads, err := replay("refunded"); err != nil || got.Status != StatusCancelled || reads != 1 {
		t.Errorf("replay after the refund = %v %v with %d MySQL reads, want CANCELLED from MySQL's row (1 read)", got.Status, err, reads)
	}
	f.ledger.fail["Reservation"] = errInjected
	if got, _, err := replay("MySQL down"); !errors.Is(err, ErrUnavailable) {
		t.Errorf("replay with MySQL unreachable = %v %v, want ErrUnavailable (not the stale copy)", got.Status, err)
	}
	delete(f.ledger.fail, "Reservation")
	if f.mysql("hot") != 10 || f.redis("hot")+f.redis("hot#1")+f.redis("hot#2") != 10 {
		t.Errorf("mysql %d, redis %d+%d+%d; want 10 in both (the stray taken and returned once)",
			f.mysql("hot"), f.redis("hot"), f.redis("hot#1"), f.redis("hot#2"))
	}
}
