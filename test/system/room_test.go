package system_test

// The waiting room: buyers queue, are admitted in order while the stock can
// serve them, buy with their admission, and hear SOLD_OUT once nothing is
// left and nothing can return. Against the real Redis and MariaDB.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/reservation"
	"github.com/redis/go-redis/v9"
)

// redisCalls counts the commands a client sends (a pipeline's each).
type redisCalls struct{ n atomic.Int64 }

func (c *redisCalls) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}

func (c *redisCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { c.n.Add(1); return next(ctx, cmd) }
}

func (c *redisCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { c.n.Add(int64(len(cmds))); return next(ctx, cmds) }
}

// roomSKU creates a SKU of stock units with a waiting room of factor and
// a sale opening opensIn from the stack's clock.
func (p *promise) roomSKU(stock int64, factor float64, opensIn time.Duration) string {
	p.t.Helper()
	sku := testservices.Name("room")
	on := true
	opens := p.clock.Now().Add(opensIn)
	c := reservation.StockChange{SKU: sku, Set: &stock, WaitingRoom: &on, AdmitFactor: &factor, OpensAt: &opens}
	if l, err := p.app.Service.ChangeStock(context.Background(), c); err != nil || !l.WaitingRoom() {
		p.t.Fatalf("create %s with a waiting room = %+v %v", sku, l, err)
	}
	return sku
}

func TestWaitingRoom(t *testing.T) {
	ctx := context.Background()

	t.Run("admitted in order while the stock can serve them; the rest hear sold out", func(t *testing.T) {
		p := newPromise(t)
		svc := p.app.Service
		sku := p.roomSKU(3, 1, 30*time.Second)
		users := []string{"u0", "u1", "u2", "u3", "u4", "u5"}
		for _, u := range users {
			q, err := svc.JoinQueue(ctx, u, sku)
			if err != nil || q.State != reservation.TicketWaiting || q.Position != 0 {
				t.Fatalf("join %s before the opening = %+v %v, want WAITING without a position", u, q, err)
			}
		}
		if q, err := svc.JoinQueue(ctx, "u0", sku); err != nil || q.Length != 6 || q.Ticket != svc.TicketOf(sku, "u0") {
			t.Fatalf("joining again = %+v %v, want the same ticket", q, err)
		}
		p.clock.Advance(30 * time.Second) // the opening
		if _, _, err := svc.Reserve(ctx, reservation.ReserveRequest{SKU: sku, Qty: 1, UserID: "u0"}); !errors.Is(err, reservation.ErrAdmissionRequired) {
			t.Errorf("a reserve without admission = %v, want ErrAdmissionRequired", err)
		}
		order := make([]string, len(users))
		admission := map[string]reservation.Admission{}
		for _, u := range users {
			q, a, err := svc.Ticket(ctx, u, sku, svc.TicketOf(sku, u))
			if err != nil || q.Position < 1 || q.Position > 6 {
				t.Fatalf("%s after the opening = %+v %v", u, q, err)
			}
			order[q.Position-1] = u
			if q.State == reservation.TicketAdmitted {
				admission[u] = a
			}
		}
		// The first three places are admitted (3 units × factor 1), the rest wait.
		for i, u := range order {
			if _, ok := admission[u]; ok != (i < 3) {
				t.Errorf("place %d (%s) admitted %v, want %v", i+1, u, ok, i < 3)
			}
		}
		if _, _, err := svc.Ticket(ctx, order[0], sku, svc.TicketOf(sku, order[1])); !errors.Is(err, reservation.ErrUnknownTicket) {
			t.Errorf("another buyer's ticket = %v, want ErrUnknownTicket", err)
		}
		if _, _, err := svc.Reserve(ctx, reservation.ReserveRequest{SKU: sku, Qty: 1, UserID: order[3], Admission: admission[order[0]].Token}); !errors.Is(err, reservation.ErrAdmissionInvalid) {
			t.Errorf("another buyer's admission = %v, want ErrAdmissionInvalid", err)
		}
		// The first two buy (the second twice: a replay); the third lets its admission lapse.
		var ids []string
		for _, u := range order[:2] {
			r, replayed, err := svc.Reserve(ctx, reservation.ReserveRequest{SKU: sku, Qty: 1, UserID: u, Admission: admission[u].Token})
			if err != nil || replayed {
				t.Fatalf("%s buys = %+v %v %v", u, r, replayed, err)
			}
			ids = append(ids, r.ID)
		}
		if r, replayed, err := svc.Reserve(ctx, reservation.ReserveRequest{SKU: sku, Qty: 1, UserID: order[1], Admission: admission[order[1]].Token}); err != nil || !replayed || r.ID != ids[1] {
			t.Errorf("the admission's retry = %+v %v %v, want a replay of %s", r, replayed, err, ids[1])
		}
		p.persistMsgs(ids...)
		p.wantStores("two sold", sku, 1, 0, 1)
		q, err := svc.QueueStatus(ctx, sku)
		if err != nil || q.Through != 3 {
			t.Fatalf("status = %+v %v, want 3 admitted (one unit left, one admission outstanding)", q, err)
		}
		p.clock.Advance(3 * time.Minute) // past the third's admission (2 min)
		q, err = svc.QueueStatus(ctx, sku)
		if err != nil || q.Through != 4 {
			t.Fatalf("after the lapse = %+v %v, want the fourth admitted", q, err)
		}
		if got, _, _ := svc.Ticket(ctx, order[2], sku, svc.TicketOf(sku, order[2])); got.State != reservation.TicketExpired {
			t.Errorf("the third = %s, want EXPIRED", got.State)
		}
		if _, _, err := svc.Reserve(ctx, reservation.ReserveRequest{SKU: sku, Qty: 1, UserID: order[2], Admission: admission[order[2]].Token}); !errors.Is(err, reservation.ErrAdmissionExpired) {
			t.Errorf("a lapsed admission = %v, want ErrAdmissionExpired", err)
		}
		_, a, err := svc.Ticket(ctx, order[3], sku, svc.TicketOf(sku, order[3]))
		if err != nil || a.Token == "" {
			t.Fatalf("the fourth's admission = %+v %v", a, err)
		}
		r, _, err := svc.Reserve(ctx, reservation.ReserveRequest{SKU: sku, Qty: 1, UserID: order[3], Admission: a.Token})
		if err != nil {
			t.Fatalf("the fourth buys: %v", err)
		}
		p.persistMsgs(r.ID)
		p.wantStores("sold out", sku, 0, 0, 0)
		for _, u := range order[4:] {
			got, _, err := svc.Ticket(ctx, u, sku, svc.TicketOf(sku, u))
			if err != nil || got.State != reservation.TicketSoldOut || !got.SoldOut() {
				t.Errorf("%s after the last unit = %+v %v, want SOLD_OUT", u, got, err)
			}
		}
	})

	t.Run("a look costs one Redis command and no MySQL statement", func(t *testing.T) {
		p := newPromise(t)
		svc := p.app.Service
		sku := p.roomSKU(5, 2, 0)
		for i := range 20 {
			if _, err := svc.JoinQueue(ctx, fmt.Sprint("w", i), sku); err != nil {
				t.Fatal(err)
			}
		}
		calls := &redisCalls{}
		p.app.Redis.AddHook(calls)
		ticket := svc.TicketOf(sku, "w7")
		var looks int64 = 50
		stmts := p.statements(5, 0, func() {
			before := calls.n.Load()
			for range looks / 2 {
				if _, err := svc.QueueStatus(ctx, sku); err != nil {
					t.Fatal(err)
				}
				if _, _, err := svc.Ticket(ctx, "w7", sku, ticket); err != nil {
					t.Fatal(err)
				}
			}
			if n := calls.n.Load() - before; n != looks {
				t.Errorf("%d looks sent %d Redis commands, want one each", looks, n)
			}
		})
		if stmts != 0 {
			t.Errorf("looks cost MariaDB %d statements, want 0", stmts)
		}
	})

	t.Run("units that come back admit the next in line, through the sweeper too", func(t *testing.T) {
		p := newPromise(t)
		svc := p.app.Service
		sku := p.roomSKU(1, 1, 0)
		for _, u := range []string{"a", "b"} {
			if _, err := svc.JoinQueue(ctx, u, sku); err != nil {
				t.Fatal(err)
			}
		}
		_, a, err := svc.Ticket(ctx, "a", sku, svc.TicketOf(sku, "a"))
		if err != nil || a.Token == "" {
			t.Fatalf("a's admission = %+v %v", a, err)
		}
		r, _, err := svc.Reserve(ctx, reservation.ReserveRequest{SKU: sku, Qty: 1, UserID: "a", Admission: a.Token})
		if err != nil {
			t.Fatal(err)
		}
		// Nobody looks while a's hold expires: the sweep returns its unit and
		// admits b with it (b's place is next; it waited while the unit was held).
		p.clock.Advance(3 * time.Minute)
		if rep := p.sweep(); rep.Expired != 1 {
			t.Fatalf("sweep = %+v, want a's hold expired", rep)
		}
		p.wantStores("a's hold expired", sku, 1, 0, 1)
		if got, _, _ := svc.Ticket(ctx, "a", sku, svc.TicketOf(sku, "a")); got.State != reservation.TicketReserved {
			t.Errorf("a = %s, want RESERVED (one ticket, one reservation, even when its hold is gone)", got.State)
		}
		if got, _, _ := svc.Ticket(ctx, "b", sku, svc.TicketOf(sku, "b")); got.State != reservation.TicketAdmitted {
			t.Errorf("b after the unit came back = %s, want ADMITTED (by the sweep)", got.State)
		}
		// a's retry after its admission's time replays its reservation (now
		// CANCELLED expired) and takes nothing: the admission fixed the id.
		if got, replayed, err := svc.Reserve(ctx, reservation.ReserveRequest{SKU: sku, Qty: 1, UserID: "a", Admission: a.Token}); err != nil || !replayed ||
			got.ID != r.ID || got.Status != reservation.StatusCancelled {
			t.Errorf("a's used admission, after its time = %+v %v %v, want its reservation %s replayed, CANCELLED", got, replayed, err, r.ID)
		}
		p.wantStores("a's retry", sku, 1, 0, 1)
		// c queues behind b; b lets its admission lapse; the sweep admits c.
		if _, err := svc.JoinQueue(ctx, "c", sku); err != nil {
			t.Fatal(err)
		}
		if got, _, _ := svc.Ticket(ctx, "c", sku, svc.TicketOf(sku, "c")); got.State != reservation.TicketWaiting {
			t.Errorf("c behind an admitted b = %s, want WAITING (nothing admitted beyond the stock)", got.State)
		}
		p.clock.Advance(3 * time.Minute)
		p.sweep()
		if got, _, _ := svc.Ticket(ctx, "b", sku, svc.TicketOf(sku, "b")); got.State != reservation.TicketExpired {
			t.Errorf("b after its admission = %s, want EXPIRED", got.State)
		}
		got, ac, err := svc.Ticket(ctx, "c", sku, svc.TicketOf(sku, "c"))
		if err != nil || got.State != reservation.TicketAdmitted || ac.Token == "" {
			t.Errorf("c after b's lapse = %+v %v, want ADMITTED", got, err)
		}
	})
}
