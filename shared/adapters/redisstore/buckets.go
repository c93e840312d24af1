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
	n, err := creditScript.Run(ctx, s.rdb, []string{k.stock(), k.meta(), k.hold(t.ID), k.ahead()},
		t.Qty, t.TransferVersion, int64(s.retention.Seconds()), t.SKU, t.Bucket, t.ExpiresAt.UnixMilli(), s.now(), t.Token, t.ID).Int()
	if err != nil {
		return false, reservation.Unavailable("redis credit", err)
	}
	if n == 2 {
		return false, fmt.Errorf("redis credit %s: %w", t.ID, reservation.ErrUnknownSKU)
	}
	return n == 1, nil // 3: too late for a credit ahead of the record, which credits it
}

// Landed implements reservation.Holds.
func (s *Store) Landed(ctx context.Context, t reservation.Reservation) error {
	k := keysOfHold(t)
	if err := landedScript.Run(ctx, s.rdb, []string{k.meta(), k.hold(t.ID)}, t.Token).Err(); err != nil {
		return reservation.Unavailable("redis landed", err)
	}
	return nil
}

// CreditsAhead implements reservation.Holds.
func (s *Store) CreditsAhead(ctx context.Context, bucket string, grace time.Duration, limit int) ([]reservation.Reservation, error) {
	k := keysOf(bucket)
	sku, into := reservation.ParseBucket(bucket)
	ids, err := expiredScript.Run(ctx, s.rdb, []string{k.ahead()}, grace.Milliseconds(), limit, s.now()).StringSlice()
	if err != nil {
		return nil, reservation.Unavailable("redis credits ahead", err)
	}
	cmds := make([]*redis.SliceCmd, len(ids))
	if len(ids) > 0 {
		_, err = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, id := range ids {
				cmds[i] = p.HMGet(ctx, k.hold(id), "state", "qty", "from", "token", "deadline")
			}
			return nil
		})
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, reservation.Unavailable("redis credits ahead", err)
		}
	}
	var out []reservation.Reservation
	for i, id := range ids {
		f := cmds[i].Val()
		state, _ := f[0].(string)
		if state != "AHEAD" {
			// The mark is gone (data loss, or its retention) or was credited
			// by its record: drop the index entry so the sweep does not spin.
			s.rdb.ZRem(ctx, k.ahead(), id)
			continue
		}
		qty, _ := strconv.Atoi(str(f[1]))
		from, _ := strconv.Atoi(str(f[2]))
		deadline, _ := strconv.ParseInt(str(f[4]), 10, 64)
		out = append(out, reservation.Reservation{
			ID: id, SKU: sku, Qty: qty, Bucket: from, Transfer: true, Into: into, Token: str(f[3]),
			Status: reservation.StatusHeld, ExpiresAt: time.UnixMilli(deadline).UTC(),
		})
	}
	return out, nil
}

func str(v any) string {
	s, _ := v.(string)
	return s
}
