package system_test

// Adversarial review (review2) of the attempt budget: requests that reach
// Redis or MySQL without being charged.

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/holdfast/holdfast/internal/testkit/testservices"
)

// A buyer whose home bucket is not bucket 0 joins a group with key K (held in
// bucket 0, charged one attempt at home). She then sends a storm of keyed
// buys with the same key K and no group: the id is the same, the hold has
// another group, so each is an idempotency mismatch. The change says a
// mismatch "is now charged like any attempt (a storm of them was free)", but
// on K > 1 crossBucketMismatch reads bucket 0 and answers 422 before any
// script charges: the storm is never 429, and afterwards her budget is
// untouched.
func TestReview2CrossBucketMismatchStormIsFree(t *testing.T) {
	const burst, k = 3, 3
	s := meteredStack(t, burst, 0)
	sku := testservices.Name("rv2mm")
	s.createSKU(sku, 100, k)
	g := s.openGroup("host", sku, 50, 600)
	if g.code != http.StatusCreated {
		t.Fatalf("open group = %d %v", g.code, g.body)
	}
	gid := g.body["group_id"].(string)
	buyer := userIn("storm", 1, k)
	if a := s.send(buyer, "POST", "/reservations", fmt.Sprintf(`{"sku":%q,"qty":1,"group_id":%q}`, sku, gid),
		map[string]string{"Idempotency-Key": "K"}); a.code != http.StatusAccepted {
		t.Fatalf("keyed join = %d %v, want 202", a.code, a.body)
	}
	const n = 20
	codes := map[int]int{}
	for range n {
		a := s.send(buyer, "POST", "/reservations", fmt.Sprintf(`{"sku":%q,"qty":1}`, sku), map[string]string{"Idempotency-Key": "K"})
		codes[a.code]++
	}
	if codes[http.StatusTooManyRequests] == 0 {
		t.Errorf("%d mismatching keyed buys (same key as a join, no group) on K=%d answered %v: none was 429, "+
			"so none was charged (burst %d, one spent on the join)", n, k, codes, burst)
	}
	// Her budget is untouched: two fresh buys still go through.
	served := 0
	for range burst {
		if a := s.send(buyer, "POST", "/reservations", fmt.Sprintf(`{"sku":%q,"qty":1}`, sku), nil); a.code == http.StatusAccepted {
			served++
		}
	}
	if served == burst-1 {
		t.Errorf("after the storm the buyer was still served %d fresh buys (all her budget but the join's): the storm of %d cost her nothing", served, n)
	}
}
