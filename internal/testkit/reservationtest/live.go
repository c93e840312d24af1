package reservationtest

import (
	"context"
	"testing"
	"time"
)

// testLive is the Holds suite's Live part: the live marks the sweeper walks
// (Touch, Live, Unmark, Withdraw) and its Cursor.
func testLive(t *testing.T, newHolds HoldsFactory) {
	ctx := context.Background()
	t.Run("a live mark stands until it passes and did not move; the cursor keeps its place", func(t *testing.T) {
		s, sku, c := setup(t, newHolds, 10, 0)
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
