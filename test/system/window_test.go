package system_test

// The sale window (issue 23, part 1) on the real stores: refused before it
// opens and after it closes by Redis's clock (the scripts' test clock here),
// each refusal an attempt like any other; a hold taken inside it settles as
// usual; a change applies at once in every bucket; the sweeper warms a SKU
// before it opens, so its first buyer reads nothing from MySQL.

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/reservation"
)

// stamp writes a window bound as the admin sends it.
func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// setWindow sets sku's sale window ("" clears a bound) and requires 200.
func (s *stack) setWindow(sku, opens, closes string) {
	s.t.Helper()
	body := fmt.Sprintf(`{"add":0,"opens_at":%q,"closes_at":%q}`, opens, closes)
	if code, b := s.call("PUT", "/admin/skus/"+sku+"/stock", body, nil); code != http.StatusOK {
		s.t.Fatalf("PUT %s %s = %d %v, want 200", sku, body, code, b)
	}
}

func TestWindow(t *testing.T) {
	t.Run("before opens_at a buy or join is 409 not_open with opens_at and Retry-After, charged like any attempt", func(t *testing.T) {
		s := meteredStack(t, 3, 0)
		sku := testservices.Name("notopen")
		s.createSKU(sku, 10, 1)
		opens := s.clock.Now().Add(90*time.Second + 300*time.Millisecond)
		s.setWindow(sku, stamp(opens), "")
		g := s.openGroup("host", sku, 2, 3600)
		if g.code != http.StatusCreated {
			t.Fatalf("a group before opening = %d %v, want 201 (the window is for buys and joins)", g.code, g.body)
		}
		for i, body := range []string{
			fmt.Sprintf(`{"sku":%q,"qty":1}`, sku),
			fmt.Sprintf(`{"sku":%q,"qty":1,"group_id":%q}`, sku, g.body["group_id"]),
			fmt.Sprintf(`{"sku":%q,"qty":2}`, sku),
		} {
			a := s.send("early", "POST", "/reservations", body, nil)
			if a.code != http.StatusConflict || a.body["error"] != "not_open" || a.body["opens_at"] != stamp(opens) || a.headers["Retry-After"] != "91" {
				t.Fatalf("attempt %d before opening = %d %v (Retry-After %q), want 409 not_open at %s, Retry-After 91",
					i+1, a.code, a.body, a.headers["Retry-After"], stamp(opens))
			}
		}
		// The burst of 3 went on the refusals: the fourth is over the rate.
		if a := s.send("early", "POST", "/reservations", fmt.Sprintf(`{"sku":%q,"qty":1}`, sku), nil); a.code != http.StatusTooManyRequests {
			t.Fatalf("a fourth attempt before opening = %d %v, want 429: each refusal cost a token", a.code, a.body)
		}
		if a, h := s.redisStock(sku); a != 10 || h != 0 || s.mysqlAvailable(sku) != 10 {
			t.Errorf("after the refusals: redis %d held %d, mysql %d; want 10, 0, 10", a, h, s.mysqlAvailable(sku))
		}
		s.clock.Advance(opens.Sub(s.clock.Now()))
		if a := s.send("early", "POST", "/reservations", fmt.Sprintf(`{"sku":%q,"qty":1}`, sku), nil); a.code != http.StatusAccepted {
			t.Errorf("at opens_at = %d %v, want 202", a.code, a.body)
		}
	})

	t.Run("after closes_at a buy is 409 sale_closed; a hold taken before settles as usual and its replay answers it", func(t *testing.T) {
		p := newPromise(t)
		sku := testservices.Name("closing")
		p.createSKU(sku, 5, 0)
		closes := p.clock.Now().Add(10 * time.Second)
		p.setWindow(sku, "", stamp(closes))
		id := p.reserved(sku, "ann", 2, "ann-1")
		p.clock.Advance(10 * time.Second)
		if code, body := p.reserve(sku, "bob", 1, ""); code != http.StatusConflict || body["error"] != "sale_closed" {
			t.Fatalf("a buy at closes_at = %d %v, want 409 sale_closed", code, body)
		}
		if code, body := p.reserve(sku, "ann", 2, "ann-1"); code != http.StatusAccepted || body["reservation_id"] != id {
			t.Fatalf("the replay of a hold taken before the close = %d %v, want 202 %s", code, body, id)
		}
		p.persistMsgs(id)
		p.wantStatus(id, reservation.StatusConfirmed, "")
		p.wantStores("settled after the close", sku, 3, 0, 3)
		if code, body := p.reserve(sku, "ann", 2, "ann-1"); code != http.StatusOK || body["status"] != "CONFIRMED" {
			t.Errorf("the replay once decided = %d %v, want 200 CONFIRMED", code, body)
		}
	})

	t.Run("a window changed mid-sale applies at the next reserve in every bucket", func(t *testing.T) {
		s := newStack(t)
		sku := testservices.Name("moved")
		s.createSKU(sku, 300, 3)
		users := map[int]string{} // a buyer at home in each bucket
		for i := 0; len(users) < 3; i++ {
			u := "buyer-" + strconv.Itoa(i)
			if _, ok := users[reservation.HomeBucket(u, "", 3)]; !ok {
				users[reservation.HomeBucket(u, "", 3)] = u
			}
		}
		buy := func(b int) (int, map[string]any) { return s.reserve(sku, users[b], 1, "") }
		for b := range 3 {
			if code, body := buy(b); code != http.StatusAccepted {
				t.Fatalf("bucket %d's buyer with no window = %d %v", b, code, body)
			}
		}
		s.setWindow(sku, "", stamp(s.clock.Now()))
		for b := range 3 {
			if code, body := buy(b); code != http.StatusConflict || body["error"] != "sale_closed" {
				t.Errorf("bucket %d's buyer once the sale was closed = %d %v, want 409 sale_closed", b, code, body)
			}
		}
		s.setWindow(sku, stamp(s.clock.Now().Add(time.Minute)), "")
		for b := range 3 {
			if code, body := buy(b); code != http.StatusConflict || body["error"] != "not_open" {
				t.Errorf("bucket %d's buyer once the opening moved ahead = %d %v, want 409 not_open", b, code, body)
			}
		}
		s.setWindow(sku, "", "")
		for b := range 3 {
			if code, body := buy(b); code != http.StatusAccepted {
				t.Errorf("bucket %d's buyer once the window was cleared = %d %v, want 202", b, code, body)
			}
		}
	})

	t.Run("GET /skus/{sku} shows the window and the server's time", func(t *testing.T) {
		s := newStack(t)
		sku := testservices.Name("countdown")
		s.createSKU(sku, 5, 1)
		opens, closes := s.clock.Now().Add(time.Hour), s.clock.Now().Add(2*time.Hour)
		s.setWindow(sku, stamp(opens), stamp(closes))
		code, body := s.call("GET", "/skus/"+sku, "", nil)
		if code != http.StatusOK || body["opens_at"] != stamp(opens) || body["closes_at"] != stamp(closes) || body["server_time"] != stamp(s.clock.Now()) {
			t.Errorf("GET /skus = %d %v, want opens_at %s, closes_at %s, server_time %s (Redis's clock)",
				code, body, stamp(opens), stamp(closes), stamp(s.clock.Now()))
		}
	})

	t.Run("a bad window is 400 naming the bound and changes nothing", func(t *testing.T) {
		s := newStack(t)
		sku := testservices.Name("badwindow")
		s.createSKU(sku, 5, 1)
		opens := s.clock.Now().Add(time.Hour)
		s.setWindow(sku, stamp(opens), "")
		version := func() float64 {
			_, b := s.call("GET", "/admin/skus/"+sku+"/stock", "", nil)
			return b["version"].(float64)
		}
		v := version()
		for _, c := range []struct{ body, names string }{
			{fmt.Sprintf(`{"add":1,"closes_at":%q}`, stamp(opens.Add(-time.Second))), "closes_at"},
			{fmt.Sprintf(`{"add":1,"opens_at":%q,"closes_at":%q}`, stamp(opens), stamp(opens)), "closes_at"},
			{`{"add":1,"opens_at":"next monday"}`, "opens_at"},
			{`{"add":1,"closes_at":"1969-12-31T23:59:59Z"}`, "closes_at"},
		} {
			code, b := s.call("PUT", "/admin/skus/"+sku+"/stock", c.body, nil)
			if msg, _ := b["message"].(string); code != http.StatusBadRequest || b["error"] != "invalid_request" || !strings.Contains(msg, c.names) {
				t.Errorf("PUT %s = %d %v, want 400 invalid_request naming %s", c.body, code, b, c.names)
			}
		}
		if v2 := version(); v2 != v || s.mysqlAvailable(sku) != 5 {
			t.Errorf("after the refused changes: version %v (was %v), %d units; want nothing changed", v2, v, s.mysqlAvailable(sku))
		}
	})

	// The sweeper warms a SKU whose sale opens within HOLDFAST_WARM_LEAD
	// (2 minutes here, the default), so the first request after opening
	// finds Redis warm: counted on MariaDB's own statement counter, the
	// least of a few runs (other packages' tests share the server).
	t.Run("after the sweeper's warm-up the first request after opening reads nothing from MySQL", func(t *testing.T) {
		s := newStack(t)
		opening := func(i int) string {
			sku := testservices.Name(fmt.Sprintf("opening%d", i))
			s.createSKU(sku, 100, 1)
			opens := s.clock.Now().Add(11 * time.Minute)
			s.setWindow(sku, stamp(opens), "")
			s.clock.Advance(10 * time.Minute) // the change's live mark passes
			if rep := s.sweep(); rep.Unmarked < 1 {
				t.Fatalf("sweep after the mark passed = %+v, want the mark ended", rep)
			}
			(&promise{stack: s}).loseSKU(sku) // a failover lost it
			rep := s.sweep()
			if rep.OpeningSKUs != 1 || rep.Warmed != 1 {
				t.Fatalf("the sweep a minute before opening = %+v, want the opening SKU warmed by the opening pass", rep)
			}
			s.clock.Advance(opens.Sub(s.clock.Now()))
			return sku
		}
		best := int64(-1)
		for run := range 5 {
			sku := opening(run)
			before := s.questions()
			code, body := s.reserve(sku, "first", 1, "")
			n := s.questions() - before - 1 // the second SHOW counts itself
			if code != http.StatusAccepted {
				t.Fatalf("the first buy after opening = %d %v, want 202", code, body)
			}
			if best < 0 || n < best {
				best = n
			}
			if best == 0 {
				break
			}
		}
		t.Logf("the first request after opening: %d MySQL statements", best)
		if best != 0 {
			t.Errorf("the first request after opening cost MySQL %d statements, want none", best)
		}
		// Without the warm-up the same request reads MySQL: the count sees it.
		sku := testservices.Name("cold")
		s.createSKU(sku, 100, 1)
		(&promise{stack: s}).loseSKU(sku)
		before := s.questions()
		if code, body := s.reserve(sku, "first", 1, ""); code != http.StatusAccepted {
			t.Fatalf("a buy of a SKU Redis lost = %d %v, want 202", code, body)
		}
		if n := s.questions() - before - 1; n == 0 {
			t.Errorf("a buy that warmed a SKU cost MySQL no statement: the count cannot see a warm-up")
		}
	})
}
