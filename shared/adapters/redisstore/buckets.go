package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/holdfast/holdfast/shared/reservation"
	"github.com/redis/go-redis/v9"
)

// Buckets implements reservation.StockFigures: K as bucket 0's meta has it.
func (s *Store) Buckets(ctx context.Context, sku string) (int, bool, error) {
	k := keysOf(sku)
	var exists *redis.IntCmd
	var fields *redis.SliceCmd
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		exists = p.Exists(ctx, k.stock())
		fields = p.HMGet(ctx, k.meta(), "k", "groups")
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return 0, false, reservation.Unavailable("redis buckets", err)
	}
	if exists.Val() == 0 {
		return 0, false, reservation.ErrUnknownSKU
	}
	vals := fields.Val()
	groups := len(vals) > 1 && vals[1] != nil
	count, _ := vals[0].(string)
	n, err := strconv.Atoi(count)
	if err != nil || n < 1 {
		return 1, groups, nil // a SKU warmed before buckets existed has one
	}
	return min(n, reservation.MaxBuckets), groups, nil
}

// TakeOut implements reservation.Holds.
func (s *Store) TakeOut(ctx context.Context, t reservation.Reservation, ttl time.Duration) (reservation.Reservation, error) {
	k := keysOfHold(t)
	out, err := takeoutScript.Run(ctx, s.rdb, []string{k.stock(), k.meta(), k.exp(), k.hold(t.ID)},
		t.SKU, t.ID, t.Qty, t.Into, ttl.Milliseconds(), t.Token, s.now()).StringSlice()
	if err != nil {
		return reservation.Reservation{}, reservation.Unavailable("redis take out", err)
	}
	if len(out) == 0 {
		return reservation.Reservation{}, fmt.Errorf("redis take out: empty reply")
	}
	switch out[0] {
	case "OK":
		if len(out) != 3 {
			return reservation.Reservation{}, fmt.Errorf("redis take out: unexpected reply %v", out)
		}
		deadline, _ := strconv.ParseInt(out[1], 10, 64)
		created, _ := strconv.ParseInt(out[2], 10, 64)
		t.ExpiresAt, t.CreatedAt, t.Status = time.UnixMilli(deadline).UTC(), time.UnixMilli(created).UTC(), reservation.StatusHeld
		return t, nil
	case "REPLAY":
		return holdFromPairs(t.ID, t.Bucket, out[1:])
	case "UNKNOWN_SKU":
		return reservation.Reservation{}, reservation.ErrUnknownSKU
	case "SOLD_OUT":
		return reservation.Reservation{}, reservation.ErrSoldOut
	}
	return reservation.Reservation{}, fmt.Errorf("redis take out: unknown code %q", out[0])
}

// Credit implements reservation.Holds.
func (s *Store) Credit(ctx context.Context, t reservation.Reservation) (bool, error) {
	k := keysOf(reservation.BucketName(t.SKU, t.Into))
	n, err := creditScript.Run(ctx, s.rdb, []string{k.stock(), k.meta(), k.hold(t.ID)},
		t.Qty, t.TransferVersion, int64(s.retention.Seconds()), t.SKU, t.Bucket).Int()
	if err != nil {
		return false, reservation.Unavailable("redis credit", err)
	}
	if n == 2 {
		return false, fmt.Errorf("redis credit %s: %w", t.ID, reservation.ErrUnknownSKU)
	}
	return n == 1, nil
}
