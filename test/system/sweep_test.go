package system_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"
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

// The sweeper's cost follows the sale: with a catalog of thousands of SKUs
// and a catalog slice of 100, one sweep visits the SKUs buyers reserved
// (marked live) plus 100 others, and still decides every expired hold on the
// live SKUs at once. A hold whose SKU Redis no longer marks (the live set
// was lost) is decided by the catalog pass within ceil(SKUs/100) sweeps.
func TestSweepCostFollowsTheSale(t *testing.T) {
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
}
