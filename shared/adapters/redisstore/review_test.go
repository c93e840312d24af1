package redisstore_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/adapters/redisstore"
	"github.com/holdfast/holdfast/shared/reservation"
)

// Review (the unpaid hash): a warm-up rebuilds the unpaid hash from every
// CONFIRMED unpaid row of the SKU in the one warm.lua call, a key and two
// arguments per row, so the script that blocks the SKU's shard grows with
// the sale. A 50,000-unit sale losing Redis inside its pay window (every
// unit confirmed and not yet paid) warms in one script run of that size,
// while every other SKU on the shard waits. The figure is logged; the bound
// asserted is a reserve's own budget of a few milliseconds (docs/design.md,
// the reserve script's cost), which one blocking script should not exceed.
func TestReviewWarmWithManyUnpaidRowsIsOneLongScript(t *testing.T) {
	env := testservices.Require(t)
	c := env.Redis(t)
	ctx := context.Background()
	s := redisstore.New(c, time.Hour)
	sku := testservices.Name("revwarm")
	const n = 50000
	payBy := time.Now().Add(time.Hour)
	rows := make([]reservation.Reservation, n)
	for i := range rows {
		rows[i] = reservation.Reservation{ID: fmt.Sprintf("%s.r%08d", sku, i), SKU: sku, Qty: 1, UserID: fmt.Sprintf("u%d", i),
			Token: "t", Status: reservation.StatusConfirmed, PayBy: payBy}
	}
	if err := c.ConfigSet(ctx, "slowlog-log-slower-than", "0").Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.ConfigSet(context.Background(), "slowlog-log-slower-than", "10000") })
	c.SlowLogReset(ctx)
	start := time.Now()
	res, err := s.Warm(ctx, reservation.StockLevel{SKU: sku, Available: 0, Version: 1, AdmitPermille: 1000}, nil, rows)
	wall := time.Since(start)
	if err != nil || res != reservation.SyncWarmed {
		t.Fatalf("warm = %v %v", res, err)
	}
	var script time.Duration
	logs, _ := c.SlowLogGet(ctx, 128).Result()
	for _, l := range logs {
		if len(l.Args) > 0 && strings.HasPrefix(strings.ToLower(l.Args[0]), "eval") && l.Duration > script {
			script = l.Duration
		}
	}
	got, _ := strconv.Atoi(c.HGet(ctx, "hf:{"+sku+"}:meta", "unpaid").Val())
	t.Logf("warm of %d unpaid rows: one script of %v on the server (slowlog), %v wall; meta.unpaid = %d", n, script, wall, got)
	if script > 5*time.Millisecond {
		t.Errorf("one warm.lua run blocked the shard %v for %d unpaid rows (> 5ms)", script, n)
	}
}

// Review (the unpaid hash, a stray in another bucket): Service.followStray
// follows MySQL's CONFIRMED row in the bucket of a twin hold (K changed
// between the two holds) with stray.Bucket = that bucket. follow.lua then
// adds the row to that bucket's unpaid hash (the hold there is HELD or
// missing, the row unpaid). The payment, a cancel and the sweep's
// settleUnpaid all follow the row in its own bucket, so the entry in the
// twin's bucket is never taken out (the hash has no TTL): once the SKU is
// down to one bucket with a waiting room, its bucket 0 counts a unit that
// can never return, and the room never says SOLD_OUT.
func TestReviewStrayInAnotherBucketLeavesAnUnpaidUnitForever(t *testing.T) {
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
	stray.Bucket, stray.Release = 0, reservation.ReleaseDone
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
