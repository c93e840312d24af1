package system_test

// Second adversarial review: each test reproduced a sequence of ordinary
// operations (or a single ordinary fault) that broke holdfast's promise on
// the code under review (issue 9 after the first review); they pass since the
// fixes (a group forms only once an accepted join fills it and MySQL has no
// member's cancellation on its way to Redis; a confirm whose hold Redis lost
// takes its units from a stock warmed before it; a stray neither stalls a
// warm-up nor the sweep).

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
	"github.com/holdfast/holdfast/shared/reservation"
)

// failUsers records every message like recordingEnqueuer, except those of
// the listed users, whose send fails (an SQS outage for that one request).
type failUsers struct {
	next  *recordingEnqueuer
	users map[string]bool
}

func (f failUsers) Enqueue(ctx context.Context, r reservation.Reservation) error {
	if f.users[r.UserID] {
		return reservation.Unavailable("sqs send", errors.New("injected: connection reset"))
	}
	return f.next.Enqueue(ctx, r)
}

// groupState reads a group's status and member count from MySQL.
func (p *promise) groupState(gid string) (status string, members, capacity int64) {
	p.t.Helper()
	if err := p.db.QueryRow(`SELECT status, members, capacity FROM group_buys WHERE group_id = ?`, gid).Scan(&status, &members, &capacity); err != nil {
		p.t.Fatalf("group %s: %v", gid, err)
	}
	return status, members, capacity
}

// TestReview2FailedJoinDoesNotFormGroup: a join that is answered 503 (its SQS send
// failed, the reservation is fenced CANCELLED publish_failed and "nothing is
// held") still forms the group when it took the last slot.
//
//  1. group of 2; u1 joins (202);
//  2. u2 joins, reserve.lua takes the last slot (FORMED in Redis, FormGroup
//     records FORMED in MySQL), the send fails, the hold is fenced and
//     released — but follow.lua returns the slot only to an OPEN group;
//  3. u3 now gets 409 group_full; at the deadline the group stays FORMED
//     with 1 member of 2 and never fails.
//
// Promised: a 503 holds nothing, a group forms only when its capacity is
// reached, an unfilled group fails and returns all its stock. Observed: a
// group "formed" by a join that never happened, with a slot nobody can take.
func TestReview2FailedJoinDoesNotFormGroup(t *testing.T) {
	p := &promise{rec: &recordingEnqueuer{}}
	p.stack = newStack(t, withEnqueuer(failUsers{next: p.rec, users: map[string]bool{"u2": true}}))
	sku := testservices.Name("r2form")
	p.createSKU(sku, 10, 0)
	gid := p.group(sku, 2, 30)
	m1 := p.joined(sku, gid, "u1")
	if code, b := p.join(sku, gid, "u2"); code != http.StatusServiceUnavailable {
		t.Fatalf("join of u2 with a failing send = %d %v, want 503", code, b)
	}
	_, g := p.call("GET", "/groups/"+gid, "", nil)
	code, b := p.join(sku, gid, "u3")
	accepted := []string{m1}
	if code == http.StatusAccepted {
		accepted = append(accepted, b["reservation_id"].(string))
	}
	p.persistMsgs(accepted...)
	p.clock.Advance(40 * time.Second)
	p.sweep()
	st, members, capacity := p.groupState(gid)
	if code != http.StatusAccepted || (st == "FORMED" && members < capacity) {
		t.Errorf("after u2's join failed (503): GET /groups = %v; u3's join = %d %v; at the deadline the group is %s with %d of %d members — "+
			"want the failed join to free its slot (u3 202) and a group FORMED only when full (or FAILED with its stock returned)",
			g, code, b, st, members, capacity)
	}
	p.check(invariant.Expect{Sellable: map[string]int64{sku: 10}, Accepted: accepted, Quiescent: true})
}

// TestReview2ReleaseBeforeFormationReopensTheSlot: a member cancels
// before the group formed, but Redis follows the refund late (a Redis blip
// during the DELETE: the release waits in the outbox for the sweeper).
//
//  1. group of 2; u1 joins and is confirmed (MySQL members 1, OPEN);
//  2. u1's DELETE refunds in MySQL (members 0) while Redis is unreachable: 200;
//  3. before the next sweep, u2 joins: Redis still counts u1's slot, so u2's
//     join takes the "last" slot: FORMED in Redis and in MySQL (members 0);
//  4. the sweeper drains the release: the group is FORMED, the slot stays taken.
//
// Promised (design.md, Groups): before formation a released or refunded
// member's slot reopens; the group forms when its last slot is taken.
// Observed: the group is FORMED for good with 1 member of 2 — formed by a
// member who had cancelled before it formed — and no one can join.
func TestReview2ReleaseBeforeFormationReopensTheSlot(t *testing.T) {
	p := newPromiseBehindProxy(t)
	sku := testservices.Name("r2pend")
	p.createSKU(sku, 10, 0)
	gid := p.group(sku, 2, 60)
	m1 := p.joined(sku, gid, "u1")
	p.persistMsgs(m1)

	p.proxy.Refuse(true)
	code, b := p.call("DELETE", "/reservations/"+m1, "", nil)
	p.proxy.Refuse(false)
	if code != http.StatusOK || b["status"] != "CANCELLED" {
		t.Fatalf("DELETE of u1 with Redis down = %d %v, want 200 CANCELLED (MySQL refunded)", code, b)
	}
	m2 := p.joined(sku, gid, "u2") // u1 cancelled: u2 is the group's only member
	p.persistMsgs(m2)
	p.clock.Advance(5 * time.Second)
	p.sweep() // the release reaches Redis

	_, g := p.call("GET", "/groups/"+gid, "", nil)
	code3, b3 := p.join(sku, gid, "u3")
	accepted := []string{m1, m2}
	if code3 == http.StatusAccepted {
		accepted = append(accepted, b3["reservation_id"].(string))
		p.persistMsgs(b3["reservation_id"].(string))
	}
	st, members, capacity := p.groupState(gid)
	if st == "FORMED" && members < capacity && code3 != http.StatusAccepted {
		t.Errorf("u1 cancelled before anyone else joined, then u2 joined: MySQL group %s with %d of %d members, GET /groups = %v, "+
			"u3's join = %d %v; want the group OPEN with one free slot (u3 202)", st, members, capacity, g, code3, b3)
	}
	p.check(invariant.Expect{Sellable: map[string]int64{sku: 10}, Accepted: accepted, Quiescent: false})
}

// TestReview2ConfirmOfHoldLostWithSKUIsDeductedOnce: Redis loses a SKU (a
// failover to an empty node, a flush) while a reservation's message is in
// flight. The next request warms the SKU from MySQL, which has not taken
// the reservation yet; then persist confirms it. MySQL takes the 2 units,
// follow.lua finds no hold and writes a tombstone — Redis never takes them:
//
//	ann holds 2 of 10; Redis loses the SKU; GET /skus warms it (10);
//	persist confirms ann: MySQL 8, Redis 10 (counted twice: sold in MySQL,
//	sellable in Redis); 10 buyers are told 202, 2 of them are cancelled
//	insufficient_stock.
//
// Promised: MySQL decides every unit that moves in both stores exactly
// once. The confirm carries the commit's version and Redis records the
// level it was warmed from (meta.wver): a confirm newer than that level,
// whose hold Redis lost, must be deducted (the refund path already does
// the mirror image with refund_version). Reconciliation repairs it only
// after HOLDFAST_RECONCILE_AFTER of a sale with no live hold.
func TestReview2ConfirmOfHoldLostWithSKUIsDeductedOnce(t *testing.T) {
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

// TestReview2StrayDoesNotBlockWarmUpOrSweep: one stray hold and a missing
// stock key deadlock a SKU — no sale, no sweep, for good.
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
func TestReview2StrayDoesNotBlockWarmUpOrSweep(t *testing.T) {
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
}
