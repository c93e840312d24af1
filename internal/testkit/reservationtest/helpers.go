package reservationtest

import (
	"context"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/reservation"
)

// The helpers the Holds and Reactions suites share.

var t0 = time.Now().UTC().Truncate(time.Millisecond)

// clock is a test clock the scripts read instead of Redis's TIME.
type clock struct{ now time.Time }

func (c *clock) Now() time.Time { return c.now }

const ttl = time.Minute

func hold(sku, id, user string, qty int) reservation.Reservation {
	return reservation.Reservation{ID: id, SKU: sku, Qty: qty, UserID: user, Token: "t-" + id}
}

// row is MySQL's decided row for a hold, as Fence (or, refunded, Refund)
// writes it: a CANCELLED row's release is owed.
func row(h reservation.Reservation, status reservation.Status, refunded bool) reservation.Reservation {
	h.Status = status
	if status == reservation.StatusCancelled {
		h.Reason, h.Cancellation, h.Release = reservation.ReasonBuyer, reservation.Fenced, reservation.ReleaseOwed
		if refunded {
			h.Cancellation = reservation.Refunded
		}
	}
	return h
}

// setup returns a fresh Holds (no attempt rate) on the clock at t0, with a
// new SKU warmed from version 1 with stock and the per-user limit.
func setup(t *testing.T, newHolds HoldsFactory, stock int64, limit int) (HoldsUnderTest, string, *clock) {
	ctx := context.Background()
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

// stockOf is the SKU's available and held units in Redis.
func stockOf(t *testing.T, s HoldsUnderTest, sku string) (int64, int64) {
	t.Helper()
	rs, err := s.Stock(context.Background(), sku)
	if err != nil {
		t.Fatalf("Stock(%s): %v", sku, err)
	}
	return rs.Available, rs.Held
}

// reserve takes a new hold for r; an error or a replay fails the test.
func reserve(t *testing.T, s HoldsUnderTest, r reservation.Reservation) reservation.Reservation {
	t.Helper()
	h, out, err := s.Reserve(context.Background(), r, ttl)
	if err != nil || out.Replayed {
		t.Fatalf("Reserve(%s) = %v %+v", r.ID, err, out)
	}
	return h
}

// follow is Follow(r, version 0); an error fails the test.
func follow(t *testing.T, s HoldsUnderTest, r reservation.Reservation) bool {
	t.Helper()
	got, err := s.Follow(context.Background(), r, 0)
	if err != nil {
		t.Fatalf("Follow(%s %s): %v", r.ID, r.Status, err)
	}
	return got
}
