package reservationtest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast/shared/reservation"
)

// ledgerPayment is the payment's part of the Ledger contract: the pay
// window a confirmation opens (a join's when its group forms), the list of
// payments due, PAID final against every cancel, and the events.
func ledgerPayment(t *testing.T, newLedger LedgerFactory) {
	within := 15 * time.Minute
	withWindow := func(t *testing.T, s reservation.Ledger, sku string, n int64) {
		t.Helper()
		c := reservation.SetTo(sku, n)
		c.PayWithin = ptr(within)
		l, err := s.ChangeStock(context.Background(), c)
		if err != nil || l.PayWithin != within {
			t.Fatalf("ChangeStock with a pay window = %+v %v", l, err)
		}
	}
	row := func(t *testing.T, s reservation.Ledger, id string) reservation.Reservation {
		t.Helper()
		r, err := s.Reservation(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}

	t.Run("a confirmation opens its pay window; a change applies to later ones; the window is kept by a change's key", func(t *testing.T) {
		ctx := context.Background()
		s := newLedger(t)
		withWindow(t, s, "s", 10)
		if got, err := apply(ctx, s, res("a", "s", 1)); err != nil || got != reservation.Applied {
			t.Fatalf("apply = %v %v", got, err)
		}
		batch, err := s.ApplyBatch(ctx, "s", []reservation.Reservation{res("b1", "s", 1), res("b2", "s", 1)}, now)
		if err != nil || batch[0].Result != reservation.Applied || batch[1].Result != reservation.Applied {
			t.Fatalf("batch = %+v %v", batch, err)
		}
		for _, id := range []string{"a", "b1", "b2"} {
			if r := row(t, s, id); !r.PayBy.Equal(now.Add(within)) || !r.PaidAt.IsZero() || r.Shown() != reservation.StatusConfirmed {
				t.Errorf("%s: pay_by %v paid_at %v shown %s, want due %v, unpaid, CONFIRMED", id, r.PayBy, r.PaidAt, r.Shown(), now.Add(within))
			}
		}
		if batch[0].Row.PayBy.IsZero() {
			t.Errorf("the batch's applied row carries no PayBy: %+v", batch[0].Row)
		}
		// Turned off: later confirmations have no window, earlier ones keep theirs.
		l, err := s.ChangeStock(ctx, reservation.StockChange{SKU: "s", Add: ptr(int64(0)), PayWithin: ptr(time.Duration(0)), Key: "off"})
		if err != nil || l.PayWithin != 0 {
			t.Fatalf("turn the window off = %+v %v", l, err)
		}
		if _, err := s.ChangeStock(ctx, reservation.StockChange{SKU: "s", Add: ptr(int64(0)), PayWithin: ptr(time.Minute), Key: "off"}); !errors.Is(err, reservation.ErrIdempotencyMismatch) {
			t.Errorf("the key reused with another window = %v, want ErrIdempotencyMismatch", err)
		}
		if got, err := apply(ctx, s, res("c", "s", 1)); err != nil || got != reservation.Applied {
			t.Fatalf("apply = %v %v", got, err)
		}
		if r := row(t, s, "c"); !r.PayBy.IsZero() {
			t.Errorf("confirmed with no window: pay_by %v, want none", r.PayBy)
		}
		if r := row(t, s, "a"); !r.PayBy.Equal(now.Add(within)) {
			t.Errorf("an earlier confirmation lost its window: %v", r.PayBy)
		}
		due, err := s.PaymentsDue(ctx, now.Add(within), 10)
		if err != nil || len(due) != 3 {
			t.Fatalf("PaymentsDue at the deadline = %d rows %v, want a, b1, b2", len(due), err)
		}
		if due, err := s.PaymentsDue(ctx, now.Add(within-time.Millisecond), 10); err != nil || len(due) != 0 {
			t.Errorf("PaymentsDue before the deadline = %d rows %v, want none", len(due), err)
		}
		if due, err := s.PaymentsDue(ctx, now.Add(within), 2); err != nil || len(due) != 2 {
			t.Errorf("PaymentsDue limit 2 = %d rows %v", len(due), err)
		}
	})

	t.Run("each batch's rows are due by the window it read, whatever the window of the batch before", func(t *testing.T) {
		ctx := context.Background()
		s := newLedger(t)
		withWindow(t, s, "w", 20)
		for i, step := range []struct {
			window time.Duration // set before the batch (-1: left as it is)
			want   time.Duration // the rows' pay_by after now (0: none)
		}{
			{-1, within},                       // the first batch of the SKU
			{-1, within},                       // the same window again
			{0, 0},                             // turned off
			{0, 0},                             // still off
			{time.Minute, time.Minute},         // turned on
			{2 * time.Minute, 2 * time.Minute}, // changed
			{-1, 2 * time.Minute},              // as it was
		} {
			if step.window >= 0 {
				c := reservation.StockChange{SKU: "w", Add: ptr(int64(0)), PayWithin: ptr(step.window), Key: fmt.Sprintf("w%d", i)}
				if l, err := s.ChangeStock(ctx, c); err != nil || l.PayWithin != step.window {
					t.Fatalf("step %d: ChangeStock = %+v %v", i, l, err)
				}
			}
			ids := []string{fmt.Sprintf("w%d-a", i), fmt.Sprintf("w%d-b", i)}
			batch, err := s.ApplyBatch(ctx, "w", []reservation.Reservation{res(ids[0], "w", 1), res(ids[1], "w", 1)}, now)
			if err != nil || batch[0].Result != reservation.Applied || batch[1].Result != reservation.Applied {
				t.Fatalf("step %d: batch = %+v %v", i, batch, err)
			}
			want := time.Time{}
			if step.want > 0 {
				want = now.Add(step.want)
			}
			for j, id := range ids {
				if r := row(t, s, id); !r.PayBy.Equal(want) {
					t.Errorf("step %d: %s due %v, want %v", i, id, r.PayBy, want)
				}
				if !batch[j].Row.PayBy.Equal(want) {
					t.Errorf("step %d: the batch says %s is due %v, want %v", i, id, batch[j].Row.PayBy, want)
				}
			}
		}
	})

	t.Run("a payment is final: refunds refuse it, it is listed due no more, and it writes ReservationPaid once", func(t *testing.T) {
		ctx := context.Background()
		s := newLedger(t)
		withWindow(t, s, "s", 10)
		if got, err := apply(ctx, s, res("a", "s", 3)); err != nil || got != reservation.Applied {
			t.Fatalf("apply = %v %v", got, err)
		}
		markPublished(t, s, "a")
		paid, ok, err := s.Pay(ctx, "a", now.Add(time.Minute))
		if err != nil || !ok || paid.Shown() != reservation.StatusPaid || !paid.PaidAt.Equal(now.Add(time.Minute)) {
			t.Fatalf("Pay = %+v %v %v, want PAID at now+1m", paid, ok, err)
		}
		again, ok, err := s.Pay(ctx, "a", now.Add(2*time.Minute))
		if err != nil || ok || again.Shown() != reservation.StatusPaid || !again.PaidAt.Equal(now.Add(time.Minute)) {
			t.Errorf("Pay again = %+v %v %v, want the PAID row as it stands", again, ok, err)
		}
		if got := unpublished(t, s, "a"); fmt.Sprint(got) != "[ReservationPaid/2]" {
			t.Errorf("events = %v, want one ReservationPaid/2", got)
		}
		for _, reason := range []reservation.Reason{reservation.ReasonBuyer, reservation.ReasonPaymentTimeout, reservation.ReasonOrderCancelled} {
			r, refunded, err := s.Refund(ctx, "a", reason, "x", now.Add(time.Hour))
			if err != nil || refunded || r.Shown() != reservation.StatusPaid {
				t.Errorf("Refund %s of a PAID row = %+v %v %v, want refused, PAID", reason, r, refunded, err)
			}
		}
		if av := available(t, s, "s"); av != 7 {
			t.Errorf("available = %d, want 7 (a PAID row keeps its units)", av)
		}
		if due, err := s.PaymentsDue(ctx, now.Add(time.Hour), 10); err != nil || len(due) != 0 {
			t.Errorf("PaymentsDue = %+v %v, want none (paid)", due, err)
		}
		tally, err := s.Tally(ctx, "s")
		if err != nil || tally.Paid() != 3 || tally.Taken() != 3 || tally.Mismatch() != 0 {
			t.Errorf("tally = %+v %v, want 3 paid of 3 taken, balanced", tally, err)
		}
		if _, _, err := s.Pay(ctx, "nosuch", now); !errors.Is(err, reservation.ErrNotFound) {
			t.Errorf("Pay of no row = %v, want ErrNotFound", err)
		}
		// A cancelled row is answered as it stands.
		if _, _, err := s.Fence(ctx, res("f", "s", 1), reservation.ReasonExpired, now); err != nil {
			t.Fatal(err)
		}
		if r, ok, err := s.Pay(ctx, "f", now); err != nil || ok || r.Status != reservation.StatusCancelled {
			t.Errorf("Pay of a CANCELLED row = %+v %v %v", r, ok, err)
		}
	})

	t.Run("a payment and a refund race: exactly one wins, and the events say which", func(t *testing.T) {
		ctx := context.Background()
		s := newLedger(t)
		withWindow(t, s, "s", 100)
		const n = 20
		for i := range n {
			if got, err := apply(ctx, s, res(fmt.Sprint("r", i), "s", 1)); err != nil || got != reservation.Applied {
				t.Fatalf("apply = %v %v", got, err)
			}
		}
		var wg sync.WaitGroup
		paid := make([]bool, n)
		refunded := make([]bool, n)
		for i := range n {
			id := fmt.Sprint("r", i)
			wg.Add(2)
			go func() {
				defer wg.Done()
				_, ok, err := s.Pay(ctx, id, now)
				if err != nil {
					t.Errorf("Pay: %v", err)
				}
				paid[i] = ok
			}()
			go func() {
				defer wg.Done()
				_, ok, err := s.Refund(ctx, id, reservation.ReasonPaymentTimeout, "", now)
				if err != nil {
					t.Errorf("Refund: %v", err)
				}
				refunded[i] = ok
			}()
		}
		wg.Wait()
		back := 0
		for i := range n {
			id := fmt.Sprint("r", i)
			r := row(t, s, id)
			evs := unpublished(t, s, id)
			switch {
			case paid[i] == refunded[i]:
				t.Errorf("%s: paid %v refunded %v, want exactly one", id, paid[i], refunded[i])
			case paid[i] && (r.Shown() != reservation.StatusPaid || fmt.Sprint(evs) != "[ReservationConfirmed/1 ReservationPaid/2]"):
				t.Errorf("%s paid: row %s, events %v", id, r.Shown(), evs)
			case refunded[i] && (r.Status != reservation.StatusCancelled || r.Reason != reservation.ReasonPaymentTimeout ||
				fmt.Sprint(evs) != "[ReservationConfirmed/1 ReservationCancelled/2]"):
				t.Errorf("%s refunded: row %+v, events %v", id, r, evs)
			case refunded[i]:
				back++
			}
		}
		if av := available(t, s, "s"); av != int64(100-n+back) {
			t.Errorf("available = %d, want %d (each refund gave its unit back once)", av, 100-n+back)
		}
	})

	t.Run("the order service's cancel keeps its note, on a fence and on a refund", func(t *testing.T) {
		ctx := context.Background()
		s := newLedger(t)
		withWindow(t, s, "s", 10)
		h := res("h", "s", 1)
		h.Note = "fraud-check"
		if r, _, err := s.Fence(ctx, h, reservation.ReasonOrderCancelled, now); err != nil || r.Note != "fraud-check" || r.Reason != reservation.ReasonOrderCancelled {
			t.Errorf("fence = %+v %v, want order_cancelled with its note", r, err)
		}
		if got, err := apply(ctx, s, res("c", "s", 1)); err != nil || got != reservation.Applied {
			t.Fatalf("apply = %v %v", got, err)
		}
		r, ok, err := s.Refund(ctx, "c", reservation.ReasonOrderCancelled, "customer-request", now)
		if err != nil || !ok || r.Note != "customer-request" || row(t, s, "c").Note != "customer-request" || !r.PaidAt.IsZero() {
			t.Errorf("refund = %+v %v %v, want the note kept", r, ok, err)
		}
		evs, err := s.EventsOf(ctx, []string{"c", "h"})
		if err != nil {
			t.Fatal(err)
		}
		notes := map[string]string{}
		for _, e := range evs {
			if e.Type == reservation.EventCancelled {
				notes[e.AggregateID] = e.Note
			}
		}
		if notes["c"] != "customer-request" || notes["h"] != "fraud-check" {
			t.Errorf("cancellation events' notes = %v", notes)
		}
		// Another reason keeps no note.
		b := res("b", "s", 1)
		b.Note = "ignored"
		if r, _, err := s.Fence(ctx, b, reservation.ReasonBuyer, now); err != nil || r.Note != "" {
			t.Errorf("a buyer's fence = %+v %v, want no note", r, err)
		}
	})

	t.Run("a join's pay window opens when its group forms; before that it cannot be paid", func(t *testing.T) {
		ctx := context.Background()
		s := newLedger(t)
		withWindow(t, s, "s", 10)
		for _, g := range []string{"g", "h"} {
			if err := s.CreateGroup(ctx, reservation.Group{ID: g, SKU: "s", Capacity: 2, Status: reservation.GroupOpen, Deadline: now.Add(time.Hour), CreatedAt: now}); err != nil {
				t.Fatal(err)
			}
		}
		join := func(id, g string, at time.Time) {
			t.Helper()
			r := res(id, "s", 1)
			r.GroupID = g
			out, err := s.Apply(ctx, r, reservation.Pessimistic, at)
			if err != nil || out.Result != reservation.Applied {
				t.Fatalf("join %s = %+v %v", id, out, err)
			}
		}
		join("g1", "g", now)
		if r := row(t, s, "g1"); !r.PayBy.IsZero() {
			t.Errorf("a join of an OPEN group is due %v, want no window yet", r.PayBy)
		}
		if _, _, err := s.Pay(ctx, "g1", now); !errors.Is(err, reservation.ErrGroupNotFormed) {
			t.Errorf("Pay of a join of an OPEN group = %v, want ErrGroupNotFormed", err)
		}
		formed := now.Add(time.Minute)
		join("g2", "g", formed) // the last slot: formed by the join
		for _, id := range []string{"g1", "g2"} {
			if r := row(t, s, id); !r.PayBy.Equal(formed.Add(within)) {
				t.Errorf("%s due %v, want %v (the group formed)", id, r.PayBy, formed.Add(within))
			}
		}
		evs, err := s.EventsOf(ctx, []string{"g"})
		if err != nil || len(evs) != 1 || evs[0].Type != reservation.EventGroupFormed || evs[0].PayBy == nil || !evs[0].PayBy.Equal(formed.Add(within)) {
			t.Errorf("GroupFormed = %+v %v, want one carrying pay_by %v", evs, err, formed.Add(within))
		}
		if _, ok, err := s.Pay(ctx, "g1", formed); err != nil || !ok {
			t.Errorf("Pay of a member of a FORMED group = %v %v", ok, err)
		}
		// Formed by FormGroup (Redis said its last slot went in time).
		join("h1", "h", now)
		at := now.Add(2 * time.Minute)
		if ok, err := s.FormGroup(ctx, "h", at, at); err != nil || !ok {
			t.Fatalf("FormGroup = %v %v", ok, err)
		}
		if r := row(t, s, "h1"); !r.PayBy.Equal(at.Add(within)) {
			t.Errorf("h1 due %v, want %v (FormGroup)", r.PayBy, at.Add(within))
		}
		late := now.Add(3 * time.Minute)
		join("h2", "h", late) // a late member of a FORMED group: its window from its confirmation
		if r := row(t, s, "h2"); !r.PayBy.Equal(late.Add(within)) {
			t.Errorf("late member due %v, want %v", r.PayBy, late.Add(within))
		}
	})
}
