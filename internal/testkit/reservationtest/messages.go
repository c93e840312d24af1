package reservationtest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/holdfast/holdfast/shared/reservation"
)

// Delivered returns the first n reservations that arrived (waiting a few
// seconds for them), as the receiving side decodes them.
type Delivered func(t *testing.T, n int) []reservation.Reservation

// EnqueuerFactory returns a fresh Enqueuer and what it delivered.
type EnqueuerFactory func(t *testing.T) (reservation.Enqueuer, Delivered)

// Published returns the first n events that arrived (waiting a few
// seconds), each with the detail-type it arrived under.
type Published func(t *testing.T, n int) []PublishedEvent

// PublishedEvent is an event as a consumer received it.
type PublishedEvent struct {
	DetailType string
	Event      reservation.Event
}

// NotifierFactory returns a fresh Notifier and the events it
// delivered.
type NotifierFactory func(t *testing.T) (reservation.Notifier, Published)

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
// order service hears of each event with everything it needs, under its
// type, as often as it was published (consumers dedupe by event_id).
func Notifier(t *testing.T, newNotifier NotifierFactory) {
	ctx := context.Background()
	at := time.Date(2026, 11, 11, 12, 0, 0, 0, time.UTC)
	r := reservation.Reservation{ID: "s.dddddddddddddddddddddddddd", SKU: "s", Qty: 2, UserID: "u-4", GroupID: "g-4"}
	t.Run("each event arrives under its type with its id, version and detail", func(t *testing.T) {
		n, published := newNotifier(t)
		evs := []reservation.Event{
			reservation.ConfirmedEvent(r, at),
			reservation.CancelledEvent(r, reservation.ReasonBuyer, true, at.Add(time.Second)),
			reservation.GroupEvent(reservation.Group{ID: "g-4", SKU: "s", Capacity: 3}, reservation.GroupFailed, at),
		}
		for i, err := range n.Publish(ctx, evs) {
			if err != nil {
				t.Fatalf("event %d: %v", i, err)
			}
		}
		got := published(t, len(evs))
		byID := map[string]PublishedEvent{}
		for _, p := range got {
			byID[p.Event.ID] = p
		}
		for _, e := range evs {
			p, ok := byID[e.ID]
			p.Event.OccurredAt = p.Event.OccurredAt.UTC()
			if !ok || p.DetailType != string(e.Type) || p.Event != e {
				t.Errorf("published %+v, sent %+v", p, e)
			}
		}
	})
	t.Run("more than one call's worth goes out, each event once per publish (at least once)", func(t *testing.T) {
		n, published := newNotifier(t)
		var evs []reservation.Event
		for i := range 12 {
			e := r
			e.ID = fmt.Sprintf("s.eeeeeeeeeeeeeeeeeeeeeeee%02d", i)
			evs = append(evs, reservation.ConfirmedEvent(e, at))
		}
		for range 2 {
			for i, err := range n.Publish(ctx, evs[:11]) {
				if err != nil {
					t.Fatalf("event %d: %v", i, err)
				}
			}
		}
		count := map[string]int{}
		for _, p := range published(t, 22) {
			count[p.Event.ID]++
		}
		for _, e := range evs[:11] {
			if count[e.ID] != 2 {
				t.Errorf("%s arrived %d times, want 2", e.ID, count[e.ID])
			}
		}
	})
}
