package system_test

// Replays are answered as their first attempt and metered like it (found
// by the fifth adversarial review of issue 20; each test says what it saw).

import (
	"net/http"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/reservation"
)

// TestKeyedJoinReplayWhoseResendFailsIsNotAccepted: group of 2; u1 joins (202,
// persisted). u2's keyed join takes the last slot; its send fails (503, the
// hold waits for the retry). u2 retries with the same key as told; the
// retry replays the HELD hold and its re-send fails too. Reserve's
// "re-send of a replayed hold failed" branch returns the HELD hold as a
// success: u2 is told 202 — with no message sent and the hold never marked
// accepted. The group's slots were all taken before the deadline by joins
// told 202, yet u2's hold expires unmarked (follow.lua: never counted), its
// slot reopens and the sweeper fails the group, cancelling u1 (who did
// nothing) group_failed.
// Expected: the retry is 503 (outcome unknown) — or, if 202, the group forms.
func TestKeyedJoinReplayWhoseResendFailsIsNotAccepted(t *testing.T) {
	enq := &switchEnqueuer{}
	p := newPromise(t, withEnqueuer(enq))
	enq.rec = p.rec
	sku := testservices.Name("r7replay")
	p.createSKU(sku, 10, 0)
	gid := p.group(sku, 2, 30)
	m1 := p.joined(sku, gid, "u1")
	p.persistMsgs(m1)

	join := func() (int, map[string]any) { return p.joinKeyed(sku, gid, "u2", "k-u2") }
	enq.fail.Store(true)
	code1, body1 := join()
	code2, body2 := join() // the retry with the same key, as a 503 asks; its send fails too
	enq.fail.Store(false)
	t.Logf("u2's join = %d %v; its retry = %d %v", code1, body1, code2, body2)
	if code1 != http.StatusServiceUnavailable {
		t.Fatalf("u2's keyed join whose send fails = %d, want 503", code1)
	}
	if code2 == http.StatusAccepted {
		t.Errorf("u2's retry whose re-send failed was told 202 (HELD) although nothing was sent and the hold is not marked accepted")
	}
	t.Logf("redis group %v", p.redisGroup(sku, gid))
	p.clock.Advance(31 * time.Second)
	p.sweep()
	p.clock.Advance(2 * time.Minute) // past u2's hold TTL
	p.sweep()
	p.clock.Advance(2 * time.Minute)
	rep := p.sweep()
	st, members, _ := p.groupState(gid)
	t.Logf("after the deadline and the hold TTL: MySQL %s members %d; Redis %v; u1 %v; report %+v",
		st, members, p.redisGroup(sku, gid), p.status(m1), rep)
	if code2 == http.StatusAccepted {
		if st != "FORMED" {
			t.Errorf("a group whose 2 slots were taken in time by joins told 202 is %s", st)
		}
		if s, reason, _ := p.row(m1); s == string(reservation.StatusCancelled) && reason == string(reservation.ReasonGroupFailed) {
			t.Errorf("u1, who did nothing, was cancelled group_failed")
		}
	}
}

// TestReplaysOfADecidedKeyedBuyAreMetered: a buyer's attempt budget is 3
// (rate 1/s, the clock still). They reserve with a key (1 attempt); the
// reservation is persisted (CONFIRMED, Redis follows). Then they POST the
// same request again and again. reserve.lua answers REPLAY of a decided hold
// without charge() (it charges only a replay of a HELD hold), and Reserve
// returns the row (200) — so these buyer writes are never metered: one
// account can hammer the SKU's Redis shard (the hot SKU's, shared by every
// buyer of it) with script calls at any rate.
// Expected (rules: every buyer write is metered per buyer per SKU): 429
// after the budget is spent. Observed: every replay answered 200.
func TestReplaysOfADecidedKeyedBuyAreMetered(t *testing.T) {
	p := newPromise(t, withVars(map[string]string{"HOLDFAST_USER_RATE": "1", "HOLDFAST_USER_BURST": "3"}))
	sku := testservices.Name("r7meter")
	p.createSKU(sku, 10, 0)
	id := p.reserved(sku, "u1", 1, "k1")
	p.persistMsgs(id)
	codes := map[int]int{}
	for range 20 {
		code, _ := p.reserve(sku, "u1", 1, "k1")
		codes[code]++
	}
	t.Logf("20 replays of the decided keyed buy: %v", codes)
	if codes[http.StatusTooManyRequests] == 0 {
		t.Errorf("20 POSTs by one buyer with a budget of 3 were never metered: %v", codes)
	}
}
