// Package reservationtest holds the contract suites of the protocol's ports
// (reservation.Holds, …): one suite per port, run against the real adapter
// and against the in-memory fakes the protocol's unit tests use, so the two
// cannot drift apart.
package reservationtest

import (
	"context"
	"testing"

	"github.com/holdfast/holdfast/shared/reservation"
)

// HoldsUnderTest is a Holds the suite can make forget a hold or a SKU's
// stock, as Redis does after its retention or a failover.
type HoldsUnderTest interface {
	reservation.Redis
	Forget(ctx context.Context, r reservation.Reservation) error
	ForgetStock(ctx context.Context, sku string) error
}

// HoldsFactory returns a fresh Holds whose scripts read clock, with the
// per-user attempt rate and burst (0, 0: none).
type HoldsFactory func(t *testing.T, clock reservation.Clock, rate, burst int) HoldsUnderTest

// Holds holds a Holds to the contract, one part per operation (river's
// driver tests split so), each a subtest: <Test>/Reserve/<behaviour>,
// <Test>/Follow/…, <Test>/Stock/…, <Test>/Groups/…, <Test>/Live/…,
// <Test>/Transfer/…, <Test>/Room/….
func Holds(t *testing.T, newHolds HoldsFactory) {
	t.Run("Reserve", func(t *testing.T) { testReserve(t, newHolds) })
	t.Run("Follow", func(t *testing.T) { testFollow(t, newHolds) })
	t.Run("Stock", func(t *testing.T) { testStock(t, newHolds) })
	t.Run("Groups", func(t *testing.T) { testGroups(t, newHolds) })
	t.Run("Live", func(t *testing.T) { testLive(t, newHolds) })
	t.Run("Transfer", func(t *testing.T) { testTransfer(t, newHolds) })
	t.Run("Room", func(t *testing.T) { testRoom(t, newHolds) })
}
