package redisstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/adapters/redisstore"
	"github.com/holdfast/holdfast/shared/reservation"
	"github.com/redis/go-redis/v9"
)

// A bucket loaded by the warm-up of its SKU's creation, with one bucket,
// holds every reservation of the SKU from then on, each until its
// retention: reserve says so (whole) with a new hold and with the refusals
// a keyed buy would otherwise ask MySQL about. It stops saying so once the
// retention may have taken a finished hold (from the bucket's first
// decision, confirm.lua's or follow.lua's; the lesser of the warm-up's and
// the caller's retention), after a change of K, and it never says so of a
// bucket any other warm-up loaded, or of K > 1 (the service ends it too when
// the creation's warm-up was not the SKU's first: checkFirst).
func TestReserveSaysWhenTheBucketHoldsEveryReservation(t *testing.T) {
	t.Run("miniredis", func(t *testing.T) {
		testWhole(t, func(t *testing.T) redis.UniversalClient {
			m := miniredis.RunT(t)
			c := redis.NewClient(&redis.Options{Addr: m.Addr()})
			t.Cleanup(func() { _ = c.Close() })
			return c
		})
	})
	t.Run("redis-server", func(t *testing.T) {
		env := testservices.Require(t)
		testWhole(t, func(t *testing.T) redis.UniversalClient { return env.Redis(t) })
	})
}

func testWhole(t *testing.T, client func(*testing.T) redis.UniversalClient) {
	ctx := context.Background()
	const retention = time.Hour
	rdb := client(t)
	clock := &testClock{now: time.Now().UTC().Truncate(time.Millisecond)}
	s := redisstore.New(rdb, retention, redisstore.WithClock(clock))
	hold := func(sku, user string) (reservation.Reservation, reservation.ReserveOutcome, error) {
		t.Helper()
		r := reservation.Reservation{ID: reservation.ReservationID(reservation.ReserveRequest{SKU: sku}, nil), SKU: sku, Qty: 1,
			UserID: user, Token: "t" + user, Status: reservation.StatusHeld}
		return s.Reserve(ctx, r, time.Minute)
	}
	buy := func(sku, user string) (reservation.ReserveOutcome, error) {
		t.Helper()
		_, out, err := hold(sku, user)
		return out, err
	}
	warm := func(level reservation.StockLevel) {
		t.Helper()
		if res, err := s.Warm(ctx, level, nil, nil); err != nil || res != reservation.SyncWarmed {
			t.Fatalf("warm %s = %v, %v", level.SKU, res, err)
		}
	}
	decide := func(h reservation.Reservation, status reservation.Status) {
		t.Helper()
		h.Status = status
		if status == reservation.StatusCancelled {
			h.Reason = reservation.ReasonBuyer
		}
		if _, errs := s.FollowAll(ctx, []reservation.Reservation{h}, 2); errs[0] != nil {
			t.Fatalf("follow %s %s: %v", h.ID, status, errs[0])
		}
	}

	sku := testservices.Name("whole")
	warm(reservation.StockLevel{SKU: sku, Available: 1, Version: 1, Created: true})
	ann, out, err := hold(sku, "ann")
	if err != nil || !out.Whole {
		t.Fatalf("a new hold in a bucket its creation's warm-up loaded = %+v, %v; want whole", out, err)
	}
	clock.now = clock.now.Add(48 * time.Hour) // no hold finished yet: none can be gone
	if out, err := buy(sku, "bob"); !errors.Is(err, reservation.ErrSoldOut) || !out.Whole {
		t.Fatalf("sold out in that bucket two days on, nothing decided = %+v, %v; want whole", out, err)
	}
	decide(ann, reservation.StatusConfirmed) // confirm.lua: the retention counts from here
	clock.now = clock.now.Add(retention - time.Millisecond)
	if out, err := buy(sku, "cat"); !errors.Is(err, reservation.ErrSoldOut) || !out.Whole {
		t.Fatalf("sold out just within the retention of the first decision = %+v, %v; want whole", out, err)
	}
	clock.now = clock.now.Add(time.Millisecond)
	if out, err := buy(sku, "dan"); !errors.Is(err, reservation.ErrSoldOut) || out.Whole {
		t.Fatalf("sold out once the retention of the first decision passed = %+v, %v; want not whole", out, err)
	}

	// A cancellation (follow.lua) starts it too; the caller's retention, if
	// shorter than the warm-up's, bounds it.
	short := testservices.Name("whole")
	warm(reservation.StockLevel{SKU: short, Available: 5, Version: 1, Created: true})
	eve, _, err := hold(short, "eve")
	if err != nil {
		t.Fatal(err)
	}
	decide(eve, reservation.StatusCancelled)
	s2 := redisstore.New(rdb, time.Minute, redisstore.WithClock(clock))
	clock.now = clock.now.Add(time.Minute)
	r := reservation.Reservation{ID: short + ".x", SKU: short, Qty: 1, UserID: "eve", Token: "te2", Status: reservation.StatusHeld}
	if _, out, err := s2.Reserve(ctx, r, time.Minute); err != nil || out.Whole {
		t.Fatalf("a hold a minute after a cancellation, by a caller keeping holds a minute = %+v, %v; want not whole", out, err)
	}
	if out, err := buy(short, "fay"); err != nil || !out.Whole {
		t.Fatalf("the same by a caller keeping them an hour = %+v, %v; want whole", out, err)
	}

	// A change of K ends it; a level of the same K keeps it.
	k := testservices.Name("whole")
	warm(reservation.StockLevel{SKU: k, Available: 5, Version: 1, Created: true})
	if _, err := s.Sync(ctx, reservation.StockLevel{SKU: k, Available: 5, Version: 2, PerUserLimit: 3}); err != nil {
		t.Fatal(err)
	}
	if out, err := buy(k, "gus"); err != nil || !out.Whole {
		t.Fatalf("after a level of the same K = %+v, %v; want whole", out, err)
	}
	if _, err := s.Sync(ctx, reservation.StockLevel{SKU: k, Available: 5, Version: 3, Buckets: 3, BucketAvailable: []int64{1, 1}}); err != nil {
		t.Fatal(err)
	}
	if out, err := buy(k, "hal"); err != nil || out.Whole {
		t.Fatalf("after K went to 3 = %+v, %v; want not whole", out, err)
	}
	if _, err := s.Sync(ctx, reservation.StockLevel{SKU: k, Available: 5, Version: 4}); err != nil {
		t.Fatal(err)
	}
	if out, err := buy(k, "ivy"); err != nil || out.Whole {
		t.Fatalf("after K came back to 1 = %+v, %v; want not whole (holds may be in the other buckets)", out, err)
	}

	// Never of a bucket another warm-up loaded, nor with K > 1.
	had := testservices.Name("whole")
	warm(reservation.StockLevel{SKU: had, Available: 5, Version: 7})
	if out, err := buy(had, "jo"); err != nil || out.Whole {
		t.Fatalf("a bucket another warm-up loaded (Redis lost it, say) = %+v, %v; want not whole", out, err)
	}
	split := testservices.Name("whole")
	warm(reservation.StockLevel{SKU: split, Available: 5, Version: 1, Buckets: 3, BucketAvailable: []int64{1, 1}, Created: true})
	if out, err := buy(split, "kim"); err != nil || out.Whole {
		t.Fatalf("bucket 0 of K = 3 = %+v, %v; want not whole", out, err)
	}
}
