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

// The in-memory Holds follows MySQL's rows as reservation.React says, as
// follow.lua does.
func TestFakeHoldsReactAsReactSays(t *testing.T) {
	reservationtest.Reactions(t, func(t *testing.T, c reservation.Clock, rate, burst int) reservationtest.HoldsUnderTest {
		return reservation.NewFakeHolds(c, rate, burst)
	})
}

// The in-memory Ledger keeps the contract the MySQL adapter keeps.
func TestFakeLedgerKeepsTheContract(t *testing.T) {
	reservationtest.Ledger(t, func(t *testing.T) reservation.Ledger { return reservation.NewFakeLedger() })
}

// The in-memory Enqueuer and Notifier keep the contracts SQS's and
// EventBridge's adapters keep.
func TestFakeQueueAndNotifierKeepTheContracts(t *testing.T) {
	first := func(t *testing.T, got []reservation.Reservation, n int) []reservation.Reservation {
		t.Helper()
		if len(got) < n {
			t.Fatalf("%d delivered, want %d", len(got), n)
		}
		return got[:n]
	}
	reservationtest.Enqueuer(t, func(t *testing.T) (reservation.Enqueuer, reservationtest.Delivered) {
		q := reservation.NewFakeQueue()
		return q, func(t *testing.T, n int) []reservation.Reservation { return first(t, q.Sent(), n) }
	})
	reservationtest.Notifier(t, func(t *testing.T) (reservation.Notifier, reservationtest.Published) {
		nt := reservation.NewFakeNotifier()
		return nt, func(t *testing.T, n int) []reservationtest.PublishedEvent {
			var out []reservationtest.PublishedEvent
			for _, e := range nt.Events() {
				out = append(out, reservationtest.PublishedEvent{DetailType: string(e.Type), Event: e})
			}
			if len(out) < n {
				t.Fatalf("%d published, want %d", len(out), n)
			}
			return out[:n]
		}
	})
}
