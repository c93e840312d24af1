package system_test

// The twenty-second review's reproductions: transfers between buckets
// credited ahead of MySQL's record (docs/design.md, "One SKU over K
// buckets"). Each test fails on the code it was written against.

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/holdfast/holdfast/internal/testkit/invariant"
	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/adapters/mysqlstore"
	"github.com/holdfast/holdfast/shared/adapters/redisstore"
	"github.com/holdfast/holdfast/shared/reservation"
	"github.com/redis/go-redis/v9"
)

// r22Keys are the Redis keys of bucket b of sku that a transfer touches
// (the transfer's hold or mark among them).
// TestBucketFailovers: a SKU's buckets failing over (a replica that missed
// the last writes, or a restart empty) at each step of a transfer, a forged
// transfer, and shard clocks apart. Found by the adversarial review of
// issue 22's transfers (December 2026); each was a failing reproduction first.
func TestBucketFailovers(t *testing.T) {
	t.Run("a receiving bucket's failover after the record leaves no credit ahead stranded", receiverFailoverAfterRecord)
	t.Run("a bucket whose credit ahead a failover brought back is healed of a real drift", restoredCreditAheadIsHealed)
	t.Run("a giving bucket's failover during the record is healed by reconciliation", giverFailoverDuringRecord)
	t.Run("a forged transfer message that no hold backs moves nothing", forgedTransferMovesNothing)
	t.Run("shard clocks further apart than a transfer's deadline still serve a dry bucket's buyer", shardClockSkewServesBuyer)
	t.Run("a record landing during the giving bucket's warm-up is completed by the sweep", recordDuringGiverWarmUp)
	t.Run("a confirm landing during a warm-up makes the warm-up read again", confirmDuringWarmUp)
}

func r22Keys(sku string, b int, id string) []string {
	tag := "hf:{" + reservation.BucketName(sku, b) + "}"
	return []string{tag + ":stock", tag + ":meta", tag + ":exp", tag + ":ahead", tag + ":r:" + id}
}

// r22Snapshot dumps keys; restore puts them back as they were (a key that
// did not exist is deleted): a failover to a replica that had received the
// writes up to the snapshot and none after (Redis replicates asynchronously).
func r22Snapshot(t *testing.T, c redis.UniversalClient, keys []string) (restore func()) {
	t.Helper()
	ctx := context.Background()
	dumps := map[string]string{}
	for _, k := range keys {
		d, err := c.Dump(ctx, k).Result()
		if err == redis.Nil {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		dumps[k] = d
	}
	return func() {
		t.Helper()
		for _, k := range keys {
			d, ok := dumps[k]
			if !ok {
				if err := c.Del(ctx, k).Err(); err != nil {
					t.Fatal(err)
				}
				continue
			}
			if err := c.RestoreReplace(ctx, k, 0, d).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// r22Stock reads bucket b's figures.
func r22Stock(t *testing.T, c redis.UniversalClient, sku string, b int) reservation.RedisStock {
	t.Helper()
	rs, err := redisstore.New(c, 0).Stock(context.Background(), reservation.BucketName(sku, b))
	if err != nil {
		t.Fatalf("stock of bucket %d: %v", b, err)
	}
	return rs
}

// receiverFailoverAfterRecord: the receiving bucket fails
// over to a replica that has the transfer's credit ahead of the record but
// not the record's credit (the last write before the failover). MySQL has
// recorded and released the transfer, so nothing credits it again: the mark
// stays AHEAD, meta.ahead stays at the transfer's units and the ahead index
// keeps the entry — for ever. Every sweep "records" it again (a duplicate),
// so the bucket is never quiet, the SKU never leaves the live marks, and
// reconciliation never reaches the bucket (were it reached, its drift would
// count units that are not in flight).
func receiverFailoverAfterRecord(t *testing.T) {
	s := newStack(t)
	const k = 3
	sku := testservices.Name("stranded")
	s.createSKU(sku, 10, k)
	if code, body := s.call("GET", "/skus/"+sku, "", nil); code != 200 || body["available"] != float64(10) {
		t.Fatalf("GET /skus = %d %v", code, body)
	}
	ctx := context.Background()
	holds := redisstore.New(s.rdb, 0, redisstore.WithClock(s.clock))
	tr := reservation.Reservation{ID: sku + ".kkkkkkkkkkkkkkkkkkkkkkkkkk", SKU: sku, Qty: 4, Bucket: 0, Transfer: true, Into: 1, Token: "tok-k"}
	held, err := holds.TakeOut(ctx, tr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := holds.Credit(ctx, held); err != nil || !ok {
		t.Fatalf("credit ahead = %v %v", ok, err)
	}
	if err := holds.Landed(ctx, held); err != nil {
		t.Fatal(err)
	}
	failover := r22Snapshot(t, s.rdb, r22Keys(sku, 1, held.ID)) // bucket 1's replica, as of the credit ahead
	// Persist records the transfer, credits it (a no-op by the mark), confirms the giving hold, releases the row.
	if _, err := s.app.Service.Persist(ctx, held); err != nil {
		t.Fatal(err)
	}
	if row, err := mysqlstore.New(s.db).Reservation(ctx, held.ID); err != nil || row.Release != reservation.ReleaseDone {
		t.Fatalf("transfer row %+v %v, want recorded and released", row, err)
	}
	failover() // bucket 1 fails over: the record's credit is lost, the credit ahead is not
	var rep reservation.SweepReport
	for range 5 {
		s.clock.Advance(5 * time.Minute) // past the deadline, the grace, ReconcileAfter, the live mark
		if rep = s.sweep(); rep.Errors != 0 {
			t.Fatalf("sweep: %+v", rep)
		}
	}
	rs := r22Stock(t, s.rdb, sku, 1)
	aheadIndex := s.rdb.ZCard(ctx, r22Keys(sku, 1, held.ID)[3]).Val()
	mark := s.rdb.HGet(ctx, r22Keys(sku, 1, held.ID)[4], "state").Val()
	t.Logf("after 5 sweeps: bucket 1 %+v, ahead index %d, mark %q; last sweep %+v", rs, aheadIndex, mark, rep)
	if rs.Ahead != 0 || aheadIndex != 0 || mark == "AHEAD" {
		t.Errorf("bucket 1 keeps a credit ahead of a record MySQL made and released: meta.ahead %d, index %d, mark %q (want 0, 0, not AHEAD)", rs.Ahead, aheadIndex, mark)
	}
	if rep.DriftUnits != 0 {
		t.Errorf("the sweep reports a drift of %d units (%v) on buckets that match MySQL", rep.DriftUnits, rep.WorstDrift)
	}
	if rep.LiveSKUs != 0 {
		t.Errorf("the SKU stays live (%d live SKUs visited): every sweep re-records the stranded credit, so its bucket is never quiet", rep.LiveSKUs)
	}
	s.check(invariant.Expect{Sellable: map[string]int64{sku: 10}, Quiescent: true})
}

// restoredCreditAheadIsHealed: with a credit ahead stranded
// as above, a real drift of the receiving bucket (a unit Redis lost) is
// never healed: reconciliation never reaches the bucket.
func restoredCreditAheadIsHealed(t *testing.T) {
	s := newStack(t)
	const k = 3
	sku := testservices.Name("noheal")
	s.createSKU(sku, 10, k)
	if code, body := s.call("GET", "/skus/"+sku, "", nil); code != 200 || body["available"] != float64(10) {
		t.Fatalf("GET /skus = %d %v", code, body)
	}
	ctx := context.Background()
	holds := redisstore.New(s.rdb, 0, redisstore.WithClock(s.clock))
	tr := reservation.Reservation{ID: sku + ".nnnnnnnnnnnnnnnnnnnnnnnnnn", SKU: sku, Qty: 4, Bucket: 0, Transfer: true, Into: 1, Token: "tok-n"}
	held, err := holds.TakeOut(ctx, tr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := holds.Credit(ctx, held); err != nil || !ok {
		t.Fatalf("credit ahead = %v %v", ok, err)
	}
	if err := holds.Landed(ctx, held); err != nil {
		t.Fatal(err)
	}
	failover := r22Snapshot(t, s.rdb, r22Keys(sku, 1, held.ID))
	if _, err := s.app.Service.Persist(ctx, held); err != nil {
		t.Fatal(err)
	}
	failover()
	// Redis loses one more unit of bucket 1 (say a give-back lost in the same failover).
	if err := s.rdb.DecrBy(ctx, r22Keys(sku, 1, held.ID)[0], 1).Err(); err != nil {
		t.Fatal(err)
	}
	for range 6 {
		s.clock.Advance(5 * time.Minute)
		if rep := s.sweep(); rep.Errors != 0 {
			t.Fatalf("sweep: %+v", rep)
		}
	}
	shares := s.count(`SELECT available FROM stock_buckets WHERE sku = ? AND bucket = 1`, sku)
	if got := r22Stock(t, s.rdb, sku, 1).Available; got != shares {
		t.Errorf("bucket 1 offers %d units, MySQL's share is %d: a drift that six sweeps, %s apart, never healed", got, shares, 5*time.Minute)
	}
}

// giverFailoverDuringRecord: the giving bucket fails
// over to a replica without the take-out, while persist records the
// transfer: its follow of the giving bucket fails (the bucket is failing
// over), so the outbox completes it — with no version, so the units the
// giving bucket lost are not taken from its stock. They stay for sale in
// both buckets after the record (docs/design.md: "only … before the
// record"), until reconciliation, which waits for a bucket with no hold.
func giverFailoverDuringRecord(t *testing.T) {
	s := newStack(t)
	const k = 3
	sku := testservices.Name("twice")
	s.createSKU(sku, 10, k)
	if code, body := s.call("GET", "/skus/"+sku, "", nil); code != 200 || body["available"] != float64(10) {
		t.Fatalf("GET /skus = %d %v", code, body)
	}
	ctx := context.Background()
	holds := redisstore.New(s.rdb, 0, redisstore.WithClock(s.clock))
	tr := reservation.Reservation{ID: sku + ".wwwwwwwwwwwwwwwwwwwwwwwwww", SKU: sku, Qty: 6, Bucket: 0, Transfer: true, Into: 1, Token: "tok-w"}
	failover := r22Snapshot(t, s.rdb, r22Keys(sku, 0, tr.ID)) // bucket 0's replica, before the take-out
	held, err := holds.TakeOut(ctx, tr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := holds.Credit(ctx, held); err != nil || !ok {
		t.Fatalf("credit ahead = %v %v", ok, err)
	}
	if err := holds.Landed(ctx, held); err != nil {
		t.Fatal(err)
	}
	// Persist commits the record; Redis's follow of it fails (bucket 0 is
	// failing over), so completeTransfer leaves it to the outbox.
	if _, recorded, err := mysqlstore.New(s.db).Transfer(ctx, held, s.clock.Now()); err != nil || !recorded {
		t.Fatalf("record = %v %v", recorded, err)
	}
	failover()
	s.clock.Advance(5 * time.Second)       // past the outbox's grace, not the hold's deadline
	if rep := s.sweep(); rep.Errors != 0 { // the outbox completes the record
		t.Fatalf("sweep: %+v", rep)
	}
	avail, held0 := bucketStocks(t, s.rdb, sku, k)
	t.Logf("after the record and the outbox: buckets %v held %v, MySQL available %d", avail, held0, s.mysqlAvailable(sku))
	// The lost take-out is drift that reconciliation heals once it holds
	// still (a failover that loses writes; MySQL decides meanwhile).
	for range 3 {
		s.clock.Advance(time.Minute)
		s.sweep()
	}
	avail, _ = bucketStocks(t, s.rdb, sku, k)
	if sum(avail) != s.mysqlAvailable(sku) {
		t.Errorf("after reconciliation the buckets offer %d units for MySQL's %d", sum(avail), s.mysqlAvailable(sku))
	}
	s.check(invariant.Expect{Sellable: map[string]int64{sku: 10}, Quiescent: true})
}

// forgedTransferMovesNothing: a TransferHeld message naming
// two buckets the SKU has, for units no bucket ever took out (no hold in the
// giving bucket, no credit in the receiving one), is recorded by persist and
// followed by Redis: MySQL's shares move 1000 units that do not exist, the
// receiving bucket offers them, and buyers of that bucket are told 202 for
// units MySQL does not have, until a sweep's cover moves them back. Nothing
// checks a transfer message against its hold.
func forgedTransferMovesNothing(t *testing.T) {
	rec := &recordingEnqueuer{}
	s := newStack(t, withEnqueuer(rec))
	const k = 3
	sku := testservices.Name("phantom")
	s.createSKU(sku, 10, k)
	if code, body := s.call("GET", "/skus/"+sku, "", nil); code != 200 || body["available"] != float64(10) {
		t.Fatalf("GET /skus = %d %v", code, body)
	}
	before, _ := bucketStocks(t, s.rdb, sku, k)
	now := s.clock.Now()
	body := fmt.Sprintf(`{"version":1,"type":"TransferHeld","reservation_id":"%s.pppppppppppppppppppppppppp","sku":%q,"qty":1000,"hold_token":"t","expires_at":%q,"created_at":%q,"bucket":1,"into_bucket":2}`,
		sku, sku, now.Add(10*time.Second).Format(time.RFC3339Nano), now.Format(time.RFC3339Nano))
	resp, err := s.persist.Handle(context.Background(), events.SQSEvent{Records: []events.SQSMessage{{MessageId: "m1", Body: body, EventSource: "aws:sqs", EventSourceARN: s.queues.ARN}}})
	t.Logf("persist of a forged transfer: %d failures, err %v", len(resp.BatchItemFailures), err)
	after, _ := bucketStocks(t, s.rdb, sku, k)
	share1 := s.count(`SELECT COALESCE(SUM(available), 0) FROM stock_buckets WHERE sku = ? AND bucket = 1`, sku)
	share2 := s.count(`SELECT COALESCE(SUM(available), 0) FROM stock_buckets WHERE sku = ? AND bucket = 2`, sku)
	t.Logf("buckets %v → %v; MySQL shares of buckets 1/2: %d/%d; MySQL available %d", before, after, share1, share2, s.mysqlAvailable(sku))
	if fmt.Sprint(after) != fmt.Sprint(before) || share1 < 0 || share2 > 10 {
		t.Errorf("a transfer no bucket took out moved units: buckets %v → %v, shares %d/%d", before, after, share1, share2)
	}
	accepted := 0
	for i := range 30 {
		if code, _ := s.reserve(sku, userIn(fmt.Sprintf("p%d", i), 2, k), 1, ""); code == 202 {
			accepted++
		}
	}
	if accepted > 10 {
		t.Errorf("%d buyers of bucket 2 told 202 for a SKU of 10 units", accepted)
	}
}

// r22Skewed is the stack's Redis with the receiving buckets' shard clock
// running ahead of the giving one's: Credit runs on a shard whose TIME is
// skew ahead (credit.lua reads its own shard's clock; takeout.lua set the
// deadline by the giving shard's).
type r22Skewed struct {
	*redisstore.Store
	receiving *redisstore.Store
}

func (r r22Skewed) Credit(ctx context.Context, t reservation.Reservation) (bool, error) {
	return r.receiving.Credit(ctx, t)
}

type r22Clock struct {
	base *testClock
	skew time.Duration
}

func (c r22Clock) Now() time.Time { return c.base.Now().Add(c.skew) }

// shardClockSkewServesBuyer: the shard of a dry bucket
// runs its clock 15 s ahead of the shard of the full one. Every credit ahead
// of the record is refused as past the transfer hold's deadline (10 s by the
// giving shard's clock), so every transfer "does not land": the refill takes
// out a half, a quarter, an eighth of the full bucket, three passes, and the
// buyer is told sold out while the SKU has all its 30 units.
func shardClockSkewServesBuyer(t *testing.T) {
	rec := &recordingEnqueuer{}
	s := newStack(t, withEnqueuer(rec))
	const k = 3
	sku := testservices.Name("skew")
	s.createSKU(sku, 30, k)
	if code, body := s.call("GET", "/skus/"+sku, "", nil); code != 200 || body["available"] != float64(30) {
		t.Fatalf("GET /skus = %d %v", code, body)
	}
	store := redisstore.New(s.rdb, s.cfg.HoldRetention, redisstore.WithClock(s.clock))
	ahead := redisstore.New(s.rdb, s.cfg.HoldRetention, redisstore.WithClock(r22Clock{s.clock, 15 * time.Second}))
	svc := reservation.NewService(s.cfg.Protocol, reservation.Deps{
		Redis: r22Skewed{Store: store, receiving: ahead}, Ledger: mysqlstore.New(s.db), Queue: rec, Clock: s.clock,
	})
	_, _, err := svc.Reserve(context.Background(), reservation.ReserveRequest{SKU: sku, Qty: 1, UserID: userIn("dry", 1, k)})
	avail, held := bucketStocks(t, s.rdb, sku, k)
	t.Logf("reserve: %v; buckets %v held %v; %d transfers sent", err, avail, held, len(rec.msgs))
	if err != nil {
		t.Errorf("a buyer of a dry bucket told %v while the SKU has 30 units (the receiving shard's clock 15 s ahead)", err)
	}
}

// recordDuringGiverWarmUp: the giving bucket
// restarts empty after the credit ahead; a warm-up reads MySQL (the share
// still has the transfer's units: not recorded yet); persist records the
// transfer and follows it in the giving bucket, which has no stock figure
// yet, so follow.lua takes nothing and leaves no trace in meta (cver moves
// only for a HELD hold); then the warm-up writes its level. warm.lua sees
// nothing stale, and the units are for sale in both buckets after the
// record, until reconciliation. (A buyer's confirm of a hold Redis lost has
// the same window with one bucket.)
func recordDuringGiverWarmUp(t *testing.T) {
	s := newStack(t)
	const k = 3
	sku := testservices.Name("warmrace")
	s.createSKU(sku, 10, k)
	if code, body := s.call("GET", "/skus/"+sku, "", nil); code != 200 || body["available"] != float64(10) {
		t.Fatalf("GET /skus = %d %v", code, body)
	}
	ctx := context.Background()
	holds := redisstore.New(s.rdb, s.cfg.HoldRetention, redisstore.WithClock(s.clock))
	ledger := mysqlstore.New(s.db)
	tr := reservation.Reservation{ID: sku + ".rrrrrrrrrrrrrrrrrrrrrrrrrr", SKU: sku, Qty: 6, Bucket: 0, Transfer: true, Into: 1, Token: "tok-r"}
	held, err := holds.TakeOut(ctx, tr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := holds.Credit(ctx, held); err != nil || !ok {
		t.Fatalf("credit ahead = %v %v", ok, err)
	}
	if err := holds.Landed(ctx, held); err != nil {
		t.Fatal(err)
	}
	if err := s.rdb.Del(ctx, r22Keys(sku, 0, held.ID)...).Err(); err != nil { // bucket 0 restarts empty
		t.Fatal(err)
	}
	// A warm-up of bucket 0 reads MySQL (Service.warm: HeldIDs, then Snapshot) ...
	level, confirmed, err := ledger.Snapshot(ctx, sku, nil)
	if err != nil {
		t.Fatal(err)
	}
	// ... persist records the transfer and Redis follows the record ...
	if _, err := s.app.Service.Persist(ctx, held); err != nil {
		t.Fatal(err)
	}
	// ... and the warm-up writes what it read.
	res, err := holds.Warm(ctx, level.Bucket(0), nil, confirmed)
	if err != nil {
		t.Fatal(err)
	}
	avail, _ := bucketStocks(t, s.rdb, sku, k)
	t.Logf("warm-up: %v; buckets %v, MySQL available %d", res, avail, s.mysqlAvailable(sku))
	// Persist found no hold behind the message and left it; the receiving
	// bucket's sweep records the transfer past its deadline, and the
	// record's follow takes the units back from the warmed giving bucket.
	s.clock.Advance(time.Minute)
	if rep := s.sweep(); rep.Errors != 0 {
		t.Fatalf("sweep: %+v", rep)
	}
	avail, _ = bucketStocks(t, s.rdb, sku, k)
	if sum(avail) != s.mysqlAvailable(sku) {
		t.Errorf("after the sweep the buckets offer %v (%d units) for MySQL's %d", avail, sum(avail), s.mysqlAvailable(sku))
	}
	s.check(invariant.Expect{Sellable: map[string]int64{sku: 10}, Quiescent: true})
}

// confirmDuringWarmUp: the same window with one
// bucket and a buyer's hold: Redis restarts empty, a warm-up reads MySQL,
// persist confirms the hold (follow.lua: no hold, no stock figure, nothing
// taken, no cver), the warm-up writes its older level: the buyer's unit is
// for sale again in Redis.
func confirmDuringWarmUp(t *testing.T) {
	rec := &recordingEnqueuer{}
	s := newStack(t, withEnqueuer(rec))
	sku := testservices.Name("warmconfirm")
	s.createSKU(sku, 5, 1)
	code, body := s.reserve(sku, "ann", 1, "")
	if code != 202 {
		t.Fatalf("reserve = %d %v", code, body)
	}
	ctx := context.Background()
	id := body["reservation_id"].(string)
	if err := s.rdb.Del(ctx, r22Keys(sku, 0, id)...).Err(); err != nil { // Redis restarts empty
		t.Fatal(err)
	}
	level, confirmed, err := mysqlstore.New(s.db).Snapshot(ctx, sku, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.persistAll(rec)
	res, err := redisstore.New(s.rdb, s.cfg.HoldRetention, redisstore.WithClock(s.clock)).Warm(ctx, level.Bucket(0), nil, confirmed)
	if err != nil {
		t.Fatal(err)
	}
	if res != reservation.SyncStale {
		t.Errorf("a warm-up from a level read before the confirm = %v, want refused as stale", res)
	}
	if code, body := s.call("GET", "/skus/"+sku, "", nil); code != 200 { // warms again from a fresh read
		t.Fatalf("GET /skus = %d %v", code, body)
	}
	got, _ := s.redisStock(sku)
	t.Logf("warm-up: %v; Redis available %d, MySQL available %d", res, got, s.mysqlAvailable(sku))
	if got > s.mysqlAvailable(sku) {
		t.Errorf("Redis offers %d units, MySQL has %d: the confirmed unit is for sale again", got, s.mysqlAvailable(sku))
	}
}
