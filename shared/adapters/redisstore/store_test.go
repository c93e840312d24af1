package redisstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/holdfast/holdfast/internal/testkit/reservationtest"
	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/adapters/redisstore"
	"github.com/holdfast/holdfast/shared/reservation"
	"github.com/redis/go-redis/v9"
)

// The contract suite runs against miniredis (fast, always) and the real
// redis-server that make test starts.
func TestContractMiniredis(t *testing.T) {
	reservationtest.Holds(t, factory(func(t *testing.T) redis.UniversalClient {
		m := miniredis.RunT(t)
		c := redis.NewClient(&redis.Options{Addr: m.Addr()})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}))
}

func TestContractRedisServer(t *testing.T) {
	env := testservices.Require(t)
	reservationtest.Holds(t, factory(func(t *testing.T) redis.UniversalClient { return env.Redis(t) }))
}

// Follow on every combination of hold and row does what reservation.React
// says, on miniredis and on the real redis-server.
func TestReactionsMiniredis(t *testing.T) {
	reservationtest.Reactions(t, factory(func(t *testing.T) redis.UniversalClient {
		m := miniredis.RunT(t)
		c := redis.NewClient(&redis.Options{Addr: m.Addr()})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}))
}

func TestReactionsRedisServer(t *testing.T) {
	env := testservices.Require(t)
	reservationtest.Reactions(t, factory(func(t *testing.T) redis.UniversalClient { return env.Redis(t) }))
}

// t0 is now: group keys expire at an absolute time (deadline + retention).
// On a real three-shard Redis Cluster: every script's keys share one slot
// (a CROSSSLOT error would fail the suite).
func TestContractRedisCluster(t *testing.T) {
	addrs := testservices.StartCluster(t)
	reservationtest.Holds(t, factory(func(t *testing.T) redis.UniversalClient {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}))
}

// factory makes the suite's Holds: a Store on client with the suite's
// clock and rate.
func factory(client func(t *testing.T) redis.UniversalClient) reservationtest.HoldsFactory {
	return func(t *testing.T, c reservation.Clock, rate, burst int) reservationtest.HoldsUnderTest {
		opts := []redisstore.Option{redisstore.WithClock(c), redisstore.WithLedger(testservices.Name("ledger"))}
		if rate > 0 {
			opts = append(opts, redisstore.WithUserRate(rate, burst))
		}
		return redisstore.New(client(t), time.Hour, opts...)
	}
}

// Without a test clock the scripts read Redis's TIME.
func TestScriptsReadRedisTime(t *testing.T) {
	ctx := context.Background()
	const ttl = time.Minute
	m := miniredis.RunT(t)
	m.SetTime(time.Now())
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	s := redisstore.New(c, time.Hour)
	sku := testservices.Name("sku")
	if _, err := s.Warm(ctx, reservation.StockLevel{SKU: sku, Available: 5, Version: 1}, nil, nil); err != nil {
		t.Fatal(err)
	}
	now, err := s.Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h, _, err := s.Reserve(ctx, reservation.Reservation{ID: "r", SKU: sku, Qty: 1, UserID: "u", Token: "t-r"}, ttl)
	if err != nil {
		t.Fatal(err)
	}
	if d := h.ExpiresAt.Sub(now.Add(ttl)); d < -time.Second || d > 5*time.Second {
		t.Errorf("deadline %v is %v from Redis's now + ttl (%v)", h.ExpiresAt, d, now.Add(ttl))
	}
}

func TestUnreachableRedisIsUnavailable(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	defer c.Close()
	s := redisstore.New(c, time.Hour)
	_, _, err := s.Reserve(context.Background(), reservation.Reservation{ID: "r", SKU: "s", Qty: 1, UserID: "u", Token: "t-r"}, time.Minute)
	if !errors.Is(err, reservation.ErrUnavailable) {
		t.Errorf("Reserve on a dead Redis = %v, want ErrUnavailable", err)
	}
}

// FollowAll sends EVALSHA in a pipeline: after Redis lost its scripts (a
// restart, SCRIPT FLUSH) it loads follow.lua and sends the pipeline again.
func TestFollowAllLoadsAScriptRedisForgot(t *testing.T) {
	ctx := context.Background()
	c := testservices.Require(t).Redis(t)
	s := redisstore.New(c, time.Hour)
	sku := testservices.Name("sku")
	if _, err := s.Warm(ctx, reservation.StockLevel{SKU: sku, Available: 5, Version: 1}, nil, nil); err != nil {
		t.Fatal(err)
	}
	h, _, err := s.Reserve(ctx, reservation.Reservation{ID: sku + ".aaaaaaaaaaaaaaaaaaaaaaaaaa", SKU: sku, Qty: 2, UserID: "u", Token: "t-a"}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	g, _, err := s.Reserve(ctx, reservation.Reservation{ID: sku + ".bbbbbbbbbbbbbbbbbbbbbbbbbb", SKU: sku, Qty: 1, UserID: "v", Token: "t-b"}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	h.Status = reservation.StatusConfirmed                                      // confirm.lua's case
	g.Status, g.Reason = reservation.StatusCancelled, reservation.ReasonExpired // follow.lua's
	if _, errs := s.FollowAll(ctx, []reservation.Reservation{h, g}, 2); errors.Join(errs...) != nil {
		t.Fatalf("FollowAll after SCRIPT FLUSH: %v", errs)
	}
	if got, err := s.Hold(ctx, h.ID, 0); err != nil || got.Status != reservation.StatusConfirmed {
		t.Errorf("hold = %+v %v, want CONFIRMED", got, err)
	}
	if got, err := s.Hold(ctx, g.ID, 0); err != nil || got.Status != reservation.StatusCancelled {
		t.Errorf("hold = %+v %v, want CANCELLED", got, err)
	}
}
