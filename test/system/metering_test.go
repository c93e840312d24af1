package system_test

// One buyer cannot slow anybody else (issue 20, part 2): every buyer write is
// metered per buyer and SKU, one attempt costs one token whatever the bucket
// layout, and what an attempt over the rate or a probe of a made-up SKU
// costs MySQL is counted on the real MariaDB (docs/design.md, threat model).

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/testkit/testservices"
)

// meteredStack is a stack whose buyers may make burst attempts per SKU and
// one a second after that (the test clock does not move by itself, so no
// token comes back unless a test moves it), with at most maxOpen open
// groups per buyer and SKU (0: no cap).
func meteredStack(t *testing.T, burst, maxOpen int) *stack {
	return newStack(t, withVars(map[string]string{
		"HOLDFAST_USER_RATE":       "1",
		"HOLDFAST_USER_BURST":      strconv.Itoa(burst),
		"HOLDFAST_MAX_OPEN_GROUPS": strconv.Itoa(maxOpen),
	}))
}

// answer is one API answer with its headers.
type answer struct {
	code    int
	body    map[string]any
	headers map[string]string
}

// send sends one request as user through the API handler.
func (s *stack) send(user, method, path, body string, headers map[string]string) answer {
	s.t.Helper()
	resp, err := s.api.Handle(context.Background(), apiRequest(user, method, path, body, headers))
	if err != nil {
		s.t.Fatalf("%s %s: handler error %v", method, path, err)
	}
	a := answer{code: resp.StatusCode, headers: resp.Headers}
	if err := json.Unmarshal([]byte(resp.Body), &a.body); err != nil {
		s.t.Fatalf("%s %s: body %q is not JSON: %v", method, path, resp.Body, err)
	}
	return a
}

// openGroup asks for a group of capacity slots on sku as user.
func (s *stack) openGroup(user, sku string, capacity, ttlSeconds int) answer {
	s.t.Helper()
	return s.send(user, "POST", "/groups", fmt.Sprintf(`{"sku":%q,"capacity":%d,"ttl_seconds":%d}`, sku, capacity, ttlSeconds), nil)
}

// groupRows counts sku's groups in MySQL.
func (s *stack) groupRows(sku string) int {
	s.t.Helper()
	var n int
	if err := s.db.QueryRow(`SELECT COUNT(*) FROM group_buys WHERE sku = ?`, sku).Scan(&n); err != nil {
		s.t.Fatal(err)
	}
	return n
}

// questions is MariaDB's count of the statements it executed, server-wide.
func (s *stack) questions() int64 {
	s.t.Helper()
	var name string
	var n int64
	if err := s.db.QueryRow(`SHOW GLOBAL STATUS LIKE 'Questions'`).Scan(&name, &n); err != nil {
		s.t.Fatal(err)
	}
	return n
}

// statements runs f up to runs times and returns the fewest statements
// MariaDB executed during one run (the reading of the counter itself left
// out). The counter is the server's: other tests on the same server only add
// to it, so the least of a few runs bounds what f itself cost; it stops at
// the first run that costs at most enough.
func (s *stack) statements(runs int, enough int64, f func()) int64 {
	s.t.Helper()
	best := int64(-1)
	for range runs {
		before := s.questions()
		f()
		n := s.questions() - before - 1 // the second SHOW counts itself
		if best < 0 || n < best {
			best = n
		}
		if best <= enough {
			break
		}
	}
	return best
}

func TestMetering(t *testing.T) {
	t.Run("opening groups past the buyer's rate is 429 with Retry-After and writes nothing to MySQL", func(t *testing.T) {
		s := meteredStack(t, 3, 0)
		sku := testservices.Name("grouprate")
		s.createSKU(sku, 10, 1)
		for i := range 3 {
			if a := s.openGroup("opener", sku, 2, 600); a.code != http.StatusCreated {
				t.Fatalf("group %d within the burst = %d %v, want 201", i+1, a.code, a.body)
			}
		}
		for i := range 20 {
			a := s.openGroup("opener", sku, 2, 600)
			if a.code != http.StatusTooManyRequests || a.body["error"] != "rate_limited" || a.headers["Retry-After"] == "" {
				t.Fatalf("group %d past the burst = %d %v (Retry-After %q), want 429 rate_limited with Retry-After",
					4+i, a.code, a.body, a.headers["Retry-After"])
			}
		}
		if n := s.groupRows(sku); n != 3 {
			t.Errorf("MySQL has %d groups of the SKU, want the 3 created (a refused create writes nothing)", n)
		}
		if a := s.openGroup("other", sku, 2, 600); a.code != http.StatusCreated {
			t.Errorf("another buyer's group = %d %v, want 201: the rate is per buyer", a.code, a.body)
		}
	})

	t.Run("a buyer holds at most the configured open groups per SKU until they end", func(t *testing.T) {
		s := meteredStack(t, 100, 2)
		sku, other := testservices.Name("groupcap"), testservices.Name("groupcap2")
		s.createSKU(sku, 10, 3)
		s.createSKU(other, 10, 1)
		for i := range 2 {
			if a := s.openGroup("hoarder", sku, 2, 30); a.code != http.StatusCreated {
				t.Fatalf("group %d within the cap = %d %v, want 201", i+1, a.code, a.body)
			}
		}
		a := s.openGroup("hoarder", sku, 2, 30)
		if a.code != http.StatusTooManyRequests || a.body["error"] != "too_many_groups" || a.headers["Retry-After"] == "" {
			t.Fatalf("a third open group = %d %v (Retry-After %q), want 429 too_many_groups with Retry-After", a.code, a.body, a.headers["Retry-After"])
		}
		if n := s.groupRows(sku); n != 2 {
			t.Errorf("MySQL has %d groups of the SKU, want 2 (the refused one writes nothing)", n)
		}
		if a := s.openGroup("neighbour", sku, 2, 30); a.code != http.StatusCreated {
			t.Errorf("another buyer's group = %d %v, want 201: the cap is per buyer", a.code, a.body)
		}
		if a := s.openGroup("hoarder", other, 2, 30); a.code != http.StatusCreated {
			t.Errorf("the buyer's group on another SKU = %d %v, want 201: the cap is per SKU", a.code, a.body)
		}
		// A group counts until the sweeper may have ended it: its deadline,
		// one sweep period and the grace.
		s.clock.Advance(30*time.Second + time.Minute + 2*time.Second + time.Millisecond)
		if a := s.openGroup("hoarder", sku, 2, 30); a.code != http.StatusCreated {
			t.Errorf("a group after the first ones ended = %d %v, want 201", a.code, a.body)
		}
	})

	t.Run("joins and buys draw on one budget per buyer and SKU over K buckets", func(t *testing.T) {
		const burst, k = 4, 3
		s := meteredStack(t, burst, 0)
		sku := testservices.Name("mixed")
		s.createSKU(sku, 100, k)
		buyer := userIn("mixer", 1, k) // home bucket 1; joins are held in bucket 0
		var groups []string
		for range 2 * burst {
			a := s.openGroup("host-"+strconv.Itoa(len(groups)), sku, 2, 600)
			if a.code != http.StatusCreated {
				t.Fatalf("open group = %d %v", a.code, a.body)
			}
			groups = append(groups, a.body["group_id"].(string))
		}
		served := 0
		for i := range 2 * burst {
			body := fmt.Sprintf(`{"sku":%q,"qty":1}`, sku)
			if i%2 == 1 {
				body = fmt.Sprintf(`{"sku":%q,"qty":1,"group_id":%q}`, sku, groups[i])
			}
			a := s.send(buyer, "POST", "/reservations", body, nil)
			switch a.code {
			case http.StatusAccepted:
				served++
			case http.StatusTooManyRequests:
			default:
				t.Fatalf("attempt %d = %d %v, want 202 or 429", i+1, a.code, a.body)
			}
		}
		if served != burst {
			t.Errorf("a buyer mixing buys and joins was served %d of %d attempts in one burst, want exactly the burst %d", served, 2*burst, burst)
		}
	})

	t.Run("a burst within the budget is served right after the buyer's bucket was warmed", func(t *testing.T) {
		const burst, k = 3, 3
		s := meteredStack(t, burst, 0)
		sku := testservices.Name("warmrate")
		s.createSKU(sku, 100, k)
		buyer := userIn("warm", 2, k) // bucket 2 is cold: the first request warms it, then refills it
		for i := range burst {
			if code, body := s.reserve(sku, buyer, 1, ""); code != http.StatusAccepted {
				t.Fatalf("attempt %d of a burst of %d = %d %v, want 202", i+1, burst, code, body)
			}
		}
		if code, body := s.reserve(sku, buyer, 1, ""); code != http.StatusTooManyRequests {
			t.Errorf("attempt %d past the burst = %d %v, want 429", burst+1, code, body)
		}
		// The same after Redis lost a warm bucket (a failover): one attempt, one token.
		buyer2 := userIn("rewarm", 0, k)
		if err := s.rdb.Del(context.Background(), "hf:{"+sku+"}:stock").Err(); err != nil {
			t.Fatal(err)
		}
		for i := range burst {
			if code, body := s.reserve(sku, buyer2, 1, ""); code != http.StatusAccepted {
				t.Fatalf("attempt %d of a burst of %d after Redis lost the bucket = %d %v, want 202", i+1, burst, code, body)
			}
		}
	})

	t.Run("a keyed join over the rate reads nothing from MySQL", func(t *testing.T) {
		s := meteredStack(t, 1, 0)
		sku := testservices.Name("keyedjoin")
		s.createSKU(sku, 100, 1)
		g := s.openGroup("host", sku, 50, 600)
		if g.code != http.StatusCreated {
			t.Fatalf("open group = %d %v", g.code, g.body)
		}
		gid := g.body["group_id"].(string)
		join := func(key string) answer {
			return s.send("joiner", "POST", "/reservations", fmt.Sprintf(`{"sku":%q,"qty":1,"group_id":%q}`, sku, gid),
				map[string]string{"Idempotency-Key": key})
		}
		if a := join("first"); a.code != http.StatusAccepted {
			t.Fatalf("the first join = %d %v, want 202", a.code, a.body)
		}
		const n = 50
		round := 0
		cost := s.statements(5, 0, func() {
			round++
			for i := range n {
				if a := join(fmt.Sprintf("r%d-%d", round, i)); a.code != http.StatusTooManyRequests {
					t.Fatalf("keyed join over the rate = %d %v, want 429", a.code, a.body)
				}
			}
		})
		t.Logf("%d keyed joins over the rate: %d MySQL statements", n, cost)
		if cost > 0 {
			t.Errorf("%d keyed joins over the rate cost MySQL %d statements, want none", n, cost)
		}
	})

	t.Run("probes of unknown SKUs cost at most 0.1 MySQL statements each", func(t *testing.T) {
		s := newStack(t)
		sku := testservices.Name("nosuch")
		probe := func() {
			if code, body := s.reserve(sku, "prober", 1, ""); code != http.StatusNotFound || body["error"] != "unknown_sku" {
				t.Fatalf("reserve of an unknown SKU = %d %v, want 404 unknown_sku", code, body)
			}
		}
		const n = 200
		cost := s.statements(5, n/10, func() {
			for range n {
				probe()
			}
		})
		t.Logf("%d probes of an unknown SKU: %d MySQL statements", n, cost)
		if cost > n/10 {
			t.Errorf("%d probes of an unknown SKU cost MySQL %d statements, want at most %d", n, cost, n/10)
		}
		if cost := s.statements(5, n/10, func() {
			for range n {
				if a := s.openGroup("prober", sku, 2, 60); a.code != http.StatusNotFound {
					t.Fatalf("POST /groups of an unknown SKU = %d %v, want 404", a.code, a.body)
				}
			}
		}); cost > n/10 {
			t.Errorf("%d group opens on an unknown SKU cost MySQL %d statements, want at most %d", n, cost, n/10)
		}
		// Another instance remembered the SKU as unknown too.
		clock := &testClock{now: s.clock.Now()}
		twin := s.twin(clock, nil)
		if _, err := twin.Available(context.Background(), sku); err == nil {
			t.Fatal("the other instance found the unknown SKU")
		}
		// The admin creates it through this instance: buyable here at once ...
		s.createSKU(sku, 5, 1)
		if code, body := s.reserve(sku, "buyer", 1, ""); code != http.StatusAccepted {
			t.Errorf("reserve right after the admin created the SKU = %d %v, want 202", code, body)
		}
		// ... and on the other instance within the unknown-SKU memory's 2 s.
		clock.Advance(2 * time.Second)
		if n, err := twin.Available(context.Background(), sku); err != nil || n != 4 {
			t.Errorf("the other instance 2 s after the SKU was created: %d, %v; want 4 units", n, err)
		}
	})

	t.Run("cancels past the buyer's rate are 429 with Retry-After and read nothing from MySQL", func(t *testing.T) {
		// A hostile-client review of make dev sent 18,346 DELETEs of one
		// cancelled reservation from one account in 5 s: each read MySQL.
		s := meteredStack(t, 3, 0)
		sku := testservices.Name("cancelrate")
		s.createSKU(sku, 10, 1)
		code, body := s.reserve(sku, "canceller", 1, "") // token 1
		if code != http.StatusAccepted {
			t.Fatalf("reserve = %d %v, want 202", code, body)
		}
		id := body["reservation_id"].(string)
		path := "/reservations/" + id
		if a := s.send("canceller", "DELETE", path, "", nil); a.code != http.StatusOK || a.body["status"] != "CANCELLED" { // token 2
			t.Fatalf("the buyer's cancel within the budget = %d %v, want 200 CANCELLED", a.code, a.body)
		}
		if a := s.send("intruder", "DELETE", path, "", nil); a.code != http.StatusNotFound || a.body["error"] != "not_found" {
			t.Errorf("another buyer's cancel of it = %d %v, want 404 not_found", a.code, a.body)
		}
		if a := s.send("canceller", "DELETE", path, "", nil); a.code != http.StatusOK { // token 3
			t.Fatalf("a repeated cancel within the budget = %d %v, want 200", a.code, a.body)
		}
		const n = 50
		cost := s.statements(5, 0, func() {
			for i := range n {
				a := s.send("canceller", "DELETE", path, "", nil)
				if a.code != http.StatusTooManyRequests || a.body["error"] != "rate_limited" || a.headers["Retry-After"] == "" {
					t.Fatalf("cancel %d past the burst = %d %v (Retry-After %q), want 429 rate_limited with Retry-After",
						4+i, a.code, a.body, a.headers["Retry-After"])
				}
			}
		})
		t.Logf("%d cancels over the rate: %d MySQL statements", n, cost)
		if cost > 0 {
			t.Errorf("%d cancels over the rate cost MySQL %d statements, want none", n, cost)
		}
		// The intruder spent their own budget, not the buyer's.
		for range 2 {
			s.send("intruder", "DELETE", path, "", nil)
		}
		if a := s.send("intruder", "DELETE", path, "", nil); a.code != http.StatusTooManyRequests {
			t.Errorf("another buyer's cancel past their own burst = %d %v, want 429", a.code, a.body)
		}
		s.clock.Advance(time.Second)
		if a := s.send("canceller", "DELETE", path, "", nil); a.code != http.StatusOK || a.body["status"] != "CANCELLED" {
			t.Errorf("the buyer's cancel a token later = %d %v, want 200 CANCELLED", a.code, a.body)
		}
	})

	t.Run("reads and cancels of ids naming unknown SKUs cost at most 0.1 MySQL statements each", func(t *testing.T) {
		s := newStack(t)
		id := testservices.Name("nosuch") + ".aaaaaaaaaaaaaaaaaaaaaaaaaa"
		const n = 200
		for _, method := range []string{"GET", "DELETE"} {
			cost := s.statements(5, n/10, func() {
				for range n {
					if a := s.send("prober", method, "/reservations/"+id, "", nil); a.code != http.StatusNotFound || a.body["error"] != "not_found" {
						t.Fatalf("%s of an id naming an unknown SKU = %d %v, want 404 not_found", method, a.code, a.body)
					}
				}
			})
			t.Logf("%d %s probes of an id naming an unknown SKU: %d MySQL statements", n, method, cost)
			if cost > n/10 {
				t.Errorf("%d %s probes of an id naming an unknown SKU cost MySQL %d statements, want at most %d", n, method, cost, n/10)
			}
		}
	})

	t.Run("reads of an unknown group cost at most 0.1 MySQL statements each", func(t *testing.T) {
		s := newStack(t)
		gid := "g-aaaaaaaaaaaaaaaaaaaaaaaaaa"
		const n = 200
		cost := s.statements(5, n/10, func() {
			for range n {
				if a := s.send("prober", "GET", "/groups/"+gid, "", nil); a.code != http.StatusNotFound || a.body["error"] != "unknown_group" {
					t.Fatalf("GET of an unknown group = %d %v, want 404 unknown_group", a.code, a.body)
				}
			}
		})
		t.Logf("%d probes of an unknown group: %d MySQL statements", n, cost)
		if cost > n/10 {
			t.Errorf("%d probes of an unknown group cost MySQL %d statements, want at most %d", n, cost, n/10)
		}
		// A group opened on another instance is visible here at once.
		sku := testservices.Name("seen")
		s.createSKU(sku, 10, 1)
		g, err := s.twin(s.clock, nil).CreateGroup(context.Background(), "host", sku, 2, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if a := s.send("prober", "GET", "/groups/"+g.ID, "", nil); a.code != http.StatusOK || a.body["status"] != "OPEN" {
			t.Errorf("GET of a group another instance just opened = %d %v, want 200 OPEN", a.code, a.body)
		}
	})

	// A bot hammering one SKU from one account is held to its attempt rate: past
	// the burst it gets 429 with Retry-After and holds nothing, while another
	// buyer still gets stock; the per-user limit holds throughout.
	t.Run("a bot over the attempt rate gets 429 while others buy", func(t *testing.T) {
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
	})

	// Replays of a keyed request whose hold is still HELD cost an attempt each:
	// one account cannot put unbounded duplicates of its reservation on the
	// persist queue.
	//
	// Found by the third review, of identity (issue 10) (was
	// TestReview3KeyedReplaysAreMetered), which saw this:
	//
	// A replay of a keyed request whose hold is still HELD costs no attempt
	// token (reserve.lua answers REPLAY before the bucket) and yet re-sends the
	// reservation to SQS every time (Service.Reserve). One account can therefore
	// put unbounded duplicate messages on the shared persist queue.
	//
	//  1. Per-user rate 1/s, burst 1. The bot reserves once with
	//     Idempotency-Key K (202; its one token is spent).
	//  2. Before persist gets to it (a flash-sale backlog), the bot replays the
	//     same request 30 times: every one is 202, none is 429.
	//  3. The reservation queue holds 31 messages for one reservation: each
	//     costs a persist invocation and delays other buyers' confirms (whose
	//     holds the sweeper cancels at the deadline), the crowding-out the
	//     attempt limit is there to prevent.
	t.Run("replays of a held keyed request are metered", func(t *testing.T) {
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
	})

	// Replays of a decided keyed buy are metered like any buyer write: past the
	// buyer's attempt budget they are 429.
	//
	// Found by the fifth adversarial review of issue 20 (was
	// TestReplaysOfADecidedKeyedBuyAreMetered), which saw this:
	//
	// A buyer's attempt budget is 3 (rate 1/s, the clock still). They reserve
	// with a key (1 attempt); the reservation is persisted (CONFIRMED, Redis
	// follows). Then they POST the same request again and again. reserve.lua
	// answers REPLAY of a decided hold without charge() (it charges only a
	// replay of a HELD hold), and Reserve returns the row (200) — so these buyer
	// writes are never metered: one account can hammer the SKU's Redis shard
	// (the hot SKU's, shared by every buyer of it) with script calls at any
	// rate. Expected (rules: every buyer write is metered per buyer per SKU):
	// 429 after the budget is spent. Observed: every replay answered 200.
	t.Run("replays of a decided keyed buy are metered", func(t *testing.T) {
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
	})

	// Retry-After holds after Redis's clock steps back: the attempt budget
	// restarts its refill, so a buyer who waits as told is served.
	//
	// Found by the third review, of identity (issue 10) (was
	// TestReview3RetryAfterHoldsAfterRedisClockStepsBack), which saw this:
	//
	// The bucket keeps its last take time 'at'; when Redis's clock is behind it
	// (an NTP step, a failover to a node whose clock lags), reserve.lua refills
	// nothing (max(0, now-at)) but computes Retry-After from the tokens alone.
	//
	//  1. Rate 1/s, burst 1. An honest buyer reserves (its token spent, at = T).
	//  2. Redis's clock steps back 30 s.
	//  3. The buyer's next attempt is 429 Retry-After: 1; it waits 1 s and is
	//     429 again, and so on for the whole 30 s of skew (the bucket key's TTL,
	//     on the same clock, lasts as long): the Retry-After promise is broken
	//     and the buyer is locked out for as long as the clock was stepped.
	t.Run("Retry-After holds after Redis's clock steps back", func(t *testing.T) {
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
	})
}
