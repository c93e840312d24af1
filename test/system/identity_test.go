package system_test

// Who a buyer is: the verified token says, no claim makes one buyer another,
// and ids compare byte for byte in both stores.

import (
	"context"
	"crypto/sha256"
	"encoding/base32"
	"net/http"
	"strings"
	"testing"

	"github.com/holdfast/holdfast/internal/testkit/invariant"
	"github.com/holdfast/holdfast/internal/testkit/testservices"
)

// hashedID is what httpapi's caller() makes of a claim that is not a valid
// id: "h:" and the lower-case base32 of the first 16 bytes of its SHA-256
// (the review found "u-…", a namespace a raw claim could enter).
func hashedID(claim string) string {
	sum := sha256.Sum256([]byte(claim))
	return "h:" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(sum[:16]))
}

// TestIdentity: a buyer is who their token says, and no one else.
func TestIdentity(t *testing.T) {
	// A buyer is who the verified token says: another buyer's reservation reads
	// and cancels as unknown (404, nothing moves), a body naming someone else is
	// refused, and a request without a token is 401.
	t.Run("a buyer is who their token says", func(t *testing.T) {
		s := newStack(t)
		sku := testservices.Name("who")
		s.setStock(sku, 10)
		code, b := s.callAs("ann", "POST", "/reservations", `{"sku":"`+sku+`","qty":2}`, nil)
		if code != http.StatusAccepted {
			t.Fatalf("ann's reserve = %d %v", code, b)
		}
		id := b["reservation_id"].(string)
		for _, m := range []string{"GET", "DELETE"} {
			if code, b := s.callAs("bob", m, "/reservations/"+id, "", nil); code != http.StatusNotFound || b["error"] != "not_found" {
				t.Errorf("bob's %s of ann's reservation = %d %v, want 404 not_found", m, code, b)
			}
		}
		if avail, held := s.redisStock(sku); avail != 8 || held != 2 {
			t.Errorf("redis = %d/%d after bob's attempts, want 8/2", avail, held)
		}
		if code, b := s.callAs("ann", "GET", "/reservations/"+id, "", nil); code != http.StatusOK || b["status"] != "HELD" {
			t.Errorf("ann's GET = %d %v", code, b)
		}
		if code, b := s.callAs("bob", "POST", "/reservations", `{"sku":"`+sku+`","qty":1,"user_id":"ann"}`, nil); code != http.StatusBadRequest || b["error"] != "user_mismatch" {
			t.Errorf("bob reserving as ann = %d %v, want 400 user_mismatch", code, b)
		}
		if code, b := s.callAs("", "POST", "/reservations", `{"sku":"`+sku+`","qty":1}`, nil); code != http.StatusUnauthorized {
			t.Errorf("no token = %d %v, want 401", code, b)
		}
		if avail, held := s.redisStock(sku); avail != 8 || held != 2 {
			t.Errorf("redis = %d/%d after refused requests, want 8/2", avail, held)
		}
	})

	// A claim that is literally another buyer's hashed id is a different buyer:
	// hashed ids live in a namespace no raw claim enters, so the attacker's GET
	// and DELETE of the victim's reservation are 404 and it stays HELD.
	//
	// Found by the third review, of identity (issue 10) (was
	// TestReview3CraftedClaimIsNeverAnotherBuyer), which saw this:
	//
	// The claim → user-id mapping is not injective. A claim that is a valid id
	// is used as it is; any other claim is hashed into "u-…", which is itself a
	// valid id.
	//
	//  1. Victim's token says sub "auth0|victim" (not a valid id) → buyer
	//     hashedID("auth0|victim"); the victim reserves.
	//  2. Attacker holds a token whose claim is literally that "u-…" string (a
	//     username-style claim, HOLDFAST_USER_CLAIM, the attacker chose).
	//  3. The attacker's GET and DELETE of the victim's reservation answer 200:
	//     the attacker IS the victim to holdfast (reads, cancels, uses up the
	//     victim's per-user limit and attempt budget).
	t.Run("a crafted claim is never another buyer", func(t *testing.T) {
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
	})

	// Ids compare byte for byte in both stores: a case variant of a SKU is an
	// unknown SKU with no Redis figure of its own, and "Ann" and "ann" are two
	// users in both.
	//
	// Found by the first review, of issue 9's first part (was
	// TestReviewIDsAreCaseSensitiveInBothStores), which saw this:
	//
	// MySQL compared SKUs case-insensitively (utf8mb4_unicode_ci), Redis keys do
	// not. A reserve of the lower-cased spelling of "Rv_Mixed..." warmed a
	// second Redis SKU from the same MySQL row (10 + 9 units for MySQL's 10),
	// and its hold was never decided (the sweeper walks MySQL's spelling only).
	// Ids now compare byte for byte in both stores (migration 0004): the variant
	// is an unknown SKU, and "Ann" and "ann" are two users in both.
	t.Run("ids are case-sensitive in both stores", func(t *testing.T) {
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
	})
}
