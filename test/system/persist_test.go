package system_test

// What persist and compensate promise: a reservation's stock leaves MySQL at
// most once however often its message arrives or under how many tokens; a
// poison message ends in the DLQ; a dead letter returns its stock once, and
// nothing if persist had confirmed it.

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/testkit/invariant"
	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/message"
	"github.com/holdfast/holdfast/shared/reservation"
)

func (p *promise) msgsOf(id string) []reservation.Reservation {
	p.rec.mu.Lock()
	defer p.rec.mu.Unlock()
	var out []reservation.Reservation
	for _, m := range p.rec.msgs {
		if m.ID == id {
			out = append(out, m)
		}
	}
	return out
}

// TestPersist: persist and compensate move each reservation's stock once.
func TestPersist(t *testing.T) {
	// The same message delivered three times takes the stock once.
	t.Run("a message delivered three times takes the stock once", func(t *testing.T) {
		rec := &recordingEnqueuer{}
		s := newStack(t, withEnqueuer(rec))
		sku := testservices.Name("dup")
		s.setStock(sku, 10)
		if code, body := s.reserve(sku, "alice", 2, ""); code != http.StatusAccepted {
			t.Fatalf("reserve = %d %v", code, body)
		}
		body, err := message.Encode(rec.msgs[0])
		if err != nil {
			t.Fatal(err)
		}
		for range 3 {
			s.sendRaw(s.queues.URL, string(body))
		}
		stop := s.runPersist(3)
		testservices.Eventually(t, 30*time.Second, "queue drained", func() bool { return s.queueDepth(s.queues.URL) == 0 })
		stop()
		if got := s.mysqlAvailable(sku); got != 8 {
			t.Errorf("mysql available = %d, want 8 (2 taken once)", got)
		}
		if n := s.count(`SELECT COUNT(*) FROM reservations WHERE sku = ?`, sku); n != 1 {
			t.Errorf("rows = %d, want 1", n)
		}
		if avail, held := s.redisStock(sku); avail != 8 || held != 0 {
			t.Errorf("redis = %d available %d held, want 8 and 0", avail, held)
		}
	})

	// Redis loses the SKU mid-sale and ann repeats her keyed request: MySQL has
	// no row yet, so the retry takes a hold again for the same id under a new
	// token. Both messages, in one persist batch or in two, take her 2 units
	// once in each store, and Redis counts them once for her per-user limit.
	// Found by the review of issue 14's first increments (was
	// TestReview4OneIDUnderTwoTokensInOneBatchCountsOnce).
	t.Run("one id held under two tokens counts once, in one batch or two", func(t *testing.T) {
		for _, oneBatch := range []bool{false, true} {
			t.Run(fmt.Sprintf("one batch %v", oneBatch), func(t *testing.T) {
				p := newPromise(t)
				sku := testservices.Name("twin")
				p.createSKU(sku, 10, 4)
				id := p.reserved(sku, "ann", 2, "k1")
				p.loseSKU(sku)
				code, b := p.reserve(sku, "ann", 2, "k1")
				if code != http.StatusAccepted || b["reservation_id"] != id {
					t.Fatalf("same-key retry: %d %v", code, b)
				}
				ms := p.msgsOf(id)
				if len(ms) != 2 || ms[0].Token == ms[1].Token {
					t.Fatalf("messages of %s: %+v, want two with different tokens", id, ms)
				}
				if oneBatch {
					p.deliverBatch(ms[0], ms[1])
				} else {
					p.deliverBatch(ms[0])
					p.deliverBatch(ms[1])
				}
				a, h := p.redisStock(sku)
				if m := p.mysqlAvailable(sku); a+h != m || m != 8 {
					t.Errorf("Redis available %d + held %d, MySQL %d: want both 8 (one reservation of 2)", a, h, m)
				}
				users, _ := p.rdb.HGet(context.Background(), "hf:{"+sku+"}:users", "ann").Int64()
				if users != p.confirmedUnits(sku, "ann") || users != 2 {
					t.Errorf("Redis counts %d units for ann, MySQL confirmed %d: want 2", users, p.confirmedUnits(sku, "ann"))
				}
				if code, b := p.reserve(sku, "ann", 2, ""); code != http.StatusAccepted {
					t.Errorf("ann's next reserve of 2 (limit 4, 2 confirmed) = %d %v", code, b)
				}
			})
		}
	})

	// A buyer at her per-user limit reserves again after Redis lost the SKU.
	// Redis may have forgotten her units, MySQL has not: persist cancels the
	// second reservation (limit_exceeded) and takes no stock.
	t.Run("the per-user limit holds after Redis lost the SKU", func(t *testing.T) {
		p := newPromise(t)
		sku := testservices.Name("limloss")
		p.createSKU(sku, 5, 1)
		first := p.reserved(sku, "ann", 1, "")
		p.persistMsgs(first)
		p.wantStores("first confirmed", sku, 4, 0, 4)

		p.loseSKU(sku)
		accepted := []string{first}
		switch code, b := p.reserve(sku, "ann", 1, ""); {
		case code == http.StatusAccepted:
			second := b["reservation_id"].(string)
			accepted = append(accepted, second)
			p.persistMsgs(second)
			if st, reason, _ := p.row(second); st != "CANCELLED" || reason != "limit_exceeded" {
				t.Errorf("second reservation after the loss: row %s %s, want CANCELLED limit_exceeded", st, reason)
			}
		case code == http.StatusConflict && b["error"] == "limit_exceeded":
		default:
			t.Fatalf("reserve after the loss = %d %v, want 202 or 409 limit_exceeded", code, b)
		}
		if n := p.confirmedUnits(sku, "ann"); n != 1 {
			t.Fatalf("MySQL confirmed %d units for ann, want 1 (per_user_limit 1)", n)
		}
		p.wantStores("after persist", sku, 4, 0, 4)
		p.check(invariant.Expect{Sellable: map[string]int64{sku: 5}, Accepted: accepted, Quiescent: true})
	})

	// A poison message ends in the DLQ without touching stock, and the rest of
	// its batch proceeds.
	t.Run("a poison message ends in the DLQ and the rest of its batch proceeds", func(t *testing.T) {
		s := newStack(t)
		sku := testservices.Name("poison")
		s.setStock(sku, 6)
		s.sendRaw(s.queues.URL, `{"version":1,"type":"ReservationHeld","reservation_id":"r-x","sku":"`+sku+`","qty":-5,"user_id":"m"}`)
		_, body := s.reserve(sku, "henry", 1, "")
		id := body["reservation_id"].(string)
		stop := s.runPersist(1)
		testservices.Eventually(t, 30*time.Second, "good message confirmed", func() bool {
			return s.count(`SELECT COUNT(*) FROM reservations WHERE reservation_id = ? AND status = 'CONFIRMED'`, id) == 1
		})
		testservices.Eventually(t, 30*time.Second, "poison message in the DLQ", func() bool { return s.queueDepth(s.queues.DLQURL) == 1 })
		stop()
		if got := s.mysqlAvailable(sku); got != 5 {
			t.Errorf("mysql available = %d, want 5", got)
		}
		if n := s.count(`SELECT COUNT(*) FROM reservations WHERE sku = ?`, sku); n != 1 {
			t.Errorf("rows = %d, want 1", n)
		}
	})

	// Compensate run twice (and concurrently) for the same dead letter returns
	// the stock once.
	t.Run("a dead letter compensated twice and concurrently returns its stock once", func(t *testing.T) {
		rec := &recordingEnqueuer{}
		s := newStack(t, withEnqueuer(rec))
		sku := testservices.Name("comp")
		s.setStock(sku, 10)
		if code, body := s.reserve(sku, "dave", 4, ""); code != http.StatusAccepted {
			t.Fatalf("reserve = %d %v", code, body)
		}
		body, _ := message.Encode(rec.msgs[0])
		s.sendRaw(s.queues.DLQURL, string(body))
		s.sendRaw(s.queues.DLQURL, string(body))
		stop := s.runCompensate()
		testservices.Eventually(t, 30*time.Second, "dlq drained", func() bool { return s.queueDepth(s.queues.DLQURL) == 0 })
		stop()
		// And once more, directly and concurrently.
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := s.app.Service.Compensate(context.Background(), rec.msgs[0]); err != nil {
					t.Errorf("compensate: %v", err)
				}
			}()
		}
		wg.Wait()
		if avail, held := s.redisStock(sku); avail != 10 || held != 0 {
			t.Errorf("redis = %d/%d, want 10 available 0 held (returned once)", avail, held)
		}
		if got := s.mysqlAvailable(sku); got != 10 {
			t.Errorf("mysql available = %d, want 10", got)
		}
		var status, reason string
		if err := s.db.QueryRow(`SELECT status, reason FROM reservations WHERE reservation_id = ?`, rec.msgs[0].ID).Scan(&status, &reason); err != nil {
			t.Fatal(err)
		}
		if status != "CANCELLED" || reason != "dead_letter" {
			t.Errorf("row = %s %s, want CANCELLED dead_letter", status, reason)
		}
		ev := s.events()
		if len(ev) == 0 || ev[0].Detail.Reason != "dead_letter" {
			t.Errorf("events = %+v, want a dead_letter cancellation", ev)
		}
	})

	// A message that reached the DLQ although persist committed: compensate sees
	// CONFIRMED and releases nothing.
	t.Run("a dead letter of a confirmed reservation releases nothing", func(t *testing.T) {
		rec := &recordingEnqueuer{}
		s := newStack(t, withEnqueuer(rec))
		sku := testservices.Name("late")
		s.setStock(sku, 3)
		s.reserve(sku, "erin", 1, "")
		if _, err := s.app.Service.Persist(context.Background(), rec.msgs[0]); err != nil {
			t.Fatal(err)
		}
		out, err := s.app.Service.Compensate(context.Background(), rec.msgs[0])
		if err != nil || out.Status != reservation.StatusConfirmed {
			t.Fatalf("compensate = %v %v, want CONFIRMED", out.Status, err)
		}
		if got := s.mysqlAvailable(sku); got != 2 {
			t.Errorf("mysql available = %d, want 2", got)
		}
		if avail, held := s.redisStock(sku); avail != 2 || held != 0 {
			t.Errorf("redis = %d/%d, want 2 available 0 held", avail, held)
		}
	})
}
