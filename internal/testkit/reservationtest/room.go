package reservationtest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/reservation"
)

// testRoom is the Holds suite's WaitingRoom part: queue.lua's places,
// admission by the stock, lapses, sold out, and reserve.lua selling a
// waiting-room SKU to admitted tickets only, once each.
func testRoom(t *testing.T, newHolds HoldsFactory) {
	ctx := context.Background()
	const admitFor = 2 * time.Minute
	// room returns a Holds with a waiting-room SKU of stock units, admit
	// factor permille, its sale opening at opens (zero: no window).
	room := func(t *testing.T, stock int64, permille int, opens time.Time) (HoldsUnderTest, string, *clock) {
		t.Helper()
		c := &clock{now: t0}
		s := newHolds(t, c, 0, 0)
		sku := testservices.Name("room")
		level := reservation.StockLevel{SKU: sku, Available: stock, Version: 1, AdmitPermille: permille, OpensAt: opens}
		if res, err := s.Warm(ctx, level, nil, nil); err != nil || res != reservation.SyncWarmed {
			t.Fatalf("Warm = %v %v", res, err)
		}
		return s, sku, c
	}
	join := func(t *testing.T, s HoldsUnderTest, sku, ticket string, place float64) reservation.QueueState {
		t.Helper()
		q, err := s.Queue(ctx, sku, ticket, reservation.QueueOp{Join: true, Place: place, Lead: 10 * time.Minute, AdmitFor: admitFor})
		if err != nil {
			t.Fatalf("join %s: %v", ticket, err)
		}
		return q
	}
	look := func(t *testing.T, s HoldsUnderTest, sku, ticket string) reservation.QueueState {
		t.Helper()
		q, err := s.Queue(ctx, sku, ticket, reservation.QueueOp{AdmitFor: admitFor})
		if err != nil {
			t.Fatalf("look %s: %v", ticket, err)
		}
		return q
	}
	buy := func(s HoldsUnderTest, sku, ticket string, q reservation.QueueState) error {
		r := hold(sku, "r-"+ticket, "u-"+ticket, 1)
		r.Ticket, r.TicketExpires = ticket, q.AdmittedAt.Add(admitFor)
		_, _, err := s.Reserve(ctx, r, ttl)
		return err
	}

	t.Run("tickets before the opening are shuffled by their places, later ones queue by arrival", func(t *testing.T) {
		opens := t0.Add(time.Minute)
		s, sku, c := room(t, 1, 1000, opens)
		if _, err := s.Queue(ctx, sku, "early", reservation.QueueOp{Join: true, Lead: 30 * time.Second, AdmitFor: admitFor}); !errors.Is(err, reservation.ErrQueueNotOpen) {
			t.Errorf("a join before the queue's lead = %v, want ErrQueueNotOpen", err)
		}
		for i, place := range []float64{0.9, 0.1, 0.5} {
			q := join(t, s, sku, fmt.Sprint("p", i), place)
			if q.Position != 0 || q.State != reservation.TicketWaiting || q.Open() {
				t.Errorf("before the opening: %+v, want WAITING with no position", q)
			}
		}
		if again := join(t, s, sku, "p0", 0.0); again.Length != 3 {
			t.Errorf("joining again took a second place: length %d", again.Length)
		}
		c.now = opens
		late := join(t, s, sku, "late", 0.0)
		want := map[string]int64{"p1": 1, "p2": 2, "p0": 3, "late": 4}
		for ticket, pos := range want {
			if q := look(t, s, sku, ticket); q.Position != pos {
				t.Errorf("%s at %d, want %d (places 0.1 < 0.5 < 0.9, then arrival)", ticket, q.Position, pos)
			}
		}
		if late.Position != 4 {
			t.Errorf("a join after the opening = %+v, want position 4", late)
		}
	})

	t.Run("admission follows the stock: ⌈(available + held) × factor⌉ - held admitted who have not reserved", func(t *testing.T) {
		s, sku, c := room(t, 3, 1500, time.Time{}) // factor 1.5: ⌈3 × 1.5⌉ = 5
		for i := range 8 {
			join(t, s, sku, fmt.Sprint("t", i), 0)
		}
		q := look(t, s, sku, "")
		if q.Through != 5 || q.Length != 8 {
			t.Fatalf("admitted %d of %d, want 5 of 8", q.Through, q.Length)
		}
		if got := look(t, s, sku, "t5"); got.State != reservation.TicketWaiting || got.Position != 6 {
			t.Errorf("t5 = %+v, want WAITING at 6", got)
		}
		// t0 buys: one less admitted outstanding, one unit held (may return),
		// its holder one of the 1.5 buyers it stands for: ⌈(2+1) × 1.5⌉ - 1 = 4
		// = t1..t4, nobody more.
		if err := buy(s, sku, "t0", look(t, s, sku, "t0")); err != nil {
			t.Fatalf("admitted t0 reserves: %v", err)
		}
		if got := look(t, s, sku, "t0"); got.State != reservation.TicketReserved {
			t.Errorf("t0 after its hold = %s, want RESERVED", got.State)
		}
		if q := look(t, s, sku, ""); q.Through != 5 {
			t.Errorf("after a hold admitted %d, want still 5", q.Through)
		}
		// t1 buys too: ⌈(1+2) × 1.5⌉ - 2 = 3 = t2..t4, still nobody more.
		if err := buy(s, sku, "t1", look(t, s, sku, "t1")); err != nil {
			t.Fatalf("admitted t1 reserves: %v", err)
		}
		if q := look(t, s, sku, ""); q.Through != 5 {
			t.Errorf("after two holds admitted %d, want still 5", q.Through)
		}
		// t0's hold is cancelled: its unit is back, ⌈(2+1) × 1.5⌉ - 1 = 4 → t5 too.
		follow(t, s, row(reservation.Reservation{ID: "r-t0", SKU: sku, Qty: 1, UserID: "u-t0", Token: "t-r-t0"}, reservation.StatusCancelled, false))
		if q := look(t, s, sku, ""); q.Through != 6 {
			t.Errorf("after a unit came back admitted %d, want 6", q.Through)
		}
		// Admissions lapse unused: t1..t5 lapse, and the next are admitted in order.
		c.now = t0.Add(admitFor + time.Second)
		if q := look(t, s, sku, ""); q.Through != 8 {
			t.Errorf("after the lapses admitted %d, want all 8", q.Through)
		}
		if got := look(t, s, sku, "t2"); got.State != reservation.TicketExpired {
			t.Errorf("t2 = %s, want EXPIRED", got.State)
		}
		if err := buy(s, sku, "t2", reservation.QueueState{AdmittedAt: t0.Add(time.Hour)}); !errors.Is(err, reservation.ErrAdmissionExpired) {
			t.Errorf("a lapsed ticket reserves: %v, want ErrAdmissionExpired", err)
		}
	})

	t.Run("a waiting-room SKU sells to admitted tickets only, once each", func(t *testing.T) {
		s, sku, _ := room(t, 5, 1000, time.Time{})
		join(t, s, sku, "a", 0)
		q := look(t, s, sku, "a")
		if _, _, err := s.Reserve(ctx, hold(sku, "x", "u-a", 1), ttl); !errors.Is(err, reservation.ErrAdmissionRequired) {
			t.Errorf("a reserve without a ticket = %v, want ErrAdmissionRequired", err)
		}
		if err := buy(s, sku, "nobody", q); !errors.Is(err, reservation.ErrAdmissionExpired) {
			t.Errorf("a ticket never admitted = %v, want ErrAdmissionExpired", err)
		}
		if err := buy(s, sku, "a", q); err != nil {
			t.Fatalf("admitted: %v", err)
		}
		r := hold(sku, "another-id", "u-a", 1)
		r.Ticket, r.TicketExpires = "a", q.AdmittedAt.Add(admitFor)
		if _, _, err := s.Reserve(ctx, r, ttl); !errors.Is(err, reservation.ErrAdmissionExpired) {
			t.Errorf("a second hold under one ticket = %v, want refused", err)
		}
		if _, out, err := s.Reserve(ctx, func() reservation.Reservation {
			r := hold(sku, "r-a", "u-a", 1)
			r.Ticket, r.TicketExpires = "a", q.AdmittedAt.Add(admitFor)
			return r
		}(), ttl); err != nil || !out.Replayed {
			t.Errorf("the ticket's retry = %+v %v, want a replay", out, err)
		}
		if avail, held := stockOf(t, s, sku); avail != 4 || held != 1 {
			t.Errorf("stock %d held %d, want 4 and 1 (one hold)", avail, held)
		}
		if _, _, err := s.Reserve(ctx, hold(sku, "y", "u", 1), ttl); !errors.Is(err, reservation.ErrAdmissionRequired) {
			t.Errorf("without a ticket after a sale = %v", err)
		}
	})

	t.Run("sold out when no unit is left and none can return", func(t *testing.T) {
		s, sku, _ := room(t, 1, 1000, time.Time{})
		for _, ticket := range []string{"a", "b", "c"} {
			join(t, s, sku, ticket, 0)
		}
		if err := buy(s, sku, "a", look(t, s, sku, "a")); err != nil {
			t.Fatal(err)
		}
		q := look(t, s, sku, "c")
		if q.SoldOut() || !q.MayReturn() || q.State != reservation.TicketWaiting {
			t.Errorf("with the last unit held: %+v, want waiting, may return", q)
		}
		// b and c wait: a's unit is held and may return, a is the buyer it
		// stands for. The hold is confirmed.
		follow(t, s, row(reservation.Reservation{ID: "r-a", SKU: sku, Qty: 1, UserID: "u-a", Token: "t-r-a"}, reservation.StatusConfirmed, false))
		q = look(t, s, sku, "c")
		if !q.SoldOut() || q.State != reservation.TicketSoldOut {
			t.Errorf("with no unit left: %+v, want SOLD_OUT", q)
		}
	})

	t.Run("a unit confirmed unpaid within a pay window may return until paid or cancelled; a warm-up rebuilds them", func(t *testing.T) {
		s, sku, _ := room(t, 2, 1000, time.Time{})
		for _, ticket := range []string{"a", "b", "c"} {
			join(t, s, sku, ticket, 0)
		}
		for _, ticket := range []string{"a", "b"} {
			if err := buy(s, sku, ticket, look(t, s, sku, ticket)); err != nil {
				t.Fatal(err)
			}
		}
		unpaid := func(ticket string) reservation.Reservation {
			r := row(hold(sku, "r-"+ticket, "u-"+ticket, 1), reservation.StatusConfirmed, false)
			r.PayBy = t0.Add(time.Minute)
			return r
		}
		a, b := unpaid("a"), unpaid("b")
		for range 2 { // a repeat counts nothing twice: confirm.lua's batch, then follow.lua's
			if _, errs := s.FollowAll(ctx, []reservation.Reservation{a}, 2); errs[0] != nil {
				t.Fatal(errs[0])
			}
			follow(t, s, b)
		}
		if q := look(t, s, sku, "c"); q.SoldOut() || !q.MayReturn() || q.Unpaid != 2 || q.State != reservation.TicketWaiting {
			t.Errorf("both units confirmed, unpaid: %+v, want waiting, may return, unpaid 2", q)
		}
		paid := a
		paid.PaidAt = t0
		follow(t, s, paid)
		follow(t, s, paid)
		if q := look(t, s, sku, "c"); q.Unpaid != 1 || q.State != reservation.TicketWaiting {
			t.Errorf("a paid: %+v, want unpaid 1, waiting", q)
		}
		refund := row(b, reservation.StatusCancelled, true)
		follow(t, s, refund)
		follow(t, s, refund)
		if q := look(t, s, sku, "c"); q.Unpaid != 0 || q.Available != 1 || q.State != reservation.TicketAdmitted {
			t.Errorf("b refunded: %+v, want unpaid 0, its unit back once, c admitted", q)
		}
		// Redis loses the stock: the warm-up counts MySQL's unpaid rows, but
		// one Redis saw paid since MySQL's read (a's).
		if err := s.ForgetStock(ctx, sku); err != nil {
			t.Fatal(err)
		}
		z := unpaid("z")
		level := reservation.StockLevel{SKU: sku, Available: 1, Version: 9, AdmitPermille: 1000}
		if res, err := s.Warm(ctx, level, nil, []reservation.Reservation{a, z}); err != nil || res != reservation.SyncWarmed {
			t.Fatalf("Warm = %v %v", res, err)
		}
		if q := look(t, s, sku, ""); q.Unpaid != 1 || q.Available != 1 {
			t.Errorf("after the warm-up: %+v, want unpaid 1 (z's; a was paid since the read), available 1", q)
		}
	})

	t.Run("an admission is for the per-user limit's units, one when the SKU sets none", func(t *testing.T) {
		s, sku, _ := room(t, 2, 1000, time.Time{})
		for _, ticket := range []string{"a", "b", "c"} {
			join(t, s, sku, ticket, 0)
		}
		if q := look(t, s, sku, ""); q.Through != 2 {
			t.Fatalf("2 units, no limit: admitted %d, want 2", q.Through)
		}
		r := hold(sku, "r-b", "u-b", 2)
		r.Ticket, r.TicketExpires = "b", look(t, s, sku, "b").AdmittedAt.Add(admitFor)
		if _, _, err := s.Reserve(ctx, r, ttl); !errors.Is(err, reservation.ErrLimitExceeded) {
			t.Errorf("place 2 reserving 2 units under one admission = %v, want ErrLimitExceeded (the unit of place 1 stays)", err)
		}
		if err := buy(s, sku, "a", look(t, s, sku, "a")); err != nil {
			t.Errorf("place 1 buys its unit: %v", err)
		}
		// A limit of 2: each admission may take 2 units, so 5 units admit 3.
		c := &clock{now: t0}
		s2 := newHolds(t, c, 0, 0)
		sku2 := testservices.Name("room")
		if res, err := s2.Warm(ctx, reservation.StockLevel{SKU: sku2, Available: 5, Version: 1, AdmitPermille: 1000, PerUserLimit: 2}, nil, nil); err != nil || res != reservation.SyncWarmed {
			t.Fatalf("Warm = %v %v", res, err)
		}
		for i := range 5 {
			join(t, s2, sku2, fmt.Sprint("t", i), 0)
		}
		if q := look(t, s2, sku2, ""); q.Through != 3 {
			t.Errorf("5 units, 2 an admission: admitted %d, want ⌈5/2⌉ = 3", q.Through)
		}
		r = hold(sku2, "r-t0", "u-t0", 2)
		r.Ticket, r.TicketExpires = "t0", look(t, s2, sku2, "t0").AdmittedAt.Add(admitFor)
		if _, _, err := s2.Reserve(ctx, r, ttl); err != nil {
			t.Errorf("t0 reserves its 2 units: %v", err)
		}
	})

	t.Run("a refused buy under a per-user limit leaves the buyer's units and the ticket as they were", func(t *testing.T) {
		// reserve.lua raises the count and takes the ticket out before it
		// knows the other can refuse: each refusal must give the other back.
		c := &clock{now: t0}
		s := newHolds(t, c, 0, 0)
		sku := testservices.Name("room")
		if res, err := s.Warm(ctx, reservation.StockLevel{SKU: sku, Available: 6, Version: 1, AdmitPermille: 1000, PerUserLimit: 2}, nil, nil); err != nil || res != reservation.SyncWarmed {
			t.Fatalf("Warm = %v %v", res, err)
		}
		for _, ticket := range []string{"a", "b"} {
			join(t, s, sku, ticket, 0)
		}
		units := func(after string, want int64) { // on stores that show them
			t.Helper()
			u, ok := s.(UserUnits)
			if !ok {
				return
			}
			if n, err := u.UserUnits(ctx, sku, "u-a"); err != nil || n != want {
				t.Errorf("after %s the buyer has %d units (%v), want %d", after, n, err, want)
			}
		}
		qa := look(t, s, sku, "a")
		over := hold(sku, "r-a", "u-a", 3)
		over.Ticket, over.TicketExpires = "a", qa.AdmittedAt.Add(admitFor)
		if _, _, err := s.Reserve(ctx, over, ttl); !errors.Is(err, reservation.ErrLimitExceeded) {
			t.Errorf("3 units under a limit of 2 = %v, want ErrLimitExceeded", err)
		}
		units("a refusal over the limit", 0)
		forged := hold(sku, "r-x", "u-a", 1)
		forged.Ticket, forged.TicketExpires = "x", qa.AdmittedAt.Add(admitFor)
		if _, _, err := s.Reserve(ctx, forged, ttl); !errors.Is(err, reservation.ErrAdmissionExpired) {
			t.Errorf("a ticket never admitted, within the limit = %v, want ErrAdmissionExpired", err)
		}
		units("a refused ticket", 0)
		if err := buy(s, sku, "a", qa); err != nil {
			t.Errorf("the ticket a refusal did not use buys: %v", err)
		}
		units("one unit", 1)
		if avail, held := stockOf(t, s, sku); avail != 5 || held != 1 {
			t.Errorf("stock %d held %d, want 5 and 1 (one hold)", avail, held)
		}
	})

	t.Run("a join and a look at the own ticket are the buyer's attempts; the public look is nobody's", func(t *testing.T) {
		c := &clock{now: t0}
		s := newHolds(t, c, 1, 3) // 1 attempt a second, a burst of 3
		sku := testservices.Name("room")
		if res, err := s.Warm(ctx, reservation.StockLevel{SKU: sku, Available: 5, Version: 1, AdmitPermille: 1000}, nil, nil); err != nil || res != reservation.SyncWarmed {
			t.Fatalf("Warm = %v %v", res, err)
		}
		charged := reservation.QueueOp{AdmitFor: admitFor, Charge: "u-a"}
		if _, err := s.Queue(ctx, sku, "a", reservation.QueueOp{Join: true, AdmitFor: admitFor, Charge: "u-a"}); err != nil {
			t.Fatalf("join: %v", err)
		}
		for i := range 2 {
			if _, err := s.Queue(ctx, sku, "a", charged); err != nil {
				t.Fatalf("look %d within the burst: %v", i+1, err)
			}
		}
		before := look(t, s, sku, "a")
		_, err := s.Queue(ctx, sku, "a", charged)
		var rl *reservation.RateLimitedError
		if !errors.As(err, &rl) || rl.RetryAfter <= 0 || rl.RetryAfter > time.Second {
			t.Fatalf("the 4th attempt in a burst of 3 = %v, want RateLimitedError within a second", err)
		}
		if _, err := s.Queue(ctx, sku, "b", reservation.QueueOp{Join: true, AdmitFor: admitFor, Charge: "u-a"}); !errors.As(err, &rl) {
			t.Errorf("a join past the rate = %v, want RateLimitedError", err)
		}
		if q := look(t, s, sku, "b"); q.State != reservation.TicketNone || q.Length != before.Length {
			t.Errorf("a join refused for the rate queued: %+v", q)
		}
		for range 5 { // the public look is never charged
			look(t, s, sku, "")
		}
		if _, err := s.Queue(ctx, sku, "a", reservation.QueueOp{AdmitFor: admitFor, Charge: "u-b"}); err != nil {
			t.Errorf("another buyer's budget: %v", err)
		}
		c.now = c.now.Add(time.Second)
		if q, err := s.Queue(ctx, sku, "a", charged); err != nil || q.State != reservation.TicketAdmitted {
			t.Errorf("a second later = %+v %v, want the ticket, ADMITTED", q, err)
		}
	})

	t.Run("a SKU without a waiting room has no queue and sells as before", func(t *testing.T) {
		s, sku, _ := setup(t, newHolds, 3, 0)
		if _, err := s.Queue(ctx, sku, "a", reservation.QueueOp{Join: true, AdmitFor: admitFor}); !errors.Is(err, reservation.ErrNoWaitingRoom) {
			t.Errorf("queue of a SKU without a room = %v", err)
		}
		reserve(t, s, hold(sku, "r", "u", 1))
		if _, err := s.Queue(ctx, testservices.Name("nosuch"), "", reservation.QueueOp{AdmitFor: admitFor}); !errors.Is(err, reservation.ErrUnknownSKU) {
			t.Errorf("queue of an unknown SKU = %v", err)
		}
	})
}
