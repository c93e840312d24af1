package reservation

import "context"

// NewFakeHolds exposes the in-memory Holds the unit tests use to the
// contract suite (contract_test.go, internal/testkit/reservationtest), so
// the fake is held to what the Redis adapter does.
// rate and burst are the per-user attempt defaults (0: none).
func NewFakeHolds(c Clock, rate, burst int) *memHolds {
	m := newMemHolds(c)
	m.rate, m.burst = rate, burst
	return m
}

// Forget drops a hold, as Redis does after its retention or a failover.
func (m *memHolds) Forget(_ context.Context, r Reservation) error { m.forget(r.ID); return nil }

// ForgetStock drops a SKU's stock figure only.
func (m *memHolds) ForgetStock(_ context.Context, sku string) error { m.forgetStock(sku); return nil }

// NewFakeLedger exposes the in-memory Ledger the unit tests use to the
// contract suite.
func NewFakeLedger() *memLedger { return newMemLedger() }
