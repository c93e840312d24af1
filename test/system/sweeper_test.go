package system_test

// What the sweeper promises: every hold past its deadline and the grace is
// decided, at a cost that follows the sale, and reconciliation heals a drift
// without counting a pending release.

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/holdfast/holdfast/internal/testkit/invariant"
	"github.com/holdfast/holdfast/internal/testkit/testservices"
)

// seedCatalog inserts n SKUs straight into MySQL (none in Redis, none
// marked live), named prefix-00000 onwards, with stock each.
func (s *stack) seedCatalog(prefix string, n, stock int) {
	s.t.Helper()
	for start := 0; start < n; start += 1000 {
		var b strings.Builder
		args := make([]any, 0, 2000)
		b.WriteString("INSERT INTO product_stock (sku, available) VALUES ")
		for i := start; i < min(n, start+1000); i++ {
			if i > start {
				b.WriteString(",")
			}
			b.WriteString("(?,?)")
			args = append(args, fmt.Sprintf("%s-%05d", prefix, i), stock)
		}
		if _, err := s.db.Exec(b.String(), args...); err != nil {
			s.t.Fatalf("seed catalog: %v", err)
		}
	}
}

// TestSweeper: the sweeper decides every expired hold and heals drift once.
func TestSweeper(t *testing.T) {
	// A hold whose message was lost is released by the sweeper once its deadline
	// passes.
	t.Run("a hold whose message was lost is released once its deadline passes", func(t *testing.T) {
		s := newStack(t, withEnqueuer(lostEnqueuer{}))
		sku := testservices.Name("lost")
		s.setStock(sku, 7)
		_, body := s.reserve(sku, "frank", 2, "")
		id := body["reservation_id"].(string)

		if rep := s.sweep(); rep.Released != 0 {
			t.Fatalf("sweep before the deadline released %d, want 0", rep.Released)
		}
		s.clock.Advance(59 * time.Second) // deadline (60s) not yet passed
		if rep := s.sweep(); rep.Released != 0 {
			t.Fatalf("sweep before the deadline released %d", rep.Released)
		}
		s.clock.Advance(2 * time.Second) // past the deadline, within the skew grace (2s)
		if rep := s.sweep(); rep.Released != 0 {
			t.Fatalf("sweep within the skew grace released %d", rep.Released)
		}
		s.clock.Advance(2 * time.Second)
		if rep := s.sweep(); rep.Released != 1 {
			t.Fatalf("sweep after the deadline released %d, want 1", rep.Released)
		}
		if avail, held := s.redisStock(sku); avail != 7 || held != 0 {
			t.Errorf("redis = %d/%d, want 7 available 0 held", avail, held)
		}
		if _, b := s.call("GET", "/reservations/"+id, "", nil); b["status"] != "CANCELLED" || b["reason"] != "expired" {
			t.Errorf("GET = %v, want CANCELLED expired", b)
		}
		if rep := s.sweep(); rep.Released != 0 {
			t.Errorf("second sweep released %d, want 0", rep.Released)
		}
		if ev := s.events(); len(ev) != 1 || ev[0].Detail.Reason != "expired" {
			t.Errorf("events = %+v, want one expired cancellation", ev)
		}
		if got := s.mysqlAvailable(sku); got != 7 {
			t.Errorf("mysql available = %d, want 7", got)
		}
	})

	// The sweeper's cost follows the sale: with a catalog of thousands of SKUs
	// and a catalog slice of 100, one sweep visits the SKUs buyers reserved
	// (marked live) plus 100 others, and still decides every expired hold on the
	// live SKUs at once. A hold whose SKU Redis no longer marks (the live set
	// was lost) is decided by the catalog pass within ceil(SKUs/100) sweeps.
	t.Run("a sweep's cost follows the sale", func(t *testing.T) {
		s := newStack(t, withVars(map[string]string{"HOLDFAST_SWEEP_CATALOG": "100"}))
		const catalog = 3000
		s.seedCatalog("cat", catalog, 5)
		var held []string
		for _, sku := range []string{"cat-00007", "cat-01500", "cat-02999"} {
			code, body := s.reserve(sku, "buyer-"+sku, 1, "")
			if code != 202 {
				t.Fatalf("reserve %s: %d %v", sku, code, body)
			}
			held = append(held, body["reservation_id"].(string))
		}
		s.clock.Advance(s.cfg.Protocol.HoldTTL + s.cfg.Protocol.SweepGrace + 1e9)
		rep := s.sweep()
		if rep.LiveSKUs != 3 || rep.SKUs > 3+100 {
			t.Errorf("one sweep visited %d SKUs (%d live), want the 3 live ones and at most 100 of the catalog", rep.SKUs, rep.LiveSKUs)
		}
		for _, id := range held {
			if got := s.count("SELECT COUNT(*) FROM reservations WHERE reservation_id = ? AND status = 'CANCELLED' AND reason = 'expired'", id); got != 1 {
				t.Errorf("%s: not decided expired by the first sweep after its deadline", id)
			}
		}

		// Redis forgets the live set: a new hold's SKU is reached by the catalog pass.
		code, body := s.reserve("cat-02500", "late-buyer", 1, "")
		if code != 202 {
			t.Fatalf("reserve: %d %v", code, body)
		}
		id := body["reservation_id"].(string)
		cfg, err := mysql.ParseDSN(s.cfg.DBDSN)
		if err != nil {
			t.Fatal(err)
		}
		if n, err := s.rdb.Del(context.Background(), "hf:{#sweep:"+cfg.DBName+"}:live").Result(); err != nil || n != 1 {
			t.Fatalf("drop the live set: %d %v", n, err)
		}
		s.clock.Advance(s.cfg.Protocol.HoldTTL + s.cfg.Protocol.SweepGrace + 1e9)
		bound := (catalog + 99) / 100
		sweeps := 0
		for sweeps < bound && s.count("SELECT COUNT(*) FROM reservations WHERE reservation_id = ?", id) == 0 {
			if rep := s.sweep(); rep.SKUs > 100 {
				t.Fatalf("a sweep with no live SKU visited %d, want at most 100", rep.SKUs)
			}
			sweeps++
		}
		if got := s.count("SELECT COUNT(*) FROM reservations WHERE reservation_id = ? AND status = 'CANCELLED'", id); got != 1 {
			t.Fatalf("the unmarked hold is undecided after %d sweeps, want decided within %d", sweeps, bound)
		}
		a, h := s.redisStock("cat-02500")
		if a != 5 || h != 0 {
			t.Errorf("cat-02500 in Redis: %d available, %d held, want 5 and 0", a, h)
		}
	})

	// A flood of reserves of made-up SKUs (each a 404) leaves no live marks, so
	// a SKU on sale stays in the sweep and its expired hold is decided by the
	// first sweep past its deadline.
	// Found by the review of issue 14's first increments (was
	// TestReview4MadeUpSKUsDoNotCrowdTheSweep).
	t.Run("reserves of made-up SKUs do not crowd a SKU on sale out of the sweep", func(t *testing.T) {
		s := newStack(t, withVars(map[string]string{"HOLDFAST_SWEEP_CATALOG": "10", "HOLDFAST_SWEEP_LIVE": "20"}))
		s.seedCatalog("shop", 300, 5)
		hot := "shop-00290"
		s.setStock(hot, 100)
		for i := range 200 {
			if code, body := s.reserve(fmt.Sprintf("zz-%05d", i), "mallory", 1, ""); code != http.StatusNotFound {
				t.Fatalf("reserve of a made-up sku: %d %v", code, body)
			}
		}
		code, body := s.reserve(hot, "ann", 1, "") // its message is lost: persist never runs
		if code != http.StatusAccepted {
			t.Fatalf("reserve %s: %d %v", hot, code, body)
		}
		id := body["reservation_id"].(string)
		s.clock.Advance(s.cfg.Protocol.HoldTTL + s.cfg.Protocol.SweepGrace + time.Second)
		rep := s.sweep()
		if rep.LiveSKUs != 1 {
			t.Errorf("the sweep visited %d live SKUs, want 1 (%s)", rep.LiveSKUs, hot)
		}
		if n := s.count(`SELECT COUNT(*) FROM reservations WHERE reservation_id = ?`, id); n != 1 {
			t.Errorf("the hold on %s is undecided after the first sweep past its deadline", hot)
		}
	})

	// Reconciliation must not count a refund twice. A refund commits in MySQL
	// while its Redis release fails, next to a real drift (sighted before the
	// refund, or only while the release is pending); once Redis is back, sweeps
	// across HOLDFAST_RECONCILE_AFTER both apply the release and heal the drift,
	// and Redis never ends above MySQL. Reasoned rather than reproduced: today
	// nothing re-applies the failed release, so this guards the repair that the
	// issue adds.
	t.Run("reconciliation waits for a pending release", func(t *testing.T) {
		for _, sightedFirst := range []bool{true, false} {
			t.Run(fmt.Sprintf("drift sighted before the refund=%v", sightedFirst), func(t *testing.T) {
				p := newPromiseBehindProxy(t, withVars(map[string]string{"HOLDFAST_RECONCILE_AFTER": "10s"}))
				sku := testservices.Name("pend")
				p.createSKU(sku, 10, 0)
				id := p.reserved(sku, "ann", 2, "")
				p.persistMsgs(id)
				p.wantStores("confirmed", sku, 8, 0, 8)
				p.rdb.DecrBy(context.Background(), "hf:{"+sku+"}:stock", 1) // a real drift of 1
				if sightedFirst {
					if rep := p.sweep(); rep.Healed != 0 {
						t.Fatalf("first sighting healed")
					}
				}

				p.proxy.Refuse(true)
				if code, b := p.call("DELETE", "/reservations/"+id, "", nil); code != http.StatusOK && code != http.StatusServiceUnavailable {
					t.Fatalf("DELETE with Redis down = %d %v, want 200 or 503", code, b)
				}
				p.proxy.Refuse(false)
				if got := p.mysqlAvailable(sku); got != 10 {
					t.Fatalf("mysql available = %d, want 10 (refunded)", got)
				}

				for i := range 4 {
					p.sweep()
					a, h := p.redisStock(sku)
					if m := p.mysqlAvailable(sku); a+h > m {
						t.Fatalf("sweep %d: redis available %d + held %d > mysql available %d: counted twice", i+1, a, h, m)
					}
					p.clock.Advance(11 * time.Second)
				}
				p.wantStores("settled", sku, 10, 0, 10)
				p.check(invariant.Expect{Sellable: map[string]int64{sku: 10}, Accepted: []string{id}, Quiescent: true})
			})
		}
	})
}
