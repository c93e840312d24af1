package system_test

// The order service pays or releases: a pay window per SKU, a payment that
// ends a reservation for good, the order service's cancel with its reason,
// and the sweeper's payment timeout — each racing the others and the
// buyer's DELETE, with exactly one outcome and the events saying which.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/testkit/outbox"

	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/reservation"
)

// payWindow sets the SKU's pay window.
func (p *promise) payWindow(sku string, d time.Duration) {
	p.t.Helper()
	c := reservation.StockChange{SKU: sku, Add: new(int64), PayWithin: &d}
	if l, err := p.app.Service.ChangeStock(context.Background(), c); err != nil || l.PayWithin != d {
		p.t.Fatalf("pay window %s = %+v %v", sku, l, err)
	}
}

// eventsOf returns each aggregate's events as the outbox records them
// (one row per event_id), as "Type/version" in version order. The bus
// delivers them at least once (the stack's drain validates each against its
// schema); the outbox is the record of what was decided.
func eventsOf(p *promise, sku string) map[string][]string {
	p.t.Helper()
	rows, err := p.db.Query(`SELECT aggregate_id, type, version FROM `+outbox.Table+` WHERE event_id LIKE 'reservation/%' AND aggregate_id LIKE CONCAT(?, '.%')
		ORDER BY aggregate_id, version`, sku)
	if err != nil {
		p.t.Fatal(err)
	}
	defer rows.Close()
	out := map[string][]string{}
	for rows.Next() {
		var id, typ string
		var v int
		if err := rows.Scan(&id, &typ, &v); err != nil {
			p.t.Fatal(err)
		}
		out[id] = append(out[id], fmt.Sprintf("%s/%d", typ, v))
	}
	if err := rows.Err(); err != nil {
		p.t.Fatal(err)
	}
	if n := p.count(`SELECT COUNT(*) FROM `+outbox.Table+` WHERE NOT published AND aggregate_id LIKE CONCAT(?, '.%')`, sku); n != 0 {
		p.t.Errorf("%d events not published", n)
	}
	return out
}

func TestPayment(t *testing.T) {
	ctx := context.Background()

	t.Run("paid is final; the order service's cancel and the timeout give the units back once", func(t *testing.T) {
		p := newPromise(t)
		svc := p.app.Service
		sku := testservices.Name("pay")
		p.createSKU(sku, 10, 0)
		p.payWindow(sku, time.Minute)
		ann := p.reserved(sku, "ann", 2, "")
		bob := p.reserved(sku, "bob", 1, "")
		cy := p.reserved(sku, "cy", 3, "")
		held := p.reserved(sku, "dee", 1, "")
		if _, err := svc.Pay(ctx, held); !errors.Is(err, reservation.ErrNotConfirmed) {
			t.Errorf("pay of a HELD reservation = %v, want ErrNotConfirmed", err)
		}
		p.persistMsgs(ann, bob, cy, held)
		p.wantStores("confirmed", sku, 3, 0, 3)

		paid, err := svc.Pay(ctx, ann)
		if err != nil || paid.Shown() != reservation.StatusPaid {
			t.Fatalf("pay = %+v %v, want PAID", paid, err)
		}
		if again, err := svc.Pay(ctx, ann); err != nil || !again.PaidAt.Equal(paid.PaidAt) {
			t.Errorf("pay again = %+v %v, want the same payment", again, err)
		}
		p.wantStatus(ann, reservation.StatusPaid, "")
		if _, err := svc.Cancel(ctx, ann, "ann"); !errors.Is(err, reservation.ErrPaid) {
			t.Errorf("buyer's cancel of a PAID reservation = %v, want ErrPaid", err)
		}
		if _, err := svc.OrderCancel(ctx, ann, "fraud"); !errors.Is(err, reservation.ErrPaid) {
			t.Errorf("order cancel of a PAID reservation = %v, want ErrPaid", err)
		}

		c, err := svc.OrderCancel(ctx, bob, "customer-request")
		if err != nil || c.Status != reservation.StatusCancelled || c.Reason != reservation.ReasonOrderCancelled || c.Note != "customer-request" {
			t.Fatalf("order cancel = %+v %v", c, err)
		}
		if again, err := svc.OrderCancel(ctx, bob, "other"); err != nil || again.Note != "customer-request" {
			t.Errorf("order cancel again = %+v %v, want the first cancel as it stands", again, err)
		}
		var ce *reservation.CancelledError
		if _, err := svc.Pay(ctx, bob); !errors.As(err, &ce) || ce.Reason != reservation.ReasonOrderCancelled {
			t.Errorf("pay of a cancelled reservation = %v, want CancelledError order_cancelled", err)
		}
		if _, err := svc.OrderCancel(ctx, cy, "no spaces please"); err == nil {
			t.Error("a reason that is not a code was taken")
		}
		p.wantStores("bob's cancel", sku, 4, 0, 4)

		// The window passes: cy and dee time out, ann (paid) does not.
		p.clock.Advance(time.Minute + 6*time.Second)
		rep := p.sweep()
		if rep.PaymentsTimedOut != 2 {
			t.Errorf("sweep timed out %d payments, want 2: %+v", rep.PaymentsTimedOut, rep)
		}
		p.wantStatus(cy, reservation.StatusCancelled, reservation.ReasonPaymentTimeout)
		p.wantStatus(held, reservation.StatusCancelled, reservation.ReasonPaymentTimeout)
		p.wantStatus(ann, reservation.StatusPaid, "")
		p.wantStores("timed out", sku, 8, 0, 8)
		if rep := p.sweep(); rep.PaymentsTimedOut != 0 {
			t.Errorf("a second sweep timed out %d more", rep.PaymentsTimedOut)
		}
		p.wantStores("swept again", sku, 8, 0, 8)

		evs := eventsOf(p, sku)
		want := map[string]string{
			ann: "[ReservationConfirmed/1 ReservationPaid/2]", bob: "[ReservationConfirmed/1 ReservationCancelled/2]",
			cy: "[ReservationConfirmed/1 ReservationCancelled/2]", held: "[ReservationConfirmed/1 ReservationCancelled/2]",
		}
		for id, w := range want {
			if got := fmt.Sprint(evs[id]); got != w {
				t.Errorf("%s events = %s, want %s", id, got, w)
			}
		}
	})

	t.Run("pay, the timeout, the buyer's and the order service's cancel race: one outcome each, units back once", func(t *testing.T) {
		p := newPromise(t)
		svc := p.app.Service
		sku := testservices.Name("payrace")
		const n = 24
		p.createSKU(sku, 100, 0)
		p.payWindow(sku, time.Minute)
		ids := make([]string, n)
		users := make([]string, n)
		for i := range n {
			users[i] = fmt.Sprint("u", i)
			ids[i] = p.reserved(sku, users[i], 1, "")
		}
		p.persistMsgs(ids...)
		p.clock.Advance(time.Minute + 6*time.Second) // every payment is due
		var wg sync.WaitGroup
		paid := make([]bool, n)
		for i, id := range ids {
			wg.Add(3)
			go func() {
				defer wg.Done()
				_, err := svc.Pay(ctx, id)
				paid[i] = err == nil
				if err != nil && !errors.Is(err, reservation.ErrCancelled) {
					t.Errorf("pay %s: %v", id, err)
				}
			}()
			go func() {
				defer wg.Done()
				var err error
				if i%2 == 0 {
					_, err = svc.Cancel(ctx, id, users[i])
				} else {
					_, err = svc.OrderCancel(ctx, id, "stock-recount")
				}
				if err != nil && !errors.Is(err, reservation.ErrPaid) {
					t.Errorf("cancel %s: %v", id, err)
				}
			}()
			go func() {
				defer wg.Done()
				if i%4 == 0 {
					if _, err := svc.Sweep(ctx); err != nil {
						t.Errorf("sweep: %v", err)
					}
				}
			}()
		}
		wg.Wait()
		p.sweep()
		npaid := 0
		evs := eventsOf(p, sku)
		for i, id := range ids {
			b := p.status(id)
			switch b["status"] {
			case string(reservation.StatusPaid):
				npaid++
				if !paid[i] {
					t.Errorf("%s PAID but its payment was refused", id)
				}
				if got := fmt.Sprint(evs[id]); got != "[ReservationConfirmed/1 ReservationPaid/2]" {
					t.Errorf("%s PAID with events %s", id, got)
				}
			case string(reservation.StatusCancelled):
				if paid[i] {
					t.Errorf("%s CANCELLED (%v) but its payment was accepted", id, b["reason"])
				}
				if got := fmt.Sprint(evs[id]); got != "[ReservationConfirmed/1 ReservationCancelled/2]" {
					t.Errorf("%s CANCELLED with events %s", id, got)
				}
			default:
				t.Errorf("%s = %v, want PAID or CANCELLED", id, b)
			}
		}
		p.wantStores("after the race", sku, int64(100-npaid), 0, int64(100-npaid))
		t.Logf("%d of %d paid", npaid, n)
	})
}
