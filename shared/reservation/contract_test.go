package reservation_test

import (
	"testing"

	"github.com/holdfast/holdfast/internal/testkit/reservationtest"
	"github.com/holdfast/holdfast/shared/reservation"
)

// The in-memory Holds behind the protocol's unit tests keeps the contract
// the Redis adapter keeps: the same suite runs on both.
func TestFakeHoldsKeepTheContract(t *testing.T) {
	reservationtest.Holds(t, func(t *testing.T, c reservation.Clock, rate, burst int) reservationtest.HoldsUnderTest {
		return reservation.NewFakeHolds(c, rate, burst)
	})
}

// The in-memory Ledger keeps the contract the MySQL adapter keeps.
func TestFakeLedgerKeepsTheContract(t *testing.T) {
	reservationtest.Ledger(t, func(t *testing.T) reservation.Ledger { return reservation.NewFakeLedger() })
}
