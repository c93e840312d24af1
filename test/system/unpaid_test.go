package system_test

// A waiting room's units that may return unpaid: a CONFIRMED reservation
// within its pay window returns if the window lapses, so the room counts it
// until it is paid or cancelled, and Redis rebuilds the count from MySQL
// after a loss (docs/design.md, "The waiting room").

import (
	"context"
	"testing"
	"time"

	"github.com/holdfast/holdfast/shared/reservation"
)

// unpaidRoom is a one-unit room SKU with a minute's pay window whose unit a
// holds CONFIRMED and unpaid, b waiting; it returns the SKU and a's id.
func (p *promise) unpaidRoom() (sku, id string) {
	p.t.Helper()
	ctx := context.Background()
	svc := p.app.Service
	sku = p.roomSKU(1, 1, 0)
	p.payWindow(sku, time.Minute)
	for _, u := range []string{"a", "b"} {
		if _, err := svc.JoinQueue(ctx, u, sku); err != nil {
			p.t.Fatal(err)
		}
	}
	r, _, err := svc.Reserve(ctx, reservation.ReserveRequest{SKU: sku, Qty: 1, UserID: "a", Admission: p.admit(sku, "a").Token})
	if err != nil {
		p.t.Fatal(err)
	}
	p.persistMsgs(r.ID)
	p.wantStatus(r.ID, reservation.StatusConfirmed, "")
	return sku, r.ID
}

// wantRoom checks the room's public status: units available, unpaid, and
// whether it says SOLD_OUT.
func (p *promise) wantRoom(sku, when string, available, unpaid int64, soldOut bool) {
	p.t.Helper()
	q, err := p.app.Service.QueueStatus(context.Background(), sku)
	if err != nil {
		p.t.Fatalf("status %s: %v", when, err)
	}
	if q.Available != available || q.Unpaid != unpaid || q.SoldOut() != soldOut || q.MayReturn() != (available <= 0 && unpaid > 0) {
		p.t.Errorf("status %s = available %d unpaid %d sold_out %v may_return %v, want available %d unpaid %d sold_out %v",
			when, q.Available, q.Unpaid, q.SoldOut(), q.MayReturn(), available, unpaid, soldOut)
	}
}

func TestWaitingRoomUnpaidUnits(t *testing.T) {
	ctx := context.Background()

	t.Run("a paid unit no longer may return: SOLD_OUT, and paying again changes nothing", func(t *testing.T) {
		p := newPromise(t)
		sku, id := p.unpaidRoom()
		p.wantRoom(sku, "while a's unit is unpaid", 0, 1, false)
		for range 2 { // the order service's retry is a repeat
			if _, err := p.app.Service.Pay(ctx, id); err != nil {
				t.Fatal(err)
			}
			p.wantRoom(sku, "after a paid", 0, 0, true)
		}
	})

	t.Run("a cancelled unpaid unit returns once and admits the next", func(t *testing.T) {
		p := newPromise(t)
		sku, id := p.unpaidRoom()
		for range 2 { // a repeated cancel changes nothing
			if _, err := p.app.Service.OrderCancel(ctx, id, "fraud"); err != nil {
				t.Fatal(err)
			}
		}
		p.wantRoom(sku, "after the order service cancelled a's", 1, 0, false)
		if got, _, _ := p.app.Service.Ticket(ctx, "b", sku, p.app.Service.TicketOf(sku, "b")); got.State != reservation.TicketAdmitted {
			t.Errorf("b after a's unit came back = %s, want ADMITTED", got.State)
		}
	})

	t.Run("Redis loses the SKU: the warm-up rebuilds the units that may return from MySQL", func(t *testing.T) {
		p := newPromise(t)
		sku, id := p.unpaidRoom()
		p.loseSKU(sku)
		if _, err := p.app.Service.JoinQueue(ctx, "c", sku); err != nil { // warms the SKU from MySQL
			t.Fatal(err)
		}
		p.wantRoom(sku, "after the warm-up", 0, 1, false)
		if _, err := p.app.Service.Pay(ctx, id); err != nil {
			t.Fatal(err)
		}
		p.wantRoom(sku, "after a paid", 0, 0, true)
		// Lost again: the warm-up reads a paid row, which cannot return.
		p.loseSKU(sku)
		if _, err := p.app.Service.JoinQueue(ctx, "c", sku); err != nil {
			t.Fatal(err)
		}
		p.wantRoom(sku, "after a second warm-up", 0, 0, true)
	})

	t.Run("a payment Redis never heard of: the sweep makes Redis follow MySQL's paid row, and the room says SOLD_OUT", func(t *testing.T) {
		p := newPromise(t)
		sku, id := p.unpaidRoom()
		if _, err := p.app.Service.Pay(ctx, id); err != nil {
			t.Fatal(err)
		}
		// What a payment whose Redis call failed, never retried, leaves.
		tag := "hf:{" + sku + "}"
		if err := p.rdb.HSet(ctx, tag+":unpaid", id, 1).Err(); err != nil {
			t.Fatal(err)
		}
		if err := p.rdb.HIncrBy(ctx, tag+":meta", "unpaid", 1).Err(); err != nil {
			t.Fatal(err)
		}
		p.wantRoom(sku, "with the payment unheard", 0, 1, false)
		for want := 1; want >= 0; want-- { // a second sweep finds nothing to settle
			if rep := p.sweep(); rep.UnpaidSettled != want {
				t.Errorf("sweep settled %d unpaid, want %d", rep.UnpaidSettled, want)
			}
			p.wantRoom(sku, "after the sweep", 0, 0, true)
		}
	})

	t.Run("Redis loses the SKU, then the payment times out: the unit returns once", func(t *testing.T) {
		p := newPromise(t)
		sku, _ := p.unpaidRoom()
		p.loseSKU(sku)
		if _, err := p.app.Service.JoinQueue(ctx, "c", sku); err != nil {
			t.Fatal(err)
		}
		p.clock.Advance(time.Minute + 6*time.Second)
		if rep := p.sweep(); rep.PaymentsTimedOut != 1 {
			t.Fatalf("sweep = %+v, want a's payment timed out", rep)
		}
		p.wantRoom(sku, "after a's payment timed out", 1, 0, false)
		if a, _ := p.redisStock(sku); a != p.mysqlAvailable(sku) {
			t.Errorf("Redis available %d, MySQL %d: want the unit back once in each", a, p.mysqlAvailable(sku))
		}
	})
}
