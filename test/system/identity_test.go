package system_test

import (
	"net/http"
	"strconv"
	"testing"

	"github.com/holdfast/holdfast/internal/testkit/testservices"
)

// A buyer is who the verified token says: another buyer's reservation reads
// and cancels as unknown (404, nothing moves), a body naming someone else is
// refused, and a request without a token is 401.
func TestBuyersAreWhoTheirTokenSays(t *testing.T) {
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
}

// A bot hammering one SKU from one account is held to its attempt rate:
// past the burst it gets 429 with Retry-After and holds nothing, while
// another buyer still gets stock; the per-user limit holds throughout.
func TestBotOverTheAttemptRateGets429(t *testing.T) {
	s := newStack(t, withVars(map[string]string{"HOLDFAST_USER_RATE": "5", "HOLDFAST_USER_BURST": "10"}))
	sku := testservices.Name("bot")
	s.setStock(sku, 100)
	var accepted, limited int
	for range 15 {
		code, b := s.callAs("bot", "POST", "/reservations", `{"sku":"`+sku+`","qty":1}`, nil)
		switch code {
		case http.StatusAccepted:
			accepted++
		case http.StatusTooManyRequests:
			limited++
			if b["error"] != "rate_limited" {
				t.Errorf("429 body = %v", b)
			}
		default:
			t.Fatalf("bot attempt = %d %v", code, b)
		}
	}
	if accepted != 10 || limited != 5 {
		t.Errorf("bot: %d accepted, %d limited; want the burst (10) then 429s", accepted, limited)
	}
	if _, held := s.redisStock(sku); held != 10 {
		t.Errorf("held = %d, want 10 (a 429 holds nothing)", held)
	}
	resp, err := s.api.Handle(t.Context(), apiRequest("bot", "POST", "/reservations", `{"sku":"`+sku+`","qty":1}`, nil))
	if err != nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("bot again = %v %v", resp.StatusCode, err)
	}
	if n, _ := strconv.Atoi(resp.Headers["Retry-After"]); n < 1 {
		t.Errorf("Retry-After = %q, want whole seconds ≥ 1", resp.Headers["Retry-After"])
	}
	if code, b := s.callAs("ann", "POST", "/reservations", `{"sku":"`+sku+`","qty":1}`, nil); code != http.StatusAccepted {
		t.Errorf("another buyer during the bot's storm = %d %v, want 202", code, b)
	}
}
