package reservationtest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/holdfast/holdfast/shared/reservation"
)

// testStock is the Holds suite's Stock part: Stock, Sync, Warm and Heal,
// and the listings of a SKU's holds (Expired, HeldIDs).
func testStock(t *testing.T, newHolds HoldsFactory) {
	ctx := context.Background()
	t.Run("expired lists held holds past deadline plus grace, by the script's clock", func(t *testing.T) {
		s, sku, c := setup(t, newHolds, 10, 0)
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
		s, sku, _ := setup(t, newHolds, 100, 0)
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
		s, sku, _ := setup(t, newHolds, 10, 0)
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
		s, sku, _ := setup(t, newHolds, 10, 0)
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

	t.Run("heal moves stock only for a persistent drift Redis did not move under", func(t *testing.T) {
		s, sku, c := setup(t, newHolds, 10, 0)
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

	t.Run("HeldIDs lists by deadline; a limit of 0 lists every one", func(t *testing.T) {
		s, sku, c := setup(t, newHolds, 10, 0)
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
}
