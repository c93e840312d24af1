package system_test

// What a buyer's reserve promises: the hold is taken in Redis and its message
// sent, or the answer is 503 and nothing is held; a keyed retry answers the
// first attempt's reservation and never cancels it; deadlines come from
// Redis's clock.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/testkit/faultproxy"
	"github.com/holdfast/holdfast/internal/testkit/invariant"
	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/app"
	"github.com/holdfast/holdfast/shared/reservation"
)

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

// TestReserve: a reserve holds and sends, or answers 503 and holds nothing;
// retries with the same key answer the same reservation.
func TestReserve(t *testing.T) {
	// 1,000 buyers at once for 100 units: exactly 100 are held, then exactly 100
	// confirmed, and MySQL ends at 0 with Redis in line.
	t.Run("1000 buyers at once for 100 units hold and confirm exactly 100", func(t *testing.T) {
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
	})

	// A failed send answers 503 and holds nothing — even when the send reached
	// the queue after all: the late message then takes nothing, and a retry with
	// the same key returns the real state.
	t.Run("a failed send answers 503 and holds nothing", func(t *testing.T) {
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
	})

	// A keyed request whose send fails answers 503 and is not cancelled: the
	// retry with the same key replays the hold and sends it, and the reservation
	// is confirmed once, even when the failed send had gone through too.
	t.Run("a keyed request whose send failed is confirmed once by its retry", func(t *testing.T) {
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
	})

	// An unkeyed reserve whose Redis reply is lost (the script ran and took the
	// hold) answers 503, and reserve fences it hold_failed at once and releases
	// the hold (at once, or by the outbox): the units are not held from
	// everybody for a hold TTL.
	// Found by the adversarial review of issue 20 (was
	// TestUnkeyedReserveWithLostReplyIsFencedAtOnce): the fence was built from
	// the request, whose zero CreatedAt MySQL refused, so it never worked.
	t.Run("an unkeyed reserve whose reply is lost is fenced and released at once", func(t *testing.T) {
		p := newPromiseBehindProxy(t)
		sku := testservices.Name("zaband")
		p.createSKU(sku, 10, 0)
		p.reserved(sku, "warm", 1, "") // layout cached, pool warm

		p.proxy.DropReplies(true)
		code, body := p.reserve(sku, "ann", 2, "")
		p.proxy.DropReplies(false)
		if code != http.StatusServiceUnavailable {
			t.Fatalf("reserve with the reply lost = %d %v, want 503", code, body)
		}
		fenced := p.count(`SELECT COUNT(*) FROM reservations WHERE sku = ? AND reason = 'hold_failed'`, sku)
		p.clock.Advance(3 * time.Second) // past the sweep grace: the release outbox drains; the hold (60 s) is not due
		p.sweep()
		avail, held := p.redisStock(sku)
		if fenced != 1 || avail != 9 || held != 1 {
			t.Errorf("after the 503 and one sweep: %d hold_failed fences in MySQL, redis available %d held %d; want 1 fence and 9/1 (the lost hold fenced at once, released at once or by the outbox)",
				fenced, avail, held)
		}
	})

	// A keyed reserve is accepted; the buyer's retry with the same key meets a
	// slow or refusing Redis and gets 503. The retry must not cancel the
	// original: its message, persisted once Redis is back, confirms it and takes
	// the stock once.
	t.Run("a same-key retry that meets a slow Redis keeps the original", func(t *testing.T) {
		for _, fault := range []struct {
			name          string
			inject, clear func(*faultproxy.Proxy)
		}{
			{"slow", func(x *faultproxy.Proxy) { x.SetLatency(700 * time.Millisecond) }, func(x *faultproxy.Proxy) { x.SetLatency(0) }},
			{"refused", func(x *faultproxy.Proxy) { x.Refuse(true) }, func(x *faultproxy.Proxy) { x.Refuse(false) }},
		} {
			t.Run(fault.name, func(t *testing.T) {
				p := newPromiseBehindProxy(t)
				sku := testservices.Name("retry")
				p.createSKU(sku, 10, 0)
				id := p.reserved(sku, "ann", 2, "k")

				fault.inject(p.proxy)
				code, b := p.reserve(sku, "ann", 2, "k")
				fault.clear(p.proxy)
				if code != http.StatusServiceUnavailable {
					t.Fatalf("retry with the same key while Redis is %s = %d %v, want 503", fault.name, code, b)
				}

				p.persistMsgs(id)
				p.persistMsgs(id) // and a redelivery
				if st, reason, _ := p.row(id); st != "CONFIRMED" {
					t.Fatalf("original after persist: row %s %s, want CONFIRMED", st, reason)
				}
				p.wantStatus(id, reservation.StatusConfirmed, "")
				p.wantStores("original confirmed", sku, 8, 0, 8)
				if code, b := p.reserve(sku, "ann", 2, "k"); code != http.StatusOK || b["status"] != "CONFIRMED" {
					t.Errorf("retry with the same key after recovery = %d %v, want 200 CONFIRMED", code, b)
				}
				p.wantStores("after the last retry", sku, 8, 0, 8)
				p.check(invariant.Expect{Sellable: map[string]int64{sku: 10}, Accepted: []string{id}, Quiescent: true})
			})
		}
	})

	// Once Redis forgot a keyed reservation's hold, MySQL's row judges the key:
	// another quantity is an idempotency_mismatch and the same request answers
	// the row's final state; neither takes anything in either store.
	t.Run("a key reused after Redis forgot its hold is judged by MySQL", func(t *testing.T) {
		p := newPromise(t)
		sku := testservices.Name("keyret")
		p.createSKU(sku, 10, 0)
		id := p.reserved(sku, "ann", 1, "k1")
		p.persistMsgs(id)
		p.wantStatus(id, reservation.StatusConfirmed, "")
		if n := p.forgetRetained(sku); n == 0 {
			t.Fatalf("the finished hold carried no TTL")
		}
		usersKey := "hf:{" + sku + "}:users"
		users := p.rdb.HGetAll(context.Background(), usersKey).Val()

		if code, b := p.reserve(sku, "ann", 5, "k1"); code != http.StatusUnprocessableEntity || b["error"] != "idempotency_mismatch" {
			t.Errorf("k1 with qty 5 after retention = %d %v, want 422 idempotency_mismatch", code, b)
		}
		p.wantStores("after the mismatched reuse", sku, 9, 0, 9)
		if got := p.rdb.HGetAll(context.Background(), usersKey).Val(); fmt.Sprint(got) != fmt.Sprint(users) {
			t.Fatalf("per-user counters moved: %v, were %v", got, users)
		}

		code, b := p.reserve(sku, "ann", 1, "k1")
		if code != http.StatusOK || b["status"] != "CONFIRMED" || b["reservation_id"] != id {
			t.Errorf("k1 with qty 1 after retention = %d %v, want 200 CONFIRMED %s", code, b, id)
		}
		if g := p.status(id); g["status"] != "CONFIRMED" || g["qty"] != float64(1) {
			t.Errorf("GET /reservations/%s = %v, want CONFIRMED qty 1", id, g)
		}
		p.wantStores("after the same request again", sku, 9, 0, 9)
		if got := p.rdb.HGetAll(context.Background(), usersKey).Val(); fmt.Sprint(got) != fmt.Sprint(users) {
			t.Errorf("per-user counters moved: %v, were %v", got, users)
		}
		p.check(invariant.Expect{Sellable: map[string]int64{sku: 10}, Accepted: []string{id}, Quiescent: true})
	})

	// A reserve function whose clock runs 10 minutes ahead (or behind) does not
	// move deadlines: a hold it creates expires HOLDFAST_HOLD_TTL after Redis's
	// time, and a group it opens closes ttl_seconds after Redis's time.
	t.Run("deadlines are set by Redis's clock, not the function's", func(t *testing.T) {
		const slack = 5 * time.Second
		near := func(got, want time.Time) bool { d := got.Sub(want); return d < slack && d > -slack }
		for _, skew := range []time.Duration{10 * time.Minute, -10 * time.Minute} {
			t.Run(fmt.Sprintf("clock %v", skew), func(t *testing.T) {
				p := newPromise(t)
				sku := testservices.Name("skew")
				p.createSKU(sku, 10, 0)
				api := p.lambdaWithClock(&testClock{now: time.Now().Add(skew)})

				code, b, _ := p.callOn(t, api, "POST", "/reservations", fmt.Sprintf(`{"sku":%q,"qty":1,"user_id":"ann"}`, sku), nil)
				want := time.Now().Add(60 * time.Second).UTC().Round(0) // HOLDFAST_HOLD_TTL of the stack
				if code != http.StatusAccepted {
					t.Fatalf("reserve through the skewed function = %d %v, want 202", code, b)
				}
				id := b["reservation_id"].(string)
				ms, err := p.rdb.HGet(context.Background(), "hf:{"+sku+"}:r:"+id, "deadline").Int64()
				if err != nil {
					t.Fatalf("hold deadline: %v", err)
				}
				if got := time.UnixMilli(ms).UTC(); !near(got, want) {
					t.Errorf("hold deadline in Redis = %v, want ≈ %v (Redis time + 60s), off by %v", got, want, got.Sub(want))
				}
				if got, err := time.Parse(time.RFC3339Nano, fmt.Sprint(b["expires_at"])); err != nil || !near(got, want) {
					t.Errorf("202 expires_at = %v, want ≈ %v", b["expires_at"], want)
				}

				code, g, _ := p.callOn(t, api, "POST", "/groups", fmt.Sprintf(`{"sku":%q,"capacity":2,"ttl_seconds":600}`, sku), nil)
				want = time.Now().Add(600 * time.Second).UTC().Round(0)
				if code != http.StatusCreated {
					t.Fatalf("create group through the skewed function = %d %v, want 201", code, g)
				}
				gms, err := p.rdb.HGet(context.Background(), "hf:{"+sku+"}:g:"+g["group_id"].(string), "deadline").Int64()
				if err != nil {
					t.Fatalf("group deadline: %v", err)
				}
				if got := time.UnixMilli(gms).UTC(); !near(got, want) {
					t.Errorf("group deadline in Redis = %v, want ≈ %v (Redis time + 600s), off by %v", got, want, got.Sub(want))
				}
				if got, err := time.Parse(time.RFC3339Nano, fmt.Sprint(g["deadline"])); err != nil || !near(got, want) {
					t.Errorf("201 group deadline = %v, want ≈ %v", g["deadline"], want)
				}
			})
		}
	})
}
