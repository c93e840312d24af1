package loadgen

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/shared/reservation"
)

// A run's decisions, the events they owe, and the scope of its events.
func eventsFixture() ([]decision, []reservation.Event, eventScope) {
	since := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	at := since.Add(time.Second)
	ds := []decision{
		{id: "flash.r1", status: "CONFIRMED", sku: "flash", user: "buyer-1", qty: 1},
		{id: "flash.r2", status: "CANCELLED", reason: "expired", sku: "flash", user: "buyer-2", qty: 1},
		{id: "flash-grp.r3", status: "CANCELLED", reason: "group_failed", sku: "flash-grp", user: "g0-user-1", qty: 1, gid: "g0"},
		{id: "flash.r4", status: "HELD", sku: "flash", user: "buyer-4", qty: 1}, // still pending when the wait ended
		{group: true, id: "g0", status: "FAILED", sku: "flash-grp"},
		{group: true, id: "g1", status: "FORMED", sku: "flash-grp"},
		{group: true, id: "g2", status: "OPEN", sku: "flash-grp"},
	}
	res := func(id, sku, user, gid string) reservation.Reservation {
		return reservation.Reservation{ID: id, SKU: sku, UserID: user, Qty: 1, GroupID: gid}
	}
	r3 := res("flash-grp.r3", "flash-grp", "g0-user-1", "g0")
	evs := []reservation.Event{
		reservation.ConfirmedEvent(res("flash.r1", "flash", "buyer-1", ""), at),
		reservation.CancelledEvent(res("flash.r2", "flash", "buyer-2", ""), reservation.ReasonExpired, false, at),
		reservation.ConfirmedEvent(r3, at),
		reservation.CancelledEvent(r3, reservation.ReasonGroupFailed, true, at.Add(time.Second)),
		reservation.GroupEvent(reservation.Group{ID: "g0", SKU: "flash-grp", Capacity: 3}, reservation.GroupFailed, at),
		reservation.GroupEvent(reservation.Group{ID: "g1", SKU: "flash-grp", Capacity: 3}, reservation.GroupFormed, at),
	}
	return ds, evs, newScope(ds, []string{"flash", "flash-grp"}, since, map[string]bool{"buyer-9": true})
}

func deliveries(evs ...reservation.Event) []delivery {
	out := make([]delivery, len(evs))
	for i, e := range evs {
		out[i] = delivery{event: e, ok: true}
	}
	return out
}

// TestEventsCompare: the events check holds the run's events, deduplicated
// by event_id, against its decisions — a decision without its event is
// missing, an event without a decision the run saw (or contradicting one,
// or repeated with other content) is extra, and either fails the run;
// repeats, other runs' and other SKUs' events, and a later version read
// first do not.
func TestEventsCompare(t *testing.T) {
	ds, evs, scope := eventsFixture()
	since := scope.since
	r1, r2, r3c, r3x, g0, g1 := evs[0], evs[1], evs[2], evs[3], evs[4], evs[5]
	other := func(e reservation.Event, f func(*reservation.Event)) reservation.Event { f(&e); return e }
	cases := []struct {
		name          string
		dels          []reservation.Event
		missing       int
		extra         int
		outOfOrder    int
		redelivered   int
		late          int
		unanswered    int
		counted       int // distinct events of the run
		confirmedSeen int
	}{
		{name: "every decision has its event", dels: evs, counted: 6, confirmedSeen: 2},
		{name: "a repeat with the same content is dropped", dels: append(append([]reservation.Event{}, evs...), r1, g1),
			counted: 6, redelivered: 2, confirmedSeen: 2},
		{name: "a refund read before its confirmation is out of order, not wrong", dels: []reservation.Event{r1, r2, r3x, r3c, g0, g1},
			counted: 6, outOfOrder: 1, confirmedSeen: 2},
		{name: "other SKUs' events and another run's on the same SKU are not the run's", dels: append(append([]reservation.Event{}, evs...),
			other(r1, func(e *reservation.Event) {
				e.ID, e.AggregateID, e.ReservationID, e.SKU = "reservation/demo.x/1", "demo.x", "demo.x", "demo"
			}),
			other(r1, func(e *reservation.Event) {
				e.ID, e.AggregateID, e.ReservationID, e.OccurredAt = "reservation/flash.old/1", "flash.old", "flash.old", since.Add(-time.Minute)
			})),
			counted: 6, confirmedSeen: 2},
		{name: "a confirmation never published is missing", dels: []reservation.Event{r2, r3c, r3x, g0, g1}, counted: 5, missing: 1, confirmedSeen: 1},
		{name: "a refund's cancellation never published is missing", dels: []reservation.Event{r1, r2, r3c, g0, g1}, counted: 5, missing: 1, confirmedSeen: 2},
		{name: "a group's end never published is missing", dels: []reservation.Event{r1, r2, r3c, r3x, g0}, counted: 5, missing: 1, confirmedSeen: 2},
		{name: "nothing published: every decision misses one", missing: 5},
		{name: "an event of a reservation the run never heard of is extra", dels: append(append([]reservation.Event{}, evs...),
			other(r1, func(e *reservation.Event) {
				e.ID, e.AggregateID, e.ReservationID, e.UserID = "reservation/flash.zz/1", "flash.zz", "flash.zz", "buyer-7"
			})),
			counted: 7, extra: 1, confirmedSeen: 3},
		{name: "unless its buyer's request got no answer", dels: append(append([]reservation.Event{}, evs...),
			other(r1, func(e *reservation.Event) {
				e.ID, e.AggregateID, e.ReservationID, e.UserID = "reservation/flash.zz/1", "flash.zz", "flash.zz", "buyer-9"
			})),
			counted: 7, unanswered: 1, confirmedSeen: 3},
		{name: "a refund of a reservation the run saw confirmed is extra", dels: append(append([]reservation.Event{}, evs...),
			reservation.CancelledEvent(reservation.Reservation{ID: "flash.r1", SKU: "flash", UserID: "buyer-1", Qty: 1}, reservation.ReasonBuyer, true, since.Add(time.Minute))),
			counted: 7, extra: 1, confirmedSeen: 2},
		{name: "an event contradicting the decision is extra, and the decision's missing", dels: []reservation.Event{
			other(r1, func(e *reservation.Event) { e.Type, e.Reason = reservation.EventCancelled, reservation.ReasonExpired }), r2, r3c, r3x, g0, g1},
			counted: 6, missing: 1, extra: 1, confirmedSeen: 1},
		{name: "a cancellation for another reason is extra, and the decision's missing", dels: []reservation.Event{
			r1, other(r2, func(e *reservation.Event) { e.Reason = reservation.ReasonDeadLetter }), r3c, r3x, g0, g1},
			counted: 6, missing: 1, extra: 1, confirmedSeen: 2},
		{name: "an event of another buyer is extra", dels: []reservation.Event{
			other(r1, func(e *reservation.Event) { e.UserID = "buyer-2" }), r2, r3c, r3x, g0, g1},
			counted: 6, missing: 1, extra: 1, confirmedSeen: 2},
		{name: "a repeat with other content is extra", dels: append(append([]reservation.Event{}, evs...),
			other(r1, func(e *reservation.Event) { e.Qty = 2 })),
			counted: 6, extra: 1, confirmedSeen: 2},
		{name: "a repeat at another time is extra", dels: append(append([]reservation.Event{}, evs...),
			other(g1, func(e *reservation.Event) { e.OccurredAt = e.OccurredAt.Add(time.Millisecond) })),
			counted: 6, extra: 1, confirmedSeen: 2},
		{name: "a repeat decoded in another time zone is the same", dels: append(append([]reservation.Event{}, evs...),
			other(g1, func(e *reservation.Event) { e.OccurredAt = e.OccurredAt.In(time.FixedZone("x", 3600)) })),
			counted: 6, redelivered: 1, confirmedSeen: 2},
		{name: "events of a reservation still pending, or of a group still open, are late, not extra", dels: append(append([]reservation.Event{}, evs...),
			reservation.ConfirmedEvent(reservation.Reservation{ID: "flash.r4", SKU: "flash", UserID: "buyer-4", Qty: 1}, since),
			reservation.GroupEvent(reservation.Group{ID: "g2", SKU: "flash-grp"}, reservation.GroupFormed, since)),
			counted: 8, late: 2, confirmedSeen: 3},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rep := compareEvents(ds, deliveries(c.dels...), scope)
			if len(rep.Missing) != c.missing || len(rep.Extra) != c.extra || len(rep.OutOfOrder) != c.outOfOrder ||
				rep.Redelivered != c.redelivered || rep.Late != c.late || rep.Unanswered != c.unanswered || rep.Events != c.counted ||
				rep.Counts[reservation.EventConfirmed] != c.confirmedSeen || rep.Decisions != 5 {
				t.Errorf("compareEvents = missing %q, extra %q, out of order %q, redelivered %d, late %d, unanswered %d, %d events (%d confirmed), %d decisions;\n"+
					"want %d missing, %d extra, %d out of order, %d redelivered, %d late, %d unanswered, %d events (%d confirmed), 5 decisions",
					rep.Missing, rep.Extra, rep.OutOfOrder, rep.Redelivered, rep.Late, rep.Unanswered, rep.Events, rep.Counts[reservation.EventConfirmed], rep.Decisions,
					c.missing, c.extra, c.outOfOrder, c.redelivered, c.late, c.unanswered, c.counted, c.confirmedSeen)
			}
			r := &Report{Events: rep}
			r.Checks = checks(r)
			if want := c.missing == 0 && c.extra == 0; r.Passed() != want {
				t.Errorf("the run passed = %v with %d missing and %d extra, want %v", r.Passed(), c.missing, c.extra, want)
			}
		})
	}
}

// TestReportShowsTheEvents: the report counts every type, names what is
// missing or extra, and says when the check was skipped and why.
func TestReportShowsTheEvents(t *testing.T) {
	ds, evs, scope := eventsFixture()
	rep := compareEvents(ds, deliveries(evs[1:]...), scope)
	rep.Queue = "holdfast-events"
	r := &Report{Events: rep}
	r.Checks = checks(r)
	var b bytes.Buffer
	r.Print(&b)
	for _, want := range []string{
		"ReservationConfirmed 1, ReservationCancelled 2, ReservationPaid 0, GroupFormed 1, GroupFailed 1 (from holdfast-events",
		"FAIL  every outcome's event — 5 decisions, 5 events: 1 missing, 0 extra; missing reservation/flash.r1/1 ReservationConfirmed (reservation CONFIRMED)",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report prints %q, want it to contain %q", b.String(), want)
		}
	}
	r = &Report{Events: &EventsReport{Skipped: `-events-queue ""`}}
	r.Checks = checks(r)
	b.Reset()
	r.Print(&b)
	if !strings.Contains(b.String(), `events   not checked: -events-queue ""`) || strings.Contains(b.String(), "every outcome's event") {
		t.Errorf("report prints %q, want the check named skipped", b.String())
	}
}
