package system_test

// Helpers shared by the subject files: the promise harness (a stack whose
// messages a test delivers when its scenario says) and the enqueuers and
// readers more than one subject uses.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/holdfast/holdfast/internal/testkit/faultproxy"
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

func (p *promise) persistMsgs(ids ...string) { p.t.Helper(); p.deliver(p.persist, ids...) }

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
// SKU that carries a TTL (finished holds, group keys) is gone, and so is
// the time in which its buckets held every reservation (meta.whole): that
// outlasts every hold decided in it by the retention (endWhole).
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
	p.endWhole(sku)
	return n
}

// forgetHold simulates retention passing for one hold (endWhole too).
func (p *promise) forgetHold(sku, id string) {
	p.t.Helper()
	if n, err := p.rdb.Del(context.Background(), "hf:{"+sku+"}:r:"+id).Result(); err != nil || n != 1 {
		p.t.Fatalf("forget hold %s: deleted %d, %v", id, n, err)
	}
	p.endWhole(sku)
}

// endWhole ends the time in which the SKU's buckets hold every reservation
// of it (warm.lua's meta.whole), as the retention passing would: a finished
// hold can be gone only once it has. The tests that forget holds without
// moving the clock that long say so through it.
func (p *promise) endWhole(sku string) {
	p.t.Helper()
	ctx := context.Background()
	for _, k := range p.keysOfSKU(sku) {
		if strings.HasSuffix(k, "}:meta") {
			if err := p.rdb.HSet(ctx, k, "whole", 0).Err(); err != nil {
				p.t.Fatalf("end whole %s: %v", k, err)
			}
		}
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

// driftOf is sku's drift as the sweep report names it (0 when it does not drift).
func driftOf(rep reservation.SweepReport, sku string) int64 {
	for _, d := range rep.WorstDrift {
		if d.SKU == sku {
			return d.Drift
		}
	}
	return 0
}

// switchEnqueuer records every message; while fail is set it reports the
// send failed (nothing sent) and first runs before (a fault to inject).
type switchEnqueuer struct {
	rec    *recordingEnqueuer
	fail   atomic.Bool
	before func()
}

func (e *switchEnqueuer) Enqueue(ctx context.Context, r reservation.Reservation) error {
	if e.fail.Load() {
		if e.before != nil {
			e.before()
		}
		return reservation.Unavailable("sqs send", errInjected)
	}
	return e.rec.Enqueue(ctx, r)
}

var errInjected = &injectedError{}

type injectedError struct{}

func (*injectedError) Error() string { return "injected send failure" }

// deliverBatch hands ms to persist as one SQS batch; every record must succeed.
func (p *promise) deliverBatch(ms ...reservation.Reservation) {
	p.t.Helper()
	var ev events.SQSEvent
	for i, m := range ms {
		body, err := message.Encode(m)
		if err != nil {
			p.t.Fatal(err)
		}
		ev.Records = append(ev.Records, events.SQSMessage{
			MessageId: fmt.Sprintf("msg-%d-%d", time.Now().UnixNano(), i), Body: string(body),
			EventSource: "aws:sqs", EventSourceARN: p.queues.ARN,
		})
	}
	resp, err := p.persist.Handle(context.Background(), ev)
	if err != nil || len(resp.BatchItemFailures) > 0 {
		p.t.Fatalf("persist: %v, %d failures", err, len(resp.BatchItemFailures))
	}
}

// groupState reads a group's status and member count from MySQL.
func (p *promise) groupState(gid string) (status string, members, capacity int64) {
	p.t.Helper()
	if err := p.db.QueryRow(`SELECT status, members, capacity FROM group_buys WHERE group_id = ?`, gid).Scan(&status, &members, &capacity); err != nil {
		p.t.Fatalf("group %s: %v", gid, err)
	}
	return status, members, capacity
}
