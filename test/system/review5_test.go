package system_test

// What the adversarial review of "one SKU over K Redis buckets" reproduced
// (docs/design.md, "One SKU over K buckets"), each now held. The hash tags
// do not matter here: one redis-server serves every bucket.

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/holdfast/holdfast/internal/testkit/faultproxy"
	"github.com/holdfast/holdfast/internal/testkit/invariant"
	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/adapters/mysqlstore"
	"github.com/holdfast/holdfast/shared/adapters/redisstore"
	"github.com/holdfast/holdfast/shared/reservation"
)

// userIn returns a user whose home bucket (of k) is b.
func userIn(prefix string, b, k int) string {
	for i := 0; ; i++ {
		u := fmt.Sprintf("%s-%d", prefix, i)
		if reservation.HomeBucket(u, "", k) == b {
			return u
		}
	}
}

// A MySQL outage: a buyer of a dry bucket hears 503, not sold out; the
// transfer's held units are decided by the fence once MySQL is back, and no
// stock stays frozen. (The review found 409s, and half of bucket 0 held
// per buyer until the sweeper ran.)
func TestReview5MySQLBlipFreezesBucketStockAsSoldOut(t *testing.T) {
	var db *faultproxy.Proxy
	s := newStack(t, withDBProxy(&db))
	const k = 3
	sku := testservices.Name("blip")
	s.createSKU(sku, 30, 3)
	// The sale is under way: every bucket is warm (all 30 units in bucket 0).
	if code, body := s.call("GET", "/skus/"+sku, "", nil); code != 200 || body["available"] != float64(30) {
		t.Fatalf("GET /skus = %d %v", code, body)
	}
	db.Refuse(true)
	for i := range 5 {
		code, body := s.reserve(sku, userIn(fmt.Sprintf("dry%d", i), 1, k), 1, "")
		t.Logf("MySQL down, buyer of dry bucket 1: %d %v", code, body)
		if code != http.StatusServiceUnavailable {
			t.Errorf("buyer told %d %v while bucket 0 holds 30 units and MySQL is down (want 503)", code, body)
		}
	}
	if avail, _ := s.redisStock(sku); avail < 15 {
		t.Errorf("bucket 0 has %d units left for sale during the outage: more than one transfer's worth frozen", avail)
	}
	db.Refuse(false)
	s.clock.Advance(15 * time.Second) // past the transfer hold's deadline and the grace
	s.sweep()

	// MySQL is back: 30 units available in MySQL, nothing held by any buyer.
	code, body := s.call("GET", "/skus/"+sku, "", nil)
	t.Logf("after MySQL is back: GET /skus = %d %v; MySQL available %d", code, body, s.mysqlAvailable(sku))
	if body["available"] != float64(30) {
		t.Errorf("GET /skus says %v available, MySQL 30 and no buyer holds a unit", body["available"])
	}
	accepted := 0
	for i := range 10 {
		code, _ := s.reserve(sku, userIn(fmt.Sprintf("after%d", i), i%k, k), 1, fmt.Sprintf("k%d", i))
		if code == http.StatusAccepted {
			accepted++
		}
	}
	if accepted != 10 {
		t.Errorf("after MySQL came back, %d of 10 buyers accepted with 30 units free (the rest told sold out)", accepted)
	}
}

// A refused big order does not make the instance answer sold out to small
// ones. (The review found the sold-out flag set by any refusal.)
func TestReview5BigOrderRefusedTellsSmallBuyersSoldOut(t *testing.T) {
	s := newStack(t)
	const k = 3
	sku := testservices.Name("bigorder")
	s.createSKU(sku, 3, 3)
	code, body := s.reserve(sku, userIn("whale", 1, k), 4, "")
	if code != http.StatusConflict {
		t.Fatalf("4 of 3 units = %d %v, want 409", code, body)
	}
	for b := range k {
		code, body := s.reserve(sku, userIn(fmt.Sprintf("small%d", b), b, k), 1, "")
		t.Logf("buyer of 1 unit in bucket %d: %d %v", b, code, body)
		if code != http.StatusAccepted {
			t.Errorf("buyer of 1 unit (bucket %d) told %d %v while the SKU has 3 units", b, code, body)
		}
	}
}

// A request the buckets together cannot serve moves nothing and writes
// nothing. (The review found a MySQL transfer, and a version bump, per
// refused request: a scalper's lever on the arbiter.)
func TestReview5RefusedOversizedOrdersEachWriteMySQL(t *testing.T) {
	s := newStack(t)
	const k = 3
	sku := testservices.Name("churn")
	s.createSKU(sku, 6, 3)
	v0 := s.count(`SELECT version FROM product_stock WHERE sku = ?`, sku)
	const attempts = 30
	for i := range attempts {
		code, body := s.reserve(sku, userIn(fmt.Sprintf("h%d", i), i%k, k), 7, fmt.Sprintf("key-%d", i))
		if code != http.StatusConflict {
			t.Fatalf("7 of 6 units = %d %v, want 409", code, body)
		}
	}
	transfers := s.count(`SELECT COUNT(*) FROM reservations WHERE sku = ? AND into_bucket IS NOT NULL`, sku)
	v1 := s.count(`SELECT version FROM product_stock WHERE sku = ?`, sku)
	t.Logf("%d refused requests: %d transfer rows in MySQL, stock version %d -> %d", attempts, transfers, v0, v1)
	if transfers != 0 || v1 != v0 {
		t.Errorf("%d requests that could never be served wrote %d transfers to MySQL (version +%d)", attempts, transfers, v1-v0)
	}
}

// A buy under the key of a held join is 422, also right after the SKU's
// first group. (The review found the instance's cached layout, taken before
// the group, skipping the check of bucket 0: both were accepted.)
func TestReview5JoinAndBuyUnderOneKeyBothAcceptedAfterFirstGroup(t *testing.T) {
	rec := &recordingEnqueuer{}
	s := newStack(t, withEnqueuer(rec))
	const k = 3
	sku := testservices.Name("keyx")
	s.createSKU(sku, 10, 3)
	// Any buyer: the instance caches the layout (no groups yet).
	if code, body := s.reserve(sku, "someone", 1, ""); code != http.StatusAccepted {
		t.Fatalf("first buyer = %d %v", code, body)
	}
	code, g := s.call("POST", "/groups", fmt.Sprintf(`{"sku":%q,"capacity":3,"ttl_seconds":600}`, sku), nil)
	if code != http.StatusCreated {
		t.Fatalf("POST /groups = %d %v", code, g)
	}
	gid := g["group_id"].(string)
	ann := userIn("ann", 2, k)
	hdr := map[string]string{"Idempotency-Key": "same-key"}
	code, join := s.call("POST", "/reservations", fmt.Sprintf(`{"sku":%q,"qty":1,"user_id":%q,"group_id":%q}`, sku, ann, gid), hdr)
	if code != http.StatusAccepted {
		t.Fatalf("join = %d %v", code, join)
	}
	code, buy := s.call("POST", "/reservations", fmt.Sprintf(`{"sku":%q,"qty":1,"user_id":%q}`, sku, ann), hdr)
	t.Logf("join under the key: 202 %v; buy under the same key: %d %v", join["reservation_id"], code, buy)
	if code != http.StatusUnprocessableEntity {
		t.Errorf("a buy under the key of a held join = %d %v, want 422 idempotency_mismatch", code, buy)
	}
	s.persistAll(rec)
	_, got := s.callAs(ann, "GET", "/reservations/"+join["reservation_id"].(string), "", nil)
	t.Logf("after persist, GET of the id: %v", got)
}

// A transfer completed late by the outbox (its finished hold gone with
// retention) takes nothing from the giving bucket a second time. (The review
// found the late follow carrying the transfer's version, so follow.lua took
// the units again.)
func TestReview5LateTransferOutboxTakesGivingBucketTwice(t *testing.T) {
	s := newStack(t)
	const k = 3
	sku := testservices.Name("late")
	s.createSKU(sku, 90, 3)
	if code, body := s.call("GET", "/skus/"+sku, "", nil); code != 200 || body["available"] != float64(90) {
		t.Fatalf("GET /skus = %d %v", code, body)
	}
	ctx := context.Background()
	const retention = time.Second // stands for HOLDFAST_HOLD_RETENTION (24 h) having passed
	holds := redisstore.New(s.rdb, retention, redisstore.WithClock(s.clock))
	ledger := mysqlstore.New(s.db)
	tr := reservation.Reservation{ID: sku + ".dddddddddddddddddddddddddd", SKU: sku, Qty: 10, Bucket: 0, Transfer: true, Into: 1, Token: "tok-d"}
	held, err := holds.TakeOut(ctx, tr, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	row, err := ledger.Transfer(ctx, held, s.clock.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := holds.Follow(ctx, row, row.RefundVersion); err != nil { // the giving side confirmed; crash before the credit
		t.Fatal(err)
	}
	time.Sleep(retention + 500*time.Millisecond) // the finished hold's retention passes
	s.clock.Advance(time.Minute)
	if rep := s.sweep(); rep.Errors != 0 {
		t.Fatalf("sweep: %+v", rep)
	}
	avail := make([]int64, k)
	for b := range k {
		rs, err := holds.Stock(ctx, reservation.BucketName(sku, b))
		if err != nil {
			t.Fatal(err)
		}
		avail[b] = rs.Available
	}
	t.Logf("after the outbox: buckets %v (sum %d), MySQL available %d", avail, sum(avail), s.mysqlAvailable(sku))
	if fmt.Sprint(avail) != fmt.Sprint([]int64{80, 10, 0}) {
		t.Errorf("buckets %v, want [80 10 0]: the transfer's 10 units left bucket 0 twice", avail)
	}
	s.check(invariant.Expect{Sellable: map[string]int64{sku: 90}, Quiescent: true})
}

// A message naming a bucket the SKU does not have takes nothing in either
// store: it is cancelled unknown_sku. (The review found it applied, with a
// share for the missing bucket that MySQL's checker did not see.)
func TestReview5MessageWithBucketPastKIsApplied(t *testing.T) {
	s := newStack(t)
	sku := testservices.Name("forged")
	s.createSKU(sku, 10, 3)
	if code, body := s.call("GET", "/skus/"+sku, "", nil); code != 200 || body["available"] != float64(10) {
		t.Fatalf("GET /skus = %d %v", code, body)
	}
	now := s.clock.Now()
	body := fmt.Sprintf(`{"version":1,"type":"ReservationHeld","reservation_id":"%s.ffffffffffffffffffffffffff","sku":%q,"qty":1,"user_id":"mallory","hold_token":"t","expires_at":%q,"created_at":%q,"bucket":5}`,
		sku, sku, now.Add(time.Minute).Format(time.RFC3339Nano), now.Format(time.RFC3339Nano))
	resp, err := s.persist.Handle(context.Background(), events.SQSEvent{Records: []events.SQSMessage{{MessageId: "m1", Body: body, EventSource: "aws:sqs", EventSourceARN: s.queues.ARN}}})
	t.Logf("persist: %d failures, err %v", len(resp.BatchItemFailures), err)
	t.Logf("MySQL available %d; stock_buckets rows for bucket 5: %d; GET /skus: %v", s.mysqlAvailable(sku),
		s.count(`SELECT COUNT(*) FROM stock_buckets WHERE sku = ? AND bucket = 5`, sku), func() any { _, b := s.call("GET", "/skus/"+sku, "", nil); return b["available"] }())
	if n := s.count(`SELECT COUNT(*) FROM stock_buckets WHERE sku = ? AND bucket = 5`, sku); n != 0 {
		t.Errorf("a share was written for bucket 5")
	}
	if n := s.count(`SELECT COUNT(*) FROM reservations WHERE sku = ? AND status = 'CANCELLED' AND reason = 'unknown_sku'`, sku); n != 1 {
		t.Errorf("the message was not cancelled unknown_sku")
	}
	s.clock.Advance(time.Minute)
	s.sweep()
	s.check(invariant.Expect{Sellable: map[string]int64{sku: 10}, Quiescent: true})
}

// A buyer finds and cancels their HELD reservation after K was raised. (The
// review found 404 for both: the hold was looked for only in the new home
// bucket and bucket 0.)
func TestReview5HeldReservationVanishesForItsBuyerWhenKIsRaised(t *testing.T) {
	rec := &recordingEnqueuer{}
	s := newStack(t, withEnqueuer(rec))
	sku := testservices.Name("raise")
	s.createSKU(sku, 10, 2)
	var bob string
	for i := 0; bob == ""; i++ {
		u := fmt.Sprintf("bob-%d", i)
		if reservation.HomeBucket(u, "", 2) == 1 && reservation.HomeBucket(u, "", 3) != 1 {
			bob = u
		}
	}
	code, res := s.reserve(sku, bob, 1, "")
	if code != http.StatusAccepted {
		t.Fatalf("reserve = %d %v", code, res)
	}
	id := res["reservation_id"].(string)
	_, lvl := s.call("GET", "/admin/skus/"+sku+"/stock", "", nil)
	h := map[string]string{"If-Match": fmt.Sprintf(`"%d"`, int(lvl["version"].(float64)))}
	if code, body := s.call("PUT", "/admin/skus/"+sku+"/stock", `{"stock":10,"buckets":3}`, h); code != 200 {
		t.Fatalf("raise K = %d %v", code, body)
	}
	code, got := s.callAs(bob, "GET", "/reservations/"+id, "", nil)
	t.Logf("GET own HELD reservation after K raised: %d %v", code, got)
	if code != http.StatusOK {
		t.Errorf("GET of the buyer's own HELD reservation = %d, want 200 HELD", code)
	}
	code, got = s.callAs(bob, "DELETE", "/reservations/"+id, "", nil)
	t.Logf("DELETE: %d %v", code, got)
	if code != http.StatusOK {
		t.Errorf("cancel of the buyer's own HELD reservation = %d, want 200", code)
	}
}
