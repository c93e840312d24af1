// Package reservationtest holds the contract suites of the protocol's ports
// (reservation.Holds, …): one suite per port, run against the real adapter
// and against the in-memory fakes the protocol's unit tests use, so the two
// cannot drift apart.
package reservationtest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/reservation"
)

// HoldsUnderTest is a Holds the suite can make forget a hold or a SKU's
// stock, as Redis does after its retention or a failover.
type HoldsUnderTest interface {
	reservation.Holds
	Forget(ctx context.Context, r reservation.Reservation) error
	ForgetStock(ctx context.Context, sku string) error
}

// HoldsFactory returns a fresh Holds whose scripts read clock, with the
// per-user attempt rate and burst (0, 0: none).
type HoldsFactory func(t *testing.T, clock reservation.Clock, rate, burst int) HoldsUnderTest

var t0 = time.Now().UTC().Truncate(time.Millisecond)

// clock is a test clock the scripts read instead of Redis's TIME.
type clock struct{ now time.Time }

func (c *clock) Now() time.Time { return c.now }

const ttl = time.Minute

func hold(sku, id, user string, qty int) reservation.Reservation {
	return reservation.Reservation{ID: id, SKU: sku, Qty: qty, UserID: user, Token: "t-" + id}
}

// row is MySQL's decided row for a hold.
func row(h reservation.Reservation, status reservation.Status, refunded bool) reservation.Reservation {
	h.Status, h.Refunded = status, refunded
	if status == reservation.StatusCancelled {
		h.Reason = reservation.ReasonBuyer
	}
	return h
}

func Holds(t *testing.T, newHolds HoldsFactory) {
	ctx := context.Background()
	setup := func(t *testing.T, stock int64, limit int) (HoldsUnderTest, string, *clock) {
		c := &clock{now: t0}
		s := newHolds(t, c, 0, 0)
		sku := testservices.Name("sku")
		if res, err := s.Sync(ctx, reservation.StockLevel{SKU: sku, Version: 1}); err != nil || res != reservation.SyncMissing {
			t.Fatalf("Sync of a new sku = %v %v, want missing", res, err)
		}
		if res, err := s.Warm(ctx, reservation.StockLevel{SKU: sku, Available: stock, Version: 1, PerUserLimit: limit}, nil, nil); err != nil || res != reservation.SyncWarmed {
			t.Fatalf("Warm = %v %v, want warmed", res, err)
		}
		return s, sku, c
	}
	stockOf := func(t *testing.T, s HoldsUnderTest, sku string) (int64, int64) {
		t.Helper()
		rs, err := s.Stock(ctx, sku)
		if err != nil {
			t.Fatalf("Stock(%s): %v", sku, err)
		}
		return rs.Available, rs.Held
	}
	reserve := func(t *testing.T, s HoldsUnderTest, r reservation.Reservation) reservation.Reservation {
		t.Helper()
		h, out, err := s.Reserve(ctx, r, ttl)
		if err != nil || out.Replayed {
			t.Fatalf("Reserve(%s) = %v %+v", r.ID, err, out)
		}
		return h
	}
	follow := func(t *testing.T, s HoldsUnderTest, r reservation.Reservation) bool {
		t.Helper()
		got, err := s.Follow(ctx, r, 0)
		if err != nil {
			t.Fatalf("Follow(%s %s): %v", r.ID, r.Status, err)
		}
		return got
	}

	t.Run("reserve deducts, sets the deadline by the script's clock, and replays without taking twice", func(t *testing.T) {
		s, sku, _ := setup(t, 5, 0)
		r := hold(sku, reservation.ReservationID(reservation.ReserveRequest{SKU: sku, UserID: "u", IdempotencyKey: "k"}, nil), "u", 2)
		h := reserve(t, s, r)
		if !h.ExpiresAt.Equal(t0.Add(ttl)) || !h.CreatedAt.Equal(t0) || h.Token != r.Token {
			t.Errorf("hold = %+v, want deadline %v created %v", h, t0.Add(ttl), t0)
		}
		got, out, err := s.Reserve(ctx, r, ttl)
		if err != nil || !out.Replayed || got.Status != reservation.StatusHeld || got.Qty != 2 || !got.ExpiresAt.Equal(h.ExpiresAt) || got.Token != r.Token {
			t.Fatalf("replay = %+v %+v %v", got, out, err)
		}
		if a, h := stockOf(t, s, sku); a != 3 || h != 2 {
			t.Errorf("stock = %d/%d, want 3 available 2 held", a, h)
		}
		other := r
		other.Qty = 1
		if _, _, err := s.Reserve(ctx, other, ttl); !errors.Is(err, reservation.ErrIdempotencyMismatch) {
			t.Errorf("same id, other qty = %v, want ErrIdempotencyMismatch", err)
		}
		if h, err := s.Hold(ctx, r.ID, 0); err != nil || h.SKU != sku || h.UserID != "u" {
			t.Errorf("Hold(%s) = %+v %v", r.ID, h, err)
		}
		if _, err := s.Hold(ctx, "no-sku-in-this-id", 0); !errors.Is(err, reservation.ErrNotFound) {
			t.Errorf("Hold(bad id) = %v, want ErrNotFound", err)
		}
	})

	t.Run("refusals take nothing", func(t *testing.T) {
		s, sku, _ := setup(t, 3, 2)
		if _, _, err := s.Reserve(ctx, hold(sku, "a", "u", 4), ttl); !errors.Is(err, reservation.ErrSoldOut) {
			t.Errorf("over stock = %v, want ErrSoldOut", err)
		}
		reserve(t, s, hold(sku, "b", "u", 2))
		if _, _, err := s.Reserve(ctx, hold(sku, "c", "u", 1), ttl); !errors.Is(err, reservation.ErrLimitExceeded) {
			t.Errorf("over per-user limit = %v, want ErrLimitExceeded", err)
		}
		if _, _, err := s.Reserve(ctx, hold("nosuch"+sku, "d", "u", 1), ttl); !errors.Is(err, reservation.ErrUnknownSKU) {
			t.Errorf("unknown sku = %v, want ErrUnknownSKU", err)
		}
		if a, h := stockOf(t, s, sku); a != 1 || h != 2 {
			t.Errorf("stock = %d/%d, want 1/2", a, h)
		}
	})

	t.Run("a fence's release returns a held hold once and leaves a tombstone", func(t *testing.T) {
		s, sku, _ := setup(t, 5, 1)
		r := reserve(t, s, hold(sku, "r1", "u", 1))
		cancelled := row(r, reservation.StatusCancelled, false)
		for i, want := range []bool{true, false, false} {
			if got := follow(t, s, cancelled); got != want {
				t.Fatalf("Follow(CANCELLED) #%d = %v, want %v", i, got, want)
			}
		}
		cancelled.Released = true // MySQL acknowledged it
		if follow(t, s, cancelled) {
			t.Fatal("released row gave stock again")
		}
		if a, h := stockOf(t, s, sku); a != 5 || h != 0 {
			t.Errorf("stock = %d/%d, want 5/0", a, h)
		}
		got, out, err := s.Reserve(ctx, hold(sku, "r1", "u", 1), ttl)
		if err != nil || !out.Replayed || got.Status != reservation.StatusCancelled || got.Reason != reservation.ReasonBuyer {
			t.Errorf("reserve after release = %+v %+v %v, want the CANCELLED hold", got, out, err)
		}
		// The per-user units came back too.
		reserve(t, s, hold(sku, "r2", "u", 1))
		// A fence of a hold Redis never saw leaves a tombstone: a late reserve takes nothing.
		ghost := row(hold(sku, "ghost", "v", 2), reservation.StatusCancelled, false)
		if follow(t, s, ghost) {
			t.Errorf("Follow(missing, fence) returned stock")
		}
		if got, out, _ := s.Reserve(ctx, hold(sku, "ghost", "v", 2), ttl); !out.Replayed || got.Status != reservation.StatusCancelled {
			t.Errorf("reserve of a tombstone = %v %+v, want replayed CANCELLED", got.Status, out)
		}
	})

	t.Run("confirm keeps stock deducted; a refund returns it once, also after Redis forgot the hold", func(t *testing.T) {
		s, sku, _ := setup(t, 5, 0)
		r := reserve(t, s, hold(sku, "r1", "u", 2))
		for range 2 {
			follow(t, s, row(r, reservation.StatusConfirmed, false))
		}
		if a, h := stockOf(t, s, sku); a != 3 || h != 0 {
			t.Errorf("after confirm = %d/%d, want 3/0", a, h)
		}
		refund := row(r, reservation.StatusCancelled, true)
		for i, want := range []bool{true, false} {
			if got := follow(t, s, refund); got != want {
				t.Fatalf("refund #%d = %v, want %v", i, got, want)
			}
		}
		if a, h := stockOf(t, s, sku); a != 5 || h != 0 {
			t.Errorf("after refund = %d/%d, want 5/0", a, h)
		}
		// Retention passed (the hold is gone) and MySQL says released: nothing moves, ever.
		if err := s.Forget(ctx, r); err != nil {
			t.Fatal(err)
		}
		refund.Released = true
		for range 3 {
			if follow(t, s, refund) {
				t.Fatal("a released refund gave stock again after the hold was forgotten")
			}
		}
		if a, _ := stockOf(t, s, sku); a != 5 {
			t.Errorf("after forgotten repeats = %d, want 5", a)
		}
		// A refund whose hold is gone but whose release is still owed returns once.
		r2 := reserve(t, s, hold(sku, "r2", "u", 1))
		follow(t, s, row(r2, reservation.StatusConfirmed, false))
		if err := s.Forget(ctx, r2); err != nil {
			t.Fatal(err)
		}
		owed := row(r2, reservation.StatusCancelled, true)
		for i, want := range []bool{true, false} {
			if got := follow(t, s, owed); got != want {
				t.Fatalf("owed refund #%d = %v, want %v", i, got, want)
			}
		}
		if a, _ := stockOf(t, s, sku); a != 5 {
			t.Errorf("after owed refund = %d, want 5", a)
		}
	})

	t.Run("a stray hold of another token is returned, never confirmed", func(t *testing.T) {
		s, sku, _ := setup(t, 10, 0)
		id := sku + ".kkkkkkkkkkkkkkkkkkkkkkkkkk"
		first := reserve(t, s, hold(sku, id, "u", 1))
		follow(t, s, row(first, reservation.StatusConfirmed, false))
		if err := s.Forget(ctx, first); err != nil {
			t.Fatal(err)
		}
		stray := hold(sku, id, "u", 5)
		stray.Token = "t-stray"
		reserve(t, s, stray) // Redis forgot: it takes the id again
		if a, h := stockOf(t, s, sku); a != 4 || h != 5 {
			t.Fatalf("with the stray = %d/%d, want 4/5", a, h)
		}
		if !follow(t, s, row(first, reservation.StatusConfirmed, false)) {
			t.Fatal("the stray's stock did not come back")
		}
		if a, h := stockOf(t, s, sku); a != 9 || h != 0 {
			t.Errorf("after the stray = %d/%d, want 9/0", a, h)
		}
		if h, err := s.Hold(ctx, id, 0); err != nil || h.Status != reservation.StatusConfirmed || h.Qty != 1 || h.Token != first.Token {
			t.Errorf("hold = %+v %v, want MySQL's CONFIRMED qty 1", h, err)
		}
	})

	t.Run("expired lists held holds past deadline plus grace, by the script's clock", func(t *testing.T) {
		s, sku, c := setup(t, 10, 0)
		early := reserve(t, s, hold(sku, "e", "u", 1))
		c.now = t0.Add(time.Hour)
		reserve(t, s, hold(sku, "l", "u", 1))
		c.now = t0
		done := reserve(t, s, hold(sku, "d", "u", 1))
		follow(t, s, row(done, reservation.StatusConfirmed, false))
		c.now = t0.Add(ttl + 3*time.Second)
		if got, err := s.Expired(ctx, sku, 5*time.Second, 10); err != nil || len(got) != 0 {
			t.Errorf("Expired within the grace = %+v %v, want none", got, err)
		}
		c.now = t0.Add(ttl + 6*time.Second)
		got, err := s.Expired(ctx, sku, 5*time.Second, 10)
		if err != nil || len(got) != 1 || got[0].ID != early.ID || got[0].Token != early.Token {
			t.Errorf("Expired = %+v %v, want only e", got, err)
		}
	})

	t.Run("sync applies each admin change once, in any order, keeping holds", func(t *testing.T) {
		s, sku, _ := setup(t, 100, 0)
		reserve(t, s, hold(sku, "r", "u", 4))
		// Two admin changes: -20 (v2, delta sum -20), then +10 (v3, delta sum -10).
		v2 := reservation.StockLevel{SKU: sku, Available: 80, Version: 2, AdminDelta: -20}
		v3 := reservation.StockLevel{SKU: sku, Available: 90, Version: 3, AdminDelta: -10, PerUserLimit: 2}
		for _, l := range []reservation.StockLevel{v3, v2, v3, v2} { // the newer first, then replays
			if _, err := s.Sync(ctx, l); err != nil {
				t.Fatal(err)
			}
		}
		rs, err := s.Stock(ctx, sku)
		if err != nil || rs.Available != 86 || rs.Held != 4 || rs.AdminDelta != -10 || rs.Version != 3 {
			t.Errorf("after the changes = %+v %v, want 86 available, 4 held, admin delta -10, version 3", rs, err)
		}
		if _, _, err := s.Reserve(ctx, hold(sku, "x", "u", 3), ttl); !errors.Is(err, reservation.ErrLimitExceeded) {
			t.Errorf("the new per-user limit did not apply: %v", err)
		}
	})

	t.Run("warm-up refuses a level older than a confirm it has seen", func(t *testing.T) {
		s, sku, _ := setup(t, 10, 0)
		r := reserve(t, s, hold(sku, "r", "u", 2))
		if _, err := s.Follow(ctx, row(r, reservation.StatusConfirmed, false), 7); err != nil {
			t.Fatal(err)
		}
		if err := s.ForgetStock(ctx, sku); err != nil {
			t.Fatal(err)
		}
		if res, err := s.Warm(ctx, reservation.StockLevel{SKU: sku, Available: 10, Version: 6}, nil, nil); err != nil || res != reservation.SyncStale {
			t.Errorf("warm from a level before the confirm = %v %v, want stale", res, err)
		}
		if res, err := s.Warm(ctx, reservation.StockLevel{SKU: sku, Available: 8, Version: 7}, nil, nil); err != nil || res != reservation.SyncWarmed {
			t.Errorf("warm from a fresh level = %v %v, want warmed", res, err)
		}
		if a, h := stockOf(t, s, sku); a != 8 || h != 0 {
			t.Errorf("after warm = %d/%d, want 8/0", a, h)
		}
	})

	t.Run("warm-up counts a hold MySQL confirmed but Redis still holds once", func(t *testing.T) {
		s, sku, _ := setup(t, 10, 0)
		a := reserve(t, s, hold(sku, "a", "u", 2))
		b := reserve(t, s, hold(sku, "b", "v", 3))
		if err := s.ForgetStock(ctx, sku); err != nil {
			t.Fatal(err)
		}
		// MySQL confirmed a (8 left); b is undecided; a's confirm has not reached Redis.
		held := []string{a.ID, b.ID}
		confirmed := []reservation.Reservation{row(a, reservation.StatusConfirmed, false)}
		// b moved after MySQL was read (released here): the level is stale.
		follow(t, s, row(b, reservation.StatusCancelled, false))
		if res, err := s.Warm(ctx, reservation.StockLevel{SKU: sku, Available: 8, Version: 2}, held, confirmed); err != nil || res != reservation.SyncStale {
			t.Fatalf("Warm after a listed hold moved = %v %v, want stale", res, err)
		}
		held = []string{a.ID}
		if res, err := s.Warm(ctx, reservation.StockLevel{SKU: sku, Available: 8, Version: 2}, held, confirmed); err != nil || res != reservation.SyncWarmed {
			t.Fatalf("Warm = %v %v", res, err)
		}
		follow(t, s, row(a, reservation.StatusConfirmed, false))
		if av, h := stockOf(t, s, sku); av != 8 || h != 0 {
			t.Errorf("after warm and confirm = %d/%d, want 8/0 (8 in MySQL; b released)", av, h)
		}
	})

	t.Run("a refund the warm-up already counted is not given back again", func(t *testing.T) {
		s, sku, _ := setup(t, 10, 0)
		a := reserve(t, s, hold(sku, "a", "u", 2))
		follow(t, s, row(a, reservation.StatusConfirmed, false))
		if err := s.ForgetStock(ctx, sku); err != nil {
			t.Fatal(err)
		}
		refund := row(a, reservation.StatusCancelled, true)
		refund.RefundVersion = 3
		if _, err := s.Follow(ctx, refund, 0); !errors.Is(err, reservation.ErrUnknownSKU) {
			t.Fatalf("a refund while Redis has no stock = %v, want ErrUnknownSKU (warm first)", err)
		}
		if _, err := s.Warm(ctx, reservation.StockLevel{SKU: sku, Available: 10, Version: 3}, nil, nil); err != nil {
			t.Fatal(err)
		}
		if follow(t, s, refund) {
			t.Error("a refund at the warm-up's version gave stock again")
		}
		if av, _ := stockOf(t, s, sku); av != 10 {
			t.Errorf("stock = %d, want 10", av)
		}
	})

	t.Run("groups: slots, one join per user, FORMED is final, close", func(t *testing.T) {
		s, sku, c := setup(t, 10, 0)
		g := reservation.Group{ID: "g1", SKU: sku, Capacity: 2, Remaining: 2, Status: reservation.GroupOpen, Deadline: t0.Add(time.Hour)}
		if err := s.CreateGroup(ctx, g); err != nil {
			t.Fatal(err)
		}
		join := func(id, user string) (reservation.Reservation, reservation.ReserveOutcome, error) {
			r := hold(sku, id, user, 1)
			r.GroupID = "g1"
			return s.Reserve(ctx, r, ttl)
		}
		a, out, err := join("a", "u1")
		if err != nil || out.Full {
			t.Fatalf("first join = %v %+v", err, out)
		}
		if _, _, err := join("b", "u1"); !errors.Is(err, reservation.ErrAlreadyJoined) {
			t.Errorf("same user twice = %v, want ErrAlreadyJoined", err)
		}
		if _, out, err := join("c", "u2"); err != nil || !out.Full {
			t.Fatalf("last slot = %v %+v, want full", err, out)
		}
		if _, _, err := join("d", "u3"); !errors.Is(err, reservation.ErrGroupFull) {
			t.Errorf("third join = %v, want ErrGroupFull", err)
		}
		if gr, err := s.Group(ctx, sku, "g1"); err != nil || gr.Remaining != 0 || gr.Status != reservation.GroupOpen {
			t.Errorf("Group = %+v %v, want OPEN with 0 remaining until MySQL records it FORMED", gr, err)
		}
		c.now = t0.Add(2 * time.Hour)
		if cl, err := s.CloseGroup(ctx, g); err != nil || !cl.Full || !cl.FullAt.Equal(t0) {
			t.Errorf("CloseGroup of a full group = %+v %v, want full (MySQL decides)", cl, err)
		}
		c.now = t0
		if ok, err := s.FormGroup(ctx, g, t0); err != nil || !ok {
			t.Fatalf("FormGroup = %v %v", ok, err)
		}
		if gr, err := s.Group(ctx, sku, "g1"); err != nil || gr.Remaining != 0 || gr.Status != reservation.GroupFormed || !gr.FormedAt.Equal(t0) {
			t.Errorf("Group = %+v %v, want FORMED at t0 with 0 remaining", gr, err)
		}
		// Releasing a member of a FORMED group does not reopen it.
		if !follow(t, s, row(a, reservation.StatusCancelled, false)) {
			t.Fatal("the member's stock did not come back")
		}
		if gr, _ := s.Group(ctx, sku, "g1"); gr.Remaining != 0 || gr.Status != reservation.GroupFormed {
			t.Errorf("after release = %+v, want still FORMED", gr)
		}
		c.now = t0.Add(2 * time.Hour)
		if cl, err := s.CloseGroup(ctx, g); err != nil || cl.Status != reservation.GroupFormed {
			t.Errorf("CloseGroup of a formed group = %+v %v, want FORMED", cl, err)
		}
	})

	t.Run("groups: a slot counts once its join is accepted (AcceptJoin), or decided", func(t *testing.T) {
		s, sku, _ := setup(t, 10, 0)
		g := reservation.Group{ID: "g3", SKU: sku, Capacity: 2, Remaining: 2, Status: reservation.GroupOpen, Deadline: t0.Add(time.Hour)}
		if err := s.CreateGroup(ctx, g); err != nil {
			t.Fatal(err)
		}
		var held []reservation.Reservation
		for _, u := range []string{"u1", "u2"} {
			r := hold(sku, "j"+u, u, 1)
			r.GroupID = "g3"
			h, _, err := s.Reserve(ctx, r, ttl)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, h)
		}
		if ok, err := s.GroupHoldersAccepted(ctx, g); err != nil || ok {
			t.Errorf("GroupHoldersAccepted with two joins in flight = %v %v, want false", ok, err)
		}
		if full, err := s.AcceptJoin(ctx, held[0]); err != nil || !full {
			t.Errorf("AcceptJoin of the first = %v %v, want full (no free slot)", full, err)
		}
		if ok, _ := s.GroupHoldersAccepted(ctx, g); ok {
			t.Error("GroupHoldersAccepted with one join in flight = true, want false")
		}
		stale := held[1]
		stale.Token = "another"
		if _, err := s.AcceptJoin(ctx, stale); !errors.Is(err, reservation.ErrNotFound) {
			t.Errorf("AcceptJoin of another token = %v, want ErrNotFound (not accepted)", err)
		}
		if ok, _ := s.GroupHoldersAccepted(ctx, g); ok {
			t.Error("AcceptJoin of another token marked the hold: GroupHoldersAccepted = true, want false")
		}
		if _, err := s.AcceptJoin(ctx, held[1]); err != nil {
			t.Fatal(err)
		}
		if ok, err := s.GroupHoldersAccepted(ctx, g); err != nil || !ok {
			t.Errorf("GroupHoldersAccepted with both joins accepted = %v %v, want true", ok, err)
		}
	})

	t.Run("groups: an unfilled group closes only after its deadline, and releases reopen slots while OPEN", func(t *testing.T) {
		s, sku, c := setup(t, 10, 0)
		g := reservation.Group{ID: "g2", SKU: sku, Capacity: 3, Remaining: 3, Status: reservation.GroupOpen, Deadline: t0.Add(time.Hour)}
		if err := s.CreateGroup(ctx, g); err != nil {
			t.Fatal(err)
		}
		join := func(id, user string) (reservation.Reservation, error) {
			r := hold(sku, id, user, 1)
			r.GroupID = "g2"
			h, _, err := s.Reserve(ctx, r, ttl)
			return h, err
		}
		a, err := join("a", "u1")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := join("b", "u2"); err != nil {
			t.Fatal(err)
		}
		follow(t, s, row(a, reservation.StatusCancelled, false))
		if gr, _ := s.Group(ctx, sku, "g2"); gr.Remaining != 2 || gr.Status != reservation.GroupOpen {
			t.Errorf("after release = %+v, want OPEN with 2 remaining", gr)
		}
		if cl, err := s.CloseGroup(ctx, g); err != nil || !cl.NotDue {
			t.Errorf("CloseGroup before the deadline = %+v %v, want not due", cl, err)
		}
		c.now = t0.Add(time.Hour)
		cl, err := s.CloseGroup(ctx, g)
		if err != nil || cl.Status != reservation.GroupFailed || len(cl.Holders) != 1 || cl.Holders[0] != "b" {
			t.Errorf("CloseGroup = %+v %v, want FAILED held by [b]", cl, err)
		}
		c.now = t0
		if _, err := join("e", "u4"); !errors.Is(err, reservation.ErrGroupClosed) {
			t.Errorf("join closed group = %v, want ErrGroupClosed", err)
		}
		other := hold(sku, "x", "u9", 1)
		other.GroupID = "nosuch"
		if _, _, err := s.Reserve(ctx, other, ttl); !errors.Is(err, reservation.ErrUnknownGroup) {
			t.Errorf("unknown group = %v, want ErrUnknownGroup", err)
		}
		if cl, err := s.CloseGroup(ctx, reservation.Group{ID: "nosuch", SKU: sku}); err != nil || !cl.Unknown {
			t.Errorf("CloseGroup(unknown) = %+v %v", cl, err)
		}
		// CloseGroups answers as CloseGroup does, group by group.
		c.now = t0.Add(time.Hour)
		many, errs := s.CloseGroups(ctx, []reservation.Group{g, {ID: "nosuch", SKU: sku}})
		if len(many) != 2 || errs[0] != nil || errs[1] != nil || many[0].Status != reservation.GroupFailed ||
			len(many[0].Holders) != 1 || many[0].Holders[0] != "b" || !many[1].Unknown {
			t.Errorf("CloseGroups(g2, unknown) = %+v %v, want FAILED held by [b], then unknown", many, errs)
		}
		c.now = t0
	})

	t.Run("a join past the deadline is refused by the script's clock", func(t *testing.T) {
		s, sku, c := setup(t, 10, 0)
		g := reservation.Group{ID: "g3", SKU: sku, Capacity: 2, Remaining: 2, Status: reservation.GroupOpen, Deadline: t0.Add(time.Minute)}
		if err := s.CreateGroup(ctx, g); err != nil {
			t.Fatal(err)
		}
		c.now = t0.Add(time.Minute)
		late := hold(sku, "y", "u8", 1)
		late.GroupID = "g3"
		if _, _, err := s.Reserve(ctx, late, ttl); !errors.Is(err, reservation.ErrGroupClosed) {
			t.Errorf("join at the deadline = %v, want ErrGroupClosed", err)
		}
	})

	t.Run("heal moves stock only for a persistent drift Redis did not move under", func(t *testing.T) {
		s, sku, c := setup(t, 10, 0)
		heal := func(avail, held, drift int64, at time.Time) bool {
			t.Helper()
			c.now = at
			ok, err := s.Heal(ctx, reservation.RedisStock{SKU: sku, Available: avail, Held: held}, drift, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			return ok
		}
		if heal(10, 0, 3, t0) || heal(10, 0, 3, t0.Add(30*time.Second)) {
			t.Fatal("healed on the first sighting or too early")
		}
		if heal(9, 0, 3, t0.Add(2*time.Minute)) {
			t.Fatal("healed although Redis moved since the measurement")
		}
		if heal(10, 0, 3, t0.Add(3*time.Minute)) {
			t.Fatal("the mismatch must have forgotten the sighting")
		}
		if !heal(10, 0, 3, t0.Add(5*time.Minute)) {
			t.Fatal("a persistent drift was not healed")
		}
		if a, _ := stockOf(t, s, sku); a != 13 {
			t.Errorf("stock after heal = %d, want 13", a)
		}
	})

	t.Run("a user past the attempt rate is refused and holds nothing; others are not", func(t *testing.T) {
		c := &clock{now: t0}
		s := newHolds(t, c, 2, 3)
		sku := testservices.Name("sku")
		if _, err := s.Warm(ctx, reservation.StockLevel{SKU: sku, Available: 100, Version: 1}, nil, nil); err != nil {
			t.Fatal(err)
		}
		try := func(id, user string) error {
			_, _, err := s.Reserve(ctx, hold(sku, id, user, 1), ttl)
			return err
		}
		for i := range 3 {
			if err := try(fmt.Sprintf("b%d", i), "bot"); err != nil {
				t.Fatalf("attempt %d within the burst = %v", i, err)
			}
		}
		err := try("b3", "bot")
		var rl *reservation.RateLimitedError
		if !errors.As(err, &rl) || !errors.Is(err, reservation.ErrRateLimited) || rl.RetryAfter != 500*time.Millisecond {
			t.Fatalf("past the burst = %v, want rate limited for 500ms", err)
		}
		if a, h := stockOf(t, s, sku); a != 97 || h != 3 {
			t.Errorf("stock = %d/%d, want 97/3 (the refused attempt holds nothing)", a, h)
		}
		if err := try("a0", "ann"); err != nil {
			t.Errorf("another buyer = %v, want a hold", err)
		}
		c.now = t0.Add(500 * time.Millisecond)
		if err := try("b4", "bot"); err != nil {
			t.Errorf("after the refill = %v", err)
		}
		// A SKU's own rate (set with the stock) wins over the default.
		if _, err := s.Sync(ctx, reservation.StockLevel{SKU: sku, Version: 2, UserRate: 1000, UserBurst: 1000}); err != nil {
			t.Fatal(err)
		}
		c.now = t0.Add(1500 * time.Millisecond) // the bucket refills at the new rate
		for i := range 20 {
			if err := try(fmt.Sprintf("c%d", i), "bot"); err != nil {
				t.Fatalf("with the sku's own rate, attempt %d = %v", i, err)
			}
		}
	})

	t.Run("charge spends the budget reserve spends, once per attempt, and caps open groups", func(t *testing.T) {
		c := &clock{now: t0}
		s := newHolds(t, c, 2, 3)
		sku := testservices.Name("sku")
		if _, err := s.Warm(ctx, reservation.StockLevel{SKU: sku, Available: 100, Version: 1}, nil, nil); err != nil {
			t.Fatal(err)
		}
		if _, _, err := s.Reserve(ctx, hold(sku, "b0", "bot", 1), ttl); err != nil {
			t.Fatalf("a buy within the burst = %v", err)
		}
		for _, token := range []string{"x1", "x1", "x2"} { // x1 twice: a retried call is charged once
			if err := s.Charge(ctx, reservation.Attempt{SKU: sku, UserID: "bot", Token: token}); err != nil {
				t.Fatalf("charge %s within the burst = %v", token, err)
			}
		}
		var rl *reservation.RateLimitedError
		if err := s.Charge(ctx, reservation.Attempt{SKU: sku, UserID: "bot", Token: "x3"}); !errors.As(err, &rl) || rl.RetryAfter != 500*time.Millisecond {
			t.Fatalf("a charge past the burst = %v, want rate limited for 500ms", err)
		}
		if _, _, err := s.Reserve(ctx, hold(sku, "b1", "bot", 1), ttl); !errors.Is(err, reservation.ErrRateLimited) {
			t.Fatalf("a buy after the budget was spent by charges = %v, want rate limited (one budget)", err)
		}
		// Open groups: at most MaxOpen count until their Until; a claim repeated is one claim.
		claim := func(gid string, until time.Duration) error {
			return s.Charge(ctx, reservation.Attempt{SKU: sku, UserID: "host", Token: "t-" + gid, Group: gid, Until: t0.Add(until), MaxOpen: 2})
		}
		for _, gid := range []string{"g1", "g1", "g2"} {
			if err := claim(gid, time.Minute); err != nil {
				t.Fatalf("claim %s within the cap = %v", gid, err)
			}
		}
		var tg *reservation.TooManyGroupsError
		if err := claim("g3", time.Minute); !errors.As(err, &tg) || !errors.Is(err, reservation.ErrTooManyGroups) || tg.RetryAfter != time.Minute {
			t.Fatalf("a third open group = %v, want too many groups for 1m", err)
		}
		if err := s.Charge(ctx, reservation.Attempt{SKU: sku, UserID: "guest", Token: "t-g4", Group: "g4", Until: t0.Add(time.Minute), MaxOpen: 2}); err != nil {
			t.Errorf("another buyer's group = %v, want claimed", err)
		}
		c.now = t0.Add(time.Minute)
		if err := claim("g5", 2*time.Minute); err != nil {
			t.Errorf("a group once the first ones stopped counting = %v, want claimed", err)
		}
	})

	t.Run("concurrent reserves never oversell", func(t *testing.T) {
		s, sku, _ := setup(t, 50, 0)
		var ok, sold atomic.Int64
		var wg sync.WaitGroup
		for i := range 200 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _, err := s.Reserve(ctx, hold(sku, fmt.Sprintf("r%d", i), fmt.Sprintf("u%d", i), 1), ttl)
				switch {
				case err == nil:
					ok.Add(1)
				case errors.Is(err, reservation.ErrSoldOut):
					sold.Add(1)
				default:
					t.Errorf("reserve: %v", err)
				}
			}()
		}
		wg.Wait()
		if ok.Load() != 50 || sold.Load() != 150 {
			t.Errorf("ok %d sold out %d, want 50 and 150", ok.Load(), sold.Load())
		}
		if a, h := stockOf(t, s, sku); a != 0 || h != 50 {
			t.Errorf("stock = %d/%d, want 0/50", a, h)
		}
	})
	t.Run("a stray meeting a refund the warm-up already counted is returned, and Follow says so", func(t *testing.T) {
		s, sku, _ := setup(t, 10, 0)
		h := hold(sku, sku+".aaaaaaaaaaaaaaaaaaaaaaaaaa", "u", 1)
		h.Token = "t-stray"
		reserve(t, s, h)
		decided := h
		decided.Token, decided.Status, decided.Reason, decided.Refunded, decided.RefundVersion = "t-decided", reservation.StatusCancelled, reservation.ReasonBuyer, true, 1
		if !follow(t, s, decided) {
			t.Errorf("Follow = false, want true: the stray's unit came back")
		}
		if a, held := stockOf(t, s, sku); a != 10 || held != 0 {
			t.Errorf("stock = %d/%d, want 10 available, 0 held", a, held)
		}
	})

	t.Run("HeldIDs lists by deadline; a limit of 0 lists every one", func(t *testing.T) {
		s, sku, c := setup(t, 10, 0)
		reserve(t, s, hold(sku, "late", "u", 1))
		c.now = c.now.Add(-time.Second)
		reserve(t, s, hold(sku, "early", "v", 1))
		ids, err := s.HeldIDs(ctx, sku, 0)
		if err != nil || len(ids) != 2 || ids[0] != "early" {
			t.Errorf("HeldIDs(0) = %v %v, want [early late]", ids, err)
		}
		if ids, err := s.HeldIDs(ctx, sku, 1); err != nil || len(ids) != 1 || ids[0] != "early" {
			t.Errorf("HeldIDs(1) = %v %v, want [early]", ids, err)
		}
	})

	t.Run("FollowAll has the effect of Follow on each row, once", func(t *testing.T) {
		s, sku, _ := setup(t, 10, 0)
		a := reserve(t, s, hold(sku, sku+".aaaaaaaaaaaaaaaaaaaaaaaaaa", "u1", 1))
		b := reserve(t, s, hold(sku, sku+".bbbbbbbbbbbbbbbbbbbbbbbbbb", "u2", 2))
		c := reserve(t, s, hold(sku, sku+".cccccccccccccccccccccccccc", "u3", 3))
		stray := row(c, reservation.StatusConfirmed, false)
		stray.Token = "t-decided-elsewhere" // MySQL decided another incarnation of c's id
		rows := []reservation.Reservation{row(a, reservation.StatusConfirmed, false), row(b, reservation.StatusCancelled, false), stray}
		returned, errs := s.FollowAll(ctx, rows, 7)
		for i, err := range errs {
			if err != nil {
				t.Fatalf("FollowAll row %d: %v", i, err)
			}
		}
		if fmt.Sprint(returned) != "[false true true]" {
			t.Errorf("returned = %v, want [false true true] (a confirmed; b's and the stray's units back)", returned)
		}
		// 10 − 1 − 2 − 3 taken; b's 2 and the stray's 3 back; the stray's
		// decided incarnation was committed at version 7, after the level
		// Redis was warmed from (1): its 3 units are taken now.
		if avail, held := stockOf(t, s, sku); avail != 6 || held != 0 {
			t.Errorf("stock = %d/%d, want 6 available, 0 held", avail, held)
		}
		if h, err := s.Hold(ctx, a.ID, 0); err != nil || h.Status != reservation.StatusConfirmed {
			t.Errorf("hold a = %+v %v, want CONFIRMED", h, err)
		}
		returned, errs = s.FollowAll(ctx, rows, 7)
		if fmt.Sprint(returned) != "[false false false]" || errors.Join(errs...) != nil {
			t.Errorf("FollowAll again = %v %v, want nothing returned twice", returned, errs)
		}
		if avail, held := stockOf(t, s, sku); avail != 6 || held != 0 {
			t.Errorf("stock after a repeat = %d/%d, want 6/0", avail, held)
		}
		if returned, errs := s.FollowAll(ctx, nil, 0); len(returned) != 0 || len(errs) != 0 {
			t.Errorf("FollowAll(nil) = %v %v", returned, errs)
		}
	})

	t.Run("a live mark stands until it passes and did not move; the cursor keeps its place", func(t *testing.T) {
		s, sku, c := setup(t, 10, 0)
		other := sku + "-b"
		if live, err := s.Live(ctx, 10); err != nil || len(live) != 0 {
			t.Fatalf("Live of a fresh store = %v %v, want none", live, err)
		}
		if m, err := s.Touch(ctx, sku, 2*ttl); err != nil || !m.Until.Equal(t0.Add(2*ttl)) {
			t.Fatalf("Touch = %+v %v, want until +2m", m, err)
		}
		if m, err := s.Touch(ctx, sku, ttl); err != nil || !m.Until.Equal(t0.Add(2*ttl)) { // shorter: the later mark stands
			t.Fatalf("Touch (shorter) = %+v %v, want the mark until +2m", m, err)
		}
		if _, err := s.Touch(ctx, other, ttl); err != nil {
			t.Fatal(err)
		}
		live, err := s.Live(ctx, 10)
		if err != nil || len(live) != 2 || live[0].SKU != other || !live[0].Until.Equal(t0.Add(ttl)) ||
			live[1].SKU != sku || !live[1].Until.Equal(t0.Add(2*ttl)) {
			t.Fatalf("Live = %+v %v, want %s until +1m, then %s until +2m", live, err, other, sku)
		}
		if one, err := s.Live(ctx, 1); err != nil || len(one) != 1 || one[0].SKU != other {
			t.Errorf("Live(1) = %+v %v, want the earliest mark only", one, err)
		}
		if ended, err := s.Unmark(ctx, live[1]); err != nil || ended {
			t.Errorf("Unmark before the mark passed = %v %v, want false", ended, err)
		}
		c.now = t0.Add(2*ttl + time.Millisecond)
		moved := live[1]
		moved.Until = moved.Until.Add(-time.Millisecond)
		if ended, err := s.Unmark(ctx, moved); err != nil || ended {
			t.Errorf("Unmark of a mark that moved = %v %v, want false", ended, err)
		}
		if ended, err := s.Unmark(ctx, live[1]); err != nil || !ended {
			t.Errorf("Unmark of a passed mark = %v %v, want true", ended, err)
		}
		if ended, err := s.Unmark(ctx, live[1]); err != nil || ended {
			t.Errorf("Unmark again = %v %v, want false", ended, err)
		}
		renewed, err := s.Touch(ctx, other, ttl) // marked again after the sweeper listed it
		if err != nil {
			t.Fatal(err)
		}
		if ended, err := s.Unmark(ctx, live[0]); err != nil || ended {
			t.Errorf("Unmark of a mark a reserve renewed = %v %v, want false", ended, err)
		}
		if live, err := s.Live(ctx, 10); err != nil || len(live) != 1 || live[0].SKU != other {
			t.Errorf("Live = %+v %v, want only %s", live, err, other)
		}
		// A withdrawal ends a mark that has not passed, only if it is still the SKU's mark.
		if ended, err := s.Withdraw(ctx, live[0]); err != nil || ended {
			t.Errorf("Withdraw of a mark since renewed = %v %v, want false", ended, err)
		}
		if ended, err := s.Withdraw(ctx, renewed); err != nil || !ended {
			t.Errorf("Withdraw of the mark as it stands = %v %v, want true", ended, err)
		}
		if live, err := s.Live(ctx, 10); err != nil || len(live) != 0 {
			t.Errorf("Live after the withdrawal = %+v %v, want none", live, err)
		}

		if cur, err := s.Cursor(ctx); err != nil || cur != "" {
			t.Errorf("Cursor of a fresh store = %q %v, want \"\"", cur, err)
		}
		if err := s.SetCursor(ctx, sku); err != nil {
			t.Fatal(err)
		}
		if cur, err := s.Cursor(ctx); err != nil || cur != sku {
			t.Errorf("Cursor = %q %v, want %q", cur, err, sku)
		}
		if err := s.SetCursor(ctx, ""); err != nil {
			t.Fatal(err)
		}
		if cur, err := s.Cursor(ctx); err != nil || cur != "" {
			t.Errorf("Cursor after a pass = %q %v, want \"\"", cur, err)
		}
	})
}
