package system_test

// What a warm-up promises: a SKU Redis lost is warmed from MySQL by the next
// request, and nothing that lands during the warm-up (a refund, a duplicate
// delivery, a confirm of a lost hold, a stray hold) is counted twice or blocks it.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/testkit/faultproxy"
	"github.com/holdfast/holdfast/internal/testkit/invariant"
	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/adapters/mysqlstore"
	"github.com/holdfast/holdfast/shared/adapters/redisstore"
	"github.com/holdfast/holdfast/shared/reservation"
)

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

// switchSend records messages, or fails every send while failing is set.
type switchSend struct {
	next    *recordingEnqueuer
	failing *atomic.Bool
}

func (s switchSend) Enqueue(ctx context.Context, r reservation.Reservation) error {
	if s.failing.Load() {
		return reservation.Unavailable("sqs send", errors.New("injected: connection reset"))
	}
	return s.next.Enqueue(ctx, r)
}

// TestWarmUp: a warm-up counts every unit once.
func TestWarmUp(t *testing.T) {
	// Redis loses a SKU's stock key and the sweeper warms it from MySQL while a
	// MySQL-first change is not yet in Redis. The warm-up must count every unit
	// once: at quiescence Redis available + held equals MySQL available, with no
	// heal needed.
	//
	//   - A hold persisted but not yet confirmed in Redis (the key is lost in the
	//     window between persist's commit and its Redis confirm): counted once
	//     by MySQL's deduction and once more as held, it would leave Redis short.
	//   - A refund committed in MySQL whose Redis release failed: warmed from
	//     MySQL's refunded figure and then released again, it would leave Redis
	//     above MySQL. Reasoned rather than reproduced: today nothing re-applies
	//     the failed release, so this guards the repair that the issue adds.
	t.Run("a warm-up does not overcount", func(t *testing.T) {
		t.Run("hold persisted, not yet confirmed", func(t *testing.T) {
			var p *promise
			var annID atomic.Value
			var fired atomic.Bool
			hooks := reservation.Hooks{AfterCommit: func(r reservation.Reservation) error {
				if r.ID != annID.Load() || !fired.CompareAndSwap(false, true) {
					return nil
				}
				// MySQL took ann's units; Redis still shows her hold HELD. The
				// stock key is lost now and the sweeper warms the SKU.
				p.rdb.Del(context.Background(), "hf:{"+r.SKU+"}:stock")
				if rep := p.sweep(); rep.Warmed != 1 {
					p.t.Errorf("sweep in the window warmed %d SKUs, want 1", rep.Warmed)
				}
				return nil
			}}
			p = newPromise(t, withHooks(hooks))
			sku := testservices.Name("warm")
			p.createSKU(sku, 10, 0)
			ann := p.reserved(sku, "ann", 2, "")
			annID.Store(ann)
			bob := p.reserved(sku, "bob", 3, "")
			p.wantStores("both held", sku, 5, 5, 10)

			p.persistMsgs(ann)
			if !fired.Load() {
				t.Fatal("the stock key was never lost between commit and confirm")
			}
			p.persistMsgs(bob)
			healed := p.sweep().Healed
			p.wantAgree("both persisted, one sweep", sku, 5)
			for range 3 {
				p.clock.Advance(2 * time.Minute) // well past HOLDFAST_RECONCILE_AFTER (50 s)
				healed += p.sweep().Healed
			}
			if healed != 0 {
				t.Errorf("reconciliation healed %d times, want 0: the warm-up must not need a heal", healed)
			}
			p.wantStores("quiescent", sku, 5, 0, 5)
			p.check(invariant.Expect{Sellable: map[string]int64{sku: 10}, Accepted: []string{ann, bob}, Quiescent: true})
		})
		t.Run("refund not yet released", func(t *testing.T) {
			p := newPromiseBehindProxy(t)
			sku := testservices.Name("warmref")
			p.createSKU(sku, 10, 0)
			id := p.reserved(sku, "ann", 2, "")
			p.persistMsgs(id)
			p.wantStores("confirmed", sku, 8, 0, 8)

			p.proxy.Refuse(true)
			if code, b := p.call("DELETE", "/reservations/"+id, "", nil); code != http.StatusOK && code != http.StatusServiceUnavailable {
				t.Fatalf("DELETE with Redis down = %d %v, want 200 or 503", code, b)
			}
			p.proxy.Refuse(false)
			p.rdb.Del(context.Background(), "hf:{"+sku+"}:stock")

			healed := 0
			for i := range 4 {
				healed += p.sweep().Healed
				a, h := p.redisStock(sku)
				if m := p.mysqlAvailable(sku); a+h > m {
					t.Fatalf("sweep %d: redis available %d + held %d > mysql available %d: the refund counted twice", i+1, a, h, m)
				}
				p.clock.Advance(time.Minute) // past the grace, then past HOLDFAST_RECONCILE_AFTER
			}
			if healed != 0 {
				t.Errorf("reconciliation healed %d times, want 0", healed)
			}
			p.wantStores("quiescent", sku, 10, 0, 10)
			p.check(invariant.Expect{Sellable: map[string]int64{sku: 10}, Accepted: []string{id}, Quiescent: true})
		})
	})

	// A refund that lands between a warm-up's read of MySQL and its script is
	// counted once: one sweep later both stores agree on 10.
	//
	// Found by the first review, of issue 9's first part (was
	// TestReviewRefundDuringWarmUpCountsOnce), which saw this:
	//
	// Redis lost a SKU's stock key (a failover, or the runbook's repair: "delete
	// hf:{sku}:stock and the next request warms it"). A request warms the SKU
	// (Service.warm: HeldIDs, then MySQL's Snapshot, then warm.lua). Between the
	// snapshot and warm.lua, a buyer cancels a CONFIRMED reservation of 2 units:
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
	t.Run("a refund during a warm-up counts once", func(t *testing.T) {
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
	})

	// A duplicate delivery whose follow runs while a warm-up is under way counts
	// the reservation once: one sweep later both stores agree on 8.
	//
	// Found by the first review, of issue 9's first part (was
	// TestReviewDuplicateDeliveryDuringWarmUpCountsOnce), which saw this:
	//
	// The warm-up's guard against a confirm it did not see (meta.cver) is set by
	// follow.lua only when *its* call turns a HELD hold CONFIRMED and carries a
	// version. SQS delivers at least once, and two persist invocations can run
	// the same message at once:
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
	t.Run("a duplicate delivery during a warm-up counts once", func(t *testing.T) {
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
	})

	// A confirm of a hold Redis lost with its SKU, landing after the SKU was
	// warmed from MySQL, is deducted from the warmed stock once: both stores
	// agree, and no buyer is told 202 for a unit MySQL cannot honour.
	//
	// Found by the second review, of issue 9 (was
	// TestReview2ConfirmOfHoldLostWithSKUIsDeductedOnce), which saw this:
	//
	// Redis loses a SKU (a failover to an empty node, a flush) while a
	// reservation's message is in flight. The next request warms the SKU from
	// MySQL, which has not taken the reservation yet; then persist confirms it.
	// MySQL takes the 2 units, follow.lua finds no hold and writes a tombstone —
	// Redis never takes them:
	//
	// 	ann holds 2 of 10; Redis loses the SKU; GET /skus warms it (10);
	// 	persist confirms ann: MySQL 8, Redis 10 (counted twice: sold in MySQL,
	// 	sellable in Redis); 10 buyers are told 202, 2 of them are cancelled
	// 	insufficient_stock.
	//
	// Promised: MySQL decides every unit that moves in both stores exactly
	// once. The confirm carries the commit's version and Redis records the
	// level it was warmed from (meta.wver): a confirm newer than that level,
	// whose hold Redis lost, must be deducted (the refund path already does
	// the mirror image with refund_version). Reconciliation repairs it only
	// after HOLDFAST_RECONCILE_AFTER of a sale with no live hold.
	t.Run("a confirm of a hold lost with its SKU is deducted once from the warmed stock", func(t *testing.T) {
		p := newPromise(t)
		sku := testservices.Name("r2lost")
		p.createSKU(sku, 10, 0)
		ann := p.reserved(sku, "ann", 2, "")
		p.loseSKU(sku)
		if code, b := p.call("GET", "/skus/"+sku, "", nil); code != http.StatusOK || b["available"] != float64(10) {
			t.Fatalf("GET /skus after the loss = %d %v, want 200 with 10 (warmed from MySQL)", code, b)
		}
		p.persistMsgs(ann)
		p.clock.Advance(5 * time.Second)
		p.sweep()
		a, h := p.redisStock(sku)
		m := p.mysqlAvailable(sku)
		var ids []string
		for i := range 10 {
			code, b := p.reserve(sku, fmt.Sprintf("b%d", i), 1, "")
			if code == http.StatusAccepted {
				ids = append(ids, b["reservation_id"].(string))
			}
		}
		p.persistMsgs(ids...)
		cancelled := p.count(`SELECT COUNT(*) FROM reservations WHERE sku = ? AND reason = 'insufficient_stock'`, sku)
		if a+h != m || cancelled != 0 {
			t.Errorf("after ann's confirm: Redis available %d + held %d, MySQL %d; then %d buyers told 202, %d of them cancelled insufficient_stock; "+
				"want Redis to follow the confirm (8) and no 202 MySQL cannot honour", a, h, m, len(ids), cancelled)
		}
	})

	// A stray hold (a keyed retry during a MySQL outage) and a lost stock key
	// block neither the warm-up nor the sweep: past its deadline the stray is
	// expired, the SKU is warmed and it sells again.
	//
	// Found by the second review, of issue 9 (was
	// TestReview2StrayDoesNotBlockWarmUpOrSweep), which saw this:
	//
	// One stray hold and a missing stock key deadlock a SKU — no sale, no sweep,
	// for good.
	//
	//  1. ann reserves with key k, confirmed; a day later Redis forgot the
	//     finished hold (retention);
	//  2. ann retries with k during a MySQL outage: Redis takes a stray hold
	//     (documented fallback) and the send fails too: 503, "retry with the
	//     same key" (her retry once MySQL is back answers the row and touches
	//     no Redis key);
	//  3. the stock key is lost (failover, or the runbook: "delete
	//     hf:{sku}:stock and the next request warms it").
	//
	// warm.lua answers stale for as long as a listed hold is CONFIRMED in MySQL
	// under another token (the stray), so every warm-up fails; sweepSKU returns
	// on that error before it decides expired holds, so the stray — the only
	// thing that could unblock the warm-up — is never expired. Every reserve of
	// the SKU is 503, every sweep errors, with MySQL and Redis both up.
	// Promised: every hold decided within hold TTL + grace + a sweep; a SKU Redis
	// lost is warmed by the next request.
	t.Run("a stray hold blocks neither the warm-up nor the sweep", func(t *testing.T) {
		var db *faultproxy.Proxy
		var failing atomic.Bool
		p := &promise{rec: &recordingEnqueuer{}}
		p.stack = newStack(t, withEnqueuer(switchSend{next: p.rec, failing: &failing}), withDBProxy(&db))
		sku := testservices.Name("r2stray")
		p.createSKU(sku, 10, 0)
		ann := p.reserved(sku, "ann", 1, "k")
		p.persistMsgs(ann)
		p.forgetHold(sku, ann)

		db.Refuse(true)
		failing.Store(true)
		code, b := p.reserve(sku, "ann", 1, "k")
		failing.Store(false)
		db.Refuse(false)
		if code != http.StatusServiceUnavailable {
			t.Fatalf("retry with k during the outage = %d %v, want 503", code, b)
		}
		if code, b := p.reserve(sku, "ann", 1, "k"); code != http.StatusOK || b["status"] != "CONFIRMED" {
			t.Fatalf("retry with k after the outage = %d %v, want 200 CONFIRMED", code, b)
		}
		p.rdb.Del(context.Background(), "hf:{"+sku+"}:stock")

		p.clock.Advance(2 * time.Minute) // past the stray's deadline (60 s) and the grace
		var rep reservation.SweepReport
		for range 3 {
			rep = p.sweep()
			p.clock.Advance(time.Minute)
		}
		code, b = p.reserve(sku, "bob", 1, "")
		if code != http.StatusAccepted {
			t.Errorf("after 3 sweeps past every deadline: last sweep %+v; bob's reserve = %d %v; want the stray expired, the SKU warmed and 202", rep, code, b)
		}
	})
}
