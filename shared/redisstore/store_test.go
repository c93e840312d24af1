package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/holdfast/holdfast/shared/redisstore"
	"github.com/holdfast/holdfast/shared/reservation"
	"github.com/holdfast/holdfast/shared/testservices"
	"github.com/redis/go-redis/v9"
)

// The contract suite runs against miniredis (fast, always) and the real
// redis-server that make test starts.
func TestContractMiniredis(t *testing.T) {
	contract(t, func(t *testing.T) redis.UniversalClient {
		m := miniredis.RunT(t)
		c := redis.NewClient(&redis.Options{Addr: m.Addr()})
		t.Cleanup(func() { _ = c.Close() })
		return c
	})
}

func TestContractRedisServer(t *testing.T) {
	env := testservices.Require(t)
	contract(t, func(t *testing.T) redis.UniversalClient { return env.Redis(t) })
}

// t0 is now: group keys expire at an absolute time (deadline + retention).
// On a real three-shard Redis Cluster: every script's keys share one slot
// (a CROSSSLOT error would fail the suite).
func TestContractRedisCluster(t *testing.T) {
	addrs := testservices.StartCluster(t)
	contract(t, func(t *testing.T) redis.UniversalClient {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
		t.Cleanup(func() { _ = c.Close() })
		return c
	})
}

var t0 = time.Now().UTC().Truncate(time.Millisecond)

func hold(sku, id, user string, qty int) reservation.Reservation {
	return reservation.Reservation{ID: id, SKU: sku, Qty: qty, UserID: user, ExpiresAt: t0.Add(time.Minute), CreatedAt: t0}
}

func contract(t *testing.T, client func(t *testing.T) redis.UniversalClient) {
	ctx := context.Background()
	setup := func(t *testing.T, stock int64, limit int) (*redisstore.Store, string) {
		s := redisstore.New(client(t), time.Hour)
		sku := testservices.Name("sku")
		if _, err := s.Warm(ctx, reservation.StockLevel{SKU: sku, Available: stock, Version: 1, PerUserLimit: limit}); err != nil {
			t.Fatalf("Warm: %v", err)
		}
		return s, sku
	}
	stockOf := func(t *testing.T, s *redisstore.Store, sku string) (int64, int64) {
		t.Helper()
		a, h, err := s.Stock(ctx, sku)
		if err != nil {
			t.Fatalf("Stock(%s): %v", sku, err)
		}
		return a, h
	}

	t.Run("reserve deducts and replays without taking twice", func(t *testing.T) {
		s, sku := setup(t, 5, 0)
		r := hold(sku, reservation.ReservationID(reservation.ReserveRequest{SKU: sku, UserID: "u", IdempotencyKey: "k"}), "u", 2)
		if _, replayed, err := s.Reserve(ctx, r, t0); err != nil || replayed {
			t.Fatalf("Reserve = %v replayed %v", err, replayed)
		}
		got, replayed, err := s.Reserve(ctx, r, t0)
		if err != nil || !replayed || got.Status != reservation.StatusHeld || got.Qty != 2 || !got.ExpiresAt.Equal(r.ExpiresAt) {
			t.Fatalf("replay = %+v %v %v", got, replayed, err)
		}
		if a, h := stockOf(t, s, sku); a != 3 || h != 2 {
			t.Errorf("stock = %d/%d, want 3 available 2 held", a, h)
		}
		other := r
		other.Qty = 1
		if _, _, err := s.Reserve(ctx, other, t0); !errors.Is(err, reservation.ErrIdempotencyMismatch) {
			t.Errorf("same id, other qty = %v, want ErrIdempotencyMismatch", err)
		}
		if h, err := s.Hold(ctx, r.ID); err != nil || h.SKU != sku || h.UserID != "u" {
			t.Errorf("Hold(%s) = %+v %v", r.ID, h, err)
		}
		if _, err := s.Hold(ctx, "no-sku-in-this-id"); !errors.Is(err, reservation.ErrNotFound) {
			t.Errorf("Hold(bad id) = %v, want ErrNotFound", err)
		}
	})

	t.Run("refusals take nothing", func(t *testing.T) {
		s, sku := setup(t, 3, 2)
		if _, _, err := s.Reserve(ctx, hold(sku, "a", "u", 4), t0); !errors.Is(err, reservation.ErrSoldOut) {
			t.Errorf("over stock = %v, want ErrSoldOut", err)
		}
		if _, _, err := s.Reserve(ctx, hold(sku, "b", "u", 2), t0); err != nil {
			t.Fatal(err)
		}
		if _, _, err := s.Reserve(ctx, hold(sku, "c", "u", 1), t0); !errors.Is(err, reservation.ErrLimitExceeded) {
			t.Errorf("over per-user limit = %v, want ErrLimitExceeded", err)
		}
		if _, _, err := s.Reserve(ctx, hold("nosuch"+sku, "d", "u", 1), t0); !errors.Is(err, reservation.ErrUnknownSKU) {
			t.Errorf("unknown sku = %v, want ErrUnknownSKU", err)
		}
		if a, h := stockOf(t, s, sku); a != 1 || h != 2 {
			t.Errorf("stock = %d/%d, want 1/2", a, h)
		}
	})

	t.Run("release returns a held hold once and leaves a tombstone", func(t *testing.T) {
		s, sku := setup(t, 5, 1)
		r := hold(sku, "r1", "u", 1)
		if _, _, err := s.Reserve(ctx, r, t0); err != nil {
			t.Fatal(err)
		}
		r.Reason = reservation.ReasonExpired
		for i, want := range []bool{true, false, false} {
			if got, err := s.Release(ctx, r, false); err != nil || got != want {
				t.Fatalf("Release #%d = %v %v, want %v", i, got, err, want)
			}
		}
		if a, h := stockOf(t, s, sku); a != 5 || h != 0 {
			t.Errorf("stock = %d/%d, want 5/0", a, h)
		}
		got, replayed, err := s.Reserve(ctx, hold(sku, "r1", "u", 1), t0)
		if err != nil || !replayed || got.Status != reservation.StatusCancelled || got.Reason != reservation.ReasonExpired {
			t.Errorf("reserve after release = %+v %v %v, want the CANCELLED hold", got, replayed, err)
		}
		// The per-user units came back too.
		if _, _, err := s.Reserve(ctx, hold(sku, "r2", "u", 1), t0); err != nil {
			t.Errorf("reserve after release by the same user = %v", err)
		}
		// A release of a hold Redis never saw leaves a tombstone: a late reserve takes nothing.
		ghost := hold(sku, "ghost", "v", 2)
		if got, err := s.Release(ctx, ghost, false); err != nil || got {
			t.Errorf("Release(missing) = %v %v, want false", got, err)
		}
		if got, replayed, _ := s.Reserve(ctx, ghost, t0); !replayed || got.Status != reservation.StatusCancelled {
			t.Errorf("reserve of a tombstone = %v %v, want replayed CANCELLED", got.Status, replayed)
		}
	})

	t.Run("confirm keeps stock deducted; only refund returns it", func(t *testing.T) {
		s, sku := setup(t, 5, 0)
		r := hold(sku, "r1", "u", 2)
		if _, _, err := s.Reserve(ctx, r, t0); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if err := s.Confirm(ctx, r); err != nil {
				t.Fatal(err)
			}
		}
		if a, h := stockOf(t, s, sku); a != 3 || h != 0 {
			t.Errorf("after confirm = %d/%d, want 3/0", a, h)
		}
		if got, _ := s.Release(ctx, r, false); got {
			t.Errorf("plain release of a CONFIRMED hold returned stock")
		}
		for i, want := range []bool{true, false} {
			if got, err := s.Release(ctx, r, true); err != nil || got != want {
				t.Fatalf("refund #%d = %v %v, want %v", i, got, err, want)
			}
		}
		if a, h := stockOf(t, s, sku); a != 5 || h != 0 {
			t.Errorf("after refund = %d/%d, want 5/0", a, h)
		}
	})

	t.Run("expired lists held holds past the deadline only", func(t *testing.T) {
		s, sku := setup(t, 10, 0)
		early, late, done := hold(sku, "e", "u", 1), hold(sku, "l", "u", 1), hold(sku, "d", "u", 1)
		late.ExpiresAt = t0.Add(time.Hour)
		for _, r := range []reservation.Reservation{early, late, done} {
			if _, _, err := s.Reserve(ctx, r, t0); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Confirm(ctx, done); err != nil {
			t.Fatal(err)
		}
		got, err := s.Expired(ctx, sku, t0.Add(2*time.Minute), 10)
		if err != nil || len(got) != 1 || got[0].ID != "e" {
			t.Errorf("Expired = %+v %v, want only e", got, err)
		}
	})

	t.Run("adjust applies once per version and keeps holds", func(t *testing.T) {
		s, sku := setup(t, 10, 0)
		if _, _, err := s.Reserve(ctx, hold(sku, "r", "u", 4), t0); err != nil {
			t.Fatal(err)
		}
		level := reservation.StockLevel{SKU: sku, Available: 15, Version: 2}
		for range 2 {
			if err := s.AdjustStock(ctx, level, 5); err != nil {
				t.Fatal(err)
			}
		}
		if a, h := stockOf(t, s, sku); a != 11 || h != 4 {
			t.Errorf("after adjust = %d/%d, want 11/4", a, h)
		}
		if warmed, err := s.Warm(ctx, level); err != nil || warmed {
			t.Errorf("Warm of a loaded sku = %v %v, want false", warmed, err)
		}
	})

	t.Run("groups: slots, one join per user, close", func(t *testing.T) {
		s, sku := setup(t, 10, 0)
		g := reservation.Group{ID: "g1", SKU: sku, Capacity: 2, Remaining: 2, Status: reservation.GroupOpen, Deadline: t0.Add(time.Hour)}
		if err := s.CreateGroup(ctx, g); err != nil {
			t.Fatal(err)
		}
		join := func(id, user string) error {
			r := hold(sku, id, user, 1)
			r.GroupID = "g1"
			_, _, err := s.Reserve(ctx, r, t0)
			return err
		}
		if err := join("a", "u1"); err != nil {
			t.Fatal(err)
		}
		if err := join("b", "u1"); !errors.Is(err, reservation.ErrAlreadyJoined) {
			t.Errorf("same user twice = %v, want ErrAlreadyJoined", err)
		}
		if err := join("c", "u2"); err != nil {
			t.Fatal(err)
		}
		if err := join("d", "u3"); !errors.Is(err, reservation.ErrGroupFull) {
			t.Errorf("third join = %v, want ErrGroupFull", err)
		}
		if gr, err := s.Group(ctx, sku, "g1"); err != nil || gr.Remaining != 0 || gr.Status != reservation.GroupFormed {
			t.Errorf("Group = %+v %v, want FORMED with 0 remaining", gr, err)
		}
		// Releasing a member reopens the slot.
		r := hold(sku, "a", "u1", 1)
		r.GroupID = "g1"
		if _, err := s.Release(ctx, r, false); err != nil {
			t.Fatal(err)
		}
		if gr, _ := s.Group(ctx, sku, "g1"); gr.Remaining != 1 || gr.Status != reservation.GroupOpen {
			t.Errorf("after release = %+v, want OPEN with 1 remaining", gr)
		}
		ids, err := s.CloseGroup(ctx, g)
		if err != nil || len(ids) != 1 || ids[0] != "c" {
			t.Errorf("CloseGroup = %v %v, want [c]", ids, err)
		}
		if err := join("e", "u4"); !errors.Is(err, reservation.ErrGroupClosed) {
			t.Errorf("join closed group = %v, want ErrGroupClosed", err)
		}
		if err := join("f", "u5"); err == nil {
			t.Errorf("join of a closed group succeeded")
		}
		other := hold(sku, "x", "u9", 1)
		other.GroupID = "nosuch"
		if _, _, err := s.Reserve(ctx, other, t0); !errors.Is(err, reservation.ErrUnknownGroup) {
			t.Errorf("unknown group = %v, want ErrUnknownGroup", err)
		}
		late := hold(sku, "y", "u8", 1)
		late.GroupID = "g1"
		if _, _, err := s.Reserve(ctx, late, t0.Add(2*time.Hour)); !errors.Is(err, reservation.ErrGroupClosed) {
			t.Errorf("join past the deadline = %v, want ErrGroupClosed", err)
		}
	})

	t.Run("heal moves stock only for a persistent drift Redis did not move under", func(t *testing.T) {
		s, sku := setup(t, 10, 0)
		heal := func(avail, held, drift int64, at time.Time) bool {
			t.Helper()
			ok, err := s.Heal(ctx, sku, avail, held, drift, at, time.Minute)
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

	t.Run("concurrent reserves never oversell", func(t *testing.T) {
		s, sku := setup(t, 50, 0)
		var ok, sold atomic.Int64
		var wg sync.WaitGroup
		for i := range 200 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _, err := s.Reserve(ctx, hold(sku, fmt.Sprintf("r%d", i), fmt.Sprintf("u%d", i), 1), t0)
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

func TestUnreachableRedisIsUnavailable(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	defer c.Close()
	s := redisstore.New(c, time.Hour)
	_, _, err := s.Reserve(context.Background(), hold("s", "r", "u", 1), t0)
	if !errors.Is(err, reservation.ErrUnavailable) {
		t.Errorf("Reserve on a dead Redis = %v, want ErrUnavailable", err)
	}
}
