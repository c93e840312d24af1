package system_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/testkit/outbox"

	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/adapters/eventbus"
	"github.com/holdfast/holdfast/shared/app"
	"github.com/holdfast/holdfast/shared/reservation"
)

// Every outcome reaches the order service as its event, exactly as decided:
// a confirmation, a fence, a refund, a group formed and a group failed, each
// with a stable event_id and its aggregate's version, published once by the
// deciding path and never again by the sweeper; each meets its schema
// (drain validates every event against api/events).
func TestEvents(t *testing.T) {
	rec := &recordingEnqueuer{}
	s := newStack(t, withEnqueuer(rec))
	ctx := context.Background()
	sku := testservices.Name("events")
	s.setStock(sku, 10)

	// A buy confirmed, then refunded by the buyer's DELETE.
	_, b := s.reserve(sku, "ann", 2, "")
	bought := b["reservation_id"].(string)
	// A buy that expires: the sweeper fences it.
	_, b = s.reserve(sku, "bob", 1, "")
	expired := b["reservation_id"].(string)
	// A group of two that forms, and a group of two that fails.
	_, g := s.call("POST", "/groups", `{"sku":"`+sku+`","capacity":2,"ttl_seconds":30}`, nil)
	formed := g["group_id"].(string)
	_, g = s.call("POST", "/groups", `{"sku":"`+sku+`","capacity":2,"ttl_seconds":30}`, nil)
	failed := g["group_id"].(string)
	var joins []string
	for _, j := range []struct{ group, user string }{{formed, "cy"}, {formed, "dee"}, {failed, "eve"}} {
		code, body := s.join(sku, j.group, j.user)
		if code != http.StatusAccepted {
			t.Fatalf("join %v = %d %v", j, code, body)
		}
		joins = append(joins, body["reservation_id"].(string))
	}
	for _, m := range rec.msgs {
		if m.ID == expired {
			continue
		}
		if _, err := s.app.Service.Persist(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	if code, body := s.call("DELETE", "/reservations/"+bought, "", nil); code != http.StatusOK || body["status"] != "CANCELLED" {
		t.Fatalf("DELETE = %d %v", code, body)
	}
	s.clock.Advance(63 * time.Second) // past the failing group's deadline and the holds' (60 s), and the grace
	if rep := s.sweep(); rep.GroupsFailed != 1 || rep.Expired != 1 {
		t.Fatalf("sweep = %+v, want one group failed, one hold expired", rep)
	}

	got := map[string]eventbus.Envelope{}
	var order []string
	for _, e := range s.drain() {
		if _, dup := got[e.Detail.ID]; dup {
			t.Errorf("%s published twice without a failure", e.Detail.ID)
		}
		got[e.Detail.ID] = e
		order = append(order, e.Detail.ID)
	}
	want := map[string]reservation.EventType{
		"reservation/" + bought + "/1":   reservation.EventConfirmed,
		"reservation/" + bought + "/2":   reservation.EventCancelled,
		"reservation/" + expired + "/1":  reservation.EventCancelled,
		"reservation/" + joins[0] + "/1": reservation.EventConfirmed,
		"reservation/" + joins[1] + "/1": reservation.EventConfirmed,
		"reservation/" + joins[2] + "/1": reservation.EventConfirmed,
		"reservation/" + joins[2] + "/2": reservation.EventCancelled,
		"group/" + formed + "/1":         reservation.EventGroupFormed,
		"group/" + failed + "/1":         reservation.EventGroupFailed,
	}
	for id, typ := range want {
		e, ok := got[id]
		if !ok || e.DetailType != string(typ) || e.Detail.Type != typ || e.Source != eventbus.Source {
			t.Errorf("%s = %+v (present %v), want a %s", id, e, ok, typ)
		}
	}
	if len(got) != len(want) {
		t.Errorf("published %v, want exactly %d events", order, len(want))
	}
	if e := got["reservation/"+bought+"/2"].Detail; e.UserID != "ann" || e.Qty != 2 || e.SKU != sku || !e.Refunded || e.Reason != reservation.ReasonBuyer {
		t.Errorf("the refund's event = %+v", e)
	}
	if e := got["reservation/"+joins[2]+"/2"].Detail; e.GroupID != failed || e.Reason != reservation.ReasonGroupFailed || !e.Refunded {
		t.Errorf("the failed group's member's event = %+v", e)
	}
	if e := got["group/"+formed+"/1"].Detail; e.Capacity != 2 || e.GroupID != formed || e.SKU != sku {
		t.Errorf("GroupFormed = %+v", e)
	}
	// In order per aggregate: a refund never goes out before its confirmation.
	for i, id := range order {
		if strings.HasSuffix(id, "/2") && !containsBefore(order[:i], strings.TrimSuffix(id, "2")+"1") {
			t.Errorf("%s published before its version 1: %v", id, order)
		}
	}
	if n := s.count(`SELECT COUNT(*) FROM ` + outbox.Table + ` WHERE NOT published`); n != 0 {
		t.Errorf("%d events unpublished after the deciding paths", n)
	}
	s.clock.Advance(time.Minute)
	if rep := s.sweep(); rep.EventsResent != 0 || rep.OutboxLagSeconds != 0 {
		t.Errorf("sweep after = %+v, want nothing to publish", rep)
	}
	if ev := s.drain(); len(ev) != 0 {
		t.Errorf("published again: %+v", ev)
	}
}

func containsBefore(ids []string, id string) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

// An event that cannot go out stays in the outbox with its decision: the
// sweeper publishes it once the bus is back, under the same event_id, and
// reports the outbox's lag while it waits.
func TestEventsOutlastTheBus(t *testing.T) {
	rec := &recordingEnqueuer{}
	bus := &gatedBus{}
	s := newStack(t, withEnqueuer(rec), func(_ *stack, o *app.Options, _ map[string]string) {
		o.Notifier = func(n reservation.Notifier) reservation.Notifier { bus.next = n; return bus }
	})
	sku := testservices.Name("evbus")
	s.setStock(sku, 5)
	_, b := s.reserve(sku, "fay", 1, "")
	id := b["reservation_id"].(string)
	bus.down.Store(true) // the bus refuses for a while
	if _, err := s.app.Service.Persist(context.Background(), rec.msgs[0]); err != nil {
		t.Fatal(err)
	}
	if n := s.count(`SELECT COUNT(*) FROM `+outbox.Table+` WHERE aggregate_id = ? AND NOT published`, id); n != 1 {
		t.Fatalf("unpublished events of %s = %d, want its confirmation kept", id, n)
	}
	s.clock.Advance(30 * time.Second)
	if rep := s.sweep(); rep.OutboxLagSeconds < 30 || rep.EventsResent != 0 {
		t.Errorf("sweep while the bus is down = %+v, want a lag of 30 s or more", rep)
	}
	bus.down.Store(false)
	if rep := s.sweep(); rep.EventsResent != 1 || rep.OutboxLagSeconds != 0 {
		t.Errorf("sweep once the bus is back = %+v, want 1 published, no lag", rep)
	}
	ev := s.drain()
	if len(ev) != 1 || ev[0].Detail.ID != "reservation/"+id+"/1" || ev[0].DetailType != string(reservation.EventConfirmed) {
		t.Errorf("published %+v, want %s's confirmation", ev, id)
	}
}

// gatedBus is the event bus, refusing every event while down.
type gatedBus struct {
	next reservation.Notifier
	down atomic.Bool
}

func (b *gatedBus) Publish(ctx context.Context, evs []reservation.Event) []error {
	if b.down.Load() {
		errs := make([]error, len(evs))
		for i := range errs {
			errs[i] = reservation.Unavailable("bus", errors.New("down"))
		}
		return errs
	}
	return b.next.Publish(ctx, evs)
}

// A persist batch publishes its confirmations without reading them back:
// what goes out is, event for event, the payload its commit stored (a pay
// window's deadline included), each once, and nothing stays unpublished.
func TestEventsOfABatch(t *testing.T) {
	rec := &recordingEnqueuer{}
	s := newStack(t, withEnqueuer(rec))
	ctx := context.Background()
	sku := testservices.Name("evbatch")
	s.setStock(sku, 10)
	within := 15 * time.Minute
	if _, err := s.app.Service.ChangeStock(ctx, reservation.StockChange{SKU: sku, Add: new(int64), PayWithin: &within}); err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{"gil", "hal", "ivy"} {
		if code, body := s.reserve(sku, u, 2, ""); code != http.StatusAccepted {
			t.Fatalf("reserve %s = %d %v", u, code, body)
		}
	}
	for i, err := range s.app.Service.PersistBatch(ctx, rec.msgs) {
		if err != nil {
			t.Fatalf("PersistBatch message %d: %v", i, err)
		}
	}
	got := map[string]reservation.Event{}
	for _, e := range s.drain() {
		if _, dup := got[e.Detail.ID]; dup {
			t.Errorf("%s published twice", e.Detail.ID)
		}
		got[e.Detail.ID] = e.Detail
	}
	for _, m := range rec.msgs {
		id := reservation.EventID("reservation", m.ID, 1)
		var payload []byte
		if err := s.db.QueryRow(`SELECT payload FROM `+outbox.Table+` WHERE event_id = ?`, id).Scan(&payload); err != nil {
			t.Fatalf("the outbox's %s: %v", id, err)
		}
		var stored reservation.Event
		if err := json.Unmarshal(payload, &stored); err != nil {
			t.Fatal(err)
		}
		e, ok := got[id]
		if !ok || !reflect.DeepEqual(e, stored) {
			t.Errorf("published %s = %+v (present %v), want the outbox's %+v", id, e, ok, stored)
		}
		if stored.PayBy == nil {
			t.Errorf("%s carries no pay_by, want the SKU's window", id)
		}
	}
	if len(got) != len(rec.msgs) {
		t.Errorf("published %d events, want %d confirmations", len(got), len(rec.msgs))
	}
	if n := s.count(`SELECT COUNT(*) FROM `+outbox.Table+` WHERE NOT published AND aggregate_id LIKE ?`, sku+".%"); n != 0 {
		t.Errorf("%d events unpublished after the batch", n)
	}
}
