package system_test

// The fault matrix of docs/design.md: one subtest of TestFaults per row, on
// the real redis-server, MariaDB and SQS server, with the fault injected for
// real — a server restarted, a TCP fault proxy, a crash point, a duplicate
// send, a skewed clock — and the outcome checked with the invariant checker.
// Rows 5, 9, 10 and 12, and row 4 without the MySQL outage, are subtests of
// TestReserve and TestPersist (named in the table); the rest are here.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/holdfast/holdfast/internal/testkit/faultproxy"
	"github.com/holdfast/holdfast/internal/testkit/invariant"
	"github.com/holdfast/holdfast/internal/testkit/outbox"
	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/reservation"
)

var errCrash = errors.New("injected crash")

// settleAll persists every recorded message (twice: redelivery is normal),
// then moves the clock past every deadline and sweeps until nothing is left.
func (s *stack) settleAll(msgs []reservation.Reservation) {
	s.t.Helper()
	ctx := context.Background()
	for _, m := range msgs {
		if _, err := s.app.Service.Persist(ctx, m); err != nil {
			s.t.Fatalf("persist %s: %v", m.ID, err)
		}
	}
	s.clock.Advance(2 * time.Hour)
	for range 3 {
		s.sweep()
		s.clock.Advance(2 * time.Minute)
	}
}

func accepted(codes map[string]int) []string {
	var ids []string
	for id, c := range codes {
		if c == http.StatusAccepted {
			ids = append(ids, id)
		}
	}
	return ids
}

// TestFaults: one subtest per row of the fault matrix.
func TestFaults(t *testing.T) {
	// Row 1: Redis loses writes mid-sale — restarted empty (a node replaced), or
	// restarted from an older snapshot (a failover to a replica that had not
	// caught up: its stock is too high and later holds are gone). Reserve warms
	// a missing SKU from MySQL; Redis over-accepts; MySQL refuses the excess
	// (accepted-then-cancelled, insufficient_stock) and never oversells; the
	// sweeper heals the drift that remains.
	t.Run("row 1: Redis losing writes mid-sale oversells nothing and heals", func(t *testing.T) {
		for _, loss := range []string{"restart empty", "restart from an older snapshot"} {
			t.Run(loss, func(t *testing.T) {
				priv := testservices.StartRedis(t)
				rec := &recordingEnqueuer{}
				s := newStack(t, withRedis(priv.Addr), withEnqueuer(rec), withVars(map[string]string{"HOLDFAST_RECONCILE_AFTER": "1m"}))
				sku := testservices.Name("loss")
				s.setStock(sku, 20)
				ok := map[string]int{}
				buy := func(prefix string, n int) {
					for i := range n {
						code, body := s.reserve(sku, fmt.Sprintf("%s%d", prefix, i), 1, "")
						if code == http.StatusAccepted {
							ok[body["reservation_id"].(string)] = code
						}
					}
				}
				buy("a", 5)
				priv.Snapshot()
				buy("b", 10)
				for _, m := range rec.msgs[:8] { // some persisted before the loss
					if _, err := s.app.Service.Persist(context.Background(), m); err != nil {
						t.Fatal(err)
					}
				}
				if loss == "restart empty" {
					priv.Restart()
				} else {
					priv.RestartFromSnapshot()
				}
				buy("c", 15)
				s.settleAll(rec.msgs)
				cancelled := s.count(`SELECT COUNT(*) FROM reservations WHERE sku = ? AND reason = 'insufficient_stock'`, sku)
				confirmed := s.count(`SELECT COUNT(*) FROM reservations WHERE sku = ? AND status = 'CONFIRMED'`, sku)
				t.Logf("accepted %d, confirmed %d, accepted-then-cancelled %d", len(ok), confirmed, cancelled)
				if confirmed > 20 || int64(len(ok)) != confirmed+cancelled+s.count(`SELECT COUNT(*) FROM reservations WHERE sku = ? AND reason = 'expired'`, sku) {
					t.Errorf("accepted %d = confirmed %d + cancelled: the books do not balance", len(ok), confirmed)
				}
				s.check(invariant.Expect{Sellable: map[string]int64{sku: 20}, Accepted: accepted(ok), Quiescent: true})
			})
		}
	})

	// Row 2: Redis slow, silent or resetting. Reserve fails closed (503) within
	// the client timeouts, and whatever a timed-out script left is released at
	// once (or by the sweeper), never deducted twice by go-redis retries.
	t.Run("row 2: a slow or unreachable Redis fails closed and deducts nothing twice", func(t *testing.T) {
		var proxy *faultproxy.Proxy
		rec := &recordingEnqueuer{}
		s := newStack(t, withRedisProxy(&proxy), withEnqueuer(rec))
		sku := testservices.Name("slow")
		s.setStock(sku, 10)

		for _, fault := range []struct {
			name   string
			inject func()
		}{
			{"latency beyond the read timeout", func() { proxy.SetLatency(700 * time.Millisecond) }},
			{"blackhole", func() { proxy.Blackhole(true) }},
			{"refused", func() { proxy.Refuse(true) }},
			{"replies lost after the script ran", func() { proxy.DropReplies(true) }},
		} {
			fault.inject()
			start := time.Now()
			code, body := s.reserve(sku, "victim-"+fault.name[:6], 1, "")
			took := time.Since(start)
			proxy.SetLatency(0)
			proxy.Blackhole(false)
			proxy.Refuse(false)
			proxy.DropReplies(false)
			if code != http.StatusServiceUnavailable {
				t.Errorf("%s: reserve = %d %v, want 503", fault.name, code, body)
			}
			if took > 10*time.Second {
				t.Errorf("%s: reserve took %v: not failing fast", fault.name, took)
			}
			avail, held := s.redisStock(sku)
			t.Logf("%s: %d %d %s", fault.name, avail, held, took)
			if avail+held != 10 || avail < 9 {
				t.Errorf("%s: redis %d available %d held: deducted more than once", fault.name, avail, held)
			}
		}
		s.settleAll(rec.msgs)
		if avail, held := s.redisStock(sku); avail != 10 || held != 0 {
			t.Errorf("after the sweeper: %d/%d, want 10/0 (nothing held for good)", avail, held)
		}
		s.check(invariant.Expect{Sellable: map[string]int64{sku: 10}, Quiescent: true})
	})

	// Row 3: the process dies between the Lua deduct and the SQS send. A client
	// retry with the same key re-sends (one reservation); without a retry the
	// sweeper releases the hold at its deadline.
	t.Run("row 3: a crash between deduct and send is re-sent by a keyed retry or released", func(t *testing.T) {
		var crashes atomic.Int32
		crashes.Store(2)
		rec := &recordingEnqueuer{}
		s := newStack(t, withEnqueuer(rec), withHooks(reservation.Hooks{AfterHold: func(reservation.Reservation) error {
			if crashes.Add(-1) >= 0 {
				return errCrash
			}
			return nil
		}}))
		sku := testservices.Name("crash")
		s.setStock(sku, 5)
		if code, _ := s.reserve(sku, "retrier", 1, "key-r"); code != http.StatusInternalServerError {
			t.Fatalf("crashed reserve = %d, want 500", code)
		}
		if code, _ := s.reserve(sku, "quitter", 1, "key-q"); code != http.StatusInternalServerError {
			t.Fatalf("crashed reserve = %d, want 500", code)
		}
		code, body := s.reserve(sku, "retrier", 1, "key-r")
		if code != http.StatusAccepted {
			t.Fatalf("retry = %d %v, want 202", code, body)
		}
		if len(rec.msgs) != 1 {
			t.Fatalf("messages = %d, want the retry's one", len(rec.msgs))
		}
		s.settleAll(rec.msgs)
		if n := s.count(`SELECT COUNT(*) FROM reservations WHERE sku = ? AND status = 'CONFIRMED'`, sku); n != 1 {
			t.Errorf("confirmed = %d, want 1", n)
		}
		if n := s.count(`SELECT COUNT(*) FROM reservations WHERE sku = ? AND reason = 'expired'`, sku); n != 1 {
			t.Errorf("expired = %d, want the quitter's hold", n)
		}
		s.check(invariant.Expect{Sellable: map[string]int64{sku: 5}, Accepted: []string{body["reservation_id"].(string)}, Quiescent: true})
	})

	// Row 4 (with MySQL down too): the send fails and the fence cannot be
	// written; nothing is released without it; 503; the sweeper decides later.
	t.Run("row 4: a failed send with MySQL down releases nothing until the sweeper decides", func(t *testing.T) {
		var db *faultproxy.Proxy
		s := newStack(t, withFailingSend(false), withDBProxy(&db))
		sku := testservices.Name("sendfail")
		s.setStock(sku, 5)
		db.Refuse(true)
		code, _ := s.reserve(sku, "u", 2, "key")
		if code != http.StatusServiceUnavailable {
			t.Fatalf("reserve = %d, want 503", code)
		}
		if avail, held := s.redisStock(sku); avail != 3 || held != 2 {
			t.Fatalf("redis = %d/%d: released without a fence", avail, held)
		}
		db.Refuse(false)
		s.clock.Advance(2 * time.Minute)
		if rep := s.sweep(); rep.Released != 1 {
			t.Fatalf("sweep released %d, want 1", rep.Released)
		}
		code, body := s.reserve(sku, "u", 2, "key")
		if code != http.StatusOK || body["status"] != "CANCELLED" {
			t.Errorf("retry = %d %v, want the real state CANCELLED", code, body)
		}
		s.check(invariant.Expect{Sellable: map[string]int64{sku: 5}, Quiescent: true})
	})

	// Row 6: persist crashes after its commit, before the message is deleted:
	// the redelivery is a no-op.
	t.Run("row 6: the redelivery after persist crashed past its commit is a no-op", func(t *testing.T) {
		var crashed atomic.Bool
		s := newStack(t, withHooks(reservation.Hooks{AfterCommit: func(reservation.Reservation) error {
			if crashed.CompareAndSwap(false, true) {
				return errCrash
			}
			return nil
		}}))
		sku := testservices.Name("aftercommit")
		s.setStock(sku, 5)
		_, body := s.reserve(sku, "u", 2, "")
		stop := s.runPersist(1)
		testservices.Eventually(t, 30*time.Second, "message consumed after the crash and the hold marked", func() bool {
			_, held := s.redisStock(sku)
			return crashed.Load() && s.queueDepth(s.queues.URL) == 0 && held == 0
		})
		stop()
		if got := s.mysqlAvailable(sku); got != 3 {
			t.Errorf("mysql available = %d, want 3 (taken once)", got)
		}
		s.check(invariant.Expect{Sellable: map[string]int64{sku: 5}, Accepted: []string{body["reservation_id"].(string)}, Quiescent: true})
	})

	// Row 7: MariaDB unreachable for a while, then back. Items are retried; no
	// compensation fires; no acknowledged reservation is lost.
	t.Run("row 7: MariaDB down then back loses nothing and dead-letters nothing", func(t *testing.T) {
		var db *faultproxy.Proxy
		s := newStack(t, withDBProxy(&db))
		sku := testservices.Name("dbdown")
		s.setStock(sku, 50)
		db.Refuse(true)
		var ids []string
		for i := range 20 {
			code, body := s.reserve(sku, fmt.Sprintf("u%d", i), 1, "")
			if code != http.StatusAccepted {
				t.Fatalf("reserve = %d %v: reserve must not need MySQL", code, body)
			}
			ids = append(ids, body["reservation_id"].(string))
		}
		var failures atomic.Int64
		inner := s.persist.Handle
		stop := s.run(s.queues.URL, s.queues.ARN, func(ctx context.Context, ev events.SQSEvent) (events.SQSEventResponse, error) {
			resp, err := inner(ctx, ev)
			failures.Add(int64(len(resp.BatchItemFailures)))
			return resp, err
		}, 2)
		testservices.Eventually(t, 30*time.Second, "persist failing against the outage", func() bool { return failures.Load() >= 20 })
		db.Refuse(false)
		// Persist publishes a batch's confirmations after its commit and its
		// follow in Redis: stop it only once they went out too (else they
		// wait for the sweeper's drain, which this stack does not run).
		testservices.Eventually(t, 60*time.Second, "all 20 confirmed after the outage, marked in Redis and published", func() bool {
			_, held := s.redisStock(sku)
			return held == 0 && s.count(`SELECT COUNT(*) FROM reservations WHERE sku = ? AND status = 'CONFIRMED'`, sku) == 20 &&
				s.count(`SELECT COUNT(*) FROM `+outbox.Table+` WHERE aggregate_id LIKE ? AND NOT published`, sku+".%") == 0
		})
		stop()
		if n := s.queueDepth(s.queues.DLQURL); n != 0 {
			t.Errorf("DLQ depth = %d: a short outage dead-lettered reservations", n)
		}
		s.check(invariant.Expect{Sellable: map[string]int64{sku: 50}, Accepted: ids, Quiescent: true})
	})

	// Row 8: an optimistic-lock storm through persist: 16 consumers, one row. No
	// lost update, no false cancellation, nothing redelivered.
	t.Run("row 8: an optimistic-lock storm loses no update and cancels nothing", func(t *testing.T) {
		rec := &recordingEnqueuer{}
		s := newStack(t, withEnqueuer(rec))
		sku := testservices.Name("storm")
		s.setStock(sku, 300)
		for i := range 300 {
			if code, _ := s.reserve(sku, fmt.Sprintf("u%d", i), 1, ""); code != http.StatusAccepted {
				t.Fatal("reserve refused")
			}
		}
		work := make(chan reservation.Reservation)
		var wg sync.WaitGroup
		var failed atomic.Int64
		for range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for m := range work {
					if out, err := s.app.Service.Persist(context.Background(), m); err != nil || out.Status != reservation.StatusConfirmed {
						failed.Add(1)
					}
				}
			}()
		}
		for _, m := range rec.msgs {
			work <- m
		}
		close(work)
		wg.Wait()
		if failed.Load() != 0 {
			t.Errorf("%d messages failed or were cancelled under contention", failed.Load())
		}
		var ids []string
		for _, m := range rec.msgs {
			ids = append(ids, m.ID)
		}
		s.check(invariant.Expect{Sellable: map[string]int64{sku: 300}, Accepted: ids, Quiescent: true})
	})

	// Row 11: the sweeper expires holds while their persists are in flight. The
	// fence decides one outcome each; never both released and confirmed.
	t.Run("row 11: the sweeper racing persist decides one outcome per id", func(t *testing.T) {
		rec := &recordingEnqueuer{}
		s := newStack(t, withEnqueuer(rec))
		sku := testservices.Name("race")
		s.setStock(sku, 60)
		for i := range 60 {
			s.reserve(sku, fmt.Sprintf("u%d", i), 1, "")
		}
		s.clock.Advance(5 * time.Minute) // every hold is past its deadline
		var wg sync.WaitGroup
		for _, m := range rec.msgs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := s.app.Service.Persist(context.Background(), m); err != nil {
					t.Errorf("persist: %v", err)
				}
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 3 {
				if _, err := s.app.Service.Sweep(context.Background()); err != nil {
					t.Errorf("sweep: %v", err)
				}
			}
		}()
		wg.Wait()
		s.sweep()
		confirmed := s.count(`SELECT COUNT(*) FROM reservations WHERE sku = ? AND status = 'CONFIRMED'`, sku)
		t.Logf("confirmed %d, expired %d", confirmed, 60-confirmed)
		var ids []string
		for _, m := range rec.msgs {
			ids = append(ids, m.ID)
		}
		s.check(invariant.Expect{Sellable: map[string]int64{sku: 60}, Accepted: ids, Quiescent: true})
	})

	// Row 13: two sweepers at once — no double release, no double warm-up.
	t.Run("row 13: two sweepers at once release once and warm up once", func(t *testing.T) {
		s := newStack(t, withEnqueuer(lostEnqueuer{}))
		sku := testservices.Name("twosweep")
		s.setStock(sku, 40)
		for i := range 30 {
			s.reserve(sku, fmt.Sprintf("u%d", i), 1, "")
		}
		s.rdb.Del(context.Background(), "hf:{"+sku+"}:stock") // and a warm-up to race on
		s.clock.Advance(5 * time.Minute)
		other := s.twin(s.clock, nil)
		var wg sync.WaitGroup
		var released atomic.Int64
		for _, svc := range []*reservation.Service{s.app.Service, other} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rep, err := svc.Sweep(context.Background())
				if err != nil {
					t.Errorf("sweep: %v", err)
				}
				released.Add(int64(rep.Released))
			}()
		}
		wg.Wait()
		s.sweep()
		if n := s.count(`SELECT COUNT(*) FROM reservations WHERE sku = ? AND reason = 'expired'`, sku); n != 30 {
			t.Errorf("expired rows = %d, want 30", n)
		}
		s.check(invariant.Expect{Sellable: map[string]int64{sku: 40}, Quiescent: true})
	})

	// Row 14: the buyer cancels while persist runs: one outcome, stock returned
	// exactly once.
	t.Run("row 14: a cancel racing persist has one outcome and returns the stock once", func(t *testing.T) {
		rec := &recordingEnqueuer{}
		s := newStack(t, withEnqueuer(rec))
		sku := testservices.Name("cancelrace")
		s.setStock(sku, 40)
		for i := range 40 {
			s.reserve(sku, fmt.Sprintf("u%d", i), 1, "")
		}
		var wg sync.WaitGroup
		for _, m := range rec.msgs {
			wg.Add(3)
			go func() {
				defer wg.Done()
				if _, err := s.app.Service.Persist(context.Background(), m); err != nil {
					t.Errorf("persist: %v", err)
				}
			}()
			for range 2 { // the buyer presses cancel twice
				go func() {
					defer wg.Done()
					if out, err := s.app.Service.Cancel(context.Background(), m.ID, m.UserID); err != nil || out.Status != reservation.StatusCancelled {
						t.Errorf("cancel = %v %v", out.Status, err)
					}
				}()
			}
		}
		wg.Wait()
		if n := s.count(`SELECT COUNT(*) FROM reservations WHERE sku = ? AND status = 'CANCELLED'`, sku); n != 40 {
			t.Errorf("cancelled = %d, want all 40 (the buyer's cancel wins either way)", n)
		}
		var ids []string
		for _, m := range rec.msgs {
			ids = append(ids, m.ID)
		}
		s.check(invariant.Expect{Sellable: map[string]int64{sku: 40}, Accepted: ids, Quiescent: true})
	})

	// Row 15: clock skew between invocations. Deadlines are set and judged by
	// Redis's clock, so a function whose own clock runs an hour ahead neither
	// stretches a hold it reserves nor releases one early; once Redis's clock
	// passes deadline + grace the hold is released through the fence, and the
	// late persist takes nothing.
	t.Run("row 15: clock skew neither stretches nor shortens a hold", func(t *testing.T) {
		rec := &recordingEnqueuer{}
		s := newStack(t, withEnqueuer(rec))
		sku := testservices.Name("skew")
		s.setStock(sku, 10)
		ahead := &testClock{now: s.clock.Now().Add(time.Hour)}
		skewed := s.twin(ahead, rec)
		held, _, err := skewed.Reserve(context.Background(), reservation.ReserveRequest{SKU: sku, Qty: 2, UserID: "u"})
		if err != nil {
			t.Fatal(err)
		}
		if want := s.clock.Now().Add(60 * time.Second); !held.ExpiresAt.Equal(want) {
			t.Fatalf("a function an hour ahead set the deadline %v, want Redis's now + 60 s = %v", held.ExpiresAt, want)
		}
		if rep, _ := skewed.Sweep(context.Background()); rep.Released != 0 {
			t.Fatalf("a sweeper an hour ahead released a hold before its deadline by Redis's clock")
		}
		s.clock.Advance(61500 * time.Millisecond) // past the deadline, within the grace
		if rep, _ := skewed.Sweep(context.Background()); rep.Released != 0 {
			t.Fatalf("released within the grace")
		}
		s.clock.Advance(time.Second)
		if rep, _ := skewed.Sweep(context.Background()); rep.Released != 1 {
			t.Fatalf("after deadline + grace by Redis's clock released %d, want 1", rep.Released)
		}
		out, err := s.app.Service.Persist(context.Background(), rec.msgs[0])
		if err != nil || out.Status != reservation.StatusCancelled {
			t.Errorf("late persist = %v %v, want CANCELLED (fenced)", out.Status, err)
		}
		s.check(invariant.Expect{Sellable: map[string]int64{sku: 10}, Accepted: []string{rec.msgs[0].ID}, Quiescent: true})
	})
}
