package reservationtest

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/shared/reservation"
)

// unpublished returns the unpublished events of an aggregate as
// "Type/version", in the outbox's order.
func unpublished(t *testing.T, s reservation.Ledger, id string) []string {
	t.Helper()
	evs, err := s.EventsOf(context.Background(), []string{id})
	if err != nil {
		t.Fatal(err)
	}
	out := make([]string, len(evs))
	for i, e := range evs {
		if e.AggregateID != id {
			t.Errorf("EventsOf(%s) returned %+v", id, e)
		}
		out[i] = string(e.Type) + "/" + strconv.Itoa(e.Version)
	}
	return out
}

// markPublished marks the aggregate's unpublished events published.
func markPublished(t *testing.T, s reservation.Ledger, id string) {
	t.Helper()
	evs, err := s.EventsOf(context.Background(), []string{id})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.MarkPublished(context.Background(), evs, now); err != nil {
		t.Fatal(err)
	}
}

// ledgerEvents is the event outbox's part of the Ledger contract.
func ledgerEvents(t *testing.T, newLedger LedgerFactory) {
	t.Run("every decision writes its event with it, once, and the outbox lists them in order until published", func(t *testing.T) {
		ctx := context.Background()
		s := newLedger(t)
		for sku, n := range map[string]int64{"s": 10, "t": 2} {
			if _, err := s.ChangeStock(ctx, reservation.SetTo(sku, n)); err != nil {
				t.Fatal(err)
			}
		}
		if got, err := apply(ctx, s, res("a", "s", 3)); err != nil || got != reservation.Applied {
			t.Fatalf("apply = %v %v", got, err)
		}
		// Each decision a millisecond after the one before: the outbox's
		// order is theirs (a batch's rows and the events rows are two
		// tables, merged by when they occurred).
		at := func(n int) time.Time { return now.Add(time.Duration(n) * time.Millisecond) }
		batch := []reservation.Reservation{res("b1", "t", 1), res("b2", "t", 1), res("b3", "t", 1)}
		for range 2 { // a redelivered batch decides nothing again
			if _, err := s.ApplyBatch(ctx, "t", batch, at(1)); err != nil {
				t.Fatal(err)
			}
		}
		if _, _, err := s.Fence(ctx, res("f", "s", 1), reservation.ReasonExpired, at(2)); err != nil {
			t.Fatal(err)
		}
		if _, _, err := s.Refund(ctx, "a", reservation.ReasonBuyer, "", at(3)); err != nil {
			t.Fatal(err)
		}
		evs, err := s.Unpublished(ctx, now.Add(time.Second), 100)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, e := range evs {
			got = append(got, e.ID)
		}
		want := []string{"reservation/a/1", "reservation/b1/1", "reservation/b2/1", "reservation/f/1", "reservation/a/2"}
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Fatalf("Unpublished = %v, want %v: the oldest first", got, want)
		}
		wantEvents := map[string]reservation.Event{
			"reservation/a/1": {ID: "reservation/a/1", Type: reservation.EventConfirmed, AggregateID: "a", Version: 1, OccurredAt: now,
				ReservationID: "a", SKU: "s", UserID: "u-a", Qty: 3},
			"reservation/b1/1": {ID: "reservation/b1/1", Type: reservation.EventConfirmed, AggregateID: "b1", Version: 1, OccurredAt: at(1),
				ReservationID: "b1", SKU: "t", UserID: "u-b1", Qty: 1},
			"reservation/b2/1": {ID: "reservation/b2/1", Type: reservation.EventConfirmed, AggregateID: "b2", Version: 1, OccurredAt: at(1),
				ReservationID: "b2", SKU: "t", UserID: "u-b2", Qty: 1},
			"reservation/f/1": {ID: "reservation/f/1", Type: reservation.EventCancelled, AggregateID: "f", Version: 1, OccurredAt: at(2),
				ReservationID: "f", SKU: "s", UserID: "u-f", Qty: 1, Reason: reservation.ReasonExpired},
			"reservation/a/2": {ID: "reservation/a/2", Type: reservation.EventCancelled, AggregateID: "a", Version: 2, OccurredAt: at(3),
				ReservationID: "a", SKU: "s", UserID: "u-a", Qty: 3, Reason: reservation.ReasonBuyer, Refunded: true},
		}
		for _, e := range evs {
			e.OccurredAt = e.OccurredAt.UTC()
			if e != wantEvents[e.ID] {
				t.Errorf("event = %+v, want %+v", e, wantEvents[e.ID])
			}
		}
		if early, err := s.Unpublished(ctx, now, 100); err != nil || len(early) != 0 {
			t.Errorf("Unpublished before the decisions = %v %v, want none", early, err)
		}
		// Under a limit, the oldest: two, or three when the second is a
		// batch's (a batch's confirmations may come whole).
		first, err := s.Unpublished(ctx, now.Add(time.Second), 2)
		if err != nil {
			t.Fatal(err)
		}
		var firstIDs []string
		for _, e := range first {
			firstIDs = append(firstIDs, e.ID)
		}
		if n := len(firstIDs); n < 2 || n > 3 || strings.Join(firstIDs, " ") != strings.Join(want[:n], " ") {
			t.Errorf("Unpublished, 2 = %v, want %v (or with %s, its batch whole)", firstIDs, want[:2], want[2])
		}
		if oldest, ok, err := s.OldestUnpublished(ctx); err != nil || !ok || !oldest.Equal(now) {
			t.Errorf("OldestUnpublished = %v %v %v, want %v", oldest, ok, err, now)
		}
		if err := s.MarkPublished(ctx, evs, now.Add(time.Second)); err != nil {
			t.Fatal(err)
		}
		if left, err := s.Unpublished(ctx, now.Add(time.Hour), 100); err != nil || len(left) != 0 {
			t.Errorf("Unpublished after MarkPublished = %v %v", left, err)
		}
		if _, ok, err := s.OldestUnpublished(ctx); err != nil || ok {
			t.Errorf("OldestUnpublished of a drained outbox = %v %v", ok, err)
		}
		if _, _, err := s.Fence(ctx, res("f", "s", 1), reservation.ReasonBuyer, now); err != nil {
			t.Fatal(err)
		}
		if got := unpublished(t, s, "f"); len(got) != 0 {
			t.Errorf("a second fence wrote %v", got)
		}
	})

	t.Run("a batch's confirmation still owed goes out before its reservation's refund", func(t *testing.T) {
		ctx := context.Background()
		s := newLedger(t)
		if _, err := s.ChangeStock(ctx, reservation.SetTo("t", 5)); err != nil {
			t.Fatal(err)
		}
		if _, err := s.ApplyBatch(ctx, "t", []reservation.Reservation{res("c1", "t", 1), res("c2", "t", 1)}, now); err != nil {
			t.Fatal(err)
		}
		if _, _, err := s.Refund(ctx, "c2", reservation.ReasonBuyer, "", now.Add(time.Minute)); err != nil {
			t.Fatal(err)
		}
		if got := unpublished(t, s, "c2"); strings.Join(got, " ") != "ReservationConfirmed/1 ReservationCancelled/2" {
			t.Errorf("events of c2 = %v, want its confirmation, then its refund", got)
		}
		markPublished(t, s, "c2")
		if got := unpublished(t, s, "c2"); len(got) != 0 {
			t.Errorf("events of c2 after they went out = %v", got)
		}
		// c1's confirmation, its batch's other, was not sent: still owed, alone.
		evs, err := s.Unpublished(ctx, now.Add(time.Hour), 100)
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) != 1 || evs[0].ID != "reservation/c1/1" {
			t.Errorf("Unpublished = %+v, want c1's confirmation alone", evs)
		}
		if err := s.MarkPublished(ctx, evs, now.Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		if left, err := s.Unpublished(ctx, now.Add(time.Hour), 100); err != nil || len(left) != 0 {
			t.Errorf("Unpublished after the batch went out = %v %v", left, err)
		}
	})

	t.Run("a group's end writes its event once, whoever ends it", func(t *testing.T) {
		ctx := context.Background()
		s := newLedger(t)
		if _, err := s.ChangeStock(ctx, reservation.SetTo("s", 10)); err != nil {
			t.Fatal(err)
		}
		group := func(id string, capacity int, deadline time.Time) {
			t.Helper()
			g := reservation.Group{ID: id, SKU: "s", Capacity: capacity, Status: reservation.GroupOpen, Deadline: deadline, CreatedAt: now}
			if err := s.CreateGroup(ctx, g); err != nil {
				t.Fatal(err)
			}
		}
		join := func(id, user, g string) {
			t.Helper()
			r := res(id, "s", 1)
			r.UserID, r.GroupID = user, g
			if got, err := apply(ctx, s, r); err != nil || got != reservation.Applied {
				t.Fatalf("join %s = %v %v", id, got, err)
			}
		}
		// Redis's last slot went before the deadline: FormGroup forms it; the late member's join writes no second event.
		group("g", 2, now.Add(time.Hour))
		join("m1", "u1", "g")
		for range 2 {
			if formed, err := s.FormGroup(ctx, "g", now.Add(time.Minute), now.Add(time.Minute)); err != nil || !formed {
				t.Fatalf("FormGroup = %v %v", formed, err)
			}
		}
		join("m2", "u2", "g")
		if got := unpublished(t, s, "g"); strings.Join(got, " ") != "GroupFormed/1" {
			t.Errorf("events of g = %v, want one GroupFormed", got)
		}
		// The join that takes the last slot in MySQL forms the group in its transaction.
		group("h", 1, now.Add(time.Hour))
		join("n1", "u1", "h")
		if got := unpublished(t, s, "h"); strings.Join(got, " ") != "GroupFormed/1" {
			t.Errorf("events of h = %v, want GroupFormed", got)
		}
		group("k", 2, now.Add(-time.Minute))
		join("k1", "u1", "k")
		for range 2 {
			if gr, err := s.FailGroup(ctx, "k", now); err != nil || gr.Status != reservation.GroupFailed {
				t.Fatalf("FailGroup = %+v %v", gr, err)
			}
		}
		group("e", 2, now.Add(-time.Minute))
		for range 2 {
			if _, err := s.FailEmptyGroups(ctx, []string{"e"}, now); err != nil {
				t.Fatal(err)
			}
		}
		evs, err := s.EventsOf(ctx, []string{"g", "h", "k", "e"})
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]reservation.Event{
			"g": {ID: "group/g/1", Type: reservation.EventGroupFormed, AggregateID: "g", Version: 1, OccurredAt: now.Add(time.Minute), SKU: "s", GroupID: "g", Capacity: 2},
			"h": {ID: "group/h/1", Type: reservation.EventGroupFormed, AggregateID: "h", Version: 1, OccurredAt: now, SKU: "s", GroupID: "h", Capacity: 1},
			"k": {ID: "group/k/1", Type: reservation.EventGroupFailed, AggregateID: "k", Version: 1, OccurredAt: now, SKU: "s", GroupID: "k", Capacity: 2},
			"e": {ID: "group/e/1", Type: reservation.EventGroupFailed, AggregateID: "e", Version: 1, OccurredAt: now, SKU: "s", GroupID: "e", Capacity: 2},
		}
		if len(evs) != len(want) {
			t.Errorf("group events = %+v, want one each of %v", evs, want)
		}
		for _, e := range evs {
			e.OccurredAt = e.OccurredAt.UTC()
			if e != want[e.AggregateID] {
				t.Errorf("event = %+v, want %+v", e, want[e.AggregateID])
			}
		}
	})
}
