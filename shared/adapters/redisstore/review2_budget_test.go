package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/adapters/redisstore"
	"github.com/holdfast/holdfast/shared/reservation"
)

// Adversarial review (review2) of the budget string "tokens:at:last": user
// ids with ':' keep budgets of their own, a clock stepped back or forward
// grants no more than the burst, and a buyer probing every millisecond
// (each refusal rewrites the refilled tokens as text) gains nothing from
// the rounding over 10 s at an odd rate.
func TestReview2BudgetStringHolds(t *testing.T) {
	ctx := context.Background()
	c := testservices.Require(t).Redis(t)
	t0 := time.UnixMilli(1_800_000_000_000).UTC()
	clk := &testClock{now: t0}
	sku := testservices.Name("rv2b")
	n := 0
	buy := func(s *redisstore.Store, user string) error {
		n++
		_, _, err := s.Reserve(ctx, reservation.Reservation{ID: fmt.Sprintf("%s.id%d", sku, n), SKU: sku, Qty: 1, UserID: user,
			Token: fmt.Sprintf("t%d", n)}, time.Minute)
		return err
	}
	s := redisstore.New(c, time.Hour, redisstore.WithClock(clk), redisstore.WithUserRate(1, 2))
	if _, err := s.Warm(ctx, reservation.StockLevel{SKU: sku, Available: 1_000_000, Version: 1}, nil, nil); err != nil {
		t.Fatal(err)
	}
	served := func(s *redisstore.Store, user string, tries int) int {
		k := 0
		for range tries {
			err := buy(s, user)
			switch {
			case err == nil:
				k++
			case !errors.Is(err, reservation.ErrRateLimited):
				t.Fatalf("%s: %v", user, err)
			}
		}
		return k
	}
	for _, u := range []string{"u", "u:1", "u:ab:u", ":", "u:", "::9:9", "a.b_c-D"} {
		if k := served(s, u, 5); k != 2 {
			t.Errorf("user %q served %d of 5 with burst 2, want 2", u, k)
		}
	}
	clk.now = t0.Add(-time.Hour) // Redis's clock stepped back an hour
	if k := served(s, "u", 3); k != 0 {
		t.Errorf("after a clock step back, u served %d, want 0 (no refill)", k)
	}
	clk.now = clk.now.Add(1000 * time.Millisecond)
	if k := served(s, "u", 3); k != 1 {
		t.Errorf("1 s after the step back, u served %d, want 1", k)
	}
	clk.now = t0.Add(24 * time.Hour) // and forward a day
	if k := served(s, "u", 5); k != 2 {
		t.Errorf("after a clock step forward, u served %d, want the burst 2", k)
	}

	// Rate 7/s, burst 1, a probe every ms for 10 s: at most 1 + 70.
	s7 := redisstore.New(c, time.Hour, redisstore.WithClock(clk), redisstore.WithUserRate(7, 1))
	start := clk.now
	k := 0
	for ms := 0; ms < 10_000; ms++ {
		clk.now = start.Add(time.Duration(ms) * time.Millisecond)
		k += served(s7, "prober", 1)
	}
	if k > 1+70 {
		t.Errorf("a prober at 7/s, burst 1, probing every ms for 10 s was served %d, want at most 71", k)
	}
	t.Logf("prober served %d in 10 s at 7/s", k)
}
