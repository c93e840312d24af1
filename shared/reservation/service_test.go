package reservation

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

type fixture struct {
	svc    *Service
	holds  *memHolds
	ledger *memLedger
	queue  *memQueue
	notes  *memNotifier
	clock  *fixedClock
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{
		holds: newMemHolds(), ledger: newMemLedger(), queue: &memQueue{}, notes: &memNotifier{},
		clock: &fixedClock{t: time.Date(2026, 11, 11, 0, 0, 0, 0, time.UTC)},
	}
	cfg := DefaultConfig()
	cfg.HoldTTL = time.Minute
	f.svc = NewService(cfg, Deps{Holds: f.holds, Ledger: f.ledger, Queue: f.queue, Notifier: f.notes, Clock: f.clock})
	f.svc.sleep = func(context.Context, time.Duration) {}
	return f
}

func (f *fixture) stock(t *testing.T, sku string, n int64) {
	t.Helper()
	if _, err := f.svc.SetStock(context.Background(), sku, n, nil); err != nil {
		t.Fatalf("SetStock(%q, %d) = %v", sku, n, err)
	}
}

func (f *fixture) reserve(t *testing.T, sku, user string, qty int) Reservation {
	t.Helper()
	r, _, err := f.svc.Reserve(context.Background(), ReserveRequest{SKU: sku, Qty: qty, UserID: user})
	if err != nil {
		t.Fatalf("Reserve(%q, %q, %d) = %v", sku, user, qty, err)
	}
	return r
}

func (f *fixture) redis(sku string) int64 { return f.holds.stock[sku] }
func (f *fixture) mysql(sku string) int64 { return f.ledger.stock[sku].Available }

func TestReserveValidatesInputAndHoldsNothingOnBadInput(t *testing.T) {
	tests := []struct {
		name string
		req  ReserveRequest
	}{
		{"zero qty", ReserveRequest{SKU: "s", Qty: 0, UserID: "u"}},
		{"negative qty", ReserveRequest{SKU: "s", Qty: -3, UserID: "u"}},
		{"qty above the limit", ReserveRequest{SKU: "s", Qty: 11, UserID: "u"}},
		{"missing sku", ReserveRequest{Qty: 1, UserID: "u"}},
		{"sku with a hash tag", ReserveRequest{SKU: "a}{b", Qty: 1, UserID: "u"}},
		{"missing user", ReserveRequest{SKU: "s", Qty: 1}},
		{"bad group id", ReserveRequest{SKU: "s", Qty: 1, UserID: "u", GroupID: "g g"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			f.stock(t, "s", 5)
			_, _, err := f.svc.Reserve(context.Background(), tt.req)
			var inv *InvalidError
			if !errors.As(err, &inv) {
				t.Fatalf("Reserve(%+v) = %v, want InvalidError", tt.req, err)
			}
			if f.holds.calls["Reserve"] != 0 || f.redis("s") != 5 {
				t.Errorf("bad input reached Redis: calls %d, stock %d", f.holds.calls["Reserve"], f.redis("s"))
			}
		})
	}
}

func TestReserveWithSameKeyReturnsSameReservation(t *testing.T) {
	f := newFixture(t)
	f.stock(t, "s", 5)
	req := ReserveRequest{SKU: "s", Qty: 2, UserID: "u", IdempotencyKey: "k"}
	a, replayedA, err := f.svc.Reserve(context.Background(), req)
	if err != nil || replayedA {
		t.Fatalf("first Reserve = %v, replayed %v", err, replayedA)
	}
	b, replayedB, err := f.svc.Reserve(context.Background(), req)
	if err != nil || !replayedB || b.ID != a.ID {
		t.Fatalf("second Reserve = %v %v %v, want replay of %s", b.ID, replayedB, err, a.ID)
	}
	if f.redis("s") != 3 {
		t.Errorf("redis stock = %d, want 3 (taken once)", f.redis("s"))
	}
	req.Qty = 3
	if _, _, err := f.svc.Reserve(context.Background(), req); !errors.Is(err, ErrIdempotencyMismatch) {
		t.Errorf("same key, other qty = %v, want ErrIdempotencyMismatch", err)
	}
}

func TestReserveWarmsAnSKURedisLost(t *testing.T) {
	f := newFixture(t)
	f.stock(t, "s", 5)
	delete(f.holds.stock, "s") // Redis lost it
	r := f.reserve(t, "s", "u", 1)
	if r.Status != StatusHeld || f.redis("s") != 4 {
		t.Errorf("after warm: %v, redis %d, want HELD and 4", r.Status, f.redis("s"))
	}
	if _, _, err := f.svc.Reserve(context.Background(), ReserveRequest{SKU: "nope", Qty: 1, UserID: "u"}); !errors.Is(err, ErrUnknownSKU) {
		t.Errorf("unknown sku = %v, want ErrUnknownSKU", err)
	}
}

func TestReservePublishFailureIsFencedAndReleased(t *testing.T) {
	f := newFixture(t)
	f.stock(t, "s", 5)
	f.queue.err = errInjected
	_, _, err := f.svc.Reserve(context.Background(), ReserveRequest{SKU: "s", Qty: 2, UserID: "u", IdempotencyKey: "k"})
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Reserve = %v, want ErrUnavailable", err)
	}
	if f.redis("s") != 5 {
		t.Errorf("redis = %d, want 5 (nothing held)", f.redis("s"))
	}
	id := ReservationID(ReserveRequest{SKU: "s", UserID: "u", IdempotencyKey: "k"})
	if row := f.ledger.rows[id]; row.Status != StatusCancelled || row.Reason != ReasonPublishFailed {
		t.Errorf("row = %+v, want CANCELLED publish_failed", row)
	}
	// The late message (the send had gone through) takes nothing.
	out, err := f.svc.Persist(context.Background(), Reservation{ID: id, SKU: "s", Qty: 2, UserID: "u"})
	if err != nil || out.Status != StatusCancelled || f.mysql("s") != 5 {
		t.Errorf("late persist = %v %v, mysql %d; want CANCELLED and 5", out.Status, err, f.mysql("s"))
	}
}

func TestReservePublishFailureWithMySQLDownLeavesHoldForSweeper(t *testing.T) {
	f := newFixture(t)
	f.stock(t, "s", 5)
	f.queue.err = errInjected
	f.ledger.fail["Fence"] = errInjected
	if _, _, err := f.svc.Reserve(context.Background(), ReserveRequest{SKU: "s", Qty: 2, UserID: "u"}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Reserve = %v, want ErrUnavailable", err)
	}
	if f.holds.calls["Release"] != 0 || f.redis("s") != 3 {
		t.Fatalf("released without a fence: calls %d redis %d", f.holds.calls["Release"], f.redis("s"))
	}
	delete(f.ledger.fail, "Fence")
	f.clock.t = f.clock.t.Add(2 * time.Minute)
	rep, err := f.svc.Sweep(context.Background())
	if err != nil || rep.Released != 1 || f.redis("s") != 5 {
		t.Errorf("sweep = %+v %v, redis %d; want 1 released and 5", rep, err, f.redis("s"))
	}
}

func TestReplayedHoldResendsAndNeverCancelsOnResendFailure(t *testing.T) {
	f := newFixture(t)
	f.stock(t, "s", 5)
	req := ReserveRequest{SKU: "s", Qty: 1, UserID: "u", IdempotencyKey: "k"}
	if _, _, err := f.svc.Reserve(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	f.queue.err = errInjected
	r, replayed, err := f.svc.Reserve(context.Background(), req)
	if err != nil || !replayed || r.Status != StatusHeld {
		t.Fatalf("replay = %v %v %v, want HELD replay", r.Status, replayed, err)
	}
	if f.ledger.calls["Fence"] != 0 {
		t.Errorf("a failed re-send fenced the reservation")
	}
	f.queue.err = nil
	if _, _, err := f.svc.Reserve(context.Background(), req); err != nil || len(f.queue.sent) != 2 {
		t.Errorf("replay re-sends: %v, sent %d, want 2", err, len(f.queue.sent))
	}
}

func TestPersistRetriesConflictsInFreshAttempts(t *testing.T) {
	f := newFixture(t)
	f.stock(t, "s", 5)
	r := f.reserve(t, "s", "u", 2)
	f.ledger.conflicts = 3
	out, err := f.svc.Persist(context.Background(), r)
	if err != nil || out.Status != StatusConfirmed {
		t.Fatalf("Persist = %v %v, want CONFIRMED", out.Status, err)
	}
	if f.ledger.calls["Apply"] != 4 {
		t.Errorf("Apply calls = %d, want 4", f.ledger.calls["Apply"])
	}
	for i, l := range f.ledger.locked {
		if l != Optimistic {
			t.Errorf("attempt %d locked the row before the last attempt", i+1)
		}
	}
	if f.mysql("s") != 3 || f.holds.holds[r.ID].Status != StatusConfirmed {
		t.Errorf("mysql %d hold %v, want 3 and CONFIRMED", f.mysql("s"), f.holds.holds[r.ID].Status)
	}
}

func TestPersistOutOfRetriesIsRedeliveredNeverCancelled(t *testing.T) {
	f := newFixture(t)
	f.stock(t, "s", 5)
	r := f.reserve(t, "s", "u", 2)
	f.ledger.conflicts = 100
	_, err := f.svc.Persist(context.Background(), r)
	if !errors.Is(err, ErrContended) {
		t.Fatalf("Persist = %v, want ErrContended", err)
	}
	if f.ledger.calls["Fence"] != 0 || len(f.ledger.rows) != 0 {
		t.Errorf("contention cancelled the reservation (false cancellation)")
	}
	if n := len(f.ledger.locked); n != f.svc.cfg.PersistAttempts || f.ledger.locked[n-1] != Pessimistic {
		t.Errorf("attempts %v: want %d, the last one locking", f.ledger.locked, f.svc.cfg.PersistAttempts)
	}
}

func TestPersistDecisions(t *testing.T) {
	tests := []struct {
		name       string
		prepare    func(f *fixture, r Reservation)
		wantStatus Status
		wantReason Reason
		wantMySQL  int64
		wantRedis  int64
	}{
		{"applies", func(*fixture, Reservation) {}, StatusConfirmed, "", 3, 3},
		{"redelivery is a no-op", func(f *fixture, r Reservation) {
			_, _ = f.svc.Persist(context.Background(), r)
		}, StatusConfirmed, "", 3, 3},
		{"fenced first takes nothing and releases", func(f *fixture, r Reservation) {
			_, _, _ = f.ledger.Fence(context.Background(), r, ReasonExpired, f.clock.t)
		}, StatusCancelled, ReasonExpired, 5, 5},
		{"insufficient in MySQL cancels now", func(f *fixture, _ Reservation) {
			f.ledger.stock["s"].Available = 1 // the stores drifted
		}, StatusCancelled, ReasonInsufficient, 1, 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			f.stock(t, "s", 5)
			r := f.reserve(t, "s", "u", 2)
			tt.prepare(f, r)
			out, err := f.svc.Persist(context.Background(), r)
			if err != nil || out.Status != tt.wantStatus || out.Reason != tt.wantReason {
				t.Fatalf("Persist = %v %q %v, want %v %q", out.Status, out.Reason, err, tt.wantStatus, tt.wantReason)
			}
			if f.mysql("s") != tt.wantMySQL || f.redis("s") != tt.wantRedis {
				t.Errorf("mysql %d redis %d, want %d and %d", f.mysql("s"), f.redis("s"), tt.wantMySQL, tt.wantRedis)
			}
			if tt.wantStatus == StatusCancelled && len(f.notes.events) != 1 {
				t.Errorf("events = %d, want 1", len(f.notes.events))
			}
		})
	}
}

func TestPersistTransientErrorIsRetriedLater(t *testing.T) {
	f := newFixture(t)
	f.stock(t, "s", 5)
	r := f.reserve(t, "s", "u", 2)
	f.ledger.fail["Apply"] = errInjected
	if _, err := f.svc.Persist(context.Background(), r); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Persist = %v, want ErrUnavailable", err)
	}
	if f.ledger.calls["Fence"] != 0 || f.redis("s") != 3 {
		t.Errorf("a database outage cancelled the reservation")
	}
}

func TestCompensateChecksMySQLFirst(t *testing.T) {
	f := newFixture(t)
	f.stock(t, "s", 5)
	r := f.reserve(t, "s", "u", 2)
	if _, err := f.svc.Persist(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	out, err := f.svc.Compensate(context.Background(), r)
	if err != nil || out.Status != StatusConfirmed || f.redis("s") != 3 || len(f.notes.events) != 0 {
		t.Errorf("Compensate of CONFIRMED = %v %v, redis %d, events %d; want CONFIRMED, 3, 0",
			out.Status, err, f.redis("s"), len(f.notes.events))
	}
}

func TestCompensateIsIdempotentAndNotifiesOnce(t *testing.T) {
	f := newFixture(t)
	f.stock(t, "s", 5)
	r := f.reserve(t, "s", "u", 2)
	for range 3 {
		out, err := f.svc.Compensate(context.Background(), r)
		if err != nil || out.Status != StatusCancelled || out.Reason != ReasonDeadLetter {
			t.Fatalf("Compensate = %v %q %v", out.Status, out.Reason, err)
		}
	}
	if f.redis("s") != 5 || len(f.notes.events) != 1 {
		t.Errorf("redis %d events %d, want 5 and 1", f.redis("s"), len(f.notes.events))
	}
}

func TestCompensateEventFailureIsRetriedAndResentBySweeper(t *testing.T) {
	f := newFixture(t)
	f.stock(t, "s", 5)
	r := f.reserve(t, "s", "u", 2)
	f.notes.err = errInjected
	if _, err := f.svc.Compensate(context.Background(), r); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Compensate = %v, want the publish error", err)
	}
	if f.redis("s") != 5 {
		t.Errorf("stock not returned before the event: redis %d", f.redis("s"))
	}
	f.notes.err = nil
	rep, err := f.svc.Sweep(context.Background())
	if err != nil || rep.Notified != 1 || len(f.notes.events) != 1 {
		t.Errorf("sweep resent %d (%v), events %d; want 1 and 1", rep.Notified, err, len(f.notes.events))
	}
}

func TestCancelHeldAndConfirmed(t *testing.T) {
	f := newFixture(t)
	f.stock(t, "s", 10)
	held := f.reserve(t, "s", "u", 2)
	confirmed := f.reserve(t, "s", "v", 3)
	if _, err := f.svc.Persist(context.Background(), confirmed); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		for _, id := range []string{held.ID, confirmed.ID} {
			out, err := f.svc.Cancel(context.Background(), id)
			if err != nil || out.Status != StatusCancelled || out.Reason != ReasonBuyer {
				t.Fatalf("Cancel(%s) = %v %q %v", id, out.Status, out.Reason, err)
			}
		}
	}
	if f.redis("s") != 10 || f.mysql("s") != 10 {
		t.Errorf("redis %d mysql %d, want 10 and 10", f.redis("s"), f.mysql("s"))
	}
	if len(f.notes.events) != 2 {
		t.Errorf("events = %d, want 2", len(f.notes.events))
	}
	if _, err := f.svc.Cancel(context.Background(), "r-unknown"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Cancel(unknown) = %v, want ErrNotFound", err)
	}
}

func TestSweepExpiredHoldFoundConfirmedOnlyMarksIt(t *testing.T) {
	f := newFixture(t)
	f.stock(t, "s", 5)
	r := f.reserve(t, "s", "u", 2)
	f.holds.fail["Confirm"] = errInjected // persist commits, the Redis mark fails
	if _, err := f.svc.Persist(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	delete(f.holds.fail, "Confirm")
	f.clock.t = f.clock.t.Add(2 * time.Minute)
	rep, err := f.svc.Sweep(context.Background())
	if err != nil || rep.Confirmed != 1 || rep.Released != 0 {
		t.Fatalf("sweep = %+v %v, want 1 confirmed", rep, err)
	}
	if f.redis("s") != 3 || f.mysql("s") != 3 || f.holds.held["s"] != 0 {
		t.Errorf("redis %d mysql %d held %d, want 3 3 0", f.redis("s"), f.mysql("s"), f.holds.held["s"])
	}
}

func TestSweepRespectsDeadlinePlusGrace(t *testing.T) {
	f := newFixture(t)
	f.stock(t, "s", 5)
	f.reserve(t, "s", "u", 2)
	f.clock.t = f.clock.t.Add(time.Minute + f.svc.cfg.SweepGrace - time.Millisecond)
	if rep, _ := f.svc.Sweep(context.Background()); rep.Released != 0 {
		t.Fatalf("released before deadline + grace")
	}
	f.clock.t = f.clock.t.Add(time.Millisecond)
	if rep, _ := f.svc.Sweep(context.Background()); rep.Released != 1 {
		t.Fatalf("not released at deadline + grace")
	}
}

func TestGroupJoinRulesAndFailure(t *testing.T) {
	f := newFixture(t)
	f.stock(t, "s", 10)
	g, err := f.svc.CreateGroup(context.Background(), "s", 3, 30*time.Second) // shorter than the holds' minute
	if err != nil {
		t.Fatal(err)
	}
	join := func(user string) (Reservation, error) {
		r, _, err := f.svc.Reserve(context.Background(), ReserveRequest{SKU: "s", Qty: 1, UserID: user, GroupID: g.ID})
		return r, err
	}
	a, err := join("a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := join("a"); !errors.Is(err, ErrAlreadyJoined) {
		t.Errorf("second join of a = %v, want ErrAlreadyJoined", err)
	}
	b, _ := join("b")
	if _, err := f.svc.Persist(context.Background(), a); err != nil {
		t.Fatal(err)
	}
	f.clock.t = f.clock.t.Add(40 * time.Second)
	if _, err := join("c"); !errors.Is(err, ErrGroupClosed) {
		t.Errorf("join after deadline = %v, want ErrGroupClosed", err)
	}
	rep, err := f.svc.Sweep(context.Background())
	if err != nil || rep.GroupsFailed != 1 {
		t.Fatalf("sweep = %+v %v, want 1 group failed", rep, err)
	}
	if f.redis("s") != 10 || f.mysql("s") != 10 {
		t.Errorf("redis %d mysql %d, want all 10 back", f.redis("s"), f.mysql("s"))
	}
	for _, id := range []string{a.ID, b.ID} {
		if row := f.ledger.rows[id]; row.Status != StatusCancelled || row.Reason != ReasonGroupFailed {
			t.Errorf("member %s = %v %q, want CANCELLED group_failed", id, row.Status, row.Reason)
		}
	}
	if rep, _ := f.svc.Sweep(context.Background()); rep.GroupsFailed != 0 {
		t.Errorf("group failed twice")
	}
}

func TestCreateGroupValidates(t *testing.T) {
	f := newFixture(t)
	f.stock(t, "s", 10)
	for _, c := range []struct {
		capacity int
		ttl      time.Duration
	}{{1, 0}, {1001, 0}, {3, -time.Second}, {3, 8 * 24 * time.Hour}} {
		var inv *InvalidError
		if _, err := f.svc.CreateGroup(context.Background(), "s", c.capacity, c.ttl); !errors.As(err, &inv) {
			t.Errorf("CreateGroup(capacity %d, ttl %v) = %v, want InvalidError", c.capacity, c.ttl, err)
		}
	}
	if _, err := f.svc.CreateGroup(context.Background(), "nope", 3, 0); !errors.Is(err, ErrUnknownSKU) {
		t.Errorf("CreateGroup(unknown sku) = %v, want ErrUnknownSKU", err)
	}
}

func TestSetStockMovesRedisByTheSameAmountKeepingHolds(t *testing.T) {
	f := newFixture(t)
	f.stock(t, "s", 10)
	f.reserve(t, "s", "u", 4) // redis 6, mysql 10, held 4
	f.stock(t, "s", 20)
	if f.redis("s") != 16 || f.mysql("s") != 20 {
		t.Errorf("redis %d mysql %d, want 16 and 20", f.redis("s"), f.mysql("s"))
	}
	var inv *InvalidError
	if _, err := f.svc.SetStock(context.Background(), "s", -1, nil); !errors.As(err, &inv) {
		t.Errorf("SetStock(-1) = %v, want InvalidError", err)
	}
}

func TestReservationIDIsStablePerUserSKUAndKey(t *testing.T) {
	a := ReservationID(ReserveRequest{SKU: "s", UserID: "u", IdempotencyKey: "k"})
	if b := ReservationID(ReserveRequest{SKU: "s", UserID: "u", IdempotencyKey: "k", Qty: 9}); a != b {
		t.Errorf("same key gave %s and %s", a, b)
	}
	for _, other := range []ReserveRequest{
		{SKU: "s", UserID: "v", IdempotencyKey: "k"},
		{SKU: "t", UserID: "u", IdempotencyKey: "k"},
		{SKU: "s", UserID: "u", IdempotencyKey: "j"},
		{SKU: "s", UserID: "u"},
	} {
		if id := ReservationID(other); id == a || !ValidReservationID(id, other.SKU) {
			t.Errorf("ReservationID(%+v) = %s (collides or invalid)", other, id)
		}
	}
}

func TestReconcileHealsOnlyAPersistentDrift(t *testing.T) {
	f := newFixture(t)
	f.stock(t, "s", 10)
	f.holds.stock["s"] = 7 // Redis lost three units' worth of writes
	sweep := func() SweepReport {
		t.Helper()
		rep, err := f.svc.Sweep(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	if rep := sweep(); rep.Healed != 0 || rep.Drift["s"] != 3 {
		t.Fatalf("first sighting = %+v, want drift 3 reported, not healed", rep)
	}
	f.clock.t = f.clock.t.Add(f.svc.cfg.ReconcileAfter - time.Second)
	if rep := sweep(); rep.Healed != 0 {
		t.Fatalf("healed before ReconcileAfter")
	}
	f.clock.t = f.clock.t.Add(time.Second)
	if rep := sweep(); rep.Healed != 1 || f.redis("s") != 10 {
		t.Fatalf("sweep = %+v, redis %d; want healed to 10", rep, f.redis("s"))
	}
	if rep := sweep(); rep.Healed != 0 || rep.Drift["s"] != 0 {
		t.Errorf("after heal = %+v, want no drift", rep)
	}
}

func TestReconcileLeavesADriftThatMovesOrHasLiveHolds(t *testing.T) {
	f := newFixture(t)
	f.stock(t, "s", 10)
	f.holds.stock["s"] = 7
	_, _ = f.svc.Sweep(context.Background()) // sighting: drift 3
	f.holds.stock["s"] = 8                   // the drift changed (something was in flight)
	f.clock.t = f.clock.t.Add(2 * f.svc.cfg.ReconcileAfter)
	if rep, _ := f.svc.Sweep(context.Background()); rep.Healed != 0 {
		t.Fatalf("healed a drift that changed between sweeps")
	}
	f.reserve(t, "s", "u", 1) // a live hold: reconciliation must wait
	f.clock.t = f.clock.t.Add(2 * f.svc.cfg.ReconcileAfter / 3)
	for range 3 {
		f.clock.t = f.clock.t.Add(f.svc.cfg.ReconcileAfter)
		rep, _ := f.svc.Sweep(context.Background())
		if rep.Healed != 0 && f.holds.held["s"] != 0 {
			t.Fatalf("healed while a hold was live")
		}
	}
}

func TestRedisFailureMidReserveIsFencedAndReleased(t *testing.T) {
	f := newFixture(t)
	f.stock(t, "s", 5)
	f.holds.fail["Reserve"] = errInjected
	_, _, err := f.svc.Reserve(context.Background(), ReserveRequest{SKU: "s", Qty: 1, UserID: "u", IdempotencyKey: "k"})
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Reserve = %v, want ErrUnavailable", err)
	}
	id := ReservationID(ReserveRequest{SKU: "s", UserID: "u", IdempotencyKey: "k"})
	if row := f.ledger.rows[id]; row.Status != StatusCancelled || row.Reason != ReasonHoldFailed {
		t.Errorf("row = %+v, want CANCELLED hold_failed", row)
	}
	delete(f.holds.fail, "Reserve")
	r, replayed, err := f.svc.Reserve(context.Background(), ReserveRequest{SKU: "s", Qty: 1, UserID: "u", IdempotencyKey: "k"})
	if err != nil || !replayed || r.Status != StatusCancelled || f.redis("s") != 5 {
		t.Errorf("retry = %v %v %v, redis %d; want the CANCELLED reservation and 5 units", r.Status, replayed, err, f.redis("s"))
	}
}

func TestPersistBatchConfirmsExactlyWhatFits(t *testing.T) {
	f := newFixture(t)
	f.stock(t, "s", 5)
	f.stock(t, "t", 5)
	var rs []Reservation
	for i := range 4 {
		rs = append(rs, f.reserve(t, "s", fmt.Sprintf("u%d", i), 1))
	}
	rs = append(rs, f.reserve(t, "t", "v", 2))
	f.ledger.stock["s"].Available = 3 // the stores drifted: MySQL can cover three of four
	rs = append(rs, rs[0])            // and a duplicate in the same batch
	f.ledger.conflicts = 2            // two optimistic misses first
	errs := f.svc.PersistBatch(context.Background(), rs)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	confirmed, cancelled := 0, 0
	for _, r := range f.ledger.rows {
		switch r.Status {
		case StatusConfirmed:
			confirmed++
		case StatusCancelled:
			cancelled++
			if r.Reason != ReasonInsufficient {
				t.Errorf("cancelled for %q", r.Reason)
			}
		}
	}
	if confirmed != 4 || cancelled != 1 || f.mysql("s") != 0 || f.mysql("t") != 3 {
		t.Errorf("confirmed %d cancelled %d, mysql s=%d t=%d; want 4, 1, 0, 3", confirmed, cancelled, f.mysql("s"), f.mysql("t"))
	}
	if f.redis("s") != 2 || f.holds.held["s"] != 0 {
		t.Errorf("redis s = %d held %d, want 2 (the refused unit back) and 0", f.redis("s"), f.holds.held["s"])
	}
}

func TestSoldOutFlagAnswersLocallyAndClearsOnRestockOrCancel(t *testing.T) {
	f := newFixture(t)
	f.svc.cfg.SoldOutTTL = time.Second
	f.stock(t, "s", 1)
	r := f.reserve(t, "s", "a", 1)
	if _, _, err := f.svc.Reserve(context.Background(), ReserveRequest{SKU: "s", Qty: 1, UserID: "b"}); !errors.Is(err, ErrSoldOut) {
		t.Fatalf("Reserve = %v, want ErrSoldOut", err)
	}
	calls := f.holds.calls["Reserve"]
	if _, _, err := f.svc.Reserve(context.Background(), ReserveRequest{SKU: "s", Qty: 1, UserID: "c"}); !errors.Is(err, ErrSoldOut) || f.holds.calls["Reserve"] != calls {
		t.Fatalf("flagged sold out = %v, Redis calls %d -> %d; want sold_out without Redis", err, calls, f.holds.calls["Reserve"])
	}
	if _, err := f.svc.Cancel(context.Background(), r.ID); err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.svc.Reserve(context.Background(), ReserveRequest{SKU: "s", Qty: 1, UserID: "d"}); err != nil {
		t.Fatalf("after a cancel returned the unit: %v, want a hold", err)
	}
	_, _, _ = f.svc.Reserve(context.Background(), ReserveRequest{SKU: "s", Qty: 1, UserID: "e"}) // sold out again
	f.clock.t = f.clock.t.Add(time.Second)
	before := f.holds.calls["Reserve"]
	_, _, _ = f.svc.Reserve(context.Background(), ReserveRequest{SKU: "s", Qty: 1, UserID: "f"})
	if f.holds.calls["Reserve"] == before {
		t.Errorf("the flag outlived its TTL")
	}
}

func TestReservationIDNamesItsSKU(t *testing.T) {
	id := ReservationID(ReserveRequest{SKU: "phone.x:1", UserID: "u"})
	if sku, ok := SKUOf(id); !ok || sku != "phone.x:1" {
		t.Errorf("SKUOf(%q) = %q %v, want phone.x:1", id, sku, ok)
	}
	for _, bad := range []string{"", "r-1", ".aaaaaaaaaaaaaaaaaaaaaaaaaa", "s.AAAAAAAAAAAAAAAAAAAAAAAAAA", "s.aaaa", "a{b}.aaaaaaaaaaaaaaaaaaaaaaaaaa"} {
		if _, ok := SKUOf(bad); ok {
			t.Errorf("SKUOf(%q) accepted", bad)
		}
	}
	if ValidReservationID(id, "other") {
		t.Errorf("an id of one SKU passed for another")
	}
}
