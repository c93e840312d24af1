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
}
