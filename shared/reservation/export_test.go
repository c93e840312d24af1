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

// NewFakeQueue and NewFakeNotifier expose the in-memory Enqueuer and
// Notifier to their contract suites.
func NewFakeQueue() *memQueue { return &memQueue{} }

// Sent returns what the fake queue was given, in order.
func (q *memQueue) Sent() []Reservation {
	q.mu.Lock()
	defer q.mu.Unlock()
	return append([]Reservation(nil), q.sent...)
}

func NewFakeNotifier() *memNotifier { return &memNotifier{} }

// Events returns the events the fake notifier was given, in order.
func (n *memNotifier) Events() []Event {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]Event(nil), n.events...)
}

// UserUnits reads a buyer's per-user units in a bucket (the Reactions suite).
func (m *memHolds) UserUnits(_ context.Context, sku, user string) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.users[sku][user], nil
}
