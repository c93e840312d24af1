package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/adapters/redisstore"
	"github.com/holdfast/holdfast/shared/reservation"
	"github.com/redis/go-redis/v9"
)

// testClock is a clock the scripts read instead of Redis's TIME.
type testClock struct{ now time.Time }

func (c *testClock) Now() time.Time { return c.now }

// TestAttemptBudget: the budget is one string, "tokens:at:last", under its
// own name (a string where the old scripts' HMGET looked would be
// WRONGTYPE while both codes run), with a TTL; a refusal keeps the refilled
// tokens and the last charge's token, and charge.lua's repeat is free.
func TestAttemptBudget(t *testing.T) {
	clients := map[string]func(t *testing.T) redis.UniversalClient{
		"miniredis": func(t *testing.T) redis.UniversalClient {
			c := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
			t.Cleanup(func() { _ = c.Close() })
			return c
		},
		"redis-server": func(t *testing.T) redis.UniversalClient { return testservices.Require(t).Redis(t) },
	}
	for name, client := range clients {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			c := client(t)
			t0 := time.UnixMilli(1_800_000_000_000).UTC()
			clk := &testClock{now: t0}
			s := redisstore.New(c, time.Hour, redisstore.WithClock(clk), redisstore.WithUserRate(2, 3))
			sku := testservices.Name("sku")
			if _, err := s.Warm(ctx, reservation.StockLevel{SKU: sku, Available: 10, Version: 1}, nil, nil); err != nil {
				t.Fatal(err)
			}
			key := redisstore.AttemptsKey(sku, 0, "bot")
			if !strings.HasSuffix(key, ":ab:bot") {
				t.Fatalf("the budget's key is %q, want the suffix :ab:<user>", key)
			}
			want := func(step, v string) {
				t.Helper()
				if got, err := c.Get(ctx, key).Result(); err != nil || got != v {
					t.Errorf("%s: budget = %q %v, want %q", step, got, err, v)
				}
				if ttl := c.PTTL(ctx, key).Val(); ttl <= 0 || ttl > 2500*time.Millisecond {
					t.Errorf("%s: budget's TTL = %v, want (0, 2.5s] (burst ÷ rate + 1 s)", step, ttl)
				}
			}
			at := fmt.Sprint(t0.UnixMilli())
			buy := func(id string) error {
				_, _, err := s.Reserve(ctx, reservation.Reservation{ID: id, SKU: sku, Qty: 1, UserID: "bot", Token: "t-" + id}, time.Minute)
				return err
			}
			if err := buy("a"); err != nil {
				t.Fatal(err)
			}
			want("a buy", "2:"+at+":")
			if err := s.Charge(ctx, reservation.Attempt{SKU: sku, UserID: "bot", Token: "x"}); err != nil {
				t.Fatal(err)
			}
			want("a charge", "1:"+at+":x")
			if err := buy("b"); err != nil {
				t.Fatal(err)
			}
			want("a buy after the charge", "0:"+at+":x")
			if err := s.Charge(ctx, reservation.Attempt{SKU: sku, UserID: "bot", Token: "x"}); err != nil {
				t.Errorf("the charge repeated = %v, want free", err)
			}
			clk.now = t0.Add(250 * time.Millisecond)
			if err := buy("c"); !errors.Is(err, reservation.ErrRateLimited) {
				t.Fatalf("a buy with half a token = %v, want rate limited", err)
			}
			want("a refusal", "0.5:"+fmt.Sprint(t0.UnixMilli()+250)+":x")
			clk.now = t0.Add(500 * time.Millisecond)
			if err := buy("d"); err != nil {
				t.Fatalf("a buy once a token is back = %v", err)
			}
			want("a buy after the refill", "0:"+fmt.Sprint(t0.UnixMilli()+500)+":x")
			if n := c.Exists(ctx, strings.TrimSuffix(key, ":ab:bot")+":rl:bot").Val(); n != 0 {
				t.Errorf("the old budget hash was written")
			}
		})
	}
}
