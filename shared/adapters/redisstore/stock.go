package redisstore

// A SKU's stock and its warm-up: Stock reads a bucket's stock and meta,
// Sync (stock.lua) makes a SKU Redis knows follow MySQL's admin changes,
// HeldIDs lists the held ids, Warm (warm.lua) loads a bucket Redis has no
// stock for from MySQL, and Heal (heal.lua) corrects a drift that has
// persisted.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/holdfast/holdfast/shared/reservation"
	"github.com/redis/go-redis/v9"
)

// Stock implements reservation.StockFigures.
func (s *Store) Stock(ctx context.Context, sku string) (reservation.RedisStock, error) {
	k := keysOf(sku)
	var stock *redis.StringCmd
	var meta *redis.SliceCmd
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		stock = p.Get(ctx, k.stock())
		meta = p.HMGet(ctx, k.meta(), "held", "added", "ver", "moving", "opens", "closes", "ahead", "room")
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return reservation.RedisStock{}, reservation.Unavailable("redis stock", err)
	}
	rs := reservation.RedisStock{SKU: sku}
	rs.Available, err = stock.Int64()
	if errors.Is(err, redis.Nil) {
		return reservation.RedisStock{}, reservation.ErrUnknownSKU
	}
	if err != nil {
		return reservation.RedisStock{}, fmt.Errorf("redis stock %s: %w", sku, err)
	}
	var opens, closes, room int64
	for i, dst := range []*int64{&rs.Held, &rs.AdminDelta, &rs.Version, &rs.Moving, &opens, &closes, &rs.Ahead, &room} {
		if v, ok := meta.Val()[i].(string); ok {
			if *dst, err = strconv.ParseInt(v, 10, 64); err != nil {
				return reservation.RedisStock{}, fmt.Errorf("redis meta %s: %w", sku, err)
			}
		}
	}
	rs.OpensAt, rs.ClosesAt, rs.AdmitPermille = fromMS(opens), fromMS(closes), int(room)
	return rs, nil
}

// Sync implements reservation.StockFigures.
func (s *Store) Sync(ctx context.Context, level reservation.StockLevel) (reservation.SyncResult, error) {
	k := keysOf(level.SKU)
	n, err := stockScript.Run(ctx, s.rdb, []string{k.stock(), k.meta()}, level.Version, level.PerUserLimit, level.AdminDelta,
		level.UserRate, level.UserBurst, level.BucketCount(), windowMS(level.OpensAt), windowMS(level.ClosesAt), level.AdmitPermille).Int()
	if err != nil {
		return reservation.SyncNone, reservation.Unavailable("redis sync stock", err)
	}
	switch n {
	case 2:
		return reservation.SyncAdjusted, nil
	case 4:
		return reservation.SyncMissing, nil
	}
	return reservation.SyncNone, nil
}

// windowMS is a window bound as meta keeps it: unix ms, 0 for none.
func windowMS(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

// fromMS is a bound meta keeps (0: none) as a time.
func fromMS(ms int64) time.Time {
	if ms <= 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms).UTC()
}

// HeldIDs implements reservation.StockFigures.
func (s *Store) HeldIDs(ctx context.Context, sku string, limit int) ([]string, error) {
	ids, err := s.rdb.ZRange(ctx, keysOf(sku).exp(), 0, int64(limit)-1).Result()
	if err != nil {
		return nil, reservation.Unavailable("redis held ids", err)
	}
	return ids, nil
}

// UnpaidIDs implements reservation.StockFigures (HSCAN of the unpaid hash
// until limit ids).
func (s *Store) UnpaidIDs(ctx context.Context, bucket string, limit int) ([]string, error) {
	var ids []string
	var cursor uint64
	for {
		kv, next, err := s.rdb.HScan(ctx, keysOf(bucket).unpaid(), cursor, "", int64(limit)).Result()
		if err != nil {
			return nil, reservation.Unavailable("redis unpaid ids", err)
		}
		for i := 0; i < len(kv) && len(ids) < limit; i += 2 {
			ids = append(ids, kv[i])
		}
		if cursor = next; cursor == 0 || len(ids) >= limit {
			return ids, nil
		}
	}
}

// EndWhole implements reservation.StockFigures: meta.whole 0, warm.lua's
// "not whole".
func (s *Store) EndWhole(ctx context.Context, bucket string) error {
	if err := s.rdb.HSet(ctx, keysOf(bucket).meta(), "whole", 0).Err(); err != nil {
		return reservation.Unavailable("redis end whole", err)
	}
	return nil
}

// Warm implements reservation.StockFigures.
func (s *Store) Warm(ctx context.Context, level reservation.StockLevel, held []string, confirmed []reservation.Reservation) (reservation.SyncResult, error) {
	k := keysOf(level.SKU)
	token := make(map[string]string, len(confirmed))
	for _, r := range confirmed {
		token[r.ID] = r.Token
	}
	ks := make([]string, 0, 3+len(held)+len(confirmed))
	ks = append(ks, k.stock(), k.meta())
	// Whole: the warm-up of the SKU's creation with one bucket: this bucket
	// will hold every reservation of it (the caller ends it unless it was
	// the SKU's first warm-up), each at least for the retention its TTL
	// gets (whole seconds).
	var wholeFor int64
	if level.Created && level.BucketCount() == 1 {
		wholeFor = s.retentionMS()
	}
	args := make([]any, 0, 13+2*len(held)+2*len(confirmed))
	args = append(args, level.Available, level.Version, level.PerUserLimit, level.AdminDelta, level.UserRate, level.UserBurst, level.BucketCount(),
		windowMS(level.OpensAt), windowMS(level.ClosesAt), level.AdmitPermille, len(held), s.now(), wholeFor)
	for _, id := range held {
		ks = append(ks, k.hold(id))
		if t, ok := token[id]; ok {
			args = append(args, "1", t)
		} else {
			args = append(args, "0", "")
		}
	}
	// The unpaid hash is rebuilt from MySQL's CONFIRMED rows of this bucket
	// still unpaid within a pay window.
	ks = append(ks, k.unpaid())
	_, bucket := reservation.ParseBucket(level.SKU)
	for _, r := range confirmed {
		if r.Status == reservation.StatusConfirmed && r.Bucket == bucket && payByMS(r) > 0 {
			ks = append(ks, k.hold(r.ID))
			args = append(args, r.ID, r.Qty)
		}
	}
	n, err := warmScript.Run(ctx, s.rdb, ks, args...).Int()
	if err != nil {
		return reservation.SyncNone, reservation.Unavailable("redis warm", err)
	}
	switch n {
	case 1:
		return reservation.SyncWarmed, nil
	case 3:
		return reservation.SyncStale, nil
	}
	return reservation.SyncNone, nil
}

// Heal implements reservation.StockFigures.
func (s *Store) Heal(ctx context.Context, seen reservation.RedisStock, drift int64, after time.Duration) (bool, error) {
	k := keysOf(seen.SKU)
	n, err := healScript.Run(ctx, s.rdb, []string{k.stock(), k.meta()},
		seen.Available, seen.Held, drift, after.Milliseconds(), s.now()).Int()
	if err != nil {
		return false, reservation.Unavailable("redis heal", err)
	}
	return n == 1, nil
}
