package reservation

import (
	"strconv"
	"time"
)

// EventType names an outcome the order service hears of (the EventBridge
// detail-type; its JSON Schema is api/events/<type>.json).
type EventType string

// The outcomes. Each is one transition of a reservation's row or a group's,
// written in the transaction that decides it (the event outbox).
const (
	EventConfirmed   EventType = "ReservationConfirmed" // none → CONFIRMED: Ledger.Apply, Ledger.ApplyBatch
	EventCancelled   EventType = "ReservationCancelled" // none → CANCELLED (Fence), CONFIRMED → CANCELLED (Refund)
	EventPaid        EventType = "ReservationPaid"      // CONFIRMED → PAID: Ledger.Pay
	EventGroupFormed EventType = "GroupFormed"          // OPEN → FORMED: FormGroup, or Apply's join of the last slot
	EventGroupFailed EventType = "GroupFailed"          // OPEN → FAILED: FailGroup, FailEmptyGroups
)

// EventTypes lists every outcome, in the order above.
var EventTypes = []EventType{EventConfirmed, EventCancelled, EventPaid, EventGroupFormed, EventGroupFailed}

// Event is one outcome exactly as MySQL decided it: the payload the outbox
// stores and the detail the bus publishes. Its ID is derived from the
// aggregate and its version, so every redelivery and re-publish carries the
// same id; Version orders an aggregate's events (a reservation's decision
// is 1, its refund or payment 2; a group's end is 1).
type Event struct {
	ID          string    `json:"event_id"`
	Type        EventType `json:"type"`
	AggregateID string    `json:"aggregate_id"` // the reservation's id, or the group's
	Version     int       `json:"version"`
	OccurredAt  time.Time `json:"occurred_at"` // the decision's time (the ledger's now)

	// What an order service needs. A reservation's: its id, buyer, SKU,
	// quantity and group; a confirmation's payment deadline (PayBy, when
	// the SKU has a pay window and it is known then: a buy's, or a join's
	// whose group formed with it); a cancellation's reason, the order
	// service's own note on its cancel, and whether it was a refund of a
	// confirmed one. A group's: its id, SKU and capacity (its members are
	// the ReservationConfirmed events that name it), and on GroupFormed the
	// payment deadline of the members confirmed before it formed, when the
	// SKU has a pay window (a member confirmed later carries its own).
	ReservationID string `json:"reservation_id,omitempty"`
	SKU           string `json:"sku"`
	UserID        string `json:"user_id,omitempty"`
	Qty           int    `json:"qty,omitempty"`
	GroupID       string `json:"group_id,omitempty"`
	Reason        Reason `json:"reason,omitempty"`
	Note          string `json:"note,omitempty"`
	Refunded      bool   `json:"refunded,omitempty"`
	Capacity      int    `json:"capacity,omitempty"`
	// PayBy is a payment deadline (RFC 3339), or nil.
	PayBy *time.Time `json:"pay_by,omitempty"`
}

// EventID is the id of an aggregate's event of version v: "reservation/<id>/<v>"
// or "group/<id>/<v>". A redelivered decision finds its row and writes no
// second event; a re-published one carries this id again.
func EventID(kind, aggregate string, v int) string {
	return kind + "/" + aggregate + "/" + strconv.Itoa(v)
}

func reservationEvent(t EventType, r Reservation, v int, at time.Time) Event {
	return Event{
		ID: EventID("reservation", r.ID, v), Type: t, AggregateID: r.ID, Version: v, OccurredAt: at.UTC().Truncate(time.Millisecond),
		ReservationID: r.ID, SKU: r.SKU, UserID: r.UserID, Qty: r.Qty, GroupID: r.GroupID,
	}
}

// ConfirmedEvent is r's confirmation at at (version 1), with r.PayBy.
func ConfirmedEvent(r Reservation, at time.Time) Event {
	e := reservationEvent(EventConfirmed, r, 1, at)
	e.PayBy = payBy(r.PayBy)
	return e
}

// WithPayBy returns e with the payment deadline t (zero: none).
func (e Event) WithPayBy(t time.Time) Event {
	e.PayBy = payBy(t)
	return e
}

func payBy(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	t = t.UTC().Truncate(time.Millisecond)
	return &t
}

// CancelledEvent is r's cancellation for reason at at: version 1 when it
// was fenced (MySQL never took its stock), 2 when a confirmed one was
// refunded. A transfer has no event (Ledger.Fence writes none).
func CancelledEvent(r Reservation, reason Reason, refunded bool, at time.Time) Event {
	v := 1
	if refunded {
		v = 2
	}
	e := reservationEvent(EventCancelled, r, v, at)
	e.Reason, e.Refunded = reason, refunded
	if reason == ReasonOrderCancelled {
		e.Note = r.Note
	}
	return e
}

// PaidEvent is the payment of the confirmed r at at (version 2: a PAID
// reservation is final, so no refund ever takes that version too), written
// by Ledger.Pay in the payment's transaction.
func PaidEvent(r Reservation, at time.Time) Event {
	return reservationEvent(EventPaid, r, 2, at)
}

// GroupEvent is the end of group g at at, FORMED or FAILED (version 1).
// A FORMED group's members' payment deadline is WithPayBy's.
func GroupEvent(g Group, status GroupStatus, at time.Time) Event {
	t := EventGroupFailed
	if status == GroupFormed {
		t = EventGroupFormed
	}
	return Event{
		ID: EventID("group", g.ID, 1), Type: t, AggregateID: g.ID, Version: 1, OccurredAt: at.UTC().Truncate(time.Millisecond),
		SKU: g.SKU, GroupID: g.ID, Capacity: g.Capacity,
	}
}
