package reservationtest

import (
	"context"
	"testing"
	"time"

	"github.com/holdfast/holdfast/shared/reservation"
)

// Delivered returns the first n reservations that arrived (waiting a few
// seconds for them), as the receiving side decodes them.
type Delivered func(t *testing.T, n int) []reservation.Reservation

// EnqueuerFactory returns a fresh Enqueuer and what it delivered.
type EnqueuerFactory func(t *testing.T) (reservation.Enqueuer, Delivered)

// NotifierFactory returns a fresh Notifier and the cancellations it
// delivered.
type NotifierFactory func(t *testing.T) (reservation.Notifier, Delivered)

var sent = time.Date(2026, 11, 11, 12, 0, 0, 123_000_000, time.UTC)

// Enqueuer is the contract of reservation.Enqueuer (SQS's): what persist
// receives is what reserve sent, field for field.
func Enqueuer(t *testing.T, newEnqueuer EnqueuerFactory) {
	ctx := context.Background()
	t.Run("a reservation arrives with every field persist decides on", func(t *testing.T) {
		q, delivered := newEnqueuer(t)
		r := reservation.Reservation{ID: "s.aaaaaaaaaaaaaaaaaaaaaaaaaa", SKU: "s", Qty: 3, UserID: "u-1", GroupID: "g-1",
			Token: "tok-1", CreatedAt: sent, ExpiresAt: sent.Add(time.Minute), Status: reservation.StatusHeld}
		if err := q.Enqueue(ctx, r); err != nil {
			t.Fatal(err)
		}
		got := delivered(t, 1)[0]
		if got.ID != r.ID || got.SKU != r.SKU || got.Qty != r.Qty || got.UserID != r.UserID || got.GroupID != r.GroupID ||
			got.Token != r.Token || !got.CreatedAt.Equal(r.CreatedAt) || !got.ExpiresAt.Equal(r.ExpiresAt) {
			t.Errorf("delivered %+v, sent %+v", got, r)
		}
	})
	t.Run("a buy without a group arrives without one", func(t *testing.T) {
		q, delivered := newEnqueuer(t)
		r := reservation.Reservation{ID: "s.bbbbbbbbbbbbbbbbbbbbbbbbbb", SKU: "s", Qty: 1, UserID: "u-2", Token: "tok-2",
			CreatedAt: sent, ExpiresAt: sent.Add(time.Minute)}
		if err := q.Enqueue(ctx, r); err != nil {
			t.Fatal(err)
		}
		if got := delivered(t, 1)[0]; got.ID != r.ID || got.GroupID != "" {
			t.Errorf("delivered %+v, want %s without a group", got, r.ID)
		}
	})
	t.Run("each send is a message: a resend arrives again (persist takes each id once)", func(t *testing.T) {
		q, delivered := newEnqueuer(t)
		r := reservation.Reservation{ID: "s.cccccccccccccccccccccccccc", SKU: "s", Qty: 1, UserID: "u-3", Token: "tok-3",
			CreatedAt: sent, ExpiresAt: sent.Add(time.Minute)}
		for range 2 {
			if err := q.Enqueue(ctx, r); err != nil {
				t.Fatal(err)
			}
		}
		if got := delivered(t, 2); got[0].ID != r.ID || got[1].ID != r.ID {
			t.Errorf("delivered %v, want %s twice", got, r.ID)
		}
	})
}

// Notifier is the contract of reservation.Notifier (EventBridge's): the
// order service hears of a cancellation with everything it needs.
func Notifier(t *testing.T, newNotifier NotifierFactory) {
	ctx := context.Background()
	t.Run("a cancellation arrives with its id, sku, qty, buyer, group, reason and refund", func(t *testing.T) {
		n, delivered := newNotifier(t)
		r := reservation.Reservation{ID: "s.dddddddddddddddddddddddddd", SKU: "s", Qty: 2, UserID: "u-4", GroupID: "g-4",
			Status: reservation.StatusCancelled, Reason: reservation.ReasonBuyer, Cancellation: reservation.Refunded}
		if err := n.Cancelled(ctx, r); err != nil {
			t.Fatal(err)
		}
		got := delivered(t, 1)[0]
		if got.ID != r.ID || got.SKU != r.SKU || got.Qty != r.Qty || got.UserID != r.UserID || got.GroupID != r.GroupID ||
			got.Reason != r.Reason || got.Cancellation != r.Cancellation {
			t.Errorf("delivered %+v, sent %+v", got, r)
		}
	})
	t.Run("each call is an event (at least once: consumers dedupe by reservation_id)", func(t *testing.T) {
		n, delivered := newNotifier(t)
		r := reservation.Reservation{ID: "s.eeeeeeeeeeeeeeeeeeeeeeeeee", SKU: "s", Qty: 1, UserID: "u-5",
			Status: reservation.StatusCancelled, Reason: reservation.ReasonExpired}
		for range 2 {
			if err := n.Cancelled(ctx, r); err != nil {
				t.Fatal(err)
			}
		}
		if got := delivered(t, 2); got[0].ID != r.ID || got[1].ID != r.ID {
			t.Errorf("delivered %v, want %s twice", got, r.ID)
		}
	})
}
