package reservationtest

import (
	"context"
	"testing"
	"time"

	"github.com/holdfast/holdfast/shared/reservation"
)

// testTransfer is the Holds suite's Transfer part: the Redis sides of a move
// between two buckets of a SKU (TakeOut, Credit, Landed), and Follow of the
// recorded transfer in the giving bucket.
func testTransfer(t *testing.T, newHolds HoldsFactory) {
	ctx := context.Background()
	// twoBuckets returns a Holds with a SKU whose bucket 0 has 10 units and
	// bucket 1 none, and a transfer of 4 from 0 to 1 taken out.
	twoBuckets := func(t *testing.T) (HoldsUnderTest, reservation.Reservation, *clock) {
		s, sku, c := setup(t, newHolds, 10, 0)
		into := reservation.BucketName(sku, 1)
		if res, err := s.Warm(ctx, reservation.StockLevel{SKU: into, Version: 1}, nil, nil); err != nil || res != reservation.SyncWarmed {
			t.Fatalf("Warm bucket 1 = %v %v", res, err)
		}
		tr := reservation.Reservation{ID: sku + ".tttttttttttttttttttttttttt", SKU: sku, Qty: 4, Bucket: 0, Transfer: true, Into: 1, Token: "t-move"}
		held, err := s.TakeOut(ctx, tr, 10*time.Second)
		if err != nil {
			t.Fatalf("TakeOut = %v", err)
		}
		return s, held, c
	}
	figures := func(t *testing.T, s HoldsUnderTest, name string) reservation.RedisStock {
		t.Helper()
		rs, err := s.Stock(ctx, name)
		if err != nil {
			t.Fatalf("Stock(%s): %v", name, err)
		}
		return rs
	}

	t.Run("take out holds the units as on their way", func(t *testing.T) {
		s, held, _ := twoBuckets(t)
		if rs := figures(t, s, held.SKU); rs.Available != 6 || rs.Held != 4 || rs.Moving != 4 {
			t.Errorf("giving bucket = %+v, want 6 available, 4 held, 4 moving", rs)
		}
		if !held.Transfer || held.Into != 1 || held.ExpiresAt.IsZero() {
			t.Errorf("the transfer's hold = %+v, want a transfer into 1 with its deadline", held)
		}
	})

	t.Run("a credit ahead of the record lands once, then the record's credit is a no-op", func(t *testing.T) {
		s, held, _ := twoBuckets(t)
		into := reservation.BucketName(held.SKU, 1)
		if ok, err := s.Credit(ctx, held); err != nil || !ok {
			t.Fatalf("Credit ahead = %v %v, want credited", ok, err)
		}
		if ok, err := s.Credit(ctx, held); err != nil || ok {
			t.Errorf("Credit ahead again = %v %v, want a no-op", ok, err)
		}
		recorded := held
		recorded.TransferVersion = 5
		if ok, err := s.Credit(ctx, recorded); err != nil || ok {
			t.Errorf("the record's credit after the credit ahead = %v %v, want a no-op", ok, err)
		}
		if rs := figures(t, s, into); rs.Available != 4 {
			t.Errorf("receiving bucket = %+v, want 4 available", rs)
		}
	})

	t.Run("a credit ahead of the record is refused from the hold's deadline on", func(t *testing.T) {
		s, held, c := twoBuckets(t)
		c.now = held.ExpiresAt
		if ok, err := s.Credit(ctx, held); err != nil || ok {
			t.Errorf("Credit ahead at the deadline = %v %v, want refused", ok, err)
		}
		recorded := held
		recorded.TransferVersion = 5
		if ok, err := s.Credit(ctx, recorded); err != nil || !ok {
			t.Errorf("the record's credit after the deadline = %v %v, want credited", ok, err)
		}
		if rs := figures(t, s, reservation.BucketName(held.SKU, 1)); rs.Available != 4 {
			t.Errorf("receiving bucket = %+v, want 4 available", rs)
		}
	})

	t.Run("landed takes the units off moving once, and the confirm does not again", func(t *testing.T) {
		s, held, _ := twoBuckets(t)
		for range 2 {
			if err := s.Landed(ctx, held); err != nil {
				t.Fatal(err)
			}
		}
		if rs := figures(t, s, held.SKU); rs.Held != 4 || rs.Moving != 0 {
			t.Errorf("after landed twice = %+v, want 4 held, 0 moving", rs)
		}
		confirmed := held
		confirmed.Status = reservation.StatusConfirmed
		if _, err := s.Follow(ctx, confirmed, 0); err != nil {
			t.Fatal(err)
		}
		if rs := figures(t, s, held.SKU); rs.Available != 6 || rs.Held != 0 || rs.Moving != 0 {
			t.Errorf("after the confirm = %+v, want 6 available, 0 held, 0 moving", rs)
		}
	})

	t.Run("a confirm of a transfer that never landed takes its units off moving", func(t *testing.T) {
		s, held, _ := twoBuckets(t)
		confirmed := held
		confirmed.Status = reservation.StatusConfirmed
		if _, err := s.Follow(ctx, confirmed, 0); err != nil {
			t.Fatal(err)
		}
		if rs := figures(t, s, held.SKU); rs.Available != 6 || rs.Held != 0 || rs.Moving != 0 {
			t.Errorf("after the confirm = %+v, want 6 available, 0 held, 0 moving", rs)
		}
		if err := s.Landed(ctx, held); err != nil {
			t.Fatal(err)
		}
		if rs := figures(t, s, held.SKU); rs.Moving != 0 {
			t.Errorf("landed after the confirm = %+v, want moving left at 0", rs)
		}
	})

	t.Run("landed of another token moves nothing", func(t *testing.T) {
		s, held, _ := twoBuckets(t)
		other := held
		other.Token = "t-other"
		if err := s.Landed(ctx, other); err != nil {
			t.Fatal(err)
		}
		if rs := figures(t, s, held.SKU); rs.Moving != 4 {
			t.Errorf("after landed of another token = %+v, want 4 moving", rs)
		}
	})

	t.Run("a credit ahead counts as ahead until the record's credit", func(t *testing.T) {
		s, held, _ := twoBuckets(t)
		into := reservation.BucketName(held.SKU, 1)
		if _, err := s.Credit(ctx, held); err != nil {
			t.Fatal(err)
		}
		if rs := figures(t, s, into); rs.Available != 4 || rs.Ahead != 4 {
			t.Errorf("after the credit ahead = %+v, want 4 available, 4 ahead", rs)
		}
		recorded := held
		recorded.TransferVersion = 5
		if _, err := s.Credit(ctx, recorded); err != nil {
			t.Fatal(err)
		}
		if rs := figures(t, s, into); rs.Available != 4 || rs.Ahead != 0 {
			t.Errorf("after the record's credit = %+v, want 4 available, 0 ahead", rs)
		}
	})

	t.Run("a bucket warmed between the credit ahead and the record is credited by the record", func(t *testing.T) {
		s, held, _ := twoBuckets(t)
		into := reservation.BucketName(held.SKU, 1)
		if _, err := s.Credit(ctx, held); err != nil {
			t.Fatal(err)
		}
		if err := s.ForgetStock(ctx, into); err != nil {
			t.Fatal(err)
		}
		// MySQL's share of bucket 1 lacks the transfer (not recorded yet).
		if res, err := s.Warm(ctx, reservation.StockLevel{SKU: into, Version: 2}, nil, nil); err != nil || res != reservation.SyncWarmed {
			t.Fatalf("Warm = %v %v", res, err)
		}
		if rs := figures(t, s, into); rs.Available != 0 || rs.Ahead != 0 {
			t.Errorf("after the warm-up = %+v, want 0 available, 0 ahead", rs)
		}
		recorded := held
		recorded.TransferVersion = 5
		if ok, err := s.Credit(ctx, recorded); err != nil || !ok {
			t.Errorf("the record's credit after a warm-up without it = %v %v, want credited", ok, err)
		}
		if ok, err := s.Credit(ctx, recorded); err != nil || ok {
			t.Errorf("the record's credit again = %v %v, want a no-op", ok, err)
		}
		if rs := figures(t, s, into); rs.Available != 4 || rs.Ahead != 0 {
			t.Errorf("after the record's credit = %+v, want 4 available, 0 ahead", rs)
		}
	})

	t.Run("a bucket warmed after the record has the units once", func(t *testing.T) {
		s, held, _ := twoBuckets(t)
		into := reservation.BucketName(held.SKU, 1)
		if _, err := s.Credit(ctx, held); err != nil {
			t.Fatal(err)
		}
		if err := s.ForgetStock(ctx, into); err != nil {
			t.Fatal(err)
		}
		// MySQL recorded the transfer at version 5: its share has the units.
		if res, err := s.Warm(ctx, reservation.StockLevel{SKU: into, Available: 4, Version: 5}, nil, nil); err != nil || res != reservation.SyncWarmed {
			t.Fatalf("Warm = %v %v", res, err)
		}
		recorded := held
		recorded.TransferVersion = 5
		if ok, err := s.Credit(ctx, recorded); err != nil || ok {
			t.Errorf("the record's credit into a level that has it = %v %v, want a no-op", ok, err)
		}
		if rs := figures(t, s, into); rs.Available != 4 {
			t.Errorf("after the record's credit = %+v, want 4 available", rs)
		}
	})

	t.Run("credits ahead past their deadline are listed until their record's credit", func(t *testing.T) {
		s, held, c := twoBuckets(t)
		into := reservation.BucketName(held.SKU, 1)
		if _, err := s.Credit(ctx, held); err != nil {
			t.Fatal(err)
		}
		if got, err := s.CreditsAhead(ctx, into, 5*time.Second, 10); err != nil || len(got) != 0 {
			t.Errorf("CreditsAhead before the deadline = %+v %v, want none", got, err)
		}
		c.now = held.ExpiresAt.Add(6 * time.Second)
		got, err := s.CreditsAhead(ctx, into, 5*time.Second, 10)
		if err != nil || len(got) != 1 {
			t.Fatalf("CreditsAhead past the deadline = %+v %v, want the transfer", got, err)
		}
		if g := got[0]; g.ID != held.ID || !g.Transfer || g.Bucket != 0 || g.Into != 1 || g.Qty != 4 || g.Token != held.Token || !g.ExpiresAt.Equal(held.ExpiresAt) {
			t.Errorf("CreditsAhead = %+v, want the transfer %+v", g, held)
		}
		recorded := held
		recorded.TransferVersion = 5
		if _, err := s.Credit(ctx, recorded); err != nil {
			t.Fatal(err)
		}
		if got, err := s.CreditsAhead(ctx, into, 5*time.Second, 10); err != nil || len(got) != 0 {
			t.Errorf("CreditsAhead after the record's credit = %+v %v, want none", got, err)
		}
	})
}
