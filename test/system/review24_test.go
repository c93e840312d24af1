package system_test

// Review of the waiting room (issue 24's adversarial review): each test
// states a claim of docs/design.md's "The waiting room" that the real
// services break. They fail until the code is fixed.

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/shared/reservation"
)

// admit returns user's admission token on sku, failing unless ADMITTED.
func (p *promise) admit(sku, user string) reservation.Admission {
	p.t.Helper()
	svc := p.app.Service
	q, a, err := svc.Ticket(context.Background(), user, sku, svc.TicketOf(sku, user))
	if err != nil || q.State != reservation.TicketAdmitted || a.Token == "" {
		p.t.Fatalf("%s's ticket on %s = %+v %v, want ADMITTED with a token", user, sku, q, err)
	}
	return a
}

// roomKeys are the waiting room's keys of sku (queue.lua's KEYS[3..6]).
func roomKeys(sku string) []string {
	tag := "hf:{" + reservation.BucketName(sku, 0) + "}"
	return []string{tag + ":q", tag + ":qm", tag + ":qa", tag + ":qd"}
}

// Claim (redisstore/room.go queueLife): "how long a waiting room's keys
// live after the last join". A crowd that joins before the opening (the
// flash sale the room is for) and nobody after: the queue's sorted set has
// a TTL, but qmeta (through), the admitted set and the done hash are
// created later, by the opening's admission and the reserves, with none.
// They never expire (Redis runs noeviction: every sale leaves them for
// good), and they outlive the queue they index (see the next test).
func TestReview24RoomKeysAllExpire(t *testing.T) {
	ctx := context.Background()
	p := newPromise(t)
	svc := p.app.Service
	sku := p.roomSKU(2, 1, 30*time.Second)
	for _, u := range []string{"a", "b", "c"} {
		if _, err := svc.JoinQueue(ctx, u, sku); err != nil {
			t.Fatal(err)
		}
	}
	p.clock.Advance(30 * time.Second) // the opening; nobody joins after it
	if q, err := svc.QueueStatus(ctx, sku); err != nil || q.Through != 2 {
		t.Fatalf("status at the opening = %+v %v, want two admitted", q, err)
	}
	var first string
	for _, u := range []string{"a", "b", "c"} {
		if q, _, _ := svc.Ticket(ctx, u, sku, svc.TicketOf(sku, u)); q.Position == 1 {
			first = u
		}
	}
	r, _, err := svc.Reserve(ctx, reservation.ReserveRequest{SKU: sku, Qty: 1, UserID: first, Admission: p.admit(sku, first).Token})
	if err != nil {
		t.Fatal(err)
	}
	p.persistMsgs(r.ID)
	for _, k := range roomKeys(sku) {
		ttl, err := p.rdb.PTTL(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if ttl == -2*time.Nanosecond || ttl == -2*time.Millisecond {
			t.Errorf("%s does not exist", k)
			continue
		}
		if ttl < 0 {
			t.Errorf("%s has no TTL (PTTL %v): it outlives the queue's life and is never freed", k, ttl)
		}
	}
}

// Claims: R2 "while a ticket waits and a unit is available, the next look
// admits it"; "Redis loses the room's keys: the queue starts over: waiters
// join again and are queued by arrival". The queue's sorted set expires
// (queueLife after the last join: every join was before the opening) while
// qmeta's through, which has no TTL, stays: through counts places by rank,
// so every ticket that joins afterwards lands at a rank below it and is
// told EXPIRED without ever being admitted, while units wait unsold.
func TestReview24QueueExpiryLeavesThroughBehind(t *testing.T) {
	ctx := context.Background()
	p := newPromise(t)
	svc := p.app.Service
	sku := p.roomSKU(3, 1, 30*time.Second)
	for _, u := range []string{"a", "b", "c"} {
		if _, err := svc.JoinQueue(ctx, u, sku); err != nil {
			t.Fatal(err)
		}
	}
	p.clock.Advance(30 * time.Second)
	if q, err := svc.QueueStatus(ctx, sku); err != nil || q.Through != 3 {
		t.Fatalf("status at the opening = %+v %v, want three admitted", q, err)
	}
	// Nobody buys; the admissions lapse (three units left).
	p.clock.Advance(3 * time.Minute)
	if _, err := svc.QueueStatus(ctx, sku); err != nil {
		t.Fatal(err)
	}
	// The queue's life passes (a week without a join): every key of the SKU
	// that carries a TTL is gone, as Redis expires it.
	p.forgetRetained(sku)
	if q, err := svc.JoinQueue(ctx, "late", sku); err != nil || q.State == reservation.TicketExpired {
		t.Fatalf("a new buyer joining with 3 units unsold = %+v %v, want WAITING or ADMITTED (never admitted, it cannot have expired)", q, err)
	}
	if q, _, err := svc.Ticket(ctx, "late", sku, svc.TicketOf(sku, "late")); err != nil || q.State != reservation.TicketAdmitted {
		t.Errorf("the only waiter with 3 units unsold = %+v %v, want ADMITTED", q, err)
	}
}

// Claims: R3 "tickets are admitted in place order: the pre-opening ones
// shuffled, then arrival"; R2. A second drop on the same SKU: the first
// sale opened and sold out, the admin restocks and sets a later opens_at.
// The new pre-opening tickets get places in [0, 1), before the first
// sale's tickets (places ≥ 2), but through still counts the first sale's
// admissions by rank: at the second opening the lowest new places are
// taken for admitted already (EXPIRED, never admitted), and the first
// sale's RESERVED ticket, pushed past through, is admitted again and eats
// a unit's admission.
func TestReview24SecondDropAdmitsNewTicketsInPlaceOrder(t *testing.T) {
	ctx := context.Background()
	p := newPromise(t)
	svc := p.app.Service
	sku := p.roomSKU(1, 1, 0)
	if _, err := svc.JoinQueue(ctx, "a", sku); err != nil {
		t.Fatal(err)
	}
	r, _, err := svc.Reserve(ctx, reservation.ReserveRequest{SKU: sku, Qty: 1, UserID: "a", Admission: p.admit(sku, "a").Token})
	if err != nil {
		t.Fatal(err)
	}
	p.persistMsgs(r.ID)
	p.wantStores("the first drop sold", sku, 0, 0, 0)

	// The second drop: two units, opening in a minute.
	two := int64(2)
	opens := p.clock.Now().Add(time.Minute)
	if _, err := svc.ChangeStock(ctx, reservation.StockChange{SKU: sku, Add: &two, OpensAt: &opens}); err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{"c", "d"} {
		if q, err := svc.JoinQueue(ctx, u, sku); err != nil || q.State != reservation.TicketWaiting {
			t.Fatalf("%s joins before the second opening = %+v %v", u, q, err)
		}
	}
	p.clock.Advance(time.Minute)
	for _, u := range []string{"c", "d"} {
		q, _, err := svc.Ticket(ctx, u, sku, svc.TicketOf(sku, u))
		if err != nil || q.State != reservation.TicketAdmitted {
			t.Errorf("%s at the second opening (2 units, factor 1, the only waiters) = %s (position %d, through %d) %v, want ADMITTED",
				u, q.State, q.Position, q.Through, err)
		}
	}
	if q, _, _ := svc.Ticket(ctx, "a", sku, svc.TicketOf(sku, "a")); q.State != reservation.TicketReserved {
		t.Errorf("a (reserved in the first drop) = %s, want RESERVED", q.State)
	}
}

// Claim: "[The admission token] fixes the reservation's id (as an
// Idempotency-Key admission:<ticket> would): a retry is a replay by
// construction", and 403 admission_expired's "nothing was held". A buyer
// whose 202 was lost retries with the same token, within its time, after
// Redis lost the SKU (a failover): the stock is warmed, the admitted set is
// gone, and the retry is refused ADMISSION_LAPSED without asking MySQL, which
// has the reservation CONFIRMED. A keyed request is judged against MySQL
// "however long Redis has forgotten the hold"; this one is not, so the buyer
// hears "nothing was held" of a unit they bought, and cannot learn its id
// (it is a MAC under the server's secret).
func TestReview24AdmissionRetryAfterRedisLossIsAReplay(t *testing.T) {
	ctx := context.Background()
	p := newPromise(t)
	svc := p.app.Service
	sku := p.roomSKU(2, 1, 0)
	if _, err := svc.JoinQueue(ctx, "a", sku); err != nil {
		t.Fatal(err)
	}
	a := p.admit(sku, "a")
	req := reservation.ReserveRequest{SKU: sku, Qty: 1, UserID: "a", Admission: a.Token}
	r, _, err := svc.Reserve(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	p.persistMsgs(r.ID)
	p.loseSKU(sku)
	p.clock.Advance(10 * time.Second) // well within the admission's 2 min
	got, replayed, err := svc.Reserve(ctx, req)
	if err != nil || !replayed || got.ID != r.ID || got.Status != reservation.StatusConfirmed {
		t.Errorf("the same request with the same token after a failover = %+v replayed %v %v, want the CONFIRMED %s replayed", got, replayed, err, r.ID)
	}
	if errors.Is(err, reservation.ErrAdmissionExpired) {
		code, body := p.callAs("a", "POST", "/reservations", `{"sku":"`+sku+`","qty":1}`, map[string]string{"Admission-Token": a.Token})
		if msg, _ := body["message"].(string); strings.Contains(msg, "nothing was held") {
			t.Errorf("over HTTP: %d %v: says nothing was held, while MySQL has %s CONFIRMED", code, body, r.ID)
		}
	}
	p.wantAgree("after the retry", sku, 1)
}

// Claim: "a retry is a replay by construction" (and the buyer page's
// "Busy; press Buy again (it cannot buy twice)"). A buyer buys near the end
// of the admission; the 202 is lost (a network error: status 0 on the page);
// they press Buy again once the token's time has passed. Go refuses the
// token as expired before the id it fixes is looked at, so the answer is 403
// admission_expired, "nothing was held" (the page: "Your turn passed
// unused."), of a reservation MySQL has CONFIRMED, whose id the buyer cannot
// compute. Note: TestWaitingRoom asserts this refusal for a used admission
// after its time; the answer it gives is still false about the hold.
func TestReview24AdmissionRetryAfterItsTimeAnswersTheReservation(t *testing.T) {
	ctx := context.Background()
	p := newPromise(t)
	svc := p.app.Service
	sku := p.roomSKU(2, 1, 0)
	if _, err := svc.JoinQueue(ctx, "a", sku); err != nil {
		t.Fatal(err)
	}
	a := p.admit(sku, "a")
	p.clock.Advance(a.Expires.Sub(p.clock.Now()) - time.Second) // the buyer presses Buy 1 s before the end
	req := reservation.ReserveRequest{SKU: sku, Qty: 1, UserID: "a", Admission: a.Token}
	r, _, err := svc.Reserve(ctx, req) // its 202 never reaches the buyer
	if err != nil {
		t.Fatal(err)
	}
	p.persistMsgs(r.ID)
	p.clock.Advance(2 * time.Second) // Buy again
	code, body := p.callAs("a", "POST", "/reservations", `{"sku":"`+sku+`","qty":1}`, map[string]string{"Admission-Token": a.Token})
	if code != 200 || body["reservation_id"] != r.ID || body["status"] != string(reservation.StatusConfirmed) {
		t.Errorf("the same request retried 1 s after the token's time = %d %v, want 200 with the CONFIRMED %s", code, body, r.ID)
	}
}
