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

// testReserve is the Holds suite's Reserve part: holds, replays and
// refusals, and the attempt budget Reserve and Charge spend.
func testReserve(t *testing.T, newHolds HoldsFactory) {
	ctx := context.Background()
	t.Run("reserve deducts, sets the deadline by the script's clock, and replays without taking twice", func(t *testing.T) {
		s, sku, _ := setup(t, newHolds, 5, 0)
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

	t.Run("refusals take nothing; the per-user limit is judged before the stock", func(t *testing.T) {
		s, sku, _ := setup(t, newHolds, 3, 2)
		reserve(t, s, hold(sku, "b", "u", 2))
		if _, _, err := s.Reserve(ctx, hold(sku, "c", "u", 1), ttl); !errors.Is(err, reservation.ErrLimitExceeded) {
			t.Errorf("over per-user limit = %v, want ErrLimitExceeded", err)
		}
		if _, _, err := s.Reserve(ctx, hold(sku, "a", "v", 2), ttl); !errors.Is(err, reservation.ErrSoldOut) {
			t.Errorf("over stock, within the limit = %v, want ErrSoldOut", err)
		}
		// Over both: the limit answers, so a caller never refills a bucket
		// for a request the limit refuses.
		if _, _, err := s.Reserve(ctx, hold(sku, "d", "v", 4), ttl); !errors.Is(err, reservation.ErrLimitExceeded) {
			t.Errorf("over stock and over the limit = %v, want ErrLimitExceeded", err)
		}
		if _, _, err := s.Reserve(ctx, hold(sku, "e", "u", 2), ttl); !errors.Is(err, reservation.ErrLimitExceeded) {
			t.Errorf("at the limit, over the stock = %v, want ErrLimitExceeded", err)
		}
		if _, _, err := s.Reserve(ctx, hold("nosuch"+sku, "d", "u", 1), ttl); !errors.Is(err, reservation.ErrUnknownSKU) {
			t.Errorf("unknown sku = %v, want ErrUnknownSKU", err)
		}
		if a, h := stockOf(t, s, sku); a != 1 || h != 2 {
			t.Errorf("stock = %d/%d, want 1/2", a, h)
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
		c.now = t0.Add(1500 * time.Millisecond) // the attempt budget refills at the new rate
		for i := range 20 {
			if err := try(fmt.Sprintf("c%d", i), "bot"); err != nil {
				t.Fatalf("with the sku's own rate, attempt %d = %v", i, err)
			}
		}
	})

	// A review found that a request mismatching an id's hold was answered
	// before any attempt was charged: a hostile client could run the hot
	// SKU's script for free, forever.
	t.Run("a request mismatching the id's hold is charged like any attempt: a storm of them is rate limited", func(t *testing.T) {
		c := &clock{now: t0}
		s := newHolds(t, c, 2, 3)
		sku := testservices.Name("sku")
		if _, err := s.Warm(ctx, reservation.StockLevel{SKU: sku, Available: 100, Version: 1}, nil, nil); err != nil {
			t.Fatal(err)
		}
		id := reservation.ReservationID(reservation.ReserveRequest{SKU: sku, UserID: "bot", IdempotencyKey: "k"}, nil)
		h := reserve(t, s, hold(sku, id, "bot", 1)) // one token of 3
		other := func(i int) reservation.Reservation {
			r := hold(sku, id, "bot", 2)
			r.Token = fmt.Sprintf("t-storm-%d", i) // a new request each: not a retry of the hold's call
			return r
		}
		for i := range 2 {
			if _, _, err := s.Reserve(ctx, other(i), ttl); !errors.Is(err, reservation.ErrIdempotencyMismatch) {
				t.Fatalf("mismatch %d within the burst = %v, want ErrIdempotencyMismatch", i, err)
			}
		}
		mismatches, limited := 0, 0
		for i := 2; i < 50; i++ {
			_, _, err := s.Reserve(ctx, other(i), ttl)
			var rl *reservation.RateLimitedError
			switch {
			case errors.As(err, &rl) && errors.Is(err, reservation.ErrRateLimited):
				limited++
				if rl.RetryAfter != 500*time.Millisecond {
					t.Errorf("mismatch %d: rate limited for %v, want 500ms", i, rl.RetryAfter)
				}
			case errors.Is(err, reservation.ErrIdempotencyMismatch):
				mismatches++
			default:
				t.Fatalf("mismatch %d = %v", i, err)
			}
		}
		if mismatches != 0 || limited != 48 {
			t.Errorf("a storm of 48 mismatches past the burst: %d answered, %d rate limited; want 0 and 48", mismatches, limited)
		}
		// The retry of an attempt already charged (ARGV[11]) stays free, and
		// is still told the mismatch.
		again := other(99)
		again.AlreadyCharged = true
		if _, _, err := s.Reserve(ctx, again, ttl); !errors.Is(err, reservation.ErrIdempotencyMismatch) {
			t.Errorf("an already-charged mismatch with the budget spent = %v, want ErrIdempotencyMismatch", err)
		}
		// The budget is the buyer's: others are not refused, and the hold is untouched.
		if _, _, err := s.Reserve(ctx, hold(sku, "a", "ann", 1), ttl); err != nil {
			t.Errorf("another buyer during the storm = %v, want a hold", err)
		}
		if got, err := s.Hold(ctx, id, 0); err != nil || got.Qty != 1 || got.Token != h.Token || got.Status != reservation.StatusHeld {
			t.Errorf("the hold after the storm = %+v %v, want it as held", got, err)
		}
		if a, held := stockOf(t, s, sku); a != 98 || held != 2 {
			t.Errorf("stock = %d/%d, want 98/2 (the storm took nothing)", a, held)
		}
		c.now = t0.Add(500 * time.Millisecond) // one token back
		if _, _, err := s.Reserve(ctx, other(100), ttl); !errors.Is(err, reservation.ErrIdempotencyMismatch) {
			t.Errorf("a mismatch after the refill = %v, want ErrIdempotencyMismatch", err)
		}
		if _, _, err := s.Reserve(ctx, other(101), ttl); !errors.Is(err, reservation.ErrRateLimited) {
			t.Errorf("the next mismatch = %v, want rate limited (the refilled token was spent)", err)
		}
	})

	t.Run("the sale window is judged by the script's clock; a replay answers its hold; refusals are charged", func(t *testing.T) {
		c := &clock{now: t0}
		s := newHolds(t, c, 1, 2)
		sku := testservices.Name("sku")
		opens, closes := t0.Add(10*time.Second), t0.Add(20*time.Second)
		if _, err := s.Warm(ctx, reservation.StockLevel{SKU: sku, Available: 10, Version: 1, OpensAt: opens, ClosesAt: closes}, nil, nil); err != nil {
			t.Fatal(err)
		}
		if rs, err := s.Stock(ctx, sku); err != nil || !rs.OpensAt.Equal(opens) || !rs.ClosesAt.Equal(closes) {
			t.Fatalf("Stock = %+v %v, want the window %v .. %v", rs, err, opens, closes)
		}
		try := func(id, user string) error {
			_, _, err := s.Reserve(ctx, hold(sku, id, user, 1), ttl)
			return err
		}
		var no *reservation.NotOpenError
		if err := try("b0", "bot"); !errors.As(err, &no) || !errors.Is(err, reservation.ErrNotOpen) || !no.OpensAt.Equal(opens) || no.RetryAfter != 10*time.Second {
			t.Fatalf("before opening = %v, want not open until %v, 10s from now", err, opens)
		}
		// Refused attempts are charged: the burst of 2 is spent by two of them.
		if err := try("b1", "bot"); !errors.Is(err, reservation.ErrNotOpen) {
			t.Fatalf("the second attempt before opening = %v, want not open", err)
		}
		if err := try("b2", "bot"); !errors.Is(err, reservation.ErrRateLimited) {
			t.Fatalf("a third attempt before opening = %v, want rate limited (each refusal cost a token)", err)
		}
		c.now = opens.Add(-time.Millisecond)
		if err := try("a0", "ann"); !errors.As(err, &no) || no.RetryAfter != time.Millisecond {
			t.Fatalf("a millisecond before opening = %v, want not open for 1ms", err)
		}
		c.now = opens
		h, _, err := s.Reserve(ctx, hold(sku, "a1", "ann", 1), ttl)
		if err != nil {
			t.Fatalf("at opens_at = %v, want a hold", err)
		}
		// Moved mid-sale (a newer level): it applies at the next reserve.
		early := opens.Add(5 * time.Second)
		if _, err := s.Sync(ctx, reservation.StockLevel{SKU: sku, Version: 2, OpensAt: opens, ClosesAt: early}); err != nil {
			t.Fatal(err)
		}
		c.now = early
		if err := try("c0", "cat"); !errors.Is(err, reservation.ErrSaleClosed) {
			t.Fatalf("at the moved closes_at = %v, want sale closed", err)
		}
		replay := hold(sku, "a1", "ann", 1)
		replay.Token = "another attempt"
		if got, out, err := s.Reserve(ctx, replay, ttl); err != nil || !out.Replayed || got.Token != h.Token {
			t.Fatalf("a replay after the close = %+v %+v %v, want the hold replayed", got, out, err)
		}
		if a, held := stockOf(t, s, sku); a != 9 || held != 1 {
			t.Errorf("stock = %d/%d, want 9/1 (only the hold taken while open)", a, held)
		}
		// Cleared: no window.
		if _, err := s.Sync(ctx, reservation.StockLevel{SKU: sku, Version: 3}); err != nil {
			t.Fatal(err)
		}
		if err := try("c1", "cat"); err != nil {
			t.Errorf("with the window cleared = %v, want a hold", err)
		}
		if rs, err := s.Stock(ctx, sku); err != nil || !rs.OpensAt.IsZero() || !rs.ClosesAt.IsZero() {
			t.Errorf("Stock after the window was cleared = %+v %v, want no window", rs, err)
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
		s, sku, _ := setup(t, newHolds, 50, 0)
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
}
