package system_test

// A bucket that holds every reservation of its SKU answers keyed buys
// alone: docs/design.md, "A bucket that holds every id".

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/holdfast/holdfast/internal/testkit/faultproxy"
	"github.com/holdfast/holdfast/internal/testkit/invariant"
	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/reservation"
)

// A sold-out crowd with Idempotency-Keys (the shop page always sends one)
// costs MySQL nothing while Redis holds every reservation of the SKU (its
// bucket was warmed when MySQL had none): a keyed id Redis has no hold of
// has no row either. Once that may no longer be so (the retention may have
// taken a finished hold), every keyed refusal asks MySQL again; and after
// Redis lost the SKU, the warm-up finds MySQL's rows and a keyed replay is
// MySQL's answer, not a new hold or a refusal.
func TestAKeyedCrowdReadsNothingFromMySQLWhileRedisHoldsEveryReservation(t *testing.T) {
	var db *faultproxy.Proxy
	p := newPromise(t, withDBProxy(&db))
	sku := testservices.Name("whole")
	p.createSKU(sku, 1, 1)

	before := db.Sent()
	id := p.reserved(sku, "ann", 1, "k1")
	newHold := db.Sent() - before

	const crowd = 20
	refuse := func(key string) int64 {
		t.Helper()
		before := db.Sent()
		for i := range crowd {
			if code, b := p.reserve(sku, fmt.Sprintf("buyer%d", i), 1, key); code != http.StatusConflict || b["error"] != "sold_out" {
				t.Fatalf("buyer%d with key %s = %d %v, want 409 sold_out", i, key, code, b)
			}
		}
		return db.Sent() - before
	}
	whole := refuse("a")
	if code, b := p.reserve(sku, "ann", 1, "k1"); b["reservation_id"] != id || b["status"] != "HELD" {
		t.Fatalf("ann's replay = %d %v, want her hold %s", code, b, id)
	}
	// None of them asks (0 here); a read of something else meanwhile is no
	// failure, one read a request is.
	if newHold > 1 || 4*whole >= crowd {
		t.Errorf("MySQL got %d chunks for a keyed new hold and %d for %d keyed sold-out answers; want none of them to ask it",
			newHold, whole, crowd)
	}

	p.endWhole(sku) // the retention passes
	if asked := refuse("b"); asked < crowd {
		t.Errorf("MySQL got %d chunks for %d keyed sold-out answers once Redis may have forgotten holds; want each to ask it", asked, crowd)
	}

	p.persistMsgs(id)
	p.wantStatus(id, reservation.StatusConfirmed, "")
	p.loseSKU(sku)
	if code, b := p.reserve(sku, "ann", 1, "k1"); code != http.StatusOK || b["reservation_id"] != id || b["status"] != "CONFIRMED" {
		t.Errorf("ann's replay after Redis lost the SKU = %d %v, want 200 CONFIRMED %s (MySQL's row)", code, b, id)
	}
	p.check(invariant.Expect{Sellable: map[string]int64{sku: 1}, Accepted: []string{id}, Quiescent: true})
}

// An operator removed a SKU by hand (its stock rows in MySQL and its keys in
// Redis) and created one of the same name: MySQL still has the old SKU's
// reservation rows. The creation's warm-up is the new SKU's first, yet
// Redis does not hold every reservation of the name, so it must not say so
// (checkFirst finds a row): a keyed replay of the old reservation answers
// MySQL's row, not a new hold.
func TestACreationOverAHandRemovedSKUsRowsIsNotWhole(t *testing.T) {
	p := newPromise(t)
	sku := testservices.Name("wholegone")
	p.createSKU(sku, 2, 0)
	id := p.reserved(sku, "ann", 1, "k1")
	p.persistMsgs(id)
	p.wantStatus(id, reservation.StatusConfirmed, "")

	p.loseSKU(sku)
	for _, table := range []string{"product_stock", "stock_buckets"} {
		if _, err := p.db.ExecContext(context.Background(), "DELETE FROM "+table+" WHERE sku = ?", sku); err != nil {
			t.Fatal(err)
		}
	}
	p.createSKU(sku, 2, 0)
	if whole, err := p.rdb.HGet(context.Background(), "hf:{"+sku+"}:meta", "whole").Result(); err != nil || whole != "0" {
		t.Errorf("meta.whole after the creation's warm-up = %q %v, want 0: MySQL has a reservation row of the name", whole, err)
	}
	if code, b := p.reserve(sku, "ann", 1, "k1"); code != http.StatusOK || b["reservation_id"] != id || b["status"] != "CONFIRMED" {
		t.Errorf("ann's keyed replay of the old SKU's reservation = %d %v, want 200 CONFIRMED %s (MySQL's row)", code, b, id)
	}
}
