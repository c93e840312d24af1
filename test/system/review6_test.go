package system_test

// What the second adversarial review of "one SKU over K Redis buckets"
// reproduced (docs/design.md, "One SKU over K buckets"), each now held. A
// transfer is made to wait by a MySQL row lock taken by the test, as it
// waits behind persist's batch on the stock row in a sale.

import (
	"context"
	"database/sql"
	"net/http"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/reservation"
)

// bucketAvail reads bucket b's Redis stock figure.
func (s *stack) bucketAvail(sku string, b int) int64 {
	s.t.Helper()
	n, err := s.rdb.Get(context.Background(), "hf:{"+reservation.BucketName(sku, b)+"}:stock").Int64()
	if err != nil {
		s.t.Fatalf("stock of bucket %d: %v", b, err)
	}
	return n
}

// waitBucket waits until bucket b of sku has want units in Redis.
func (s *stack) waitBucket(sku string, b int, want int64) {
	s.t.Helper()
	testservices.Eventually(s.t, 5*time.Second, "bucket reaches its figure", func() bool { return s.bucketAvail(sku, b) == want })
}

// lockRow holds a MySQL row lock (query … FOR UPDATE) until the test ends or
// release is called.
func (s *stack) lockRow(query string, args ...any) (release func()) {
	s.t.Helper()
	tx, err := s.db.Begin()
	if err != nil {
		s.t.Fatal(err)
	}
	var v sql.NullInt64
	if err := tx.QueryRow(query, args...).Scan(&v); err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { _ = tx.Rollback() })
	return func() { _ = tx.Rollback() }
}

// Units on their way between buckets count: a cover (another instance)
// pays bucket 0's debt from bucket 1 and waits for MySQL; a buyer of dry
// bucket 2 is not told sold out while the SKU has 2 units free (503 at worst,
// or 202 once they arrive), and no sold-out flag is left behind for buyers
// of bucket 1.
func TestReview6CoverInTransitTellsBuyersSoldOut(t *testing.T) {
	s := newStack(t)
	const k = 3
	sku := testservices.Name("transit")
	s.createSKU(sku, 10, 3)
	// A buyer of bucket 1 draws 5 units there and holds one: bucket 0 has 5, bucket 1 has 4.
	if code, body := s.reserve(sku, userIn("first", 1, k), 1, ""); code != http.StatusAccepted {
		t.Fatalf("first reserve = %d %v", code, body)
	}
	if a0, a1 := s.bucketAvail(sku, 0), s.bucketAvail(sku, 1); a0 != 5 || a1 != 4 {
		t.Fatalf("buckets 0/1 = %d/%d, want 5/4", a0, a1)
	}
	release := s.lockRow(`SELECT available FROM stock_buckets WHERE sku = ? AND bucket = 1 FOR UPDATE`, sku)
	// Another instance: the admin removes 7 units (bucket 0: 5 − 7 = −2; 2 free); its cover runs.
	other := s.twin(s.clock, nil)
	done := make(chan error, 1)
	go func() {
		_, err := other.ChangeStock(context.Background(), reservation.StockChange{SKU: sku, Add: ptr(int64(-7))})
		done <- err
	}()
	s.waitBucket(sku, 1, 2) // the cover took 2 out of bucket 1; MySQL has not recorded it yet
	code, body := s.reserve(sku, userIn("dry", 2, k), 1, "")
	if code == http.StatusConflict {
		t.Errorf("a buyer told sold out (409 %v) while 2 units are on their way between buckets", body)
	}
	release()
	if err := <-done; err != nil {
		t.Fatalf("change stock: %v", err)
	}
	if code, body := s.reserve(sku, userIn("full", 1, k), 1, ""); code != http.StatusAccepted && code != http.StatusConflict {
		t.Fatalf("buyer of bucket 1 = %d %v", code, body)
	} else if left := s.bucketAvail(sku, 0) + s.bucketAvail(sku, 1) + s.bucketAvail(sku, 2); code == http.StatusConflict && left > 0 {
		t.Errorf("a buyer of bucket 1 told sold out while the buckets have %d units", left)
	}
}

func ptr[T any](v T) *T { return &v }

// No debt needed: a refill of another instance moves 2 of bucket 0's 3 units
// to bucket 1 for a buyer of 1 and waits for MySQL; a buyer of 2 units in
// bucket 2 is not told sold out meanwhile (the SKU has 2 free after the
// other buyer's).
func TestReview6RefillInTransitTellsBiggerBuyerSoldOut(t *testing.T) {
	s := newStack(t)
	const k = 3
	sku := testservices.Name("transit2")
	s.createSKU(sku, 3, 3)
	release := s.lockRow(`SELECT version FROM product_stock WHERE sku = ? FOR UPDATE`, sku)
	other := s.twin(s.clock, nil)
	done := make(chan error, 1)
	go func() {
		_, _, err := other.Reserve(context.Background(), reservation.ReserveRequest{SKU: sku, Qty: 1, UserID: userIn("a", 1, k)})
		done <- err
	}()
	s.waitBucket(sku, 0, 1)
	code, body := s.reserve(sku, userIn("b", 2, k), 2, "")
	release()
	if err := <-done; err != nil {
		t.Fatalf("other buyer: %v", err)
	}
	if code != http.StatusAccepted && code != http.StatusServiceUnavailable {
		t.Errorf("a buyer of 2 told %d %v while the SKU had 2 units free for them", code, body)
	}
}

// A buyer's one request that lands in a dry bucket is one attempt: the
// script's retry after the refill is not charged again (a SKU allowing one
// attempt a second, burst 1).
func TestReview6RefillRetryChargesTheBuyerTwice(t *testing.T) {
	s := newStack(t)
	const k = 3
	sku := testservices.Name("ratecharge")
	if code, body := s.call("PUT", "/admin/skus/"+sku+"/stock", `{"stock":10,"buckets":3,"rate_per_second":1,"burst":1}`, nil); code != 200 {
		t.Fatalf("set stock = %d %v", code, body)
	}
	if code, body := s.reserve(sku, userIn("once", 1, k), 1, ""); code != http.StatusAccepted {
		t.Errorf("a buyer's first request told %d %v while the SKU has 10 units", code, body)
	}
}

// A buyer who goes away while their refill's transfer waits for MySQL does
// not stop the transfer half-way, and does not pause transfers for the next
// buyer while MySQL is fine.
func TestReview6CancelledBuyerPausesTransfersForEveryone(t *testing.T) {
	s := newStack(t)
	const k = 3
	sku := testservices.Name("pause")
	s.createSKU(sku, 10, 3)
	svc := s.twin(reservation.SystemClock{}, nil)
	release := s.lockRow(`SELECT version FROM product_stock WHERE sku = ? FOR UPDATE`, sku)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, _, err := svc.Reserve(ctx, reservation.ReserveRequest{SKU: sku, Qty: 1, UserID: userIn("gone", 1, k)})
		done <- err
	}()
	s.waitBucket(sku, 0, 5) // the takeout ran; MySQL's record waits
	cancel()
	release()
	<-done
	if _, _, err := svc.Reserve(context.Background(), reservation.ReserveRequest{SKU: sku, Qty: 1, UserID: userIn("next", 2, k)}); err != nil {
		t.Errorf("the next buyer of a dry bucket: %v, while MySQL is up and bucket 0 has units", err)
	}
	// The first transfer ran to its end: its units are in bucket 1, none held.
	testservices.Eventually(t, 5*time.Second, "the first transfer is credited", func() bool { return s.bucketAvail(sku, 1) >= 4 })
}
