package system_test

// Third adversarial review (identity, issue 10): each test reproduced a
// break on the code under review; they pass since the fixes (hashed user ids
// live in a namespace no raw claim enters; a client's replay of a HELD hold
// costs an attempt; the attempt bucket restarts its refill when Redis's
// clock steps back).

import (
	"crypto/sha256"
	"encoding/base32"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/testkit/testservices"
)

// hashedID is what httpapi's caller() makes of a claim that is not a valid
// id: "h:" and the lower-case base32 of the first 16 bytes of its SHA-256
// (the review found "u-…", a namespace a raw claim could enter).
func hashedID(claim string) string {
	sum := sha256.Sum256([]byte(claim))
	return "h:" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(sum[:16]))
}

// TestReview3CraftedClaimIsNeverAnotherBuyer: the claim → user-id mapping is not
// injective. A claim that is a valid id is used as it is; any other claim is
// hashed into "u-…", which is itself a valid id.
//
//  1. Victim's token says sub "auth0|victim" (not a valid id) → buyer
//     hashedID("auth0|victim"); the victim reserves.
//  2. Attacker holds a token whose claim is literally that "u-…" string (a
//     username-style claim, HOLDFAST_USER_CLAIM, the attacker chose).
//  3. The attacker's GET and DELETE of the victim's reservation answer 200:
//     the attacker IS the victim to holdfast (reads, cancels, uses up the
//     victim's per-user limit and attempt bucket).
func TestReview3CraftedClaimIsNeverAnotherBuyer(t *testing.T) {
	s := newStack(t)
	sku := testservices.Name("collide")
	s.setStock(sku, 10)
	const victim = "auth0|victim"
	code, b := s.callAs(victim, "POST", "/reservations", `{"sku":"`+sku+`","qty":2}`, nil)
	if code != http.StatusAccepted {
		t.Fatalf("victim's reserve = %d %v", code, b)
	}
	id := b["reservation_id"].(string)
	attacker := hashedID(victim) // a distinct claim value, chosen by the attacker
	if code, b := s.callAs(attacker, "GET", "/reservations/"+id, "", nil); code != http.StatusNotFound {
		t.Errorf("attacker (claim %q) GET of %q's reservation = %d %v, want 404 (another buyer's)", attacker, victim, code, b)
	}
	if code, b := s.callAs(attacker, "DELETE", "/reservations/"+id, "", nil); code != http.StatusNotFound {
		t.Errorf("attacker DELETE of the victim's reservation = %d %v, want 404", code, b)
	}
	if code, b := s.callAs(victim, "GET", "/reservations/"+id, "", nil); code != http.StatusOK || b["status"] != "HELD" {
		t.Errorf("victim's reservation after the attack = %d %v, want HELD", code, b)
	}
}

// TestReview3KeyedReplaysAreMetered: a replay of a keyed
// request whose hold is still HELD costs no attempt token (reserve.lua
// answers REPLAY before the bucket) and yet re-sends the reservation to SQS
// every time (Service.Reserve). One account can therefore put unbounded
// duplicate messages on the shared persist queue.
//
//  1. Per-user rate 1/s, burst 1. The bot reserves once with
//     Idempotency-Key K (202; its one token is spent).
//  2. Before persist gets to it (a flash-sale backlog), the bot replays the
//     same request 30 times: every one is 202, none is 429.
//  3. The reservation queue holds 31 messages for one reservation: each
//     costs a persist invocation and delays other buyers' confirms (whose
//     holds the sweeper cancels at the deadline), the crowding-out the
//     attempt limit is there to prevent.
func TestReview3KeyedReplaysAreMetered(t *testing.T) {
	s := newStack(t, withVars(map[string]string{"HOLDFAST_USER_RATE": "1", "HOLDFAST_USER_BURST": "1"}))
	sku := testservices.Name("replay")
	s.setStock(sku, 10)
	h := map[string]string{"Idempotency-Key": "k-1"}
	body := `{"sku":"` + sku + `","qty":1}`
	if code, b := s.callAs("bot", "POST", "/reservations", body, h); code != http.StatusAccepted {
		t.Fatalf("first = %d %v", code, b)
	}
	limited := 0
	for range 30 {
		code, b := s.callAs("bot", "POST", "/reservations", body, h)
		switch code {
		case http.StatusAccepted:
		case http.StatusTooManyRequests:
			limited++
		default:
			t.Fatalf("replay = %d %v", code, b)
		}
	}
	time.Sleep(200 * time.Millisecond)
	depth := s.queueDepth(s.queues.URL)
	if depth > 2 {
		t.Errorf("one account's one reservation put %d messages on the persist queue (%d of 30 replays rate-limited) with an attempt budget of 1/s, burst 1", depth, limited)
	}
}

// TestReview3RetryAfterHoldsAfterRedisClockStepsBack: the bucket keeps its
// last take time 'at'; when Redis's clock is behind it (an NTP step, a
// failover to a node whose clock lags), reserve.lua refills nothing
// (max(0, now-at)) but computes Retry-After from the tokens alone.
//
//  1. Rate 1/s, burst 1. An honest buyer reserves (its token spent, at = T).
//  2. Redis's clock steps back 30 s.
//  3. The buyer's next attempt is 429 Retry-After: 1; it waits 1 s and is
//     429 again, and so on for the whole 30 s of skew (the bucket key's TTL,
//     on the same clock, lasts as long): the Retry-After promise is broken
//     and the buyer is locked out for as long as the clock was stepped.
func TestReview3RetryAfterHoldsAfterRedisClockStepsBack(t *testing.T) {
	s := newStack(t, withVars(map[string]string{"HOLDFAST_USER_RATE": "1", "HOLDFAST_USER_BURST": "1"}))
	sku := testservices.Name("skew")
	s.setStock(sku, 10)
	body := `{"sku":"` + sku + `","qty":1}`
	if code, b := s.callAs("ann", "POST", "/reservations", body, nil); code != http.StatusAccepted {
		t.Fatalf("first = %d %v", code, b)
	}
	s.clock.Advance(-30 * time.Second)
	resp, err := s.api.Handle(t.Context(), apiRequest("ann", "POST", "/reservations", body, nil))
	if err != nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("second = %d %v", resp.StatusCode, err)
	}
	wait, _ := strconv.Atoi(resp.Headers["Retry-After"])
	s.clock.Advance(time.Duration(wait) * time.Second)
	if code, b := s.callAs("ann", "POST", "/reservations", body, nil); code != http.StatusAccepted {
		t.Errorf("after waiting Retry-After (%d s) = %d %v, want 202", wait, code, b)
	}
}
