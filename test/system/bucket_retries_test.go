package system_test

// Keyed retries across a raise of K: what the buyer is told. Found by a
// hostile-client session against make dev (issue 22's review, December
// 2026); each subtest failed on the code it was written against.

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/reservation"
)

func TestBucketKeyedRetries(t *testing.T) {
	// K raised while a keyed hold is HELD: the buyer's keyed retry lands in
	// the new home bucket and is held there again (a twin, documented). When
	// persist gets both copies in one batch it confirms the first and returns
	// the twin, but it follows the twin with the message (status HELD), not
	// the row: follow.lua writes a CANCELLED tombstone in the twin's bucket.
	// From then on every keyed retry of the CONFIRMED reservation answers
	// 200 CANCELLED (seen on make dev: retry said CANCELLED, GET and MySQL
	// CONFIRMED).
	t.Run("a keyed retry of a twin confirmed in one batch answers the row, not CANCELLED", func(t *testing.T) {
		p := newPromise(t)
		sku := testservices.Name("twin")
		p.createSKU(sku, 10, 0)
		var bob string
		for i := 0; bob == ""; i++ {
			if u := fmt.Sprintf("bob-%d", i); reservation.HomeBucket(u, "", 3) != 0 {
				bob = u
			}
		}
		id := p.reserved(sku, bob, 1, "k1")
		_, lvl := p.call("GET", "/admin/skus/"+sku+"/stock", "", nil)
		h := map[string]string{"If-Match": fmt.Sprintf(`"%d"`, int(lvl["version"].(float64)))}
		if code, body := p.call("PUT", "/admin/skus/"+sku+"/stock", `{"stock":10,"buckets":3}`, h); code != http.StatusOK {
			t.Fatalf("raise K = %d %v", code, body)
		}
		if again := p.reserved(sku, bob, 1, "k1"); again != id {
			t.Fatalf("keyed retry got id %s, want %s", again, id)
		}
		p.rec.mu.Lock()
		var twins []reservation.Reservation
		for _, m := range p.rec.msgs {
			if m.ID == id {
				twins = append(twins, m)
			}
		}
		p.rec.mu.Unlock()
		if len(twins) != 2 || twins[0].Bucket == twins[1].Bucket {
			t.Fatalf("want two copies of %s in two buckets, got %+v", id, twins)
		}
		p.deliverBatch(twins...) // one SQS batch, as make dev's event source delivered them
		p.wantStatus(id, reservation.StatusConfirmed, "")
		code, body := p.reserve(sku, bob, 1, "k1")
		if code != http.StatusOK || body["status"] != string(reservation.StatusConfirmed) {
			t.Errorf("keyed retry after persist = %d %v, want 200 CONFIRMED (MySQL confirmed it)", code, body)
		}
		_, view := p.call("GET", "/admin/skus/"+sku+"/stock", "", nil)
		if view["mysql_available"].(float64) != 9 || view["redis_available"].(float64) != 9 || view["held"].(float64) != 0 {
			t.Errorf("stock view %v, want 9 available in both stores, 0 held", view)
		}
	})

	// A keyed reservation confirmed at K = 1, K raised, the buyer's keyed
	// retry answered from their new home bucket (a stray taken there and
	// returned, a CONFIRMED tombstone of the row left in its place), then the
	// buyer's refund: its follow lands in the row's own bucket (0), and the
	// tombstone in the new home still says CONFIRMED. A keyed retry routed
	// there must answer the row, CANCELLED, not the stale tombstone for the
	// day it is retained. Found by a hostile-client review (December 2026).
	t.Run("a keyed retry after a refund answers CANCELLED from a bucket K's raise made home", func(t *testing.T) {
		p := newPromise(t)
		sku := testservices.Name("stale")
		p.createSKU(sku, 10, 0)
		bob := userIn("bob", 2, 3)
		id := p.reserved(sku, bob, 1, "k1")
		p.persistMsgs(id)
		p.wantStatus(id, reservation.StatusConfirmed, "")
		p.raiseK(sku, 3)
		if code, body := p.reserve(sku, bob, 1, "k1"); code != http.StatusOK || body["status"] != string(reservation.StatusConfirmed) {
			t.Fatalf("keyed retry after K raised = %d %v, want 200 CONFIRMED", code, body)
		}
		p.refunded(id, bob)
		p.wantKeyedAnswer(sku, bob, "k1", id, reservation.StatusCancelled)
		p.wantStocks(sku, 10)
	})

	// The same with the tombstone of a twin: K raised while the keyed hold is
	// HELD, the retry held again in the new home bucket, both copies confirmed
	// in one batch (the twin's bucket keeps a CONFIRMED tombstone, see the
	// first subtest), then the refund.
	t.Run("a keyed retry after a refund answers CANCELLED from a twin's bucket", func(t *testing.T) {
		p := newPromise(t)
		sku := testservices.Name("staletwin")
		p.createSKU(sku, 10, 0)
		bob := userIn("bob", 1, 3)
		id := p.reserved(sku, bob, 1, "k1")
		p.raiseK(sku, 3)
		if again := p.reserved(sku, bob, 1, "k1"); again != id {
			t.Fatalf("keyed retry got id %s, want %s", again, id)
		}
		p.rec.mu.Lock()
		var twins []reservation.Reservation
		for _, m := range p.rec.msgs {
			if m.ID == id {
				twins = append(twins, m)
			}
		}
		p.rec.mu.Unlock()
		if len(twins) != 2 || twins[0].Bucket != 0 || twins[1].Bucket != 1 {
			t.Fatalf("want copies of %s in buckets 0 and 1, got %+v", id, twins)
		}
		p.deliverBatch(twins...)
		p.wantStatus(id, reservation.StatusConfirmed, "")
		p.refunded(id, bob)
		p.wantKeyedAnswer(sku, bob, "k1", id, reservation.StatusCancelled)
		p.wantStocks(sku, 10)
	})
}

// raiseK sets K of sku to k, its stock unchanged.
func (p *promise) raiseK(sku string, k int) {
	p.t.Helper()
	_, lvl := p.call("GET", "/admin/skus/"+sku+"/stock", "", nil)
	h := map[string]string{"If-Match": fmt.Sprintf(`"%d"`, int(lvl["version"].(float64)))}
	body := fmt.Sprintf(`{"stock":%d,"buckets":%d}`, int(lvl["mysql_available"].(float64)), k)
	if code, b := p.call("PUT", "/admin/skus/"+sku+"/stock", body, h); code != http.StatusOK {
		p.t.Fatalf("raise K = %d %v", code, b)
	}
}

// refunded cancels user's CONFIRMED reservation id and requires the refund.
func (p *promise) refunded(id, user string) {
	p.t.Helper()
	code, body := p.callAs(user, "DELETE", "/reservations/"+id, "", nil)
	if code != http.StatusOK || body["status"] != string(reservation.StatusCancelled) {
		p.t.Fatalf("DELETE /reservations/%s = %d %v, want 200 CANCELLED", id, code, body)
	}
	p.wantStatus(id, reservation.StatusCancelled, reservation.ReasonBuyer)
}

// wantKeyedAnswer requires a keyed retry (twice: the first may leave a
// trace the second reads) to answer id with status, as MySQL has it.
func (p *promise) wantKeyedAnswer(sku, user, key, id string, status reservation.Status) {
	p.t.Helper()
	for i := range 2 {
		code, body := p.reserve(sku, user, 1, key)
		if code != http.StatusOK || body["reservation_id"] != id || body["status"] != string(status) {
			p.t.Errorf("keyed retry %d = %d %v, want 200 %s (MySQL's row)", i+1, code, body, status)
		}
	}
}

// wantStocks requires both stores to have n units of sku free, none held
// (each id took stock at most once per store, and gave it back once).
func (p *promise) wantStocks(sku string, n float64) {
	p.t.Helper()
	_, view := p.call("GET", "/admin/skus/"+sku+"/stock", "", nil)
	if view["mysql_available"] != n || view["redis_available"] != n || view["held"] != float64(0) {
		p.t.Errorf("stock view %v, want %v available in both stores, 0 held", view, n)
	}
}
