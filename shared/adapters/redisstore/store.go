// Package redisstore is the Redis adapter of the reservation protocol: the
// stock buyers see, holds and group slots, changed only by the Lua scripts in
// lua/ so that every change is atomic and safe to repeat. All keys of one
// bucket of a SKU share its hash tag — {sku} for bucket 0, {sku#b} for bucket
// b — so each script touches one cluster slot, and a SKU's K buckets can sit
// on K shards.
package redisstore

import (
	"context"
	"strconv"
	"time"

	"github.com/holdfast/holdfast/shared/reservation"
	"github.com/redis/go-redis/v9"
)

var _ reservation.Redis = (*Store)(nil)

// Store keeps holds in Redis (standalone or cluster).
type Store struct {
	rdb redis.UniversalClient
	// retention is how long a finished hold is kept so that a replayed
	// request finds it.
	retention time.Duration
	// clock, when set, replaces Redis's clock in the scripts: tests move
	// time with it. Production leaves it nil, so scripts read TIME.
	clock reservation.Clock
	// rate and burst are the per-user attempt limits of a SKU that sets
	// none (0: none).
	rate, burst int
	// sweep names the sweeper's keys (live SKUs, catalog cursor) of the
	// ledger this Store serves (WithLedger).
	sweep sweepKeys
}

// Option adjusts a Store.
type Option func(*Store)

// WithClock makes the scripts take the time from c instead of Redis's own
// clock. For tests that move time; production never sets it.
func WithClock(c reservation.Clock) Option { return func(s *Store) { s.clock = c } }

// WithUserRate sets the per-user reserve attempts per second and burst for
// SKUs that set none of their own.
func WithUserRate(rate, burst int) Option {
	return func(s *Store) { s.rate, s.burst = rate, burst }
}

// WithLedger names the MySQL ledger (its database) whose sweeper state
// this Store keeps, so that ledgers sharing one Redis (the tests' databases)
// keep apart the SKUs they mark live and their catalog cursors. The SKUs'
// own keys carry no ledger: one Redis serves one stage.
func WithLedger(name string) Option {
	return func(s *Store) { s.sweep = sweepKeysOf(name) }
}

// New returns a Store. retention is how long finished holds stay readable
// for replays and status polls (24h if zero).
func New(rdb redis.UniversalClient, retention time.Duration, opts ...Option) *Store {
	if retention <= 0 {
		retention = 24 * time.Hour
	}
	s := &Store{rdb: rdb, retention: retention, sweep: sweepKeysOf("")}
	for _, o := range opts {
		o(s)
	}
	return s
}

// now is the ARGV a script reads the time from: "" for Redis's clock.
func (s *Store) now() string {
	if s.clock == nil {
		return ""
	}
	return strconv.FormatInt(s.clock.Now().UnixMilli(), 10)
}

func ms(t time.Time) int64 { return t.UnixMilli() }

// retentionMS is how long a finished hold stays, as its TTL has it: whole
// seconds (EXPIRE), in ms.
func (s *Store) retentionMS() int64 { return int64(s.retention.Seconds()) * 1000 }

// Now implements reservation.GroupSlots.
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	if s.clock != nil {
		return s.clock.Now(), nil
	}
	t, err := s.rdb.Time(ctx).Result()
	if err != nil {
		return time.Time{}, reservation.Unavailable("redis time", err)
	}
	return t.UTC(), nil
}
