package redisstore

import (
	"context"

	"github.com/holdfast/holdfast/shared/reservation"
)

// Forget deletes a hold, as retention or a failover would.
func (s *Store) Forget(ctx context.Context, r reservation.Reservation) error {
	return s.rdb.Del(ctx, keysOfHold(r).hold(r.ID)).Err()
}

// ForgetStock deletes a SKU's stock figure, as a failover might.
func (s *Store) ForgetStock(ctx context.Context, sku string) error {
	return s.rdb.Del(ctx, keysOf(sku).stock()).Err()
}
