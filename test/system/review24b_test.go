package system_test

// The waiting room's second adversarial review (issue 24): each test states
// a claim of docs/design.md's "The waiting room" (or of the issue) that the
// real services break. They fail until the code is fixed.

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/holdfast/holdfast/internal/devstack"
	"github.com/holdfast/holdfast/internal/samtemplate"
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

// The same claim, against a crowd of made-up SKUs: a SKU name costs
// nothing to invent, and a memory of unknown SKUs (per name, per instance)
// cannot cover names never asked before. Each anonymous look at a new name
// is a Lambda invocation, a miss at every edge (a new path) and MySQL's
// statements: the public route, which needs no account and has no meter,
// lets anyone load the arbiter at the API's whole rate. (GET /skus/{sku}
// does the same, but behind a JWT.)
func TestReview24bPublicLooksAtMadeUpSKUsAskMySQLNothing(t *testing.T) {
	p := newPromise(t)
	const looks = 20
	stmts := p.statements(5, 0, func() {
		for range looks {
			if code, body := p.callAs("", "GET", "/skus/"+testservices.Name("made")+"/queue", "", nil); code != 404 {
				t.Fatalf("the public status of a made-up sku = %d %v, want 404", code, body)
			}
		}
	})
	if stmts > 0 {
		t.Errorf("%d anonymous looks at made-up skus' public status cost MariaDB %d statements, want 0 (polls cost no MySQL)", looks, stmts)
	}
}

// Claims (design.md, the admission rule): "So at factor 1 the admitted who
// have not reserved never outnumber the units available"; the fix it
// records: "at factor 1 … a buyer behind another could take the last unit
// first". The rule counts buyers against units, but the admission token
// does not bind a quantity: at factor 1 with 2 units, places 1 and 2 are
// admitted, one unit each; place 2 reserves qty 2 (no per-user limit, or
// one of 2) before place 1 clicks, and place 1 — admitted for a unit —
// hears sold_out. A scalper behind a buyer takes the unit the room
// admitted the buyer for, and the room admitted more buyers than the stock
// could serve.
func TestReview24bABuyerBehindCannotTakeTheUnitOfTheOneAhead(t *testing.T) {
	ctx := context.Background()
	p := newPromise(t)
	svc := p.app.Service
	sku := p.roomSKU(2, 1, 0)
	for _, u := range []string{"first", "scalper"} {
		if _, err := svc.JoinQueue(ctx, u, sku); err != nil {
			t.Fatal(err)
		}
	}
	if q, _, _ := svc.Ticket(ctx, "first", sku, svc.TicketOf(sku, "first")); q.Position != 1 || q.State != reservation.TicketAdmitted {
		t.Fatalf("first = %+v, want place 1, ADMITTED", q)
	}
	r, _, err := svc.Reserve(ctx, reservation.ReserveRequest{SKU: sku, Qty: 2, UserID: "scalper", Admission: p.admit(sku, "scalper").Token})
	if err == nil {
		p.persistMsgs(r.ID)
		t.Errorf("place 2, admitted at factor 1 for one of 2 units, reserved qty 2 (%s): the unit of place 1 went with it", r.ID)
	}
	if r, _, err := svc.Reserve(ctx, reservation.ReserveRequest{SKU: sku, Qty: 1, UserID: "first", Admission: p.admit(sku, "first").Token}); err != nil {
		t.Errorf("place 1, admitted at factor 1, buys one unit = %v, want a hold", err)
	} else {
		p.persistMsgs(r.ID)
	}
}

// Claims (issue 24): "Design it so that 100,000 waiters polling every
// second do not mean 100,000 Lambda invocations a second"; design.md "Cheap
// polls": the public status is "one answer for everyone", cached a second.
// Only a 200 is: every error of the public route is Cache-Control no-store
// (httpapi's noStore), and the distribution keeps none (ErrorCachingMinTTL
// 0, which make dev's gateway mirrors). So whenever the public status is an
// error for everyone — the admin turned the room off mid-sale (404
// no_waiting_room, which the page's poll ignores and polls again, each
// second, for ever), Redis is unreachable (503), the SKU is unknown — every
// waiter's every poll is a Lambda invocation: 100,000 a second against an
// API throttled at 5,000 (ApiThrottleRate), which then refuses the buyers'
// reserves and joins too. Through make dev's gateway (the CDN's stand-in)
// on the real handler.
func TestReview24bAnErrorOfThePublicStatusIsNotAnInvocationPerPoll(t *testing.T) {
	ctx := context.Background()
	p := newPromise(t)
	sku := p.roomSKU(5, 1, 0)
	tpl, err := samtemplate.Load("../../template.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var invocations atomic.Int64
	fn := func(ctx context.Context, ev events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
		if ev.RouteKey == "GET /skus/{sku}/queue" {
			invocations.Add(1)
		}
		return p.api.Handle(ctx, ev)
	}
	srv := httptest.NewServer(devstack.Gateway(fn, tpl.Routes(), nil, slog.New(slog.DiscardHandler)))
	defer srv.Close()
	get := func() int {
		resp, err := http.Get(srv.URL + "/skus/" + sku + "/queue")
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	polls := func(want int) (n int64, took time.Duration) {
		before, start := invocations.Load(), time.Now()
		for range 20 {
			if code := get(); code != want {
				t.Fatalf("a poll = %d, want %d", code, want)
			}
		}
		return invocations.Load() - before, time.Since(start)
	}
	if n, took := polls(200); n > 1+int64(took/time.Second) {
		t.Fatalf("20 polls of the room's status in %v reached the API %d times (a 200: cached)", took, n)
	}
	// The admin turns the room off mid-sale (to sell directly).
	off := false
	if _, err := p.app.Service.ChangeStock(ctx, reservation.StockChange{SKU: sku, Add: new(int64), WaitingRoom: &off}); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(5 * time.Second); get() != 404; { // the edge's second passes
		if time.Now().After(end) {
			t.Fatal("the public status still answers 200 5 s after the room was turned off")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n, took := polls(404); n > 1+int64(took/time.Second) {
		t.Errorf("20 polls of a room turned off (404 no_waiting_room, the same for everyone) in %v reached the API %d times, want at most %d (kept a second, as a 200 is)",
			took, n, 1+int64(took/time.Second))
	}
}

// Claims: R2 "no undersell while buyers wait"; "Tickets still waiting from
// the earlier round come first" (design.md, "Rounds"); a SOLD_OUT look
// means "no unit is left and none can return". A first drop sells out and
// tells its waiters SOLD_OUT (the page's end: it stops polling, the buyer
// leaves). A second drop on the SKU (a restock with a new opening) puts
// every one of those tickets ahead of the buyers who came for it: each is
// admitted in turn to a page nobody watches and lapses after AdmitFor, so
// the second drop's buyer waits for every leftover to lapse (here 3 × 2
// min for 1 unit; 99,500 leftovers of a 500-unit first drop hold a
// 500-unit second drop up for 199 × 2 min, over six hours) while its units
// sit unsold.
func TestReview24bASecondDropDoesNotWaitBehindTicketsToldSoldOut(t *testing.T) {
	ctx := context.Background()
	p := newPromise(t)
	svc := p.app.Service
	sku := p.roomSKU(1, 1, 0)
	for _, u := range []string{"a", "b", "c", "d"} {
		if _, err := svc.JoinQueue(ctx, u, sku); err != nil {
			t.Fatal(err)
		}
	}
	r, _, err := svc.Reserve(ctx, reservation.ReserveRequest{SKU: sku, Qty: 1, UserID: "a", Admission: p.admit(sku, "a").Token})
	if err != nil {
		t.Fatal(err)
	}
	p.persistMsgs(r.ID)
	for _, u := range []string{"b", "c", "d"} {
		if q, _, _ := svc.Ticket(ctx, u, sku, svc.TicketOf(sku, u)); q.State != reservation.TicketSoldOut {
			t.Fatalf("%s after the first drop sold out = %s, want SOLD_OUT", u, q.State)
		}
	}
	// The second drop: one unit, opening in a minute; e comes for it.
	one := int64(1)
	opens := p.clock.Now().Add(time.Minute)
	if _, err := svc.ChangeStock(ctx, reservation.StockChange{SKU: sku, Add: &one, OpensAt: &opens}); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.JoinQueue(ctx, "e", sku); err != nil {
		t.Fatal(err)
	}
	p.clock.Advance(time.Minute)
	var waited time.Duration
	for ; waited <= 10*time.Minute; waited += 10 * time.Second {
		if q, _, _ := svc.Ticket(ctx, "e", sku, svc.TicketOf(sku, "e")); q.State == reservation.TicketAdmitted {
			break
		}
		p.clock.Advance(10 * time.Second)
	}
	if waited > 0 {
		t.Errorf("e, the second drop's only buyer, was admitted %v after its opening (the unit waited for the admissions of b, c and d, told SOLD_OUT by the first drop, to lapse), want at the opening", waited)
	}
}
