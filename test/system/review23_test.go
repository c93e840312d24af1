package system_test

// The twenty-third review's findings against the order-service operations
// (pay, the order service's cancel, the payment timeout, the pay window).
// Each test fails while its hole is open.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/reservation"
)

// payByOf reads a row's pay_by (zero: NULL).
func (p *promise) payByOf(id string) time.Time {
	p.t.Helper()
	var t sql.NullTime
	if err := p.db.QueryRow(`SELECT pay_by FROM reservations WHERE reservation_id = ?`, id).Scan(&t); err != nil {
		p.t.Fatalf("pay_by of %s: %v", id, err)
	}
	return t.Time
}

// The order service's cancel of a transfer between buckets' row: Ledger.Pay
// refuses a transfer (not found), but OrderCancel finds a CONFIRMED row and refunds it —
// a transfer moves units between buckets, never out of the SKU, so its
// "refund" puts units back into MySQL's available that no buyer ever took:
// MySQL would sell them (oversell), and the ledger audit mismatches.
func TestReview23OrderCancelRefundsATransfer(t *testing.T) {
	ctx := context.Background()
	p := newPromise(t)
	const k = 2
	sku, xfer := p.soldOutThroughATransfer("r23xfer", k)
	row, err := p.app.Service.OrderCancel(ctx, xfer, "bogus")
	t.Logf("order cancel of transfer %s = %s %s, %v", xfer, row.Status, row.Reason, err)
	if m := p.mysqlAvailable(sku); m != 0 {
		t.Errorf("MySQL available %d after the order service's cancel of a transfer's id, want 0: units no buyer returned", m)
	}
	if st, reason, refunded := p.row(xfer); st != string(reservation.StatusConfirmed) || refunded {
		t.Errorf("the transfer's row is %s %s refunded=%v, want it untouched (CONFIRMED)", st, reason, refunded)
	}
	p.sweep()
	sold := 0
	for i := range 4 {
		if code, _ := p.reserve(sku, userIn(fmt.Sprint("late", i), i%k, k), 1, ""); code == 202 {
			sold++
		}
	}
	if sold > 0 {
		t.Errorf("%d more units sold of a SKU of 4 already sold out", sold)
	}
}

// soldOutThroughATransfer sells a SKU of 4 units over k = 2 buckets to
// four buyers of bucket 1 (it runs dry and is refilled by a transfer from
// bucket 0), settles everything, and returns the SKU and the transfer's id.
func (p *promise) soldOutThroughATransfer(prefix string, k int) (sku, xfer string) {
	p.t.Helper()
	sku = testservices.Name(prefix)
	p.stack.createSKU(sku, 4, k)
	var ids []string
	for i := 0; i < 4; i++ {
		ids = append(ids, p.reserved(sku, userIn(fmt.Sprint("a", i), 1, k), 1, ""))
	}
	p.persistAll(p.rec)
	p.sweep()
	if err := p.db.QueryRow(`SELECT reservation_id FROM reservations WHERE sku = ? AND into_bucket IS NOT NULL LIMIT 1`, sku).Scan(&xfer); err != nil {
		p.t.Fatalf("no transfer row for %s (%v): %v", sku, ids, err)
	}
	if m := p.mysqlAvailable(sku); m != 0 {
		p.t.Fatalf("MySQL available %d after four buys of a SKU of 4, want 0", m)
	}
	return sku, xfer
}

// POST /admin/reservations/{id}/paid of a transfer's id: Ledger.Pay
// answers not found (a transfer is no buyer's), but Service.Pay then finds
// the transfer's hold in Redis and answers 409 not_confirmed ("still HELD:
// MySQL has not confirmed it yet") for a row MySQL recorded long ago and
// that never becomes payable: an order service that retries not_confirmed
// retries for ever. It is no reservation: 404.
func TestReview23PayOfATransferIsNotConfirmed(t *testing.T) {
	p := newPromise(t)
	_, xfer := p.soldOutThroughATransfer("r23xpay", 2)
	if _, err := p.app.Service.Pay(context.Background(), xfer); !errors.Is(err, reservation.ErrNotFound) {
		t.Errorf("pay of a transfer = %v, want ErrNotFound", err)
	}
}

// A group that filled in time but whose formation MySQL recorded late (a
// blip at the last join's reserve and at the first member's persist; the
// sweeper records it at the deadline) opens its members' pay windows at the
// time Redis filled it (FormGroup's formedAt), not when it formed in MySQL:
// a member who could not pay before (409 group_not_formed) gets a deadline
// already past, and the next sweep times her out (payment_timeout) — she
// never had a moment to pay.
func TestReview23LateFormationOpensAPayWindowAlreadyPast(t *testing.T) {
	ctx := context.Background()
	var blip atomic.Bool
	p := newPromise(t, withHooks(reservation.Hooks{RecordFormed: func(reservation.Group) error {
		if blip.Load() {
			return errInjected
		}
		return nil
	}}))
	sku := testservices.Name("r23late")
	p.createSKU(sku, 10, 0)
	p.payWindow(sku, time.Minute)
	gid := p.group(sku, 2, 600)
	blip.Store(true)
	ann := p.joined(sku, gid, "ann")
	p.joined(sku, gid, "bob") // the last slot; recording FORMED fails
	p.persistMsgs(ann)        // recording FORMED fails again; bob's message lags
	if st, _, _ := p.groupState(gid); st != string(reservation.GroupOpen) {
		t.Fatalf("group %s before the deadline, want OPEN in MySQL", st)
	}
	if _, err := p.app.Service.Pay(ctx, ann); !errors.Is(err, reservation.ErrGroupNotFormed) {
		t.Fatalf("pay before formation = %v, want ErrGroupNotFormed", err)
	}
	blip.Store(false)
	p.clock.Advance(10*time.Minute + 3*time.Second)
	p.sweep() // the deadline: the group filled in time, so it forms
	formedAt := p.clock.Now()
	if st, _, _ := p.groupState(gid); st != string(reservation.GroupFormed) {
		t.Fatalf("group %s after its deadline, want FORMED", st)
	}
	if payBy := p.payByOf(ann); payBy.Before(formedAt) {
		t.Errorf("ann's pay window opened at the group's formation (%s) already closed: pay_by %s", formedAt.Format(time.RFC3339), payBy.Format(time.RFC3339))
	}
	p.clock.Advance(time.Second)
	p.sweep()
	if b := p.status(ann); b["status"] != string(reservation.StatusConfirmed) {
		t.Errorf("ann, a member of a group formed a second ago with a one-minute pay window: %v, want CONFIRMED (payable)", b)
	}
}

// A SKU with no pay window when its group formed: its members are
// confirmed without one. The admin then sets a window; a late member's
// persist (its message came after formation) opens the windows of every
// member of the FORMED group without one (startPayWindows), the earlier
// member's included: a window moved under a buyer confirmed before the
// change ("A change applies to later confirmations. A confirmed row keeps
// the pay_by it was given"), and the sweeper then times her out.
func TestReview23LateMemberOpensAWindowUnderAnEarlierMember(t *testing.T) {
	p := newPromise(t)
	sku := testservices.Name("r23lm")
	p.createSKU(sku, 10, 0)
	gid := p.group(sku, 2, 600)
	ann := p.joined(sku, gid, "ann")
	bob := p.joined(sku, gid, "bob") // the last slot: reserve records FORMED
	if st, _, _ := p.groupState(gid); st != string(reservation.GroupFormed) {
		t.Fatalf("group %s after its last join, want FORMED", st)
	}
	p.persistMsgs(ann)
	if payBy := p.payByOf(ann); !payBy.IsZero() {
		t.Fatalf("ann confirmed with pay_by %s while the SKU has no pay window", payBy)
	}
	p.payWindow(sku, time.Minute) // a change: for later confirmations
	p.persistMsgs(bob)            // a later confirmation: bob's window opens
	if payBy := p.payByOf(bob); payBy.IsZero() {
		t.Errorf("bob, confirmed after the change, has no pay window")
	}
	if payBy := p.payByOf(ann); !payBy.IsZero() {
		t.Errorf("ann, confirmed before the window was set, now has pay_by %s", payBy.Format(time.RFC3339))
	}
	p.clock.Advance(2 * time.Minute)
	p.sweep()
	p.wantStatus(ann, reservation.StatusConfirmed, "")
}

// A join's payment deadline reaches the order service exactly once, by a
// rule it can apply (design.md, "Payment"): its ReservationConfirmed's
// pay_by when it has one (confirmed with its group formed), else its
// GroupFormed's (confirmed before the formation). The review found
// GroupFormed announcing one deadline for members whose windows opened
// later, at their own persist; held here in both orders: the formation
// recorded before the members' persist (at the last join's reserve), and a
// member persisted before it.
func TestReview23GroupFormedPayByIsNotItsMembers(t *testing.T) {
	for _, first := range []bool{false, true} {
		t.Run(fmt.Sprintf("a member persisted before the formation: %v", first), func(t *testing.T) {
			p := newPromise(t)
			sku := testservices.Name("r23gf")
			p.createSKU(sku, 10, 0)
			p.payWindow(sku, time.Minute)
			gid := p.group(sku, 2, 600)
			ann := p.joined(sku, gid, "ann")
			if first {
				p.persistMsgs(ann)
				p.clock.Advance(10 * time.Second)
			}
			bob := p.joined(sku, gid, "bob")  // reserve records FORMED now
			p.clock.Advance(30 * time.Second) // persist lags
			if !first {
				p.persistMsgs(ann)
			}
			p.persistMsgs(bob)
			confirmed := map[string]*time.Time{}
			var formed *time.Time
			seen := false
			for _, e := range p.drain() {
				switch {
				case e.Detail.Type == reservation.EventGroupFormed && e.Detail.AggregateID == gid:
					formed, seen = e.Detail.PayBy, true
				case e.Detail.Type == reservation.EventConfirmed:
					confirmed[e.Detail.AggregateID] = e.Detail.PayBy
				}
			}
			if !seen {
				t.Fatalf("no GroupFormed event for %s", gid)
			}
			for _, id := range []string{ann, bob} {
				told := confirmed[id]
				if told == nil {
					told = formed
				}
				if got := p.payByOf(id); told == nil || !got.Equal(*told) {
					t.Errorf("member %s must pay by %s; its events said %v (confirmed %v, formed %v)", id, got.Format(time.RFC3339Nano), told, confirmed[id], formed)
				}
			}
		})
	}
}

// Two sweeps at once (design: "two sweeps at once do no harm") both list
// the same due payment; one refunds it, and the other finds it CANCELLED
// payment_timeout and counts it too: payments_timed_out says 2 for one
// reservation.
func TestReview23TwoSweepsCountOneTimeoutTwice(t *testing.T) {
	ctx := context.Background()
	p := newPromise(t)
	sku := testservices.Name("r23two")
	p.createSKU(sku, 10, 0)
	p.payWindow(sku, time.Minute)
	id := p.reserved(sku, "ann", 1, "")
	p.persistMsgs(id)
	p.clock.Advance(time.Minute + 3*time.Second)
	release := p.lockRow(`SELECT qty FROM reservations WHERE reservation_id = ? FOR UPDATE`, id)
	var wg sync.WaitGroup
	reps := make([]reservation.SweepReport, 2)
	for i := range reps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rep, err := p.app.Service.Sweep(ctx)
			if err != nil {
				t.Errorf("sweep: %v", err)
			}
			reps[i] = rep
		}()
	}
	testservices.Eventually(t, 20*time.Second, "both sweeps wait on the row's lock", func() bool {
		return p.count(`SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'INNODB_ROW_LOCK_CURRENT_WAITS'`) >= 2
	})
	release()
	wg.Wait()
	p.wantStatus(id, reservation.StatusCancelled, reservation.ReasonPaymentTimeout)
	if n := reps[0].PaymentsTimedOut + reps[1].PaymentsTimedOut; n != 1 {
		t.Errorf("two sweeps counted %d payment timeouts (%d + %d) of one reservation, want 1", n, reps[0].PaymentsTimedOut, reps[1].PaymentsTimedOut)
	}
	p.wantStores("timed out", sku, 10, 0, 10)
}
