package reservationtest

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/holdfast/holdfast/shared/reservation"
)

// testFollow is the Holds suite's Follow part: MySQL's decisions reaching
// Redis through Follow and FollowAll, refunds and strays.
func testFollow(t *testing.T, newHolds HoldsFactory) {
	ctx := context.Background()
	t.Run("a fence's release returns a held hold once and leaves a tombstone", func(t *testing.T) {
		s, sku, _ := setup(t, newHolds, 5, 1)
		r := reserve(t, s, hold(sku, "r1", "u", 1))
		cancelled := row(r, reservation.StatusCancelled, false)
		for i, want := range []bool{true, false, false} {
			if got := follow(t, s, cancelled); got != want {
				t.Fatalf("Follow(CANCELLED) #%d = %v, want %v", i, got, want)
			}
		}
		cancelled.Release = reservation.ReleaseDone // MySQL acknowledged it
		if follow(t, s, cancelled) {
			t.Fatal("released row gave stock again")
		}
		if a, h := stockOf(t, s, sku); a != 5 || h != 0 {
			t.Errorf("stock = %d/%d, want 5/0", a, h)
		}
		got, out, err := s.Reserve(ctx, hold(sku, "r1", "u", 1), ttl)
		if err != nil || !out.Replayed || out.Tombstone || got.Status != reservation.StatusCancelled || got.Reason != reservation.ReasonBuyer {
			t.Errorf("reserve after release = %+v %+v %v, want the CANCELLED hold, the bucket's own (no Tombstone)", got, out, err)
		}
		// The per-user units came back too.
		reserve(t, s, hold(sku, "r2", "u", 1))
		// A fence of a hold Redis never saw leaves a tombstone: a late reserve takes nothing.
		ghost := row(hold(sku, "ghost", "v", 2), reservation.StatusCancelled, false)
		if follow(t, s, ghost) {
			t.Errorf("Follow(missing, fence) returned stock")
		}
		if got, out, _ := s.Reserve(ctx, hold(sku, "ghost", "v", 2), ttl); !out.Replayed || !out.Tombstone || got.Status != reservation.StatusCancelled {
			t.Errorf("reserve of a tombstone = %v %+v, want replayed CANCELLED, reported a Tombstone", got.Status, out)
		}
	})

	t.Run("confirm keeps stock deducted; a refund returns it once, also after Redis forgot the hold", func(t *testing.T) {
		s, sku, _ := setup(t, newHolds, 5, 0)
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
		refund.Release = reservation.ReleaseDone
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
		s, sku, _ := setup(t, newHolds, 10, 0)
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
		// The stray's place holds the row's tombstone, not a hold of the
		// bucket's own: a replay says so (the service asks MySQL then).
		again := hold(sku, id, "u", 1)
		again.Token = "t-again"
		if got, out, err := s.Reserve(ctx, again, ttl); err != nil || !out.Replayed || !out.Tombstone || got.Status != reservation.StatusConfirmed {
			t.Errorf("replay of the stray's tombstone = %+v %+v %v, want replayed CONFIRMED, reported a Tombstone", got, out, err)
		}
	})

	t.Run("a refund the warm-up already counted is not given back again", func(t *testing.T) {
		s, sku, _ := setup(t, newHolds, 10, 0)
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

	t.Run("a stray meeting a refund the warm-up already counted is returned, and Follow says so", func(t *testing.T) {
		s, sku, _ := setup(t, newHolds, 10, 0)
		h := hold(sku, sku+".aaaaaaaaaaaaaaaaaaaaaaaaaa", "u", 1)
		h.Token = "t-stray"
		reserve(t, s, h)
		decided := h
		decided = row(decided, reservation.StatusCancelled, true)
		decided.Token, decided.RefundVersion = "t-decided", 1
		if !follow(t, s, decided) {
			t.Errorf("Follow = false, want true: the stray's unit came back")
		}
		if a, held := stockOf(t, s, sku); a != 10 || held != 0 {
			t.Errorf("stock = %d/%d, want 10 available, 0 held", a, held)
		}
	})

	t.Run("FollowAll has the effect of Follow on each row, once", func(t *testing.T) {
		s, sku, _ := setup(t, newHolds, 10, 0)
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
}
