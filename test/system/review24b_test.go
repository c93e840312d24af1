package system_test

// The waiting room's second adversarial review (issue 24): each test states
// a claim of docs/design.md's "The waiting room" (or of the issue) that the
// real services break. They fail until the code is fixed.

import (
	"context"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/reservation"
)

// Claims (issue 24, design.md): "When no unit is left and none can return,
// every waiter's next poll says SOLD_OUT. If held units may still return,
// the waiter says so"; "A look answers SOLD_OUT to every waiter once
// available = 0 and held = 0". On a SKU with a pay window a CONFIRMED
// reservation is not the end: unpaid by pay_by, the sweeper times it out
// and its unit comes back. queue.lua counts only HELD units as ones that
// may return, so the moment the last unit is confirmed every waiter hears
// SOLD_OUT (may_return false) — the buyer page stops polling there for
// good (SOLD_OUT is terminal in shop.js) — and when the payment times out
// the unit admits a waiter who was told it never would, whose page is gone:
// the admission lapses unseen, then the next one's, while the unit waits.
func TestReview24bSoldOutWhileAnUnpaidUnitMayReturn(t *testing.T) {
	ctx := context.Background()
	p := newPromise(t)
	svc := p.app.Service
	sku := p.roomSKU(1, 1, 0)
	p.payWindow(sku, time.Minute)
	for _, u := range []string{"a", "b"} {
		if _, err := svc.JoinQueue(ctx, u, sku); err != nil {
			t.Fatal(err)
		}
	}
	r, _, err := svc.Reserve(ctx, reservation.ReserveRequest{SKU: sku, Qty: 1, UserID: "a", Admission: p.admit(sku, "a").Token})
	if err != nil {
		t.Fatal(err)
	}
	p.persistMsgs(r.ID)
	p.wantStatus(r.ID, reservation.StatusConfirmed, "")
	// a has a minute to pay; b waits.
	q, err := svc.QueueStatus(ctx, sku)
	if err != nil {
		t.Fatal(err)
	}
	if q.SoldOut() || !q.MayReturn() {
		t.Errorf("status while a's unit is confirmed, unpaid, within its pay window = sold_out %v may_return %v, want sold_out false, may_return true (the unit returns if a does not pay)",
			q.SoldOut(), q.MayReturn())
	}
	if got, _, _ := svc.Ticket(ctx, "b", sku, svc.TicketOf(sku, "b")); got.State == reservation.TicketSoldOut {
		t.Errorf("b while a's unit may still come back = SOLD_OUT, want WAITING")
	}
	// a does not pay: the unit comes back, and admits b, who was told SOLD_OUT.
	p.clock.Advance(time.Minute + 6*time.Second)
	if rep := p.sweep(); rep.PaymentsTimedOut != 1 {
		t.Fatalf("sweep = %+v, want a's payment timed out", rep)
	}
	if got, _, _ := svc.Ticket(ctx, "b", sku, svc.TicketOf(sku, "b")); got.State != reservation.TicketAdmitted {
		t.Errorf("b after a's payment timed out = %s, want ADMITTED", got.State)
	}
}

// Claim (issue 24, design.md "Cheap polls"): "Polling is cheap: no MySQL,
// at most one Redis call"; the public status "needs no token" and names
// nobody. For a SKU MySQL does not have, QueueStatus skips the unknown-SKU
// memory every other route uses (layoutOf) and warms bucket 0 from MySQL
// on every look. The answer is an error (404 unknown_sku, Cache-Control
// no-store, and the distribution's ErrorCachingMinTTL 0), so the CDN keeps
// none of it: anyone, with no account and no meter, makes MySQL — the
// arbiter of every sale — answer one query per request, at the API's
// whole rate, through the CDN.
func TestReview24bPublicLookOfAnUnknownSKUAsksMySQLOnce(t *testing.T) {
	p := newPromise(t)
	sku := testservices.Name("nosuch")
	const looks = 20
	stmts := p.statements(5, 1, func() {
		for range looks {
			code, body := p.callAs("", "GET", "/skus/"+sku+"/queue", "", nil)
			if code != 404 || body["error"] != "unknown_sku" {
				t.Fatalf("the public status of an unknown sku = %d %v, want 404 unknown_sku", code, body)
			}
		}
	})
	if stmts > 1 {
		t.Errorf("%d anonymous looks at an unknown sku's public status cost MariaDB %d statements, want at most 1 (then the unknown-SKU memory answers)", looks, stmts)
	}
}
