package system_test

// Seeded chaos: many short schedules, each a random sale on its own SKU —
// buyers (some retrying with the same key), group joins (some users twice),
// cancellations by the buyer and the order service, payments under a pay
// window that times out, deliveries (some duplicated, some lost, some to the DLQ),
// sweeps on a moving and skewed clock, the sale window opening, closing and
// moving under them — with faults drawn from the same seed:
// lost and failed sends, sends that fail after enqueueing, crashes between the
// deduct and the send and after the commit, Redis losing the SKU's keys. Each
// schedule then settles and the invariant checker must find I1–I5 intact.
//
// The seed of every schedule is printed on failure; HOLDFAST_CHAOS_SEED=<n>
// replays that schedule (the same operations and faults; goroutine
// interleavings inside a concurrent step may differ). make test runs
// HOLDFAST_CHAOS_SCHEDULES (default 1000); make chaos runs for
// HOLDFAST_CHAOS_DURATION.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/testkit/invariant"
	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/adapters/redisstore"
	"github.com/holdfast/holdfast/shared/reservation"
)

type sendMode int

const (
	deliver sendMode = iota
	lose
	failBefore
	failAfter
	duplicate
)

// chaosQueue is the SQS stand-in of the chaos test: it keeps the messages
// and applies the send fault the schedule chose for each user.
type chaosQueue struct {
	mu    sync.Mutex
	msgs  []reservation.Reservation
	modes map[string]sendMode // by user
}

func (q *chaosQueue) Enqueue(_ context.Context, r reservation.Reservation) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	switch q.modes[r.UserID] {
	case lose:
		return nil
	case failBefore:
		return reservation.Unavailable("sqs send", errors.New("chaos: refused"))
	case failAfter:
		q.msgs = append(q.msgs, r)
		return reservation.Unavailable("sqs send", errors.New("chaos: timed out after enqueueing"))
	case duplicate:
		q.msgs = append(q.msgs, r, r)
		return nil
	}
	q.msgs = append(q.msgs, r)
	return nil
}

func (q *chaosQueue) take(rng *rand.Rand) (reservation.Reservation, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.msgs) == 0 {
		return reservation.Reservation{}, false
	}
	i := rng.IntN(len(q.msgs))
	m := q.msgs[i]
	q.msgs = append(q.msgs[:i], q.msgs[i+1:]...)
	return m, true
}

// crashes are the crash points the schedule armed, by user and by id.
type crashes struct {
	mu        sync.Mutex
	afterHold map[string]bool
	afterCmt  map[string]bool
}

func (c *crashes) hooks() reservation.Hooks {
	return reservation.Hooks{
		AfterHold: func(r reservation.Reservation) error {
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.afterHold[r.UserID] {
				delete(c.afterHold, r.UserID)
				return errCrash
			}
			return nil
		},
		AfterCommit: func(r reservation.Reservation) error {
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.afterCmt[r.ID] {
				delete(c.afterCmt, r.ID)
				return errCrash
			}
			return nil
		},
	}
}

type chaos struct {
	s       *stack
	q       *chaosQueue
	crash   *crashes
	skewed  *reservation.Service // a second execution environment whose clock runs ahead
	skewClk *testClock
	k       int // each schedule's SKU has k buckets
}

func TestChaos(t *testing.T) {
	runChaos(t, 1, nil, "HOLDFAST_CHAOS_SCHEDULES", 1000)
}

// TestChaosBuckets is TestChaos with each schedule's SKU over K = 3 buckets
// on the three shards of a real Redis Cluster; Redis losing a key loses one
// bucket's.
func TestChaosBuckets(t *testing.T) {
	testservices.Require(t)
	runChaos(t, 3, testservices.StartCluster(t), "HOLDFAST_CHAOS_BUCKET_SCHEDULES", 300)
}

// runChaos runs the schedules with SKUs of k buckets, on the cluster when
// addrs is not nil; countEnv (default def) sets how many.
func runChaos(t *testing.T, k int, addrs []string, countEnv string, def int) {
	q := &chaosQueue{modes: map[string]sendMode{}}
	cr := &crashes{afterHold: map[string]bool{}, afterCmt: map[string]bool{}}
	opts := []stackOption{withEnqueuer(q), withHooks(cr.hooks()), withVars(map[string]string{
		"HOLDFAST_HOLD_TTL": "30s", "HOLDFAST_SWEEP_GRACE": "2s", "HOLDFAST_RECONCILE_AFTER": "1m",
	})}
	if addrs != nil {
		opts = append(opts, withCluster(addrs))
	}
	s := newStack(t, opts...)
	skewClk := &testClock{now: s.clock.Now()}
	c := &chaos{s: s, q: q, crash: cr, skewClk: skewClk, skewed: s.twin(skewClk, q), k: k}

	if seed := os.Getenv("HOLDFAST_CHAOS_SEED"); seed != "" {
		n, err := strconv.ParseUint(seed, 10, 64)
		if err != nil {
			t.Fatalf("HOLDFAST_CHAOS_SEED=%q", seed)
		}
		c.schedule(t, n)
		return
	}
	count, _ := strconv.Atoi(os.Getenv(countEnv))
	if count == 0 {
		count = def
	}
	if testing.Short() {
		count = 50
	}
	var until time.Time
	if d, err := time.ParseDuration(os.Getenv("HOLDFAST_CHAOS_DURATION")); err == nil {
		until, count = time.Now().Add(d), 1<<30
	}
	base := uint64(time.Now().UnixNano())
	if b, err := strconv.ParseUint(os.Getenv("HOLDFAST_CHAOS_BASE"), 10, 64); err == nil {
		base = b
	}
	if until.IsZero() {
		t.Logf("chaos: base seed %d, %d schedules (replay one with HOLDFAST_CHAOS_SEED)", base, count)
	} else {
		t.Logf("chaos: base seed %d, schedules until %s (replay one with HOLDFAST_CHAOS_SEED)", base, until.Format(time.TimeOnly))
	}
	start := time.Now()
	ran := 0
	for i := range count {
		if !until.IsZero() && time.Now().After(until) {
			break
		}
		seed := base + uint64(i)
		if !c.schedule(t, seed) {
			t.Fatalf("chaos: schedule with seed %d broke an invariant; replay: HOLDFAST_CHAOS_SEED=%d go test ./test/system -run '%s$'", seed, seed, t.Name())
		}
		ran++
	}
	t.Logf("chaos: %d schedules passed in %v", ran, time.Since(start).Round(time.Millisecond))
}

// schedule runs one seeded schedule and reports whether the invariants held.
func (c *chaos) schedule(t *testing.T, seed uint64) bool {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	s := c.s
	ctx := context.Background()
	sku := fmt.Sprintf("chaos%d-%d", c.k, seed)
	stock := 1 + rng.IntN(8)
	payWithin := []int{0, 0, 10, 30}[rng.IntN(4)] // seconds; 0: no pay window
	if code, body := s.call("PUT", "/admin/skus/"+sku+"/stock", fmt.Sprintf(`{"stock":%d,"buckets":%d,"pay_within_seconds":%d}`, stock, c.k, payWithin), nil); code != http.StatusOK {
		t.Errorf("seed %d: create sku = %d %v", seed, code, body)
		return false
	}
	var group string
	if rng.IntN(3) == 0 {
		code, body := s.call("POST", "/groups", fmt.Sprintf(`{"sku":%q,"capacity":%d,"ttl_seconds":%d}`, sku, 2+rng.IntN(3), 20+rng.IntN(60)), nil)
		if code != http.StatusCreated {
			t.Errorf("seed %d: create group = %d %v", seed, code, body)
			return false
		}
		group = body["group_id"].(string)
	}

	var mu sync.Mutex
	accepted := map[string]bool{}
	var healed atomic.Int64 // Redis corrections by reconciliation
	var lossInjected atomic.Bool
	note := func(code int, body map[string]any) {
		if code == http.StatusAccepted {
			mu.Lock()
			accepted[body["reservation_id"].(string)] = true
			mu.Unlock()
		} else if code >= 500 && code != http.StatusServiceUnavailable && code != http.StatusInternalServerError {
			t.Errorf("seed %d: unexpected %d %v", seed, code, body)
		}
	}
	pick := func() (string, bool) {
		mu.Lock()
		defer mu.Unlock()
		if len(accepted) == 0 {
			return "", false
		}
		n := rng.IntN(len(accepted))
		for id := range accepted {
			if n == 0 {
				return id, true
			}
			n--
		}
		return "", false
	}

	steps := 6 + rng.IntN(10)
	for range steps {
		width := 1 + rng.IntN(3) // actions run concurrently in this step
		var actions []func()
		for range width {
			user := fmt.Sprintf("u%d", rng.IntN(6))
			switch k := rng.IntN(100); {
			case k < 35: // a buyer, maybe with a send fault or a crash
				mode := sendMode(0)
				if f := rng.IntN(10); f < 5 {
					mode = sendMode(f)
				}
				c.q.mu.Lock()
				c.q.modes[user] = mode
				c.q.mu.Unlock()
				if rng.IntN(12) == 0 {
					c.crash.mu.Lock()
					c.crash.afterHold[user] = true
					c.crash.mu.Unlock()
				}
				key := ""
				if rng.IntN(2) == 0 {
					key = fmt.Sprintf("k%d", rng.IntN(3))
				}
				qty := 1 + rng.IntN(2)
				actions = append(actions, func() { note(s.reserve(sku, user, qty, key)) })
			case k < 47 && group != "": // a group join (users repeat)
				actions = append(actions, func() { note(s.join(sku, group, user)) })
			case k < 50: // a buyer cancels
				actions = append(actions, func() {
					if id, ok := pick(); ok {
						s.call("DELETE", "/reservations/"+id, "", nil)
					}
				})
			case k < 53: // the order service records a payment
				actions = append(actions, func() {
					if id, ok := pick(); ok {
						if code, b := s.call("POST", "/admin/reservations/"+id+"/paid", "", nil); code != http.StatusOK && code != http.StatusConflict &&
							code != http.StatusNotFound && code != http.StatusServiceUnavailable {
							t.Errorf("seed %d: pay %s = %d %v", seed, id, code, b)
						}
					}
				})
			case k < 55: // the order service cancels
				actions = append(actions, func() {
					if id, ok := pick(); ok {
						if code, b := s.call("POST", "/admin/reservations/"+id+"/cancel", `{"reason":"chaos"}`, nil); code != http.StatusOK &&
							code != http.StatusConflict && code != http.StatusNotFound && code != http.StatusServiceUnavailable {
							t.Errorf("seed %d: order cancel %s = %d %v", seed, id, code, b)
						}
					}
				})
			case k < 80: // SQS delivers a batch of 1–3 (crashing after commit, now and then)
				crashAfter := rng.IntN(8) == 0
				size := 1 + rng.IntN(3)
				actions = append(actions, func() {
					var batch []reservation.Reservation
					for range size {
						if m, ok := c.q.take(rng); ok {
							batch = append(batch, m)
						}
					}
					if len(batch) == 0 {
						return
					}
					if crashAfter {
						c.crash.mu.Lock()
						c.crash.afterCmt[batch[0].ID] = true
						c.crash.mu.Unlock()
					}
					for i, err := range s.app.Service.PersistBatch(ctx, batch) {
						if err != nil {
							c.q.mu.Lock()
							c.q.msgs = append(c.q.msgs, batch[i]) // redelivered
							c.q.mu.Unlock()
						}
					}
				})
			case k < 85: // a message ends in the DLQ instead
				actions = append(actions, func() {
					if m, ok := c.q.take(rng); ok {
						if _, err := s.app.Service.Compensate(ctx, m); err != nil {
							t.Errorf("seed %d: compensate: %v", seed, err)
						}
					}
				})
			case k < 95: // time passes; a sweep (on the skewed clock, sometimes)
				adv := time.Duration(rng.IntN(40)) * time.Second
				skewed := rng.IntN(3) == 0
				actions = append(actions, func() {
					s.clock.Advance(adv)
					c.skewClk.Advance(adv)
					svc := s.app.Service
					if skewed {
						svc = c.skewed
					}
					rep, err := svc.Sweep(ctx)
					if err != nil {
						t.Errorf("seed %d: sweep: %v", seed, err)
					}
					healed.Add(int64(rep.Healed))
				})
			case k < 97: // an admin moves the sale window: opening ahead, closed now, or none
				var body string
				switch now := s.clock.Now(); rng.IntN(3) {
				case 0:
					body = fmt.Sprintf(`{"add":0,"opens_at":%q,"closes_at":""}`, now.Add(time.Duration(1+rng.IntN(30))*time.Second).Format(time.RFC3339Nano))
				case 1:
					body = fmt.Sprintf(`{"add":0,"opens_at":"","closes_at":%q}`, now.Format(time.RFC3339Nano))
				default:
					body = `{"add":0,"opens_at":"","closes_at":""}`
				}
				actions = append(actions, func() {
					if code, b := s.call("PUT", "/admin/skus/"+sku+"/stock", body, nil); code != http.StatusOK && code != http.StatusServiceUnavailable {
						t.Errorf("seed %d: PUT window %s = %d %v", seed, body, code, b)
					}
				})
			default: // Redis loses a stock key of this SKU (a lost write)
				b := rng.IntN(c.k)
				actions = append(actions, func() {
					lossInjected.Store(true)
					s.redis().Del(ctx, "hf:{"+reservation.BucketName(sku, b)+"}:stock")
				})
			}
		}
		var wg sync.WaitGroup
		for _, act := range actions {
			wg.Add(1)
			go func() { defer wg.Done(); act() }()
		}
		wg.Wait()
	}

	// Settle: every message is delivered (until none is redelivered), the
	// clock passes every deadline, and the sweeper runs.
	for range 20 {
		m, ok := c.q.take(rng)
		if !ok {
			break
		}
		if _, err := s.app.Service.Persist(ctx, m); err != nil {
			c.q.mu.Lock()
			c.q.msgs = append(c.q.msgs, m)
			c.q.mu.Unlock()
		}
	}
	for range 3 {
		s.clock.Advance(2 * time.Hour)
		c.skewClk.Advance(2 * time.Hour)
		rep, err := s.app.Service.Sweep(ctx)
		if err != nil {
			t.Errorf("seed %d: settling sweep: %v", seed, err)
		}
		healed.Add(int64(rep.Healed))
	}
	ids := make([]string, 0, len(accepted))
	for id := range accepted {
		ids = append(ids, id)
	}
	vs, err := invariant.Check(ctx, s.db, redisstore.New(s.redis(), 0), invariant.Expect{
		Sellable: map[string]int64{sku: int64(stock)}, Accepted: ids, Quiescent: true,
	})
	if err != nil {
		t.Errorf("seed %d: check: %v", seed, err)
		return false
	}
	// Reconciliation heals Redis, so a Redis accounting error would be
	// masked at quiescence: without a Redis fault there must be nothing to heal.
	if healed.Load() > 0 && !lossInjected.Load() {
		vs = append(vs, invariant.Violation{Invariant: "I3", Detail: fmt.Sprintf(
			"%s: Redis drifted from MySQL without a Redis fault (reconciliation healed it %d times)", sku, healed.Load())})
	}
	if len(vs) > 0 {
		t.Errorf("seed %d: %s", seed, invariant.Violations(vs))
		return false
	}
	// Keep the sweep's work per schedule constant: retire the SKU.
	if _, err := s.db.ExecContext(ctx, `DELETE FROM product_stock WHERE sku = ?`, sku); err != nil {
		t.Fatal(err)
	}
	c.q.mu.Lock()
	c.q.msgs = nil
	c.q.modes = map[string]sendMode{}
	c.q.mu.Unlock()
	return true
}
