package events_test

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/testkit/eventschema"
	"github.com/holdfast/holdfast/shared/reservation"
)

// Every event type has a schema in api/events, and no schema names a type
// the protocol does not publish.
func TestEveryEventTypeHasASchema(t *testing.T) {
	types, err := eventschema.Types()
	if err != nil {
		t.Fatal(err)
	}
	want := make([]string, len(reservation.EventTypes))
	for i, e := range reservation.EventTypes {
		want[i] = string(e)
	}
	slices.Sort(types)
	slices.Sort(want)
	if !slices.Equal(types, want) {
		t.Errorf("schemas for %v, want one for each of %v", types, want)
	}
}

// What the constructors build validates, and what breaks the contract does
// not: a missing member, an unknown one, a wrong version, a bad time.
func TestSchemasAcceptTheEventsAndRefuseOthers(t *testing.T) {
	at := time.Date(2026, 11, 11, 12, 0, 0, 0, time.UTC)
	r := reservation.Reservation{ID: "s.aaaaaaaaaaaaaaaaaaaaaaaaaa", SKU: "s", Qty: 2, UserID: "u-1", GroupID: "g-1"}
	g := reservation.Group{ID: "g-1", SKU: "s", Capacity: 3}
	due := r
	due.PayBy = at.Add(15 * time.Minute)
	noted := r
	noted.Note = "checkout:abandoned"
	good := []reservation.Event{
		reservation.ConfirmedEvent(r, at),
		reservation.ConfirmedEvent(due, at),
		reservation.CancelledEvent(r, reservation.ReasonExpired, false, at),
		reservation.CancelledEvent(r, reservation.ReasonBuyer, true, at),
		reservation.CancelledEvent(due, reservation.ReasonPaymentTimeout, true, at),
		reservation.CancelledEvent(noted, reservation.ReasonOrderCancelled, false, at),
		reservation.CancelledEvent(noted, reservation.ReasonOrderCancelled, true, at),
		reservation.CancelledEvent(noted, reservation.ReasonBuyer, true, at), // a note only with order_cancelled
		reservation.PaidEvent(due, at),
		reservation.GroupEvent(g, reservation.GroupFormed, at),
		reservation.GroupEvent(g, reservation.GroupFormed, at).WithPayBy(at.Add(time.Hour)),
		reservation.GroupEvent(g, reservation.GroupFailed, at),
	}
	for _, e := range good {
		body, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		if err := eventschema.Validate(string(e.Type), body); err != nil {
			t.Errorf("%s: %v", e.ID, err)
		}
	}
	bad := map[string]struct{ typ, body string }{
		"no sku":                   {"ReservationConfirmed", `{"event_id":"reservation/a/1","type":"ReservationConfirmed","aggregate_id":"a","version":1,"occurred_at":"2026-11-11T12:00:00Z","reservation_id":"a","user_id":"u","qty":1}`},
		"unknown member":           {"GroupFailed", `{"event_id":"group/g/1","type":"GroupFailed","aggregate_id":"g","version":1,"occurred_at":"2026-11-11T12:00:00Z","sku":"s","group_id":"g","capacity":2,"extra":1}`},
		"version 3":                {"ReservationCancelled", `{"event_id":"reservation/a/3","type":"ReservationCancelled","aggregate_id":"a","version":3,"occurred_at":"2026-11-11T12:00:00Z","sku":"s","reservation_id":"a","user_id":"u","qty":1,"reason":"expired"}`},
		"bad time":                 {"ReservationConfirmed", `{"event_id":"reservation/a/1","type":"ReservationConfirmed","aggregate_id":"a","version":1,"occurred_at":"yesterday","sku":"s","reservation_id":"a","user_id":"u","qty":1}`},
		"unknown reason":           {"ReservationCancelled", `{"event_id":"reservation/a/1","type":"ReservationCancelled","aggregate_id":"a","version":1,"occurred_at":"2026-11-11T12:00:00Z","sku":"s","reservation_id":"a","user_id":"u","qty":1,"reason":"bored"}`},
		"wrong type":               {"GroupFormed", `{"event_id":"group/g/1","type":"GroupFailed","aggregate_id":"g","version":1,"occurred_at":"2026-11-11T12:00:00Z","sku":"s","group_id":"g","capacity":2}`},
		"no schema":                {"ReservationShipped", `{}`},
		"note with another reason": {"ReservationCancelled", `{"event_id":"reservation/a/2","type":"ReservationCancelled","aggregate_id":"a","version":2,"occurred_at":"2026-11-11T12:00:00Z","sku":"s","reservation_id":"a","user_id":"u","qty":1,"reason":"buyer_cancelled","note":"x"}`},
		"note free text":           {"ReservationCancelled", `{"event_id":"reservation/a/2","type":"ReservationCancelled","aggregate_id":"a","version":2,"occurred_at":"2026-11-11T12:00:00Z","sku":"s","reservation_id":"a","user_id":"u","qty":1,"reason":"order_cancelled","note":"<b>no</b>"}`},
		"pay_by not a time":        {"ReservationConfirmed", `{"event_id":"reservation/a/1","type":"ReservationConfirmed","aggregate_id":"a","version":1,"occurred_at":"2026-11-11T12:00:00Z","sku":"s","reservation_id":"a","user_id":"u","qty":1,"pay_by":"soon"}`},
		"pay_by on a payment":      {"ReservationPaid", `{"event_id":"reservation/a/2","type":"ReservationPaid","aggregate_id":"a","version":2,"occurred_at":"2026-11-11T12:00:00Z","sku":"s","reservation_id":"a","user_id":"u","qty":1,"pay_by":"2026-11-11T12:15:00Z"}`},
		"paid as version 1":        {"ReservationPaid", `{"event_id":"reservation/a/1","type":"ReservationPaid","aggregate_id":"a","version":1,"occurred_at":"2026-11-11T12:00:00Z","sku":"s","reservation_id":"a","user_id":"u","qty":1}`},
	}
	for name, b := range bad {
		if err := eventschema.Validate(b.typ, []byte(b.body)); err == nil {
			t.Errorf("%s: validated", name)
		}
	}
}
