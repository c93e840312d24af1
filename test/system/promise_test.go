package system_test

// The promise under ordinary use (issue 9): scenarios in which buyers,
// admins and the platform do ordinary things — a second click, a late
// dead letter, a retry while Redis is slow, a refund after a group formed,
// a stock change whose Redis update failed, a Lambda whose clock runs ahead
// — and the two stores must still tell one story. Each test drives the
// system through the HTTP handler, the persist and compensate consumers
// (messages captured at reserve and delivered when the scenario says) and
// the sweeper, and asserts the stock in both stores.
//
// These tests are written against the contract in the issue; on the code
// before it most of them fail.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/holdfast/holdfast/internal/testkit/faultproxy"
	"github.com/holdfast/holdfast/internal/testkit/invariant"
	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/app"
	"github.com/holdfast/holdfast/shared/handlers/consumer"
	"github.com/holdfast/holdfast/shared/handlers/httpapi"
	"github.com/holdfast/holdfast/shared/message"
	"github.com/holdfast/holdfast/shared/reservation"
)

// promise is a stack whose reservation messages are captured instead of
// sent, so that a test delivers each one to persist or compensate exactly
// when its scenario says.
type promise struct {
	*stack
	rec   *recordingEnqueuer
	proxy *faultproxy.Proxy // set when built by newPromiseBehindProxy
}

func newPromise(t *testing.T, opts ...stackOption) *promise {
	t.Helper()
	p := &promise{rec: &recordingEnqueuer{}}
	p.stack = newStack(t, append([]stackOption{withEnqueuer(p.rec)}, opts...)...)
	return p
}

// newPromiseBehindProxy puts a fault proxy between holdfast and Redis; the
// test still reads Redis directly.
func newPromiseBehindProxy(t *testing.T, opts ...stackOption) *promise {
	t.Helper()
	p := &promise{rec: &recordingEnqueuer{}}
	p.stack = newStack(t, append([]stackOption{withEnqueuer(p.rec), withRedisProxy(&p.proxy)}, opts...)...)
	return p
}

// msg returns the captured message of a reservation.
func (p *promise) msg(id string) reservation.Reservation {
	p.t.Helper()
	p.rec.mu.Lock()
	defer p.rec.mu.Unlock()
	for _, m := range p.rec.msgs {
		if m.ID == id {
			return m
		}
	}
	p.t.Fatalf("no message was sent for %s", id)
	return reservation.Reservation{}
}

// deliver hands the captured messages of ids to a consumer as one SQS
// batch, as Lambda's event source would, and requires every record to succeed.
func (p *promise) deliver(h *consumer.Handler, ids ...string) {
	p.t.Helper()
	var ev events.SQSEvent
	for i, id := range ids {
		body, err := message.Encode(p.msg(id))
		if err != nil {
			p.t.Fatal(err)
		}
		ev.Records = append(ev.Records, events.SQSMessage{
			MessageId: fmt.Sprintf("msg-%d-%d", time.Now().UnixNano(), i), Body: string(body),
			EventSource: "aws:sqs", EventSourceARN: p.queues.ARN,
		})
	}
	resp, err := h.Handle(context.Background(), ev)
	if err != nil {
		p.t.Fatalf("consumer: %v", err)
	}
	if len(resp.BatchItemFailures) > 0 {
		p.t.Fatalf("consumer reported %d of %d records failed", len(resp.BatchItemFailures), len(ids))
	}
}

func (p *promise) persistMsgs(ids ...string)    { p.t.Helper(); p.deliver(p.persist, ids...) }
func (p *promise) compensateMsgs(ids ...string) { p.t.Helper(); p.deliver(p.compensate, ids...) }

// reserved reserves through the API and requires 202; it returns the id.
func (p *promise) reserved(sku, user string, qty int, key string) string {
	p.t.Helper()
	code, body := p.reserve(sku, user, qty, key)
	if code != http.StatusAccepted {
		p.t.Fatalf("POST /reservations %s %s qty %d key %q = %d %v, want 202", sku, user, qty, key, code, body)
	}
	return body["reservation_id"].(string)
}

func (p *promise) joined(sku, gid, user string) string {
	p.t.Helper()
	code, body := p.join(sku, gid, user)
	if code != http.StatusAccepted {
		p.t.Fatalf("join %s %s = %d %v, want 202", gid, user, code, body)
	}
	return body["reservation_id"].(string)
}

func (p *promise) group(sku string, capacity, ttlSeconds int) string {
	p.t.Helper()
	code, g := p.call("POST", "/groups", fmt.Sprintf(`{"sku":%q,"capacity":%d,"ttl_seconds":%d}`, sku, capacity, ttlSeconds), nil)
	if code != http.StatusCreated {
		p.t.Fatalf("POST /groups = %d %v, want 201", code, g)
	}
	return g["group_id"].(string)
}

// createSKU creates a SKU (no precondition is needed for a new one).
func (p *promise) createSKU(sku string, stock, perUserLimit int) {
	p.t.Helper()
	body := fmt.Sprintf(`{"stock":%d}`, stock)
	if perUserLimit > 0 {
		body = fmt.Sprintf(`{"stock":%d,"per_user_limit":%d}`, stock, perUserLimit)
	}
	if code, b := p.call("PUT", "/admin/skus/"+sku+"/stock", body, nil); code != http.StatusOK {
		p.t.Fatalf("create %s: PUT stock %s = %d %v", sku, body, code, b)
	}
}

// status GETs a reservation and returns the answer.
func (p *promise) status(id string) map[string]any {
	p.t.Helper()
	code, body := p.call("GET", "/reservations/"+id, "", nil)
	if code != http.StatusOK {
		p.t.Fatalf("GET /reservations/%s = %d %v, want 200", id, code, body)
	}
	return body
}

// wantStatus requires GET /reservations/{id} to answer status (and reason, when given).
func (p *promise) wantStatus(id string, status reservation.Status, reason reservation.Reason) {
	p.t.Helper()
	b := p.status(id)
	if b["status"] != string(status) || (reason != "" && b["reason"] != string(reason)) {
		p.t.Fatalf("GET /reservations/%s = %v, want %s %s", id, b, status, reason)
	}
}

// wantStores requires the stock figures of both stores.
func (p *promise) wantStores(step, sku string, available, held, mysql int64) {
	p.t.Helper()
	a, h := p.redisStock(sku)
	m := p.mysqlAvailable(sku)
	if a != available || h != held || m != mysql {
		p.t.Fatalf("%s: redis available %d held %d, mysql available %d; want %d, %d, %d", step, a, h, m, available, held, mysql)
	}
}

// wantAgree requires Redis available + held to equal MySQL available, and that to be want.
func (p *promise) wantAgree(step, sku string, want int64) {
	p.t.Helper()
	a, h := p.redisStock(sku)
	m := p.mysqlAvailable(sku)
	if a+h != m || m != want {
		p.t.Fatalf("%s: redis available %d + held %d = %d, mysql available %d; want both %d", step, a, h, a+h, m, want)
	}
}

// keysOfSKU lists every Redis key of a SKU. The braces of the hash tag are
// literal, so they are escaped in the glob.
func (p *promise) keysOfSKU(sku string) []string {
	p.t.Helper()
	ctx := context.Background()
	var out []string
	iter := p.rdb.Scan(ctx, 0, `hf:\{`+sku+`\}:*`, 100).Iterator()
	for iter.Next(ctx) {
		out = append(out, iter.Val())
	}
	if err := iter.Err(); err != nil {
		p.t.Fatalf("scan keys of %s: %v", sku, err)
	}
	return out
}

// forgetRetained simulates HOLDFAST_HOLD_RETENTION passing: every key of the
// SKU that carries a TTL (finished holds, group keys) is gone.
func (p *promise) forgetRetained(sku string) int {
	p.t.Helper()
	ctx := context.Background()
	n := 0
	for _, k := range p.keysOfSKU(sku) {
		ttl, err := p.rdb.PTTL(ctx, k).Result()
		if err != nil {
			p.t.Fatalf("pttl %s: %v", k, err)
		}
		if ttl > 0 {
			p.rdb.Del(ctx, k)
			n++
		}
	}
	return n
}

// forgetHold simulates retention passing for one hold.
func (p *promise) forgetHold(sku, id string) {
	p.t.Helper()
	if n, err := p.rdb.Del(context.Background(), "hf:{"+sku+"}:r:"+id).Result(); err != nil || n != 1 {
		p.t.Fatalf("forget hold %s: deleted %d, %v", id, n, err)
	}
}

// loseSKU simulates Redis losing the SKU (a failover, a restart): every key goes.
func (p *promise) loseSKU(sku string) {
	p.t.Helper()
	keys := p.keysOfSKU(sku)
	if len(keys) == 0 {
		p.t.Fatalf("redis has no key of %s to lose", sku)
	}
	if err := p.rdb.Del(context.Background(), keys...).Err(); err != nil {
		p.t.Fatal(err)
	}
}

// confirmedUnits is what MySQL has CONFIRMED for a user on a SKU.
func (p *promise) confirmedUnits(sku, user string) int64 {
	p.t.Helper()
	return p.count(`SELECT SUM(qty) FROM reservations WHERE sku = ? AND user_id = ? AND status = 'CONFIRMED'`, sku, user)
}

// row reads a reservation's row in MySQL.
func (p *promise) row(id string) (status, reason string, refunded bool) {
	p.t.Helper()
	var r *string
	if err := p.db.QueryRow(`SELECT status, reason, refunded FROM reservations WHERE reservation_id = ?`, id).Scan(&status, &r, &refunded); err != nil {
		p.t.Fatalf("row %s: %v", id, err)
	}
	if r != nil {
		reason = *r
	}
	return status, reason, refunded
}

// stockVersion reads the SKU's version from GET /admin/skus/{sku}/stock.
func (p *promise) stockVersion(sku string) int64 {
	p.t.Helper()
	code, body := p.call("GET", "/admin/skus/"+sku+"/stock", "", nil)
	v, ok := body["version"].(float64)
	if code != http.StatusOK || !ok {
		p.t.Fatalf("GET /admin/skus/%s/stock = %d %v, want 200 with a version", sku, code, body)
	}
	return int64(v)
}

// putStock sends PUT /admin/skus/{sku}/stock; version < 0 sends no If-Match.
func (p *promise) putStock(sku, body string, version int64) (int, map[string]any) {
	p.t.Helper()
	var h map[string]string
	if version >= 0 {
		h = map[string]string{"If-Match": `"` + strconv.FormatInt(version, 10) + `"`}
	}
	return p.call("PUT", "/admin/skus/"+sku+"/stock", body, h)
}

// callOn sends one API Gateway request to a handler, as the buyer it
// concerns (ownerOf), and also returns the response headers.
func (p *promise) callOn(t *testing.T, h *httpapi.Handler, method, path, body string, headers map[string]string) (int, map[string]any, map[string]string) {
	t.Helper()
	resp, err := h.Handle(context.Background(), apiRequest(p.caller(method, path, body), method, path, body, headers))
	if err != nil {
		t.Fatalf("%s %s: handler error %v", method, path, err)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(resp.Body), &m); err != nil {
		t.Fatalf("%s %s: body %q is not JSON: %v", method, path, resp.Body, err)
	}
	return resp.StatusCode, m, resp.Headers
}

// lambdaWithClock builds another reserve function on the same stores with
// production wiring whose only difference is the clock of its execution
// environment (a Lambda whose clock runs ahead or behind). No test seam for
// the scripts' time is set: what the scripts do with time is what production does.
func (p *promise) lambdaWithClock(clock reservation.Clock) *httpapi.Handler {
	p.t.Helper()
	a, err := app.Build(context.Background(), p.cfg, app.Options{Function: "skewed", Out: io.Discard, Clock: clock,
		Enqueuer: func(reservation.Enqueuer) reservation.Enqueuer { return p.rec }})
	if err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(func() { _ = a.Close() })
	return a.Handlers(nil).API
}

// refundedThenForgotten: a reservation of 2 of 10 units is confirmed, the
// buyer cancels it (a refund to both stores), and then Redis forgets its
// finished hold (retention passed).
func refundedThenForgotten(t *testing.T) (p *promise, sku, id string) {
	t.Helper()
	p = newPromise(t)
	sku = testservices.Name("dd")
	p.createSKU(sku, 10, 0)
	id = p.reserved(sku, "ann", 2, "")
	p.persistMsgs(id)
	p.wantStatus(id, reservation.StatusConfirmed, "")
	p.wantStores("confirmed", sku, 8, 0, 8)
	if code, b := p.call("DELETE", "/reservations/"+id, "", nil); code != http.StatusOK || b["status"] != "CANCELLED" {
		t.Fatalf("DELETE %s = %d %v, want 200 CANCELLED", id, code, b)
	}
	p.wantStores("refunded", sku, 10, 0, 10)
	if n := p.forgetRetained(sku); n == 0 {
		t.Fatalf("no finished hold of %s carried a TTL", sku)
	}
	return p, sku, id
}

// TestPromise01DoubleDeleteAfterRetention: a refunded reservation whose
// finished hold Redis has forgotten gives no stock back again — not to a
// second DELETE, a late dead letter or a persist redelivery — and a buyer
// cannot use a forgotten refund to pass her per-user limit.
func TestPromise01DoubleDeleteAfterRetention(t *testing.T) {
	t.Run("second DELETE", func(t *testing.T) {
		p, sku, id := refundedThenForgotten(t)
		code, b := p.call("DELETE", "/reservations/"+id, "", nil)
		if code != http.StatusOK || b["status"] != "CANCELLED" || b["reason"] != "buyer_cancelled" {
			t.Errorf("second DELETE = %d %v, want 200 CANCELLED buyer_cancelled", code, b)
		}
		p.wantStores("after the second DELETE", sku, 10, 0, 10)
		p.check(invariant.Expect{Sellable: map[string]int64{sku: 10}, Accepted: []string{id}, Quiescent: true})
	})
	t.Run("late dead letter", func(t *testing.T) {
		p, sku, id := refundedThenForgotten(t)
		p.compensateMsgs(id)
		p.wantStores("after compensate", sku, 10, 0, 10)
		if st, reason, refunded := p.row(id); st != "CANCELLED" || reason != "buyer_cancelled" || !refunded {
			t.Errorf("row = %s %s refunded=%v, want CANCELLED buyer_cancelled refunded", st, reason, refunded)
		}
		p.check(invariant.Expect{Sellable: map[string]int64{sku: 10}, Accepted: []string{id}, Quiescent: true})
	})
	t.Run("persist redelivery", func(t *testing.T) {
		p, sku, id := refundedThenForgotten(t)
		p.persistMsgs(id)
		p.wantStores("after the redelivery", sku, 10, 0, 10)
		p.wantStatus(id, reservation.StatusCancelled, reservation.ReasonBuyer)
		p.check(invariant.Expect{Sellable: map[string]int64{sku: 10}, Accepted: []string{id}, Quiescent: true})
	})
	t.Run("per-user limit", func(t *testing.T) {
		p := newPromise(t)
		sku := testservices.Name("ddlimit")
		p.createSKU(sku, 5, 1)
		first := p.reserved(sku, "ann", 1, "")
		p.persistMsgs(first)
		if code, b := p.call("DELETE", "/reservations/"+first, "", nil); code != http.StatusOK || b["status"] != "CANCELLED" {
			t.Fatalf("DELETE = %d %v, want 200 CANCELLED", code, b)
		}
		second := p.reserved(sku, "ann", 1, "") // the refunded unit no longer counts
		p.persistMsgs(second)
		p.wantStatus(second, reservation.StatusConfirmed, "")
		p.wantStores("ann holds one unit again", sku, 4, 0, 4)

		p.forgetHold(sku, first)
		if code, b := p.call("DELETE", "/reservations/"+first, "", nil); code != http.StatusOK || b["status"] != "CANCELLED" {
			t.Errorf("DELETE of the forgotten refund = %d %v, want 200 CANCELLED", code, b)
		}
		accepted := []string{first, second}
		switch code, b := p.reserve(sku, "ann", 1, ""); {
		case code == http.StatusAccepted:
			third := b["reservation_id"].(string)
			accepted = append(accepted, third)
			p.persistMsgs(third)
		case code == http.StatusConflict && b["error"] == "limit_exceeded":
		default:
			t.Fatalf("third reserve = %d %v, want 202 or 409 limit_exceeded", code, b)
		}
		if n := p.confirmedUnits(sku, "ann"); n != 1 {
			t.Fatalf("MySQL confirmed %d units for ann, want 1 (per_user_limit 1)", n)
		}
		p.clock.Advance(2 * time.Minute)
		p.sweep()
		p.wantAgree("after a sweep", sku, 4)
		p.check(invariant.Expect{Sellable: map[string]int64{sku: 5}, Accepted: accepted, Quiescent: true})
	})
}

// TestPromise02RefundAfterFormationKeepsGroupFormed: a group of two formed
// and both members were confirmed; after its deadline one member cancels.
// Only that member is refunded: the group stays FORMED, the other member
// stays CONFIRMED, and the sweeper fails nothing.
func TestPromise02RefundAfterFormationKeepsGroupFormed(t *testing.T) {
	p := newPromise(t)
	sku := testservices.Name("gref")
	p.createSKU(sku, 10, 0)
	gid := p.group(sku, 2, 30)
	m1, m2 := p.joined(sku, gid, "u1"), p.joined(sku, gid, "u2")
	p.persistMsgs(m1, m2)
	if n := p.count(`SELECT COUNT(*) FROM group_buys WHERE group_id = ? AND status = 'FORMED'`, gid); n != 1 {
		t.Fatalf("group not FORMED in MySQL after both members persisted")
	}
	p.wantStores("formed", sku, 8, 0, 8)

	p.clock.Advance(40 * time.Second) // past the group's deadline and the sweep grace
	if code, b := p.call("DELETE", "/reservations/"+m1, "", nil); code != http.StatusOK || b["status"] != "CANCELLED" {
		t.Fatalf("DELETE member 1 = %d %v, want 200 CANCELLED", code, b)
	}
	rep := p.sweep()
	if code, g := p.call("GET", "/groups/"+gid, "", nil); code != http.StatusOK || g["status"] != "FORMED" || g["remaining"] != float64(0) {
		t.Fatalf("GET /groups/%s = %d %v, want FORMED with remaining 0 (sweep failed %d groups)", gid, code, g, rep.GroupsFailed)
	}
	p.wantStatus(m2, reservation.StatusConfirmed, "")
	p.wantStatus(m1, reservation.StatusCancelled, reservation.ReasonBuyer)
	p.wantStores("member 1 refunded", sku, 9, 0, 9)
	p.check(invariant.Expect{Sellable: map[string]int64{sku: 10}, Accepted: []string{m1, m2}, Quiescent: true})
}

// TestPromise03GroupFilledInTimeSurvivesPersistLag: both slots of a group
// are taken in Redis before its deadline, but one member's message reaches
// persist only after deadline + grace and a sweep. The group formed in
// time: it stays FORMED, and both members end CONFIRMED with nothing refunded.
func TestPromise03GroupFilledInTimeSurvivesPersistLag(t *testing.T) {
	p := newPromise(t)
	sku := testservices.Name("glag")
	p.createSKU(sku, 10, 0)
	gid := p.group(sku, 2, 30)
	m1, m2 := p.joined(sku, gid, "u1"), p.joined(sku, gid, "u2")
	if code, g := p.call("GET", "/groups/"+gid, "", nil); code != http.StatusOK || g["remaining"] != float64(0) || g["status"] != "FORMED" {
		t.Errorf("GET /groups/%s with every slot held = %d %v, want FORMED with remaining 0", gid, code, g)
	}
	p.persistMsgs(m1)

	p.clock.Advance(35 * time.Second) // deadline 30 s + grace 2 s passed; the holds (60 s) not yet
	if rep := p.sweep(); rep.GroupsFailed != 0 {
		t.Errorf("sweep failed %d groups, want 0: the group formed in Redis before its deadline", rep.GroupsFailed)
	}
	p.persistMsgs(m2)

	p.wantStatus(m1, reservation.StatusConfirmed, "")
	p.wantStatus(m2, reservation.StatusConfirmed, "")
	if code, g := p.call("GET", "/groups/"+gid, "", nil); code != http.StatusOK || g["status"] != "FORMED" || g["remaining"] != float64(0) {
		t.Fatalf("GET /groups/%s = %d %v, want FORMED with remaining 0", gid, code, g)
	}
	if n := p.count(`SELECT COUNT(*) FROM reservations WHERE sku = ? AND status = 'CANCELLED'`, sku); n != 0 {
		t.Fatalf("%d reservations cancelled, want none", n)
	}
	p.wantStores("both members confirmed", sku, 8, 0, 8)
	p.clock.Advance(2 * time.Minute)
	p.sweep()
	p.wantStores("after a later sweep", sku, 8, 0, 8)
	p.check(invariant.Expect{Sellable: map[string]int64{sku: 10}, Accepted: []string{m1, m2}, Quiescent: true})
}

// TestPromise04SameKeyRetryDuringRedisSlownessKeepsOriginal: a keyed
// reserve is accepted; the buyer's retry with the same key meets a slow or
// refusing Redis and gets 503. The retry must not cancel the original: its
// message, persisted once Redis is back, confirms it and takes the stock once.
func TestPromise04SameKeyRetryDuringRedisSlownessKeepsOriginal(t *testing.T) {
	for _, fault := range []struct {
		name          string
		inject, clear func(*faultproxy.Proxy)
	}{
		{"slow", func(x *faultproxy.Proxy) { x.SetLatency(700 * time.Millisecond) }, func(x *faultproxy.Proxy) { x.SetLatency(0) }},
		{"refused", func(x *faultproxy.Proxy) { x.Refuse(true) }, func(x *faultproxy.Proxy) { x.Refuse(false) }},
	} {
		t.Run(fault.name, func(t *testing.T) {
			p := newPromiseBehindProxy(t)
			sku := testservices.Name("retry")
			p.createSKU(sku, 10, 0)
			id := p.reserved(sku, "ann", 2, "k")

			fault.inject(p.proxy)
			code, b := p.reserve(sku, "ann", 2, "k")
			fault.clear(p.proxy)
			if code != http.StatusServiceUnavailable {
				t.Fatalf("retry with the same key while Redis is %s = %d %v, want 503", fault.name, code, b)
			}

			p.persistMsgs(id)
			p.persistMsgs(id) // and a redelivery
			if st, reason, _ := p.row(id); st != "CONFIRMED" {
				t.Fatalf("original after persist: row %s %s, want CONFIRMED", st, reason)
			}
			p.wantStatus(id, reservation.StatusConfirmed, "")
			p.wantStores("original confirmed", sku, 8, 0, 8)
			if code, b := p.reserve(sku, "ann", 2, "k"); code != http.StatusOK || b["status"] != "CONFIRMED" {
				t.Errorf("retry with the same key after recovery = %d %v, want 200 CONFIRMED", code, b)
			}
			p.wantStores("after the last retry", sku, 8, 0, 8)
			p.check(invariant.Expect{Sellable: map[string]int64{sku: 10}, Accepted: []string{id}, Quiescent: true})
		})
	}
}

// TestPromise05KeyReuseAfterRetentionIsJudgedByMySQL: once Redis forgot a
// keyed reservation's hold, MySQL's row judges the key: another quantity
// is an idempotency_mismatch and the same request answers the row's final
// state; neither takes anything in either store.
func TestPromise05KeyReuseAfterRetentionIsJudgedByMySQL(t *testing.T) {
	p := newPromise(t)
	sku := testservices.Name("keyret")
	p.createSKU(sku, 10, 0)
	id := p.reserved(sku, "ann", 1, "k1")
	p.persistMsgs(id)
	p.wantStatus(id, reservation.StatusConfirmed, "")
	if n := p.forgetRetained(sku); n == 0 {
		t.Fatalf("the finished hold carried no TTL")
	}
	usersKey := "hf:{" + sku + "}:users"
	users := p.rdb.HGetAll(context.Background(), usersKey).Val()

	if code, b := p.reserve(sku, "ann", 5, "k1"); code != http.StatusUnprocessableEntity || b["error"] != "idempotency_mismatch" {
		t.Errorf("k1 with qty 5 after retention = %d %v, want 422 idempotency_mismatch", code, b)
	}
	p.wantStores("after the mismatched reuse", sku, 9, 0, 9)
	if got := p.rdb.HGetAll(context.Background(), usersKey).Val(); fmt.Sprint(got) != fmt.Sprint(users) {
		t.Fatalf("per-user counters moved: %v, were %v", got, users)
	}

	code, b := p.reserve(sku, "ann", 1, "k1")
	if code != http.StatusOK || b["status"] != "CONFIRMED" || b["reservation_id"] != id {
		t.Errorf("k1 with qty 1 after retention = %d %v, want 200 CONFIRMED %s", code, b, id)
	}
	if g := p.status(id); g["status"] != "CONFIRMED" || g["qty"] != float64(1) {
		t.Errorf("GET /reservations/%s = %v, want CONFIRMED qty 1", id, g)
	}
	p.wantStores("after the same request again", sku, 9, 0, 9)
	if got := p.rdb.HGetAll(context.Background(), usersKey).Val(); fmt.Sprint(got) != fmt.Sprint(users) {
		t.Errorf("per-user counters moved: %v, were %v", got, users)
	}
	p.check(invariant.Expect{Sellable: map[string]int64{sku: 10}, Accepted: []string{id}, Quiescent: true})
}

// TestPromise06RefundWhoseRedisReleaseFailedIsRepaired: a buyer cancels a
// confirmed reservation while Redis is down. MySQL refunds; GET answers
// CANCELLED from MySQL meanwhile; once Redis is back the sweeper returns the
// unit to Redis exactly once, and a retried DELETE gives nothing more.
func TestPromise06RefundWhoseRedisReleaseFailedIsRepaired(t *testing.T) {
	p := newPromiseBehindProxy(t)
	sku := testservices.Name("relfail")
	p.createSKU(sku, 10, 0)
	id := p.reserved(sku, "ann", 2, "")
	p.persistMsgs(id)
	p.wantStores("confirmed", sku, 8, 0, 8)

	p.proxy.Refuse(true)
	if code, b := p.call("DELETE", "/reservations/"+id, "", nil); code != http.StatusOK && code != http.StatusServiceUnavailable {
		t.Fatalf("DELETE with Redis down = %d %v, want 200 or 503", code, b)
	}
	if st, _, refunded := p.row(id); st != "CANCELLED" || !refunded {
		t.Fatalf("row = %s refunded=%v, want CANCELLED refunded", st, refunded)
	}
	if got := p.mysqlAvailable(sku); got != 10 {
		t.Fatalf("mysql available = %d, want 10 (refunded)", got)
	}
	if code, b := p.call("GET", "/reservations/"+id, "", nil); code != http.StatusOK || b["status"] != "CANCELLED" {
		t.Errorf("GET with Redis down = %d %v, want 200 CANCELLED from MySQL", code, b)
	}
	p.proxy.Refuse(false)

	p.clock.Advance(5 * time.Second) // past the sweep grace, well within HOLDFAST_RECONCILE_AFTER (50 s)
	p.sweep()
	p.wantStores("after one sweep with Redis back", sku, 10, 0, 10)
	p.clock.Advance(2 * time.Minute)
	p.sweep()
	p.sweep()
	p.wantStores("after more sweeps", sku, 10, 0, 10)

	if code, b := p.call("DELETE", "/reservations/"+id, "", nil); code != http.StatusOK || b["status"] != "CANCELLED" {
		t.Errorf("retried DELETE = %d %v, want 200 CANCELLED", code, b)
	}
	p.wantStores("after the retried DELETE", sku, 10, 0, 10)
	p.check(invariant.Expect{Sellable: map[string]int64{sku: 10}, Accepted: []string{id}, Quiescent: true})
}

// TestPromise07StockChanges: admin stock changes are preconditioned on the
// version (If-Match), Redis follows MySQL's changes once each and in order
// even when a Redis update failed, and the runbook's repair of a drifted
// Redis (two sweeps HOLDFAST_RECONCILE_AFTER apart) still heals.
func TestPromise07StockChanges(t *testing.T) {
	t.Run("failed Redis update then a later change", func(t *testing.T) {
		p := newPromiseBehindProxy(t)
		sku := testservices.Name("stk")
		p.createSKU(sku, 100, 0)
		v := p.stockVersion(sku)

		p.proxy.Refuse(true)
		code, b := p.putStock(sku, `{"stock":80}`, v)
		p.proxy.Refuse(false)
		if code != http.StatusOK && code < 500 {
			t.Fatalf("PUT 80 with Redis down = %d %v, want 200 or 5xx", code, b)
		}
		if got := p.mysqlAvailable(sku); got != 80 {
			t.Fatalf("mysql available after PUT 80 = %d, want 80", got)
		}

		v = p.stockVersion(sku)
		if code, b := p.putStock(sku, `{"stock":90}`, v); code != http.StatusOK {
			t.Fatalf("PUT 90 with If-Match %d = %d %v, want 200", v, code, b)
		}
		p.clock.Advance(5 * time.Second) // past the sweep grace, within HOLDFAST_RECONCILE_AFTER
		p.sweep()
		p.wantAgree("after PUT 90 and a sweep", sku, 90)
		p.check(invariant.Expect{Sellable: map[string]int64{sku: 90}, Quiescent: true})
	})
	t.Run("stale precondition", func(t *testing.T) {
		p := newPromise(t)
		sku := testservices.Name("stale")
		p.createSKU(sku, 10, 0)
		code, body, headers := p.callOn(t, p.api, "GET", "/admin/skus/"+sku+"/stock", "", nil)
		old, _ := body["version"].(float64)
		if code != http.StatusOK {
			t.Fatalf("GET stock = %d %v", code, body)
		}
		if want := fmt.Sprintf(`"%d"`, int64(old)); headers["ETag"] != want {
			t.Errorf("GET stock ETag = %q, want %q", headers["ETag"], want)
		}
		id := p.reserved(sku, "ann", 1, "")
		p.persistMsgs(id) // a sale moves the version
		now := p.stockVersion(sku)

		code, b := p.putStock(sku, `{"stock":50}`, int64(old))
		if code != http.StatusPreconditionFailed || b["error"] != "version_mismatch" {
			t.Errorf("PUT with the version read before the sale = %d %v, want 412 version_mismatch", code, b)
		}
		p.wantStores("after the stale PUT", sku, 9, 0, 9)
		if v := p.stockVersion(sku); v != now {
			t.Errorf("version = %d after a refused PUT, want %d", v, now)
		}
		p.check(invariant.Expect{Sellable: map[string]int64{sku: 10}, Accepted: []string{id}, Quiescent: true})
	})
	t.Run("no precondition", func(t *testing.T) {
		p := newPromise(t)
		sku := testservices.Name("noprec")
		p.createSKU(sku, 10, 0)
		code, b := p.putStock(sku, `{"stock":20}`, -1)
		if code != http.StatusPreconditionRequired || b["error"] != "precondition_required" {
			t.Errorf("PUT on an existing SKU without If-Match = %d %v, want 428 precondition_required", code, b)
		}
		p.wantStores("after the PUT without precondition", sku, 10, 0, 10)
	})
	t.Run("runbook repair of a drifted Redis", func(t *testing.T) {
		p := newPromise(t, withVars(map[string]string{"HOLDFAST_RECONCILE_AFTER": "10s"}))
		sku := testservices.Name("heal")
		p.createSKU(sku, 10, 0)
		p.rdb.DecrBy(context.Background(), "hf:{"+sku+"}:stock", 3) // Redis lost 3 units
		if rep := p.sweep(); rep.Healed != 0 || driftOf(rep, sku) != 3 {
			t.Fatalf("first sweep healed %d, drift %d; want 0 healed (a sighting), drift 3", rep.Healed, driftOf(rep, sku))
		}
		p.clock.Advance(11 * time.Second)
		if rep := p.sweep(); rep.Healed != 1 {
			t.Fatalf("sweep %v after the sighting healed %d SKUs, want 1", 11*time.Second, rep.Healed)
		}
		p.wantStores("healed", sku, 10, 0, 10)
		p.check(invariant.Expect{Sellable: map[string]int64{sku: 10}, Quiescent: true})
	})
}

// TestPromise08PerUserLimitSurvivesRedisLoss: a buyer at her per-user limit
// reserves again after Redis lost the SKU. Redis may have forgotten her
// units, MySQL has not: persist cancels the second reservation
// (limit_exceeded) and takes no stock.
func TestPromise08PerUserLimitSurvivesRedisLoss(t *testing.T) {
	p := newPromise(t)
	sku := testservices.Name("limloss")
	p.createSKU(sku, 5, 1)
	first := p.reserved(sku, "ann", 1, "")
	p.persistMsgs(first)
	p.wantStores("first confirmed", sku, 4, 0, 4)

	p.loseSKU(sku)
	accepted := []string{first}
	switch code, b := p.reserve(sku, "ann", 1, ""); {
	case code == http.StatusAccepted:
		second := b["reservation_id"].(string)
		accepted = append(accepted, second)
		p.persistMsgs(second)
		if st, reason, _ := p.row(second); st != "CANCELLED" || reason != "limit_exceeded" {
			t.Errorf("second reservation after the loss: row %s %s, want CANCELLED limit_exceeded", st, reason)
		}
	case code == http.StatusConflict && b["error"] == "limit_exceeded":
	default:
		t.Fatalf("reserve after the loss = %d %v, want 202 or 409 limit_exceeded", code, b)
	}
	if n := p.confirmedUnits(sku, "ann"); n != 1 {
		t.Fatalf("MySQL confirmed %d units for ann, want 1 (per_user_limit 1)", n)
	}
	p.wantStores("after persist", sku, 4, 0, 4)
	p.check(invariant.Expect{Sellable: map[string]int64{sku: 5}, Accepted: accepted, Quiescent: true})
}

// TestPromise09ScriptsTakeTimeFromRedis: a reserve function whose clock
// runs 10 minutes ahead (or behind) does not move deadlines: a hold it
// creates expires HOLDFAST_HOLD_TTL after Redis's time, and a group it
// opens closes ttl_seconds after Redis's time.
func TestPromise09ScriptsTakeTimeFromRedis(t *testing.T) {
	const slack = 5 * time.Second
	near := func(got, want time.Time) bool { d := got.Sub(want); return d < slack && d > -slack }
	for _, skew := range []time.Duration{10 * time.Minute, -10 * time.Minute} {
		t.Run(fmt.Sprintf("clock %v", skew), func(t *testing.T) {
			p := newPromise(t)
			sku := testservices.Name("skew")
			p.createSKU(sku, 10, 0)
			api := p.lambdaWithClock(&testClock{now: time.Now().Add(skew)})

			code, b, _ := p.callOn(t, api, "POST", "/reservations", fmt.Sprintf(`{"sku":%q,"qty":1,"user_id":"ann"}`, sku), nil)
			want := time.Now().Add(60 * time.Second).UTC().Round(0) // HOLDFAST_HOLD_TTL of the stack
			if code != http.StatusAccepted {
				t.Fatalf("reserve through the skewed function = %d %v, want 202", code, b)
			}
			id := b["reservation_id"].(string)
			ms, err := p.rdb.HGet(context.Background(), "hf:{"+sku+"}:r:"+id, "deadline").Int64()
			if err != nil {
				t.Fatalf("hold deadline: %v", err)
			}
			if got := time.UnixMilli(ms).UTC(); !near(got, want) {
				t.Errorf("hold deadline in Redis = %v, want ≈ %v (Redis time + 60s), off by %v", got, want, got.Sub(want))
			}
			if got, err := time.Parse(time.RFC3339Nano, fmt.Sprint(b["expires_at"])); err != nil || !near(got, want) {
				t.Errorf("202 expires_at = %v, want ≈ %v", b["expires_at"], want)
			}

			code, g, _ := p.callOn(t, api, "POST", "/groups", fmt.Sprintf(`{"sku":%q,"capacity":2,"ttl_seconds":600}`, sku), nil)
			want = time.Now().Add(600 * time.Second).UTC().Round(0)
			if code != http.StatusCreated {
				t.Fatalf("create group through the skewed function = %d %v, want 201", code, g)
			}
			gms, err := p.rdb.HGet(context.Background(), "hf:{"+sku+"}:g:"+g["group_id"].(string), "deadline").Int64()
			if err != nil {
				t.Fatalf("group deadline: %v", err)
			}
			if got := time.UnixMilli(gms).UTC(); !near(got, want) {
				t.Errorf("group deadline in Redis = %v, want ≈ %v (Redis time + 600s), off by %v", got, want, got.Sub(want))
			}
			if got, err := time.Parse(time.RFC3339Nano, fmt.Sprint(g["deadline"])); err != nil || !near(got, want) {
				t.Errorf("201 group deadline = %v, want ≈ %v", g["deadline"], want)
			}
		})
	}
}

// TestPromise10HealWaitsForPendingRelease: reconciliation must not count a
// refund twice. A refund commits in MySQL while its Redis release fails,
// next to a real drift (sighted before the refund, or only while the release
// is pending); once Redis is back, sweeps across HOLDFAST_RECONCILE_AFTER
// both apply the release and heal the drift, and Redis never ends above MySQL.
// Reasoned rather than reproduced: today nothing re-applies the failed
// release, so this guards the repair that the issue adds.
func TestPromise10HealWaitsForPendingRelease(t *testing.T) {
	for _, sightedFirst := range []bool{true, false} {
		t.Run(fmt.Sprintf("drift sighted before the refund=%v", sightedFirst), func(t *testing.T) {
			p := newPromiseBehindProxy(t, withVars(map[string]string{"HOLDFAST_RECONCILE_AFTER": "10s"}))
			sku := testservices.Name("pend")
			p.createSKU(sku, 10, 0)
			id := p.reserved(sku, "ann", 2, "")
			p.persistMsgs(id)
			p.wantStores("confirmed", sku, 8, 0, 8)
			p.rdb.DecrBy(context.Background(), "hf:{"+sku+"}:stock", 1) // a real drift of 1
			if sightedFirst {
				if rep := p.sweep(); rep.Healed != 0 {
					t.Fatalf("first sighting healed")
				}
			}

			p.proxy.Refuse(true)
			if code, b := p.call("DELETE", "/reservations/"+id, "", nil); code != http.StatusOK && code != http.StatusServiceUnavailable {
				t.Fatalf("DELETE with Redis down = %d %v, want 200 or 503", code, b)
			}
			p.proxy.Refuse(false)
			if got := p.mysqlAvailable(sku); got != 10 {
				t.Fatalf("mysql available = %d, want 10 (refunded)", got)
			}

			for i := range 4 {
				p.sweep()
				a, h := p.redisStock(sku)
				if m := p.mysqlAvailable(sku); a+h > m {
					t.Fatalf("sweep %d: redis available %d + held %d > mysql available %d: counted twice", i+1, a, h, m)
				}
				p.clock.Advance(11 * time.Second)
			}
			p.wantStores("settled", sku, 10, 0, 10)
			p.check(invariant.Expect{Sellable: map[string]int64{sku: 10}, Accepted: []string{id}, Quiescent: true})
		})
	}
}

// TestPromise11WarmUpDoesNotOvercount: Redis loses a SKU's stock key and
// the sweeper warms it from MySQL while a MySQL-first change is not yet in
// Redis. The warm-up must count every unit once: at quiescence Redis
// available + held equals MySQL available, with no heal needed.
//
//   - A hold persisted but not yet confirmed in Redis (the key is lost in the
//     window between persist's commit and its Redis confirm): counted once
//     by MySQL's deduction and once more as held, it would leave Redis short.
//   - A refund committed in MySQL whose Redis release failed: warmed from
//     MySQL's refunded figure and then released again, it would leave Redis
//     above MySQL. Reasoned rather than reproduced: today nothing re-applies
//     the failed release, so this guards the repair that the issue adds.
func TestPromise11WarmUpDoesNotOvercount(t *testing.T) {
	t.Run("hold persisted, not yet confirmed", func(t *testing.T) {
		var p *promise
		var annID atomic.Value
		var fired atomic.Bool
		hooks := reservation.Hooks{AfterCommit: func(r reservation.Reservation) error {
			if r.ID != annID.Load() || !fired.CompareAndSwap(false, true) {
				return nil
			}
			// MySQL took ann's units; Redis still shows her hold HELD. The
			// stock key is lost now and the sweeper warms the SKU.
			p.rdb.Del(context.Background(), "hf:{"+r.SKU+"}:stock")
			if rep := p.sweep(); rep.Warmed != 1 {
				p.t.Errorf("sweep in the window warmed %d SKUs, want 1", rep.Warmed)
			}
			return nil
		}}
		p = newPromise(t, withHooks(hooks))
		sku := testservices.Name("warm")
		p.createSKU(sku, 10, 0)
		ann := p.reserved(sku, "ann", 2, "")
		annID.Store(ann)
		bob := p.reserved(sku, "bob", 3, "")
		p.wantStores("both held", sku, 5, 5, 10)

		p.persistMsgs(ann)
		if !fired.Load() {
			t.Fatal("the stock key was never lost between commit and confirm")
		}
		p.persistMsgs(bob)
		healed := p.sweep().Healed
		p.wantAgree("both persisted, one sweep", sku, 5)
		for range 3 {
			p.clock.Advance(2 * time.Minute) // well past HOLDFAST_RECONCILE_AFTER (50 s)
			healed += p.sweep().Healed
		}
		if healed != 0 {
			t.Errorf("reconciliation healed %d times, want 0: the warm-up must not need a heal", healed)
		}
		p.wantStores("quiescent", sku, 5, 0, 5)
		p.check(invariant.Expect{Sellable: map[string]int64{sku: 10}, Accepted: []string{ann, bob}, Quiescent: true})
	})
	t.Run("refund not yet released", func(t *testing.T) {
		p := newPromiseBehindProxy(t)
		sku := testservices.Name("warmref")
		p.createSKU(sku, 10, 0)
		id := p.reserved(sku, "ann", 2, "")
		p.persistMsgs(id)
		p.wantStores("confirmed", sku, 8, 0, 8)

		p.proxy.Refuse(true)
		if code, b := p.call("DELETE", "/reservations/"+id, "", nil); code != http.StatusOK && code != http.StatusServiceUnavailable {
			t.Fatalf("DELETE with Redis down = %d %v, want 200 or 503", code, b)
		}
		p.proxy.Refuse(false)
		p.rdb.Del(context.Background(), "hf:{"+sku+"}:stock")

		healed := 0
		for i := range 4 {
			healed += p.sweep().Healed
			a, h := p.redisStock(sku)
			if m := p.mysqlAvailable(sku); a+h > m {
				t.Fatalf("sweep %d: redis available %d + held %d > mysql available %d: the refund counted twice", i+1, a, h, m)
			}
			p.clock.Advance(time.Minute) // past the grace, then past HOLDFAST_RECONCILE_AFTER
		}
		if healed != 0 {
			t.Errorf("reconciliation healed %d times, want 0", healed)
		}
		p.wantStores("quiescent", sku, 10, 0, 10)
		p.check(invariant.Expect{Sellable: map[string]int64{sku: 10}, Accepted: []string{id}, Quiescent: true})
	})
}

// driftOf is sku's drift as the sweep report names it (0 when it does not drift).
func driftOf(rep reservation.SweepReport, sku string) int64 {
	for _, d := range rep.WorstDrift {
		if d.SKU == sku {
			return d.Drift
		}
	}
	return 0
}
