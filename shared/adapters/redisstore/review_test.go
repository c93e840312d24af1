package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/adapters/redisstore"
	"github.com/holdfast/holdfast/shared/reservation"
)

// Review (the unpaid hash, a stray in another bucket): Service.followStray
// follows MySQL's CONFIRMED row in the bucket of a twin hold (K changed
// between the two holds). The payment, a cancel and the sweep's
// settleUnpaid all follow the row in its own bucket, so an entry in the
// twin's unpaid hash would never be taken out: followStray passes the row
// without its pay_by, and the twin's bucket counts nothing unpaid.
func TestReviewStrayInAnotherBucketCountsNoUnpaidUnit(t *testing.T) {
	env := testservices.Require(t)
	c := env.Redis(t)
	ctx := context.Background()
	s := redisstore.New(c, time.Hour)
	sku := testservices.Name("revstray")
	for b := range 2 {
		if _, err := s.Warm(ctx, reservation.StockLevel{SKU: reservation.BucketName(sku, b), Available: 5, Version: 1}, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	row := reservation.Reservation{ID: sku + ".x", SKU: sku, Bucket: 1, Qty: 1, UserID: "u", Token: "t",
		Status: reservation.StatusConfirmed, PayBy: time.Now().Add(time.Hour)}
	if _, err := s.Follow(ctx, row, 2); err != nil { // its own bucket follows the confirmation
		t.Fatal(err)
	}
	stray := row // what followStray passes for the twin held in bucket 0
	stray.Bucket, stray.Release, stray.PayBy = 0, reservation.ReleaseDone, time.Time{}
	if _, err := s.Follow(ctx, stray, 0); err != nil {
		t.Fatal(err)
	}
	paid := row
	paid.PaidAt = time.Now()
	for range 2 { // Service.Pay, then the sweep's settleUnpaid: both follow the row in bucket 1
		if _, err := s.Follow(ctx, paid, 0); err != nil {
			t.Fatal(err)
		}
	}
	for b := range 2 {
		tag := "hf:{" + reservation.BucketName(sku, b) + "}"
		if n := c.HGet(ctx, tag+":meta", "unpaid").Val(); n != "" && n != "0" {
			t.Errorf("bucket %d: meta.unpaid = %s after the row was paid (unpaid hash %v), want 0", b, n, c.HGetAll(ctx, tag+":unpaid").Val())
		}
	}
}
