package redisstore

import (
	"context"
	"errors"

	"github.com/holdfast/holdfast/shared/reservation"
	"github.com/redis/go-redis/v9"
)

// Forget deletes a hold, as retention or a failover would.
func (s *Store) Forget(ctx context.Context, r reservation.Reservation) error {
	return s.rdb.Del(ctx, keysOfHold(r).hold(r.ID)).Err()
}

// ForgetStock deletes a SKU's stock figure, as a failover might.
func (s *Store) ForgetStock(ctx context.Context, sku string) error {
	return s.rdb.Del(ctx, keysOf(sku).stock()).Err()
}

// UserUnits reads a buyer's per-user units in a bucket (the Reactions suite).
func (s *Store) UserUnits(ctx context.Context, sku, user string) (int64, error) {
	n, err := s.rdb.HGet(ctx, keysOf(sku).users(), user).Int64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	return n, err
}

// AttemptsKey names a buyer's attempt budget in a bucket of a SKU.
func AttemptsKey(sku string, bucket int, user string) string {
	return keysOf(reservation.BucketName(sku, bucket)).attempts(user)
}
