package system_test

// One SKU over K = 3 Redis buckets on the three shards of a real Redis
// Cluster (docs/design.md, "One SKU over K buckets"): the sale sells exactly
// its stock, the last units reach buyers of any bucket, and a transfer
// between buckets that crashes half-way loses nothing.

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/services"
	"github.com/holdfast/holdfast/internal/testkit/invariant"
	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/adapters/mysqlstore"
	"github.com/holdfast/holdfast/shared/adapters/redisstore"
	"github.com/holdfast/holdfast/shared/reservation"
	"github.com/redis/go-redis/v9"
)

// spreadSKU returns a SKU named after prefix whose k buckets sit on k
// different masters of the cluster (the tests' precondition: each bucket on
// its own shard).
func spreadSKU(t *testing.T, c *redis.ClusterClient, prefix string, k int) string {
	t.Helper()
	sku, err := services.SpreadSKU(context.Background(), c, prefix, k)
	if err != nil {
		t.Fatal(err)
	}
	return sku
}

// createSKU creates sku with stock units over k buckets through the admin API.
func (s *stack) createSKU(sku string, stock, k int) {
	s.t.Helper()
	if code, body := s.call("PUT", "/admin/skus/"+sku+"/stock", fmt.Sprintf(`{"stock":%d,"buckets":%d}`, stock, k), nil); code != 200 {
		s.t.Fatalf("create %s with %d units over %d buckets = %d %v", sku, stock, k, code, body)
	}
}

// bucketStocks returns the Redis figures (available, held) of each bucket.
func bucketStocks(t *testing.T, c *redis.ClusterClient, sku string, k int) (avail, held []int64) {
	t.Helper()
	h := redisstore.New(c, 0)
	for b := range k {
		rs, err := h.Stock(context.Background(), reservation.BucketName(sku, b))
		if err != nil {
			t.Fatalf("stock of bucket %d: %v", b, err)
		}
		avail, held = append(avail, rs.Available), append(held, rs.Held)
	}
	return avail, held
}

func sum(ns []int64) (n int64) {
	for _, v := range ns {
		n += v
	}
	return n
}

// persistAll settles the recorded messages through persist's batch path,
// 100 at a time, as Lambda's event source hands them over.
func (s *stack) persistAll(rec *recordingEnqueuer) []reservation.Reservation {
	s.t.Helper()
	rec.mu.Lock()
	msgs := rec.msgs
	rec.msgs = nil
	rec.mu.Unlock()
	for lo := 0; lo < len(msgs); lo += 100 {
		batch := msgs[lo:min(len(msgs), lo+100)]
		for i, err := range s.app.Service.PersistBatch(context.Background(), batch) {
			if err != nil {
				s.t.Fatalf("persist %s: %v", batch[i].ID, err)
			}
		}
	}
	return msgs
}

func TestBuckets(t *testing.T) {
	testservices.Require(t)
	addrs := testservices.StartCluster(t)
	const k = 3

	t.Run("a sale of S units sells exactly S over three shards", func(t *testing.T) {
		rec := &recordingEnqueuer{}
		s := newStack(t, withCluster(addrs), withEnqueuer(rec))
		sku := spreadSKU(t, s.cluster, "spread", k)
		const units, buyers = 300, 600
		if code, body := s.call("PUT", "/admin/skus/"+sku+"/stock", `{"stock":300,"buckets":3}`, nil); code != 200 || body["buckets"] != float64(k) {
			t.Fatalf("set stock with 3 buckets = %d %v", code, body)
		}
		var mu sync.Mutex
		codes := map[int]int{}
		var ids []string
		var wg sync.WaitGroup
		sem := make(chan struct{}, 32)
		for i := range buyers {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				code, body := s.reserve(sku, fmt.Sprintf("buyer-%d", i), 1, "")
				mu.Lock()
				defer mu.Unlock()
				codes[code]++
				if code == http.StatusAccepted {
					ids = append(ids, body["reservation_id"].(string))
				}
			}()
		}
		wg.Wait()
		if codes[http.StatusAccepted] != units || codes[http.StatusConflict] != buyers-units {
			t.Fatalf("answers %v: want %d accepted and %d sold out", codes, units, buyers-units)
		}
		// Every bucket sold: the sale spread over the three shards.
		perBucket := map[int]int{}
		for _, m := range rec.msgs {
			perBucket[m.Bucket]++
		}
		for b := range k {
			if perBucket[b] == 0 {
				t.Errorf("bucket %d held nothing: %v", b, perBucket)
			}
		}
		s.persistAll(rec)
		if n := s.count(`SELECT COUNT(*) FROM reservations WHERE sku = ? AND status = 'CONFIRMED' AND into_bucket IS NULL`, sku); n != units {
			t.Errorf("MySQL confirmed %d reservations, want %d", n, units)
		}
		if n := s.count(`SELECT COUNT(*) FROM reservations WHERE sku = ? AND into_bucket IS NOT NULL`, sku); n == 0 {
			t.Errorf("no transfer: the buckets never refilled one another")
		}
		avail, held := bucketStocks(t, s.cluster, sku, k)
		if sum(avail) != 0 || sum(held) != 0 {
			t.Errorf("Redis buckets available %v held %v, want all 0", avail, held)
		}
		s.check(invariant.Expect{Sellable: map[string]int64{sku: units}, Accepted: ids, Quiescent: true})
	})

	t.Run("concurrent buyers of every bucket never hear sold out while stock remains", func(t *testing.T) {
		// Buckets 1 and 2 start empty and draw from bucket 0 at once: a
		// refill whose donor another refill drained first reads it again.
		rec := &recordingEnqueuer{}
		s := newStack(t, withCluster(addrs), withEnqueuer(rec))
		sku := spreadSKU(t, s.cluster, "race", k)
		const units, workers, each = 100000, 32, 25
		s.createSKU(sku, units, k)
		var mu sync.Mutex
		codes := map[int]int{}
		var wg sync.WaitGroup
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range each {
					code, _ := s.reserve(sku, fmt.Sprintf("w%d-%d", w, i), 1, "")
					mu.Lock()
					codes[code]++
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		if codes[http.StatusAccepted] != workers*each {
			t.Fatalf("answers %v: want all %d accepted (%d units)", codes, workers*each, units)
		}
		if avail, held := bucketStocks(t, s.cluster, sku, k); sum(avail) != units-workers*each || sum(held) != workers*each {
			t.Errorf("buckets available %v held %v: want %d available and %d held in all", avail, held, units-workers*each, workers*each)
		}
	})

	t.Run("the last units reach a buyer of any bucket", func(t *testing.T) {
		// Buyers one at a time: every unit is sold before anyone hears sold
		// out, whichever bucket it sits in and whichever the buyer hashes to.
		rec := &recordingEnqueuer{}
		s := newStack(t, withCluster(addrs), withEnqueuer(rec))
		sku := spreadSKU(t, s.cluster, "tail", k)
		const units = 40
		s.createSKU(sku, 40, k)
		var ids []string
		for i := range units + 10 {
			code, body := s.reserve(sku, fmt.Sprintf("one-%d", i), 1, "")
			switch {
			case i < units && code != http.StatusAccepted:
				avail, _ := bucketStocks(t, s.cluster, sku, k)
				t.Fatalf("buyer %d of %d units: %d %v while the buckets have %v", i, units, code, body, avail)
			case i >= units && code != http.StatusConflict:
				t.Fatalf("buyer %d after the %d units sold: %d %v, want sold out", i, units, code, body)
			case code == http.StatusAccepted:
				ids = append(ids, body["reservation_id"].(string))
			}
		}
		// A unit that comes back (a buyer's cancel) goes back to its own
		// bucket, and a buyer of another bucket gets it.
		var back reservation.Reservation
		for _, m := range rec.msgs {
			if m.Bucket != 0 {
				back = m
				break
			}
		}
		if code, body := s.callAs(back.UserID, "DELETE", "/reservations/"+back.ID, "", nil); code != 200 {
			t.Fatalf("cancel %s: %d %v", back.ID, code, body)
		}
		if avail, _ := bucketStocks(t, s.cluster, sku, k); avail[back.Bucket] != 1 || sum(avail) != 1 {
			t.Fatalf("after the cancel the buckets have %v, want the unit back in bucket %d", avail, back.Bucket)
		}
		user := ""
		for i := 0; user == ""; i++ {
			if u := fmt.Sprintf("late-%d", i); reservation.HomeBucket(u, "", k) != back.Bucket {
				user = u
			}
		}
		code, body := s.reserve(sku, user, 1, "")
		if code != http.StatusAccepted {
			t.Fatalf("a unit came back in bucket %d and %s (bucket %d) heard %d %v", back.Bucket, user, reservation.HomeBucket(user, "", k), code, body)
		}
		ids = append(ids, body["reservation_id"].(string))
		s.persistAll(rec)
		s.check(invariant.Expect{Sellable: map[string]int64{sku: units}, Accepted: ids, Quiescent: true})
	})

	t.Run("a transfer that crashes half-way loses nothing", func(t *testing.T) {
		s := newStack(t, withCluster(addrs))
		sku := spreadSKU(t, s.cluster, "crash", k)
		s.createSKU(sku, 90, k)
		ctx := context.Background()
		holds := redisstore.New(s.cluster, 0, redisstore.WithClock(s.clock))
		ledger := mysqlstore.New(s.db)
		// The buckets warm when first asked: all 90 units start in bucket 0.
		if code, body := s.call("GET", "/skus/"+sku, "", nil); code != 200 || body["available"] != float64(90) {
			t.Fatalf("GET /skus = %d %v, want 90 available", code, body)
		}
		move := func(id string, qty, from, into int) reservation.Reservation {
			t.Helper()
			tr := reservation.Reservation{ID: sku + "." + id, SKU: sku, Qty: qty, Bucket: from, Transfer: true, Into: into, Token: "tok-" + id}
			h, err := holds.TakeOut(ctx, tr, 30*time.Second)
			if err != nil {
				t.Fatalf("take out %s: %v", id, err)
			}
			return h
		}
		// 1: crashed after the giving bucket held the units, before MySQL
		// recorded the move. 2: crashed after MySQL recorded it, before
		// Redis followed. 3: crashed after the giving bucket confirmed, before
		// the receiving bucket was credited.
		move("aaaaaaaaaaaaaaaaaaaaaaaaaa", 10, 0, 1)
		second := move("bbbbbbbbbbbbbbbbbbbbbbbbbb", 20, 0, 2)
		if _, err := ledger.Transfer(ctx, second, s.clock.Now()); err != nil {
			t.Fatal(err)
		}
		third := move("cccccccccccccccccccccccccc", 5, 0, 1)
		row, err := ledger.Transfer(ctx, third, s.clock.Now())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := holds.Follow(ctx, row, row.RefundVersion); err != nil {
			t.Fatal(err)
		}
		// The SKU is live (a stock change marked it); the units in flight
		// are not for sale anywhere until the sweeper settles them.
		if avail, held := bucketStocks(t, s.cluster, sku, k); sum(avail) != 55 || sum(held) != 30 {
			t.Fatalf("mid-move: available %v held %v, want 55 available and 30 held (the two moves not confirmed)", avail, held)
		}
		s.clock.Advance(time.Minute)
		rep := s.sweep()
		if rep.Errors != 0 {
			t.Fatalf("sweep: %+v", rep)
		}
		avail, held := bucketStocks(t, s.cluster, sku, k)
		if want := []int64{65, 5, 20}; fmt.Sprint(avail) != fmt.Sprint(want) || sum(held) != 0 {
			t.Errorf("after the sweep: buckets %v held %v, want %v (the unrecorded move returned to bucket 0, the recorded ones credited once)", avail, held, want)
		}
		for _, id := range []string{"aaaaaaaaaaaaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbbbbbbbbbbbb", "cccccccccccccccccccccccccc"} {
			r, err := ledger.Reservation(ctx, sku+"."+id)
			if err != nil || !r.Released || !r.Transfer {
				t.Errorf("transfer %s: %+v %v; want a released transfer row", id, r, err)
			}
		}
		// A second sweep moves nothing more: each move happened once.
		s.sweep()
		if again, _ := bucketStocks(t, s.cluster, sku, k); fmt.Sprint(again) != fmt.Sprint(avail) {
			t.Errorf("a second sweep moved units: %v → %v", avail, again)
		}
		s.check(invariant.Expect{Sellable: map[string]int64{sku: 90}, Quiescent: true})
	})
}
