package system_test

// Adversarial review: each test here reproduced a sequence of ordinary
// operations (or hostile-but-valid input) that broke holdfast's promise on
// the code under review (issue 9's first part); they pass since the fixes.

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/testkit/invariant"
	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/adapters/mysqlstore"
	"github.com/holdfast/holdfast/shared/adapters/redisstore"
	"github.com/holdfast/holdfast/shared/reservation"
)

// handle sends one request straight to the handler; safe from goroutines.
func (s *stack) handle(method, path, body string, headers map[string]string) (int, string) {
	resp, err := s.api.Handle(context.Background(), apiRequest(s.caller(method, path, body), method, path, body, headers))
	if err != nil {
		return -1, err.Error()
	}
	return resp.StatusCode, resp.Body
}

// TestReviewIDsAreCaseSensitiveInBothStores: MySQL compared SKUs
// case-insensitively (utf8mb4_unicode_ci), Redis keys do not. A reserve of
// the lower-cased spelling of "Rv_Mixed..." warmed a second Redis SKU from
// the same MySQL row (10 + 9 units for MySQL's 10), and its hold was never
// decided (the sweeper walks MySQL's spelling only). Ids now compare byte
// for byte in both stores (migration 0004): the variant is an unknown SKU,
// and "Ann" and "ann" are two users in both.
func TestReviewIDsAreCaseSensitiveInBothStores(t *testing.T) {
	p := newPromise(t)
	sku := testservices.Name("Rv_Mixed")
	variant := strings.ToLower(sku)
	p.createSKU(sku, 10, 0)

	if code, b := p.reserve(variant, "ann", 1, ""); code != http.StatusNotFound || b["error"] != "unknown_sku" {
		t.Fatalf("reserve of a case variant = %d %v, want 404 unknown_sku", code, b)
	}
	ctx := context.Background()
	if n, _ := p.rdb.Exists(ctx, "hf:{"+variant+"}:stock").Result(); n != 0 {
		t.Errorf("a case variant of the SKU got a Redis figure of its own")
	}
	code, g := p.call("POST", "/groups", `{"sku":"`+sku+`","capacity":2}`, nil)
	if code != http.StatusCreated {
		t.Fatalf("create group = %d %v", code, g)
	}
	gid := g["group_id"].(string)
	var ids []string
	for _, user := range []string{"Ann", "ann"} {
		code, b := p.join(sku, gid, user)
		if code != http.StatusAccepted {
			t.Fatalf("join as %s = %d %v", user, code, b)
		}
		ids = append(ids, b["reservation_id"].(string))
	}
	p.persistMsgs(ids...)
	for _, id := range ids {
		if st := p.status(id); st["status"] != "CONFIRMED" {
			t.Errorf("%s = %v, want CONFIRMED (Ann and ann are two users in both stores)", id, st)
		}
	}
	p.check(invariant.Expect{Sellable: map[string]int64{sku: 10}, Accepted: ids, Quiescent: false})
}

// TestReviewConcurrentSKUCreationSucceeds: admins (or one double-click)
// creating new SKUs at the same moment are all answered 200. The review
// found ChangeStock reading the missing row FOR UPDATE (a gap lock under
// REPEATABLE READ) before inserting it, so two creations deadlocked on each
// other's gap lock and the admin got 500; the deadlock was then retried, and
// since issue 20 a creation inserts first and takes no gap lock at all
// (mysqlstore's TestChangeStock).
func TestReviewConcurrentSKUCreationSucceeds(t *testing.T) {
	s := newStack(t)
	base := testservices.Name("rvnew")
	codes := map[int]int{}
	var bodies []string
	var mu sync.Mutex
	for round := range 10 {
		var wg sync.WaitGroup
		for i := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				code, body := s.handle("PUT", fmt.Sprintf("/admin/skus/%s-%d-%d/stock", base, round, i), `{"stock":10}`, nil)
				mu.Lock()
				codes[code]++
				if code >= 500 {
					bodies = append(bodies, body)
				}
				mu.Unlock()
			}()
		}
		wg.Wait()
	}
	if codes[http.StatusOK] != 40 {
		t.Errorf("creating 40 distinct new SKUs, 4 at a time: answers %v, want 40 × 200; 5xx bodies: %v", codes, bodies)
	}
}

// TestReviewGroupTTLOverflowIsRefused: POST /groups with ttl_seconds
// 18446744074 (about 585 years) must be refused (400: at most 604800). The
// handler multiplies by time.Second in int64, which wraps to 0.29 s; the
// range check passes and a group is created that closes at once.
func TestReviewGroupTTLOverflowIsRefused(t *testing.T) {
	p := newPromise(t)
	sku := testservices.Name("rvttl")
	p.createSKU(sku, 10, 0)
	code, g := p.call("POST", "/groups", fmt.Sprintf(`{"sku":%q,"capacity":2,"ttl_seconds":18446744074}`, sku), nil)
	if code != http.StatusBadRequest {
		t.Errorf("POST /groups with ttl_seconds 18446744074 = %d %v, want 400 invalid_request", code, g)
	}
	if n := p.count(`SELECT COUNT(*) FROM group_buys WHERE sku = ?`, sku); n != 0 {
		t.Errorf("bad input created %d group(s)", n)
	}
}

// TestReviewStockAddPastTheMaximumIsRefused: {"add": n} is accepted for any n up to
// 1e9, but product_stock.available is an INT. A third add of 1e9 overflows it:
// MariaDB refuses the write (strict mode) and the admin gets 503 "a
// dependency is unavailable; retry later" for a request that will never succeed.
func TestReviewStockAddPastTheMaximumIsRefused(t *testing.T) {
	p := newPromise(t)
	sku := testservices.Name("rvint")
	p.createSKU(sku, 0, 0)
	for i := range 3 {
		code, b := p.call("PUT", "/admin/skus/"+sku+"/stock", `{"add":1000000000}`, nil)
		if code >= 500 || (i > 0 && (code != http.StatusBadRequest || b["error"] != "invalid_request")) {
			t.Fatalf("add #%d of 1e9 = %d %v: want 200 once, then 400 (past the most a sku holds)", i+1, code, b)
		}
	}
}

// TestReviewRefundDuringWarmUpCountsOnce: Redis lost a SKU's stock key (a
// failover, or the runbook's repair: "delete hf:{sku}:stock and the next
// request warms it"). A request warms the SKU (Service.warm: HeldIDs, then
// MySQL's Snapshot, then warm.lua). Between the snapshot and warm.lua, a
// buyer cancels a CONFIRMED reservation of 2 units:
//
//  1. MySQL refunds (8 -> 10) and follow.lua runs while the stock key is
//     missing: it skips the INCRBY, marks the hold released, and MySQL's
//     released flag is set — nothing will give the units back again;
//  2. warm.lua writes stock = the snapshot's 8: warm refuses a level older
//     than a confirm it saw (cver) but has no such guard for a refund.
//
// Redis ends with 8 sellable units for MySQL's 10 with nothing in flight:
// two units are lost from Redis (undersold) until reconciliation heals them,
// which it never does while the SKU has any live hold (a sale in progress).
func TestReviewRefundDuringWarmUpCountsOnce(t *testing.T) {
	p := newPromise(t)
	sku := testservices.Name("rvwarm")
	p.createSKU(sku, 10, 0)
	id := p.reserved(sku, "ann", 2, "")
	p.persistMsgs(id)
	p.wantStores("confirmed", sku, 8, 0, 8)

	ctx := context.Background()
	p.rdb.Del(ctx, "hf:{"+sku+"}:stock") // the key is lost

	// A Lambda warming the SKU: the same calls, in the same order, as Service.warm.
	holds := redisstore.New(p.rdb, 0, redisstore.WithClock(p.clock))
	ledger := mysqlstore.New(p.db)
	ids, err := holds.HeldIDs(ctx, sku, 5000)
	if err != nil {
		t.Fatal(err)
	}
	level, confirmed, err := ledger.Snapshot(ctx, sku, ids)
	if err != nil {
		t.Fatal(err)
	}

	// Meanwhile, on another Lambda, ann cancels her confirmed reservation.
	if code, b := p.call("DELETE", "/reservations/"+id, "", nil); code != http.StatusOK || b["status"] != "CANCELLED" {
		t.Fatalf("DELETE = %d %v, want 200 CANCELLED", code, b)
	}

	finishWarm(t, holds, ledger, level, ids, confirmed) // the warm-up lands
	p.clock.Advance(5 * time.Second)                    // a sweep: outbox drained, nothing unreleased
	p.sweep()
	p.wantAgree("refund landed during the warm-up, one sweep later", sku, 10)
	p.check(invariant.Expect{Sellable: map[string]int64{sku: 10}, Accepted: []string{id}, Quiescent: true})
}

// TestReviewStockChangeKeyReusedWithAnotherBodyIsRefused: an admin
// adds 5 units with Idempotency-Key "restock"; later a different change
// (remove 8) is sent with the same key. stock_change_keys stores only the
// key, not the change, so the second request is answered 200 with the
// current level and nothing changes: the admin is told the removal
// happened. Reservations answer 422 idempotency_mismatch in the same case.
func TestReviewStockChangeKeyReusedWithAnotherBodyIsRefused(t *testing.T) {
	p := newPromise(t)
	sku := testservices.Name("rvkey")
	p.createSKU(sku, 10, 0)
	key := map[string]string{"Idempotency-Key": "restock"}
	if code, b := p.call("PUT", "/admin/skus/"+sku+"/stock", `{"add":5}`, key); code != http.StatusOK {
		t.Fatalf("add 5 = %d %v", code, b)
	}
	code, b := p.call("PUT", "/admin/skus/"+sku+"/stock", `{"add":-8}`, key)
	if code != http.StatusUnprocessableEntity || b["error"] != "idempotency_mismatch" || p.mysqlAvailable(sku) != 15 {
		t.Errorf("add -8 with a key already used for add 5 = %d %v, MySQL %d; want 422 idempotency_mismatch and 15", code, b, p.mysqlAvailable(sku))
	}
	if code, _ := p.call("PUT", "/admin/skus/"+sku+"/stock", `{"add":5}`, key); code != http.StatusOK || p.mysqlAvailable(sku) != 15 {
		t.Errorf("the same change retried = %d, MySQL %d; want 200 and 15 (applied once)", code, p.mysqlAvailable(sku))
	}
}

// TestReviewDuplicateDeliveryDuringWarmUpCountsOnce: the warm-up's
// guard against a confirm it did not see (meta.cver) is set by follow.lua
// only when *its* call turns a HELD hold CONFIRMED and carries a version.
// SQS delivers at least once, and two persist invocations can run the same
// message at once:
//
//  1. ann holds 2 of 10; Redis lost the stock key; a request starts warming
//     the SKU and reads MySQL's snapshot (10 available, ann not confirmed);
//  2. persist A commits ann (MySQL 8); before A's follow, the duplicate
//     delivery B finds the row (AlreadyConfirmed) and follows it with version
//     0: HELD -> CONFIRMED, held -2, cver untouched; A's follow then finds
//     the hold CONFIRMED and also leaves cver alone;
//  3. warm.lua lands: cver is not newer than its snapshot, so it writes
//     stock = 10 - held(0) = 10.
//
// Redis offers 10 units for MySQL's 8: ann's 2 units are counted twice
// (sellable in Redis, sold in MySQL) until reconciliation heals it.
func TestReviewDuplicateDeliveryDuringWarmUpCountsOnce(t *testing.T) {
	var p *promise
	var annID atomic.Value
	var fired atomic.Bool
	hooks := reservation.Hooks{AfterCommit: func(r reservation.Reservation) error {
		if r.ID == annID.Load() && fired.CompareAndSwap(false, true) {
			p.persistMsgs(r.ID) // the duplicate delivery, handled by another invocation
		}
		return nil
	}}
	p = newPromise(t, withHooks(hooks))
	sku := testservices.Name("rvdup")
	p.createSKU(sku, 10, 0)
	ann := p.reserved(sku, "ann", 2, "")
	annID.Store(ann)
	p.wantStores("held", sku, 8, 2, 10)

	ctx := context.Background()
	p.rdb.Del(ctx, "hf:{"+sku+"}:stock") // the key is lost
	holds := redisstore.New(p.rdb, 0, redisstore.WithClock(p.clock))
	ledger := mysqlstore.New(p.db)
	ids, err := holds.HeldIDs(ctx, sku, 5000) // Service.warm, first half
	if err != nil {
		t.Fatal(err)
	}
	level, confirmed, err := ledger.Snapshot(ctx, sku, ids)
	if err != nil {
		t.Fatal(err)
	}

	p.persistMsgs(ann) // persist A, with the duplicate B inside its commit-to-follow window
	if !fired.Load() {
		t.Fatal("the duplicate delivery did not run")
	}
	finishWarm(t, holds, ledger, level, ids, confirmed) // Service.warm, second half
	p.clock.Advance(5 * time.Second)
	p.sweep()
	p.wantAgree("duplicate delivery during the warm-up, one sweep later", sku, 8)
	p.check(invariant.Expect{Sellable: map[string]int64{sku: 10}, Accepted: []string{ann}, Quiescent: true})
}

// finishWarm is the second half of Service.warm: the script, and on a stale
// answer (a hold moved since MySQL was read) a fresh read and another try.
func finishWarm(t *testing.T, holds *redisstore.Store, ledger *mysqlstore.Store, level reservation.StockLevel, ids []string, confirmed []reservation.Reservation) {
	t.Helper()
	ctx := context.Background()
	for range 3 {
		res, err := holds.Warm(ctx, level, ids, confirmed)
		if err != nil {
			t.Fatal(err)
		}
		if res != reservation.SyncStale {
			return
		}
		if ids, err = holds.HeldIDs(ctx, level.SKU, 5000); err != nil {
			t.Fatal(err)
		}
		if level, confirmed, err = ledger.Snapshot(ctx, level.SKU, ids); err != nil {
			t.Fatal(err)
		}
	}
	t.Fatal("warm-up stale three times")
}
