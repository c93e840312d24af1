package redisstore

import (
	"context"
	"errors"
	"time"

	"github.com/holdfast/holdfast/shared/reservation"
	"github.com/redis/go-redis/v9"
)

// Touch implements reservation.LiveMarks.
func (s *Store) Touch(ctx context.Context, sku string, ttl time.Duration) (reservation.LiveSKU, error) {
	end, err := touchScript.Run(ctx, s.rdb, []string{s.sweep.live()}, sku, ttl.Milliseconds(), s.now()).Int64()
	if err != nil {
		return reservation.LiveSKU{}, reservation.Unavailable("redis mark live", err)
	}
	return reservation.LiveSKU{SKU: sku, Until: time.UnixMilli(end).UTC()}, nil
}

// Live implements reservation.LiveMarks.
func (s *Store) Live(ctx context.Context, limit int) ([]reservation.LiveSKU, error) {
	zs, err := s.rdb.ZRangeWithScores(ctx, s.sweep.live(), 0, int64(limit)-1).Result()
	if err != nil {
		return nil, reservation.Unavailable("redis live skus", err)
	}
	out := make([]reservation.LiveSKU, 0, len(zs))
	for _, z := range zs {
		sku, _ := z.Member.(string)
		out = append(out, reservation.LiveSKU{SKU: sku, Until: time.UnixMilli(int64(z.Score)).UTC()})
	}
	return out, nil
}

// Unmark implements reservation.LiveMarks.
func (s *Store) Unmark(ctx context.Context, m reservation.LiveSKU) (bool, error) {
	return s.unmark(ctx, m, "0")
}

// Withdraw implements reservation.LiveMarks.
func (s *Store) Withdraw(ctx context.Context, m reservation.LiveSKU) (bool, error) {
	return s.unmark(ctx, m, "1")
}

func (s *Store) unmark(ctx context.Context, m reservation.LiveSKU, withdraw string) (bool, error) {
	n, err := unmarkScript.Run(ctx, s.rdb, []string{s.sweep.live()}, m.SKU, m.Until.UnixMilli(), s.now(), withdraw).Int()
	if err != nil {
		return false, reservation.Unavailable("redis unmark", err)
	}
	return n == 1, nil
}

// Cursor implements reservation.LiveMarks.
func (s *Store) Cursor(ctx context.Context) (string, error) {
	sku, err := s.rdb.Get(ctx, s.sweep.cursor()).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", reservation.Unavailable("redis sweep cursor", err)
	}
	return sku, nil
}

// SetCursor implements reservation.LiveMarks.
func (s *Store) SetCursor(ctx context.Context, sku string) error {
	if err := s.rdb.Set(ctx, s.sweep.cursor(), sku, 0).Err(); err != nil {
		return reservation.Unavailable("redis move sweep cursor", err)
	}
	return nil
}
