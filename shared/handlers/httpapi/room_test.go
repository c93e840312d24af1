package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/holdfast/holdfast/shared/handlers/httpapi"
	"github.com/holdfast/holdfast/shared/reservation"
)

// roomStub is a SKU "s" with a waiting room: ticket "t1" ADMITTED at place
// 3 of 5, opened, 2 units left and 1 held.
func roomStub() *stub {
	return &stub{room: true, queue: reservation.QueueState{
		SKU: "s", Now: time.UnixMilli(1_800_000_001_000), OpensAt: time.UnixMilli(1_800_000_000_000), ClosesAt: time.UnixMilli(1_800_003_600_000),
		Through: 3, Length: 5, Available: 2, Held: 1,
		Ticket: "t1", Position: 3, State: reservation.TicketAdmitted, AdmittedAt: time.UnixMilli(1_800_000_000_500),
	}, admission: reservation.Admission{Token: "1800000120500.sig", Expires: time.UnixMilli(1_800_000_120_500)}}
}

// The waiting room's three routes: a buyer joins (no body, or {}), anyone
// reads the queue's state without a token (cacheable for a second), a buyer
// reads their ticket and its admission token (never cached).
func TestWaitingRoomRoutes(t *testing.T) {
	h := func(svc *stub) *httpapi.Handler {
		return httpapi.New(svc, slog.New(slog.NewTextHandler(io.Discard, nil)))
	}
	const queueState = `"admitted_through":3,"closes_at":"2027-01-15T09:00:00Z","length":5,"may_return":false,"open":true,` +
		`"opens_at":"2027-01-15T08:00:00Z","server_time":"2027-01-15T08:00:01Z","sku":"s","sold_out":false`

	for _, body := range []string{"", "{}", " \n"} {
		svc := roomStub()
		resp, _ := h(svc).Handle(context.Background(), request("POST", "/skus/s/queue", body, nil))
		var got map[string]any
		_ = json.Unmarshal([]byte(resp.Body), &got)
		if resp.StatusCode != 200 || got["ticket"] != "t1" || got["status"] != "ADMITTED" || got["position"] != float64(3) ||
			got["admission_token"] != nil || svc.asked != "u s" {
			t.Errorf("POST /skus/s/queue %q = %d %s (asked %q), want 200 the ticket without its token, for u on s", body, resp.StatusCode, resp.Body, svc.asked)
		}
		if cc := resp.Headers["Cache-Control"]; cc != "no-store" {
			t.Errorf("POST /skus/s/queue: Cache-Control %q, want no-store", cc)
		}
	}

	svc := roomStub()
	resp, _ := h(svc).Handle(context.Background(), anonymous("GET", "/skus/s/queue", "", nil))
	if want := `{` + queueState + `}`; resp.StatusCode != 200 || resp.Body != want || svc.asked != "s" {
		t.Errorf("GET /skus/s/queue without a token = %d %s, want 200 %s", resp.StatusCode, resp.Body, want)
	}
	if cc := resp.Headers["Cache-Control"]; cc != "public, max-age=1" {
		t.Errorf("GET /skus/s/queue: Cache-Control %q, want public, max-age=1", cc)
	}
	// With a token it is the same answer: it names nobody.
	if again, _ := h(roomStub()).Handle(context.Background(), request("GET", "/skus/s/queue", "", nil)); again.Body != resp.Body {
		t.Errorf("GET /skus/s/queue with a token = %s, want the anonymous answer %s", again.Body, resp.Body)
	}

	svc = roomStub()
	resp, _ = h(svc).Handle(context.Background(), request("GET", "/skus/s/queue/t1", "", nil))
	want := `{"admission_expires_at":"2027-01-15T08:02:00.5Z","admission_token":"1800000120500.sig","admitted_through":3,` +
		`"closes_at":"2027-01-15T09:00:00Z","length":5,"may_return":false,"open":true,"opens_at":"2027-01-15T08:00:00Z","position":3,` +
		`"server_time":"2027-01-15T08:00:01Z","sku":"s","sold_out":false,"status":"ADMITTED","ticket":"t1"}`
	if resp.StatusCode != 200 || resp.Body != want || svc.asked != "u s t1" || resp.Headers["Cache-Control"] != "no-store" {
		t.Errorf("GET /skus/s/queue/t1 = %d %s %v (asked %q), want 200 %s, no-store, for u's ticket t1 on s", resp.StatusCode, resp.Body, resp.Headers, svc.asked, want)
	}
	// Before the opening a ticket has no place yet, and WAITING no token.
	svc = roomStub()
	svc.queue.Position, svc.queue.State = 0, reservation.TicketWaiting
	if code, body := do(t, svc, request("GET", "/skus/s/queue/t1", "", nil)); code != 200 || body["position"] != nil || body["admission_token"] != nil || body["status"] != "WAITING" {
		t.Errorf("a WAITING ticket before the opening = %d %v, want no position and no token", code, body)
	}

	for _, r := range []struct{ method, path string }{{"POST", "/skus/s/queue"}, {"GET", "/skus/s/queue/t1"}} {
		svc := roomStub()
		if code, body := do(t, svc, anonymous(r.method, r.path, "", nil)); code != 401 || svc.calls != 0 {
			t.Errorf("%s %s without a token = %d %v (%d calls), want 401 and no call", r.method, r.path, code, body, svc.calls)
		}
	}
	for _, b := range []string{`{"ticket":"x"}`, `null`, `[]`} {
		svc := roomStub()
		if code, body := do(t, svc, request("POST", "/skus/s/queue", b, nil)); code != 400 || svc.calls != 0 {
			t.Errorf("POST /skus/s/queue %s = %d %v (%d calls), want 400 and no call", b, code, body, svc.calls)
		}
	}
}

// The queue's refusals: 404s that say which thing is missing, 409s with
// what to wait for, and never cached (Cache-Control: no-store), the
// public route's included.
func TestWaitingRoomErrors(t *testing.T) {
	opens := time.Now().Add(90 * time.Second).Truncate(time.Millisecond)
	for _, c := range []struct {
		err        error
		status     int
		code       string
		retryAfter bool
	}{
		{reservation.ErrUnknownSKU, 404, "unknown_sku", false},
		{reservation.ErrNoWaitingRoom, 404, "no_waiting_room", false},
		{&reservation.QueueNotOpenError{OpensAt: opens, RetryAfter: 90 * time.Second}, 409, "queue_not_open", true},
		{reservation.ErrSaleClosed, 409, "sale_closed", false},
		{&reservation.RateLimitedError{RetryAfter: 200 * time.Millisecond}, 429, "rate_limited", true},
		{reservation.Unavailable("redis queue", fmt.Errorf("i/o timeout")), 503, "unavailable", true},
		{reservation.ErrUnknownTicket, 404, "unknown_ticket", false},
	} {
		for _, r := range []struct{ method, path string }{{"POST", "/skus/s/queue"}, {"GET", "/skus/s/queue"}, {"GET", "/skus/s/queue/t1"}} {
			svc := roomStub()
			svc.err = c.err
			h := httpapi.New(svc, slog.New(slog.NewTextHandler(io.Discard, nil)))
			resp, _ := h.Handle(context.Background(), request(r.method, r.path, "", nil))
			var body map[string]string
			_ = json.Unmarshal([]byte(resp.Body), &body)
			if resp.StatusCode != c.status || body["error"] != c.code {
				t.Errorf("%s %s: %v -> %d %v, want %d %s", r.method, r.path, c.err, resp.StatusCode, body, c.status, c.code)
			}
			// The public status's errors are everyone's, as its answer is:
			// kept a second (a room turned off is not every poll reaching
			// the API); a buyer's are nobody's.
			want := "no-store"
			if r.method == "GET" && r.path == "/skus/s/queue" {
				want = "public, max-age=1"
			}
			if cc := resp.Headers["Cache-Control"]; cc != want {
				t.Errorf("%s %s: %v -> Cache-Control %q, want %s", r.method, r.path, c.err, cc, want)
			}
			if _, ok := resp.Headers["Retry-After"]; ok != c.retryAfter {
				t.Errorf("%s %s: %v -> Retry-After present %v, want %v", r.method, r.path, c.err, ok, c.retryAfter)
			}
			if c.code == "queue_not_open" {
				n, _ := strconv.Atoi(resp.Headers["Retry-After"])
				if body["queue_opens_at"] != opens.UTC().Format(time.RFC3339Nano) || n < 89 || n > 91 {
					t.Errorf("queue_not_open = %v, Retry-After %q; want queue_opens_at %s and about 90 s", body, resp.Headers["Retry-After"], opens.UTC().Format(time.RFC3339Nano))
				}
			}
		}
	}
}

// POST /reservations hands the Admission-Token on (any case of the
// header's name); the admission's refusals are 403s naming what is wrong.
func TestReserveWithAdmission(t *testing.T) {
	svc := &stub{}
	code, _ := do(t, svc, request("POST", "/reservations", `{"sku":"s","qty":1}`, map[string]string{"admission-token": "123.abc", "Idempotency-Key": "k"}))
	if code != 202 || svc.last.Admission != "123.abc" || svc.last.UserID != "u" {
		t.Errorf("reserve with an admission = %d, request %+v; want 202 with Admission 123.abc for u", code, svc.last)
	}
	for _, c := range []struct {
		err  error
		code string
	}{
		{reservation.ErrAdmissionRequired, "admission_required"},
		{reservation.ErrAdmissionInvalid, "admission_invalid"},
		{fmt.Errorf("reserve: %w", reservation.ErrAdmissionExpired), "admission_expired"},
	} {
		if code, body := do(t, &stub{err: c.err}, request("POST", "/reservations", `{"sku":"s","qty":1}`, nil)); code != 403 || body["error"] != c.code {
			t.Errorf("%v -> %d %v, want 403 %s", c.err, code, body, c.code)
		}
	}
}

// The stock route takes waiting_room and admit_factor; every stock answer
// says whether the SKU has a room (and the factor with it), and GET
// /skus/{sku} says waiting_room: true when it has one.
func TestStockWaitingRoom(t *testing.T) {
	svc := &stub{}
	if code, body := do(t, svc, request("PUT", "/admin/skus/s/stock", `{"add":0,"waiting_room":true,"admit_factor":1.5}`, nil)); code != 200 ||
		svc.change.WaitingRoom == nil || !*svc.change.WaitingRoom || svc.change.AdmitFactor == nil || *svc.change.AdmitFactor != 1.5 {
		t.Errorf("PUT with a room = %d %v, change %+v", code, body, svc.change)
	}
	if code, _ := do(t, svc, request("PUT", "/admin/skus/s/stock", `{"add":0}`, nil)); code != 200 || svc.change.WaitingRoom != nil || svc.change.AdmitFactor != nil {
		t.Errorf("PUT without a room = %d, change %+v; want the room left alone", code, svc.change)
	}
	for _, b := range []string{`{"add":0,"waiting_room":"yes"}`, `{"add":0,"admit_factor":"2"}`, `{"add":0,"waiting_room":null}`} {
		svc := &stub{}
		if code, body := do(t, svc, request("PUT", "/admin/skus/s/stock", b, nil)); code != 400 || svc.calls != 0 {
			t.Errorf("PUT %s = %d %v, want 400 and no call", b, code, body)
		}
	}
	if code, body := do(t, &stub{err: &reservation.InvalidError{Field: "admit_factor", Msg: "must be between 1 and 100"}}, request("PUT", "/admin/skus/s/stock", `{"add":0,"admit_factor":0.5}`, nil)); code != 400 || body["error"] != "invalid_request" {
		t.Errorf("a bad admit_factor = %d %v, want 400 invalid_request", code, body)
	}

	h := httpapi.New(&roomLevelStub{stub: stub{room: true}}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	resp, _ := h.Handle(context.Background(), anonymous("PUT", "/admin/skus/s/stock", `{"add":0}`, nil))
	var body map[string]any
	_ = json.Unmarshal([]byte(resp.Body), &body)
	if resp.StatusCode != 200 || body["waiting_room"] != true || body["admit_factor"] != 2.5 {
		t.Errorf("PUT answer of a SKU with a room = %d %v, want waiting_room true, admit_factor 2.5", resp.StatusCode, body)
	}
	if code, body := do(t, &stub{}, anonymous("PUT", "/admin/skus/s/stock", `{"add":0}`, nil)); code != 200 || body["waiting_room"] != false || body["admit_factor"] != nil {
		t.Errorf("PUT answer of a SKU without a room = %d %v, want waiting_room false, no admit_factor", code, body)
	}
	for _, c := range []struct {
		room bool
		want any
	}{{true, true}, {false, false}} {
		if code, body := do(t, &stub{room: c.room}, anonymous("GET", "/admin/skus/s/stock", "", nil)); code != 200 || body["waiting_room"] != c.want {
			t.Errorf("GET admin stock, room %v = %d %v, want waiting_room %v", c.room, code, body, c.want)
		}
	}
	if code, body := do(t, &stub{room: true}, request("GET", "/skus/s", "", nil)); code != 200 || body["waiting_room"] != true {
		t.Errorf("GET /skus/s with a room = %d %v, want waiting_room true", code, body)
	}
	if code, body := do(t, &stub{}, request("GET", "/skus/s", "", nil)); code != 200 || body["waiting_room"] != nil {
		t.Errorf("GET /skus/s without a room = %d %v, want no waiting_room", code, body)
	}
}

// roomLevelStub's SKU has a room admitting 2.5 buyers per unit.
type roomLevelStub struct{ stub }

func (s *roomLevelStub) ChangeStock(context.Context, reservation.StockChange) (reservation.StockLevel, error) {
	return reservation.StockLevel{SKU: "s", Available: 1, Version: 2, AdmitPermille: 2500}, nil
}

// With an edge secret the public status is answered only to the CDN (its
// origin custom header): a poll of the API's own endpoint around the cache
// is 403 edge_only and reads nothing; the buyer's own routes are not gated.
func TestPublicStatusOnlyThroughTheEdge(t *testing.T) {
	h := func(svc *stub) *httpapi.Handler {
		return httpapi.New(svc, slog.New(slog.NewTextHandler(io.Discard, nil)), httpapi.WithEdgeSecret("edge-s3cret"))
	}
	for _, headers := range []map[string]string{nil, {"x-holdfast-edge": "wrong"}, {"x-holdfast-edge": "edge-s3cre"}, {"x-holdfast-edge": ""}} {
		svc := roomStub()
		resp, _ := h(svc).Handle(context.Background(), anonymous("GET", "/skus/s/queue", "", headers))
		var got map[string]any
		_ = json.Unmarshal([]byte(resp.Body), &got)
		if resp.StatusCode != 403 || got["error"] != "edge_only" || svc.asked != "" || resp.Headers["Cache-Control"] != "no-store" {
			t.Errorf("GET /skus/s/queue with %v = %d %s (asked %q), want 403 edge_only, no-store, nothing read", headers, resp.StatusCode, resp.Body, svc.asked)
		}
	}
	svc := roomStub()
	if resp, _ := h(svc).Handle(context.Background(), anonymous("GET", "/skus/s/queue", "", map[string]string{"X-Holdfast-Edge": "edge-s3cret"})); resp.StatusCode != 200 || svc.asked != "s" {
		t.Errorf("GET /skus/s/queue from the CDN = %d %s, want 200", resp.StatusCode, resp.Body)
	}
	svc = roomStub()
	if resp, _ := h(svc).Handle(context.Background(), request("GET", "/skus/s/queue/t1", "", nil)); resp.StatusCode != 200 {
		t.Errorf("GET /skus/s/queue/t1 without the edge's header = %d %s, want 200 (a buyer's own)", resp.StatusCode, resp.Body)
	}
}
