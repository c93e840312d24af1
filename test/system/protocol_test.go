package system_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/app"
	"github.com/holdfast/holdfast/shared/message"
	"github.com/holdfast/holdfast/shared/reservation"
)

// 1,000 buyers at once for 100 units: exactly 100 are held, then exactly 100
// confirmed, and MySQL ends at 0 with Redis in line.
func TestFlashSaleHoldsThenConfirmsExactlyTheStock(t *testing.T) {
	s := newStack(t)
	sku := testservices.Name("hot")
	s.setStock(sku, 100)

	const buyers = 1000
	codes := make([]int, buyers)
	ids := make([]string, buyers)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	for i := range buyers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			code, body := s.reserve(sku, fmt.Sprintf("u%d", i), 1, "")
			codes[i] = code
			if code == http.StatusAccepted {
				ids[i], _ = body["reservation_id"].(string)
			} else if body["error"] != "sold_out" {
				t.Errorf("reserve %d = %d %v, want 202 or 409 sold_out", i, code, body)
			}
		}()
	}
	wg.Wait()
	accepted := 0
	for _, c := range codes {
		if c == http.StatusAccepted {
			accepted++
		}
	}
	if accepted != 100 {
		t.Fatalf("accepted = %d, want exactly 100", accepted)
	}
	if avail, held := s.redisStock(sku); avail != 0 || held != 100 {
		t.Fatalf("redis after the rush: available %d held %d, want 0 and 100", avail, held)
	}

	stop := s.runPersist(4)
	testservices.Eventually(t, 60*time.Second, "100 reservations confirmed in MySQL", func() bool {
		return s.count(`SELECT COUNT(*) FROM reservations WHERE sku = ? AND status = 'CONFIRMED'`, sku) == 100
	})
	testservices.Eventually(t, 10*time.Second, "every hold marked confirmed in redis", func() bool {
		_, held := s.redisStock(sku)
		return held == 0
	})
	stop()
	if n := s.count(`SELECT COUNT(*) FROM reservations WHERE sku = ?`, sku); n != 100 {
		t.Errorf("reservation rows = %d, want 100 (no cancellation)", n)
	}
	if got := s.mysqlAvailable(sku); got != 0 {
		t.Errorf("mysql available = %d, want 0", got)
	}
	for _, id := range ids {
		if id == "" {
			continue
		}
		if code, body := s.call("GET", "/reservations/"+id, "", nil); code != 200 || body["status"] != "CONFIRMED" {
			t.Fatalf("GET %s = %d %v, want 200 CONFIRMED", id, code, body)
		}
	}
}

// The same message delivered three times takes the stock once.
func TestDuplicateDeliveryDeductsOnce(t *testing.T) {
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
}

// A reservation the buyer cancels before its message arrives is never deducted.
func TestCancelledBeforeMessageArrivesIsNeverDeducted(t *testing.T) {
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
}

// A buyer cancels a CONFIRMED reservation: stock returns to both stores once.
func TestCancelConfirmedRefundsBothStoresOnce(t *testing.T) {
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
}

// Compensate run twice (and concurrently) for the same dead letter returns the stock once.
func TestCompensateTwiceReturnsStockOnce(t *testing.T) {
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
}

// A message that reached the DLQ although persist committed: compensate sees
// CONFIRMED and releases nothing.
func TestCompensateOfConfirmedReleasesNothing(t *testing.T) {
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
}

// A hold whose message was lost is released by the sweeper once its deadline passes.
func TestSweeperReleasesHoldOfLostMessage(t *testing.T) {
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
}

// A failed send answers 503 and holds nothing — even when the send reached
// the queue after all: the late message then takes nothing, and a retry
// with the same key returns the real state.
func TestPublishFailureHoldsNothing(t *testing.T) {
	for _, delivered := range []bool{false, true} {
		t.Run(fmt.Sprintf("delivered=%v", delivered), func(t *testing.T) {
			s := newStack(t, withFailingSend(delivered))
			sku := testservices.Name("pubfail")
			s.setStock(sku, 5)
			code, body := s.reserve(sku, "gina", 2, "")
			if code != http.StatusServiceUnavailable || body["error"] != "unavailable" {
				t.Fatalf("reserve = %d %v, want 503 unavailable", code, body)
			}
			if avail, held := s.redisStock(sku); avail != 5 || held != 0 {
				t.Fatalf("redis = %d/%d, want 5 available 0 held", avail, held)
			}
			if n := s.count(`SELECT COUNT(*) FROM reservations WHERE sku = ? AND status = 'CANCELLED' AND reason = 'publish_failed'`, sku); n != 1 {
				t.Fatalf("publish_failed fences = %d, want 1", n)
			}
			if delivered {
				stop := s.runPersist(1)
				testservices.Eventually(t, 30*time.Second, "late message consumed", func() bool { return s.queueDepth(s.queues.URL) == 0 })
				stop()
			}
			if got := s.mysqlAvailable(sku); got != 5 {
				t.Errorf("mysql available = %d, want 5", got)
			}
			if avail, held := s.redisStock(sku); avail != 5 || held != 0 {
				t.Errorf("redis = %d/%d, want 5 available 0 held", avail, held)
			}
		})
	}
}

// A keyed request whose send fails answers 503 and is not cancelled: the
// retry with the same key replays the hold and sends it, and the reservation
// is confirmed once, even when the failed send had gone through too.
func TestKeyedPublishFailureIsRetriedNotCancelled(t *testing.T) {
	for _, delivered := range []bool{false, true} {
		t.Run(fmt.Sprintf("delivered=%v", delivered), func(t *testing.T) {
			var fails atomic.Int32
			fails.Store(1)
			s := newStack(t, func(_ *stack, o *app.Options, _ map[string]string) {
				o.Enqueuer = func(real reservation.Enqueuer) reservation.Enqueuer {
					return flakyEnqueuer{next: real, fails: &fails, delivered: delivered}
				}
			})
			sku := testservices.Name("pubkey")
			s.setStock(sku, 5)
			if code, body := s.reserve(sku, "gina", 2, "key-1"); code != http.StatusServiceUnavailable {
				t.Fatalf("reserve = %d %v, want 503", code, body)
			}
			code, body := s.reserve(sku, "gina", 2, "key-1")
			if code != http.StatusAccepted || body["status"] != "HELD" {
				t.Fatalf("retry with the same key = %d %v, want 202 HELD", code, body)
			}
			id := body["reservation_id"].(string)
			stop := s.runPersist(1)
			testservices.Eventually(t, 30*time.Second, "confirmed", func() bool {
				_, b := s.call("GET", "/reservations/"+id, "", nil)
				return b["status"] == "CONFIRMED"
			})
			testservices.Eventually(t, 30*time.Second, "queue drained", func() bool { return s.queueDepth(s.queues.URL) == 0 })
			stop()
			if got := s.mysqlAvailable(sku); got != 3 {
				t.Errorf("mysql available = %d, want 3 (taken once)", got)
			}
			if avail, held := s.redisStock(sku); avail != 3 || held != 0 {
				t.Errorf("redis = %d/%d, want 3 available 0 held", avail, held)
			}
		})
	}
}

// flakyEnqueuer fails the first *fails sends (after sending them through
// when delivered), then sends.
type flakyEnqueuer struct {
	next      reservation.Enqueuer
	fails     *atomic.Int32
	delivered bool
}

func (f flakyEnqueuer) Enqueue(ctx context.Context, r reservation.Reservation) error {
	if f.fails.Add(-1) < 0 {
		return f.next.Enqueue(ctx, r)
	}
	if f.delivered {
		if err := f.next.Enqueue(ctx, r); err != nil {
			return err
		}
	}
	return reservation.Unavailable("sqs send", errors.New("injected: connection reset"))
}

// A 3-slot group with 10 concurrent joiners, two of them the same user:
// 3 members, no user twice, in Redis and then in MySQL.
func TestGroupOfThreeTakesThreeDistinctJoiners(t *testing.T) {
	s := newStack(t)
	sku := testservices.Name("grp")
	s.setStock(sku, 100)
	code, g := s.call("POST", "/groups", `{"sku":"`+sku+`","capacity":3,"ttl_seconds":600}`, nil)
	if code != http.StatusCreated || g["status"] != "OPEN" {
		t.Fatalf("create group = %d %v", code, g)
	}
	gid := g["group_id"].(string)
	users := []string{"u0", "u1", "u2", "u3", "u4", "u5", "u6", "u7", "u8", "u0"}
	type result struct {
		code int
		body map[string]any
	}
	results := make([]result, len(users))
	var wg sync.WaitGroup
	for i, u := range users {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, b := s.join(sku, gid, u)
			results[i] = result{c, b}
		}()
	}
	wg.Wait()
	joined := map[string]int{}
	for i, r := range results {
		switch {
		case r.code == http.StatusAccepted:
			joined[users[i]]++
		case r.code == http.StatusConflict && (r.body["error"] == "group_full" || r.body["error"] == "already_joined"):
		default:
			t.Errorf("join %s = %d %v", users[i], r.code, r.body)
		}
	}
	if len(joined) != 3 {
		t.Fatalf("joined = %v, want 3 distinct users", joined)
	}
	for u, n := range joined {
		if n != 1 {
			t.Errorf("user %s joined %d times", u, n)
		}
	}
	if avail, _ := s.redisStock(sku); avail != 97 {
		t.Errorf("redis available = %d, want 97", avail)
	}
	stop := s.runPersist(2)
	testservices.Eventually(t, 30*time.Second, "group formed in MySQL", func() bool {
		return s.count(`SELECT COUNT(*) FROM group_buys WHERE group_id = ? AND status = 'FORMED' AND members = 3`, gid) == 1
	})
	stop()
	if n := s.count(`SELECT COUNT(DISTINCT user_id) FROM group_members WHERE group_id = ?`, gid); n != 3 {
		t.Errorf("mysql members = %d, want 3", n)
	}
	if got := s.mysqlAvailable(sku); got != 97 {
		t.Errorf("mysql available = %d, want 97", got)
	}
	if code, body := s.call("GET", "/groups/"+gid, "", nil); code != 200 || body["status"] != "FORMED" || body["remaining"] != float64(0) {
		t.Errorf("GET group = %d %v, want FORMED with 0 remaining", code, body)
	}
	if code, body := s.join(sku, gid, "late"); code != http.StatusConflict {
		t.Errorf("join after formed = %d %v, want 409", code, body)
	}
}

// An unfilled group past its deadline fails and returns all its stock to
// Redis and MySQL: confirmed members are refunded, held ones released.
func TestUnfilledGroupFailsAndReturnsAllStock(t *testing.T) {
	rec := &recordingEnqueuer{}
	s := newStack(t, withEnqueuer(rec))
	sku := testservices.Name("gfail")
	s.setStock(sku, 10)
	_, g := s.call("POST", "/groups", `{"sku":"`+sku+`","capacity":3,"ttl_seconds":30}`, nil)
	gid := g["group_id"].(string)
	for _, u := range []string{"a", "b"} {
		if code, body := s.join(sku, gid, u); code != http.StatusAccepted {
			t.Fatalf("join %s = %d %v", u, code, body)
		}
	}
	// One member is confirmed in MySQL, the other's message is still in flight.
	if _, err := s.app.Service.Persist(context.Background(), rec.msgs[0]); err != nil {
		t.Fatal(err)
	}
	if got := s.mysqlAvailable(sku); got != 9 {
		t.Fatalf("mysql available = %d, want 9", got)
	}
	s.clock.Advance(29 * time.Second) // before the group's deadline (30 s)
	if rep := s.sweep(); rep.GroupsFailed != 0 {
		t.Fatalf("failed a group before its deadline")
	}
	s.clock.Advance(2 * time.Second) // past it (by Redis's clock too), not the holds' (60 s)
	if rep := s.sweep(); rep.GroupsFailed != 1 {
		t.Fatalf("sweep failed %d groups, want 1", rep.GroupsFailed)
	}
	// The in-flight message arrives late: it takes nothing.
	out, err := s.app.Service.Persist(context.Background(), rec.msgs[1])
	if err != nil || out.Status != reservation.StatusCancelled {
		t.Fatalf("late persist = %v %v, want CANCELLED", out.Status, err)
	}
	if got := s.mysqlAvailable(sku); got != 10 {
		t.Errorf("mysql available = %d, want 10", got)
	}
	if avail, held := s.redisStock(sku); avail != 10 || held != 0 {
		t.Errorf("redis = %d/%d, want 10 available 0 held", avail, held)
	}
	if code, body := s.call("GET", "/groups/"+gid, "", nil); body["status"] != "FAILED" {
		t.Errorf("GET group = %d %v, want FAILED", code, body)
	}
	if n := s.count(`SELECT COUNT(*) FROM reservations WHERE group_id = ? AND status = 'CANCELLED' AND reason = 'group_failed'`, gid); n != 2 {
		rows, _ := s.db.Query(`SELECT reservation_id, status, IFNULL(reason,''), IFNULL(group_id,'') FROM reservations WHERE sku = ?`, sku)
		for rows.Next() {
			var a, b, c, d string
			_ = rows.Scan(&a, &b, &c, &d)
			t.Logf("row %s %s %s %s", a, b, c, d)
		}
		t.Errorf("cancelled members = %d, want 2", n)
	}
	if rep := s.sweep(); rep.GroupsFailed != 0 {
		t.Errorf("second sweep failed %d groups, want 0", rep.GroupsFailed)
	}
	if code, body := s.join(sku, gid, "c"); code != http.StatusConflict || body["error"] != "group_closed" {
		t.Errorf("join failed group = %d %v, want 409 group_closed", code, body)
	}
}

// A poison message ends in the DLQ without touching stock, and the rest of
// its batch proceeds.
func TestPoisonMessageEndsInDLQWithoutTouchingStock(t *testing.T) {
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
}
