package system_test

// What a buyer's cancel promises: the reservation's stock goes back to both
// stores exactly once, whatever Redis has forgotten or failed to apply.

import (
	"net/http"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/testkit/invariant"
	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/reservation"
)

// refundedThenForgotten: a reservation of 2 of 10 units is confirmed, the
// buyer cancels it (a refund to both stores), and then Redis forgets its
// finished hold (retention passed).
func refundedThenForgotten(t *testing.T) (p *promise, sku, id string) {
	t.Helper()
	p = newPromise(t)
	sku = testservices.Name("dd")
	p.createSKU(sku, 10, 0)
	id = p.reserved(sku, "ann", 2, "")
	p.persistMsgs(id)
	p.wantStatus(id, reservation.StatusConfirmed, "")
	p.wantStores("confirmed", sku, 8, 0, 8)
	if code, b := p.call("DELETE", "/reservations/"+id, "", nil); code != http.StatusOK || b["status"] != "CANCELLED" {
		t.Fatalf("DELETE %s = %d %v, want 200 CANCELLED", id, code, b)
	}
	p.wantStores("refunded", sku, 10, 0, 10)
	if n := p.forgetRetained(sku); n == 0 {
		t.Fatalf("no finished hold of %s carried a TTL", sku)
	}
	return p, sku, id
}

// TestCancel: a cancel returns the stock to both stores exactly once.
func TestCancel(t *testing.T) {
	// A reservation the buyer cancels before its message arrives is never
	// deducted.
	t.Run("a reservation cancelled before its message arrives is never deducted", func(t *testing.T) {
		s := newStack(t)
		sku := testservices.Name("early")
		s.setStock(sku, 5)
		code, body := s.reserve(sku, "bob", 3, "")
		if code != http.StatusAccepted {
			t.Fatalf("reserve = %d %v", code, body)
		}
		id := body["reservation_id"].(string)
		if code, body := s.call("DELETE", "/reservations/"+id, "", nil); code != 200 || body["status"] != "CANCELLED" {
			t.Fatalf("DELETE = %d %v, want 200 CANCELLED", code, body)
		}
		if avail, held := s.redisStock(sku); avail != 5 || held != 0 {
			t.Fatalf("redis after cancel = %d/%d, want 5 available 0 held", avail, held)
		}
		stop := s.runPersist(1)
		testservices.Eventually(t, 30*time.Second, "message consumed", func() bool { return s.queueDepth(s.queues.URL) == 0 })
		stop()
		if got := s.mysqlAvailable(sku); got != 5 {
			t.Errorf("mysql available = %d, want 5 (never deducted)", got)
		}
		if code, body := s.call("GET", "/reservations/"+id, "", nil); body["status"] != "CANCELLED" || body["reason"] != "buyer_cancelled" {
			t.Errorf("GET = %d %v, want CANCELLED buyer_cancelled", code, body)
		}
		if avail, _ := s.redisStock(sku); avail != 5 {
			t.Errorf("redis available = %d, want 5 (returned once)", avail)
		}
		// Cancelling again changes nothing.
		if code, body := s.call("DELETE", "/reservations/"+id, "", nil); code != 200 || body["status"] != "CANCELLED" {
			t.Errorf("second DELETE = %d %v", code, body)
		}
		if avail, _ := s.redisStock(sku); avail != 5 {
			t.Errorf("redis available after second cancel = %d, want 5", avail)
		}
	})

	// A buyer cancels a CONFIRMED reservation: stock returns to both stores
	// once.
	t.Run("a cancelled confirmed reservation is refunded in both stores once", func(t *testing.T) {
		s := newStack(t)
		sku := testservices.Name("refund")
		s.setStock(sku, 4)
		_, body := s.reserve(sku, "carol", 2, "")
		id := body["reservation_id"].(string)
		stop := s.runPersist(1)
		testservices.Eventually(t, 30*time.Second, "confirmed", func() bool {
			_, b := s.call("GET", "/reservations/"+id, "", nil)
			return b["status"] == "CONFIRMED"
		})
		stop()
		for range 2 {
			if code, body := s.call("DELETE", "/reservations/"+id, "", nil); code != 200 || body["status"] != "CANCELLED" {
				t.Fatalf("DELETE = %d %v", code, body)
			}
		}
		if got := s.mysqlAvailable(sku); got != 4 {
			t.Errorf("mysql available = %d, want 4", got)
		}
		if avail, held := s.redisStock(sku); avail != 4 || held != 0 {
			t.Errorf("redis = %d/%d, want 4 available 0 held", avail, held)
		}
		if ev := s.events(); len(ev) != 1 || ev[0].Detail.ReservationID != id || !ev[0].Detail.Refunded {
			t.Errorf("events = %+v, want one refunded cancellation of %s", ev, id)
		}
	})

	// A refunded reservation whose finished hold Redis has forgotten gives no
	// stock back again — not to a second DELETE, a late dead letter or a persist
	// redelivery — and a buyer cannot use a forgotten refund to pass her
	// per-user limit.
	t.Run("a refund whose hold Redis forgot gives no stock back again", func(t *testing.T) {
		t.Run("second DELETE", func(t *testing.T) {
			p, sku, id := refundedThenForgotten(t)
			code, b := p.call("DELETE", "/reservations/"+id, "", nil)
			if code != http.StatusOK || b["status"] != "CANCELLED" || b["reason"] != "buyer_cancelled" {
				t.Errorf("second DELETE = %d %v, want 200 CANCELLED buyer_cancelled", code, b)
			}
			p.wantStores("after the second DELETE", sku, 10, 0, 10)
			p.check(invariant.Expect{Sellable: map[string]int64{sku: 10}, Accepted: []string{id}, Quiescent: true})
		})
		t.Run("late dead letter", func(t *testing.T) {
			p, sku, id := refundedThenForgotten(t)
			p.compensateMsgs(id)
			p.wantStores("after compensate", sku, 10, 0, 10)
			if st, reason, refunded := p.row(id); st != "CANCELLED" || reason != "buyer_cancelled" || !refunded {
				t.Errorf("row = %s %s refunded=%v, want CANCELLED buyer_cancelled refunded", st, reason, refunded)
			}
			p.check(invariant.Expect{Sellable: map[string]int64{sku: 10}, Accepted: []string{id}, Quiescent: true})
		})
		t.Run("persist redelivery", func(t *testing.T) {
			p, sku, id := refundedThenForgotten(t)
			p.persistMsgs(id)
			p.wantStores("after the redelivery", sku, 10, 0, 10)
			p.wantStatus(id, reservation.StatusCancelled, reservation.ReasonBuyer)
			p.check(invariant.Expect{Sellable: map[string]int64{sku: 10}, Accepted: []string{id}, Quiescent: true})
		})
		t.Run("per-user limit", func(t *testing.T) {
			p := newPromise(t)
			sku := testservices.Name("ddlimit")
			p.createSKU(sku, 5, 1)
			first := p.reserved(sku, "ann", 1, "")
			p.persistMsgs(first)
			if code, b := p.call("DELETE", "/reservations/"+first, "", nil); code != http.StatusOK || b["status"] != "CANCELLED" {
				t.Fatalf("DELETE = %d %v, want 200 CANCELLED", code, b)
			}
			second := p.reserved(sku, "ann", 1, "") // the refunded unit no longer counts
			p.persistMsgs(second)
			p.wantStatus(second, reservation.StatusConfirmed, "")
			p.wantStores("ann holds one unit again", sku, 4, 0, 4)

			p.forgetHold(sku, first)
			if code, b := p.call("DELETE", "/reservations/"+first, "", nil); code != http.StatusOK || b["status"] != "CANCELLED" {
				t.Errorf("DELETE of the forgotten refund = %d %v, want 200 CANCELLED", code, b)
			}
			accepted := []string{first, second}
			switch code, b := p.reserve(sku, "ann", 1, ""); {
			case code == http.StatusAccepted:
				third := b["reservation_id"].(string)
				accepted = append(accepted, third)
				p.persistMsgs(third)
			case code == http.StatusConflict && b["error"] == "limit_exceeded":
			default:
				t.Fatalf("third reserve = %d %v, want 202 or 409 limit_exceeded", code, b)
			}
			if n := p.confirmedUnits(sku, "ann"); n != 1 {
				t.Fatalf("MySQL confirmed %d units for ann, want 1 (per_user_limit 1)", n)
			}
			p.clock.Advance(2 * time.Minute)
			p.sweep()
			p.wantAgree("after a sweep", sku, 4)
			p.check(invariant.Expect{Sellable: map[string]int64{sku: 5}, Accepted: accepted, Quiescent: true})
		})
	})

	// A buyer cancels a confirmed reservation while Redis is down. MySQL
	// refunds; GET answers CANCELLED from MySQL meanwhile; once Redis is back
	// the sweeper returns the unit to Redis exactly once, and a retried DELETE
	// gives nothing more.
	t.Run("a refund whose Redis release failed is repaired once", func(t *testing.T) {
		p := newPromiseBehindProxy(t)
		sku := testservices.Name("relfail")
		p.createSKU(sku, 10, 0)
		id := p.reserved(sku, "ann", 2, "")
		p.persistMsgs(id)
		p.wantStores("confirmed", sku, 8, 0, 8)

		p.proxy.Refuse(true)
		if code, b := p.call("DELETE", "/reservations/"+id, "", nil); code != http.StatusOK && code != http.StatusServiceUnavailable {
			t.Fatalf("DELETE with Redis down = %d %v, want 200 or 503", code, b)
		}
		if st, _, refunded := p.row(id); st != "CANCELLED" || !refunded {
			t.Fatalf("row = %s refunded=%v, want CANCELLED refunded", st, refunded)
		}
		if got := p.mysqlAvailable(sku); got != 10 {
			t.Fatalf("mysql available = %d, want 10 (refunded)", got)
		}
		if code, b := p.call("GET", "/reservations/"+id, "", nil); code != http.StatusOK || b["status"] != "CANCELLED" {
			t.Errorf("GET with Redis down = %d %v, want 200 CANCELLED from MySQL", code, b)
		}
		p.proxy.Refuse(false)

		p.clock.Advance(5 * time.Second) // past the sweep grace, well within HOLDFAST_RECONCILE_AFTER (50 s)
		p.sweep()
		p.wantStores("after one sweep with Redis back", sku, 10, 0, 10)
		p.clock.Advance(2 * time.Minute)
		p.sweep()
		p.sweep()
		p.wantStores("after more sweeps", sku, 10, 0, 10)

		if code, b := p.call("DELETE", "/reservations/"+id, "", nil); code != http.StatusOK || b["status"] != "CANCELLED" {
			t.Errorf("retried DELETE = %d %v, want 200 CANCELLED", code, b)
		}
		p.wantStores("after the retried DELETE", sku, 10, 0, 10)
		p.check(invariant.Expect{Sellable: map[string]int64{sku: 10}, Accepted: []string{id}, Quiescent: true})
	})
}
