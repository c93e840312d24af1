package httpapi_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/holdfast/holdfast/internal/testkit/apievent"
	"github.com/holdfast/holdfast/shared/handlers/httpapi"
	"github.com/holdfast/holdfast/shared/reservation"
)

// stub records calls and answers with err (or a plausible value).
type stub struct {
	calls     int
	err       error
	last      reservation.ReserveRequest
	change    reservation.StockChange
	user      string // the caller Get or Cancel was asked for
	groupUser string // the creator CreateGroup was asked for
	id, note  string // the reservation Pay or OrderCancel was asked for, and OrderCancel's note
	// The waiting room: room makes QueueStatus answer, and SKU and
	// InspectStock report one (else
	// ErrNoWaitingRoom); queue and admission are what the queue's methods
	// answer; asked records their arguments ("user sku ticket").
	room      bool
	queue     reservation.QueueState
	admission reservation.Admission
	asked     string
}

func (s *stub) Reserve(_ context.Context, req reservation.ReserveRequest) (reservation.Reservation, bool, error) {
	s.calls++
	s.last = req
	return reservation.Reservation{ID: "r-1", SKU: req.SKU, Qty: req.Qty, Status: reservation.StatusHeld, ExpiresAt: time.Unix(1, 0)}, false, s.err
}
func (s *stub) Get(_ context.Context, _, user string) (reservation.Reservation, error) {
	s.calls++
	s.user = user
	return reservation.Reservation{ID: "r-1", Status: reservation.StatusConfirmed}, s.err
}
func (s *stub) Cancel(_ context.Context, _, user string) (reservation.Reservation, error) {
	s.calls++
	s.user = user
	return reservation.Reservation{ID: "r-1", Status: reservation.StatusCancelled, Reason: reservation.ReasonBuyer}, s.err
}
func (s *stub) Pay(_ context.Context, id string) (reservation.Reservation, error) {
	s.calls++
	s.id = id
	return reservation.Reservation{ID: id, SKU: "s", Qty: 1, Status: reservation.StatusConfirmed,
		PayBy: time.UnixMilli(1_800_000_900_000), PaidAt: time.UnixMilli(1_800_000_060_500)}, s.err
}
func (s *stub) OrderCancel(_ context.Context, id, note string) (reservation.Reservation, error) {
	s.calls++
	s.id, s.note = id, note
	return reservation.Reservation{ID: id, SKU: "s", Qty: 1, Status: reservation.StatusCancelled,
		Reason: reservation.ReasonOrderCancelled, Note: note}, s.err
}
func (s *stub) CreateGroup(_ context.Context, user, sku string, capacity int, _ time.Duration) (reservation.Group, error) {
	s.groupUser = user
	s.calls++
	return reservation.Group{ID: "g-1", SKU: sku, Capacity: capacity, Remaining: capacity, Status: reservation.GroupOpen}, s.err
}
func (s *stub) Group(context.Context, string) (reservation.Group, error) {
	s.calls++
	return reservation.Group{ID: "g-1", Status: reservation.GroupOpen}, s.err
}
func (s *stub) SKU(_ context.Context, sku string) (reservation.SKUState, error) {
	s.calls++
	return reservation.SKUState{SKU: sku, Available: 7, OpensAt: time.UnixMilli(1_800_000_000_000), Now: time.UnixMilli(1_799_999_990_500), WaitingRoom: s.room}, s.err
}
func (s *stub) ChangeStock(_ context.Context, c reservation.StockChange) (reservation.StockLevel, error) {
	s.calls++
	s.change = c
	if c.Set != nil {
		return reservation.StockLevel{SKU: c.SKU, Available: *c.Set, Version: 4}, s.err
	}
	return reservation.StockLevel{SKU: c.SKU, Available: *c.Add, Version: 4}, s.err
}

func (s *stub) JoinQueue(_ context.Context, user, sku string) (reservation.QueueState, error) {
	s.calls++
	s.asked = user + " " + sku
	return s.queue, s.err
}

func (s *stub) QueueStatus(_ context.Context, sku string) (reservation.QueueState, error) {
	s.calls++
	s.asked = sku
	if s.err == nil && !s.room {
		return reservation.QueueState{}, reservation.ErrNoWaitingRoom
	}
	q := s.queue
	q.Ticket, q.Position, q.State, q.AdmittedAt = "", 0, reservation.TicketNone, time.Time{}
	return q, s.err
}

func (s *stub) Ticket(_ context.Context, user, sku, ticket string) (reservation.QueueState, reservation.Admission, error) {
	s.calls++
	s.asked = user + " " + sku + " " + ticket
	return s.queue, s.admission, s.err
}

func (s *stub) InspectStock(_ context.Context, sku string) (reservation.StockReport, error) {
	s.calls++
	r := reservation.StockReport{SKU: sku, MySQLAvailable: 10, RedisAvailable: 7, Held: 2}
	if s.room {
		r.AdmitPermille = 2500
	}
	return r, s.err
}

func (s *stub) Account(_ context.Context, sku string) (reservation.SKUAccount, error) {
	s.calls++
	return reservation.SKUAccount{
		Tally: reservation.Tally{SKU: sku, PutIn: 10, Available: 6, Rows: []reservation.RowTally{
			{Status: reservation.StatusConfirmed, Count: 2, Units: 3},
			{Status: reservation.StatusCancelled, Reason: reservation.ReasonBuyer, Refunded: true, Count: 1, Units: 2},
			{Status: reservation.StatusCancelled, Reason: reservation.ReasonBuyer, Count: 1, Units: 1},
		}},
		Stock:     reservation.StockReport{SKU: sku, MySQLAvailable: 6, RedisAvailable: 5, Held: 0},
		LastAudit: reservation.AuditResult{SKU: sku, At: time.Unix(60, 0), PutIn: 10, Available: 6, Taken: 3, Mismatch: 1, Drift: 1},
		Audited:   true,
	}, s.err
}

// request is a v2 event as API Gateway passes it for buyer "u" (its JWT
// authorizer's claims); anonymous drops them.
func request(method, path, body string, headers map[string]string) events.APIGatewayV2HTTPRequest {
	req := anonymous(method, path, body, headers)
	req.RequestContext.Authorizer = &events.APIGatewayV2HTTPRequestContextAuthorizerDescription{
		JWT: &events.APIGatewayV2HTTPRequestContextAuthorizerJWTDescription{Claims: map[string]string{"sub": "u"}},
	}
	return req
}

func anonymous(method, path, body string, headers map[string]string) events.APIGatewayV2HTTPRequest {
	return apievent.New(method, path, body, headers)
}

func do(t *testing.T, svc *stub, req events.APIGatewayV2HTTPRequest) (int, map[string]any) {
	t.Helper()
	h := httpapi.New(svc, slog.New(slog.NewTextHandler(io.Discard, nil)))
	resp, err := h.Handle(context.Background(), req)
	if err != nil {
		t.Fatalf("Handle returned an error: %v", err)
	}
	if resp.Headers["Content-Type"] != "application/json" {
		t.Errorf("Content-Type = %q", resp.Headers["Content-Type"])
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(resp.Body), &m); err != nil {
		t.Fatalf("body %q: %v", resp.Body, err)
	}
	return resp.StatusCode, m
}

func TestBadInputIsA4xxThatNamesTheProblemAndReachesNothing(t *testing.T) {
	tests := []struct {
		name, method, path, body string
		wantStatus               int
		wantInMessage            string
	}{
		{"bad json", "POST", "/reservations", `{"sku":`, 400, "not valid JSON"},
		{"empty body", "POST", "/reservations", ``, 400, "body is required"},
		{"qty a string", "POST", "/reservations", `{"sku":"s","qty":"2","user_id":"u"}`, 400, `"qty"`},
		{"qty a fraction", "POST", "/reservations", `{"sku":"s","qty":1.5,"user_id":"u"}`, 400, `"qty"`},
		{"missing sku", "POST", "/reservations", `{"qty":1,"user_id":"u"}`, 400, "sku is required"},
		{"missing qty", "POST", "/reservations", `{"sku":"s","user_id":"u"}`, 400, "qty is required"},
		{"another user in the body", "POST", "/reservations", `{"sku":"s","qty":1,"user_id":"mallory"}`, 400, "not the user the token names"},
		{"unknown field", "POST", "/reservations", `{"sku":"s","qty":1,"user_id":"u","quantity":2}`, 400, "quantity"},
		{"two objects", "POST", "/reservations", `{"sku":"s","qty":1,"user_id":"u"}{}`, 400, "after the JSON"},
		{"oversize", "POST", "/reservations", `{"sku":"` + strings.Repeat("x", 5000) + `","qty":1,"user_id":"u"}`, 413, "larger than"},
		{"group without capacity", "POST", "/groups", `{"sku":"s"}`, 400, "capacity is required"},
		{"group ttl zero", "POST", "/groups", `{"sku":"s","capacity":3,"ttl_seconds":0}`, 400, "ttl_seconds"},
		{"stock missing", "PUT", "/admin/skus/s/stock", `{}`, 400, "exactly one of stock"},
		{"stock and add", "PUT", "/admin/skus/s/stock", `{"stock":1,"add":1}`, 400, "exactly one of stock"},
		{"opens_at not a time", "PUT", "/admin/skus/s/stock", `{"add":0,"opens_at":"tomorrow"}`, 400, "opens_at must be an RFC 3339 time"},
		{"closes_at without a zone", "PUT", "/admin/skus/s/stock", `{"add":0,"closes_at":"2026-12-01T09:00:00"}`, 400, "closes_at must be an RFC 3339 time"},
		{"opens_at a number", "PUT", "/admin/skus/s/stock", `{"add":0,"opens_at":1800000000}`, 400, `"opens_at" must be a string`},
		{"opens_at the zero time", "PUT", "/admin/skus/s/stock", `{"add":0,"opens_at":"0001-01-01T00:00:00Z"}`, 400, "opens_at must be an RFC 3339 time"},
		{"opens_at null", "PUT", "/admin/skus/s/stock", `{"add":0,"opens_at":null}`, 400, `"opens_at" must not be null`},
		{"pay_within_seconds a string", "PUT", "/admin/skus/s/stock", `{"add":0,"pay_within_seconds":"60"}`, 400, `"pay_within_seconds" must be an integer`},
		{"pay_within_seconds a fraction", "PUT", "/admin/skus/s/stock", `{"add":0,"pay_within_seconds":1.5}`, 400, `"pay_within_seconds"`},
		{"paid with a member", "POST", "/admin/reservations/s.aaaaaaaaaaaaaaaaaaaaaaaaaa/paid", `{"amount":5}`, 400, `unknown field "amount"`},
		{"paid with null", "POST", "/admin/reservations/s.aaaaaaaaaaaaaaaaaaaaaaaaaa/paid", `null`, 400, "body must be a JSON object"},
		{"paid with an array", "POST", "/admin/reservations/s.aaaaaaaaaaaaaaaaaaaaaaaaaa/paid", `[]`, 400, "body must be a JSON object"},
		{"paid with two objects", "POST", "/admin/reservations/s.aaaaaaaaaaaaaaaaaaaaaaaaaa/paid", `{}{}`, 400, "after the JSON"},
		{"paid oversize", "POST", "/admin/reservations/s.aaaaaaaaaaaaaaaaaaaaaaaaaa/paid", `{}` + strings.Repeat(" ", 5000), 413, "larger than"},
		{"order cancel without a body", "POST", "/admin/reservations/s.aaaaaaaaaaaaaaaaaaaaaaaaaa/cancel", ``, 400, "body is required"},
		{"order cancel without a reason", "POST", "/admin/reservations/s.aaaaaaaaaaaaaaaaaaaaaaaaaa/cancel", `{}`, 400, "reason is required"},
		{"order cancel with a reason a number", "POST", "/admin/reservations/s.aaaaaaaaaaaaaaaaaaaaaaaaaa/cancel", `{"reason":7}`, 400, `"reason" must be a string`},
		{"order cancel with a note", "POST", "/admin/reservations/s.aaaaaaaaaaaaaaaaaaaaaaaaaa/cancel", `{"reason":"fraud","note":"x"}`, 400, `unknown field "note"`},
		{"unknown route", "GET", "/nope", ``, 404, "no route"},
		{"a route API Gateway does not have", "PATCH", "/reservations", ``, 404, "no route"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc := &stub{}
			code, body := do(t, svc, request(tt.method, tt.path, tt.body, nil))
			if code != tt.wantStatus {
				t.Errorf("%s %s = %d %v, want %d", tt.method, tt.path, code, body, tt.wantStatus)
			}
			if msg, _ := body["message"].(string); !strings.Contains(msg, tt.wantInMessage) || body["error"] == nil {
				t.Errorf("body = %v, want an error whose message names %q", body, tt.wantInMessage)
			}
			if svc.calls != 0 {
				t.Errorf("bad input reached the service (%d calls)", svc.calls)
			}
		})
	}
}

func TestDomainErrorsMapToStatusAndCode(t *testing.T) {
	tests := []struct {
		err      error
		status   int
		code     string
		retryHdr bool
	}{
		{reservation.ErrSoldOut, 409, "sold_out", false},
		{reservation.ErrGroupFull, 409, "group_full", false},
		{reservation.ErrAlreadyJoined, 409, "already_joined", false},
		{reservation.ErrGroupClosed, 409, "group_closed", false},
		{reservation.ErrLimitExceeded, 409, "limit_exceeded", false},
		{&reservation.NotOpenError{OpensAt: time.Unix(1_800_000_000, 0), RetryAfter: 1500 * time.Millisecond}, 409, "not_open", true},
		{reservation.ErrSaleClosed, 409, "sale_closed", false},
		{reservation.ErrIdempotencyMismatch, 422, "idempotency_mismatch", false},
		{reservation.ErrUnknownSKU, 404, "unknown_sku", false},
		{reservation.ErrUnknownGroup, 404, "unknown_group", false},
		{&reservation.RateLimitedError{RetryAfter: 300 * time.Millisecond}, 429, "rate_limited", true},
		{&reservation.TooManyGroupsError{RetryAfter: 90 * time.Second}, 429, "too_many_groups", true},
		{&reservation.InvalidError{Field: "qty", Msg: "must be at most 10"}, 400, "invalid_request", false},
		{reservation.Unavailable("redis reserve", errors.New("i/o timeout")), 503, "unavailable", true},
		{errors.New("boom"), 500, "internal", false},
	}
	for _, tt := range tests {
		t.Run(tt.code, func(t *testing.T) {
			svc := &stub{err: tt.err}
			h := httpapi.New(svc, slog.New(slog.NewTextHandler(io.Discard, nil)))
			resp, _ := h.Handle(context.Background(), request("POST", "/reservations", `{"sku":"s","qty":1,"user_id":"u"}`, nil))
			var body map[string]string
			_ = json.Unmarshal([]byte(resp.Body), &body)
			if resp.StatusCode != tt.status || body["error"] != tt.code {
				t.Errorf("error %v -> %d %v, want %d %s", tt.err, resp.StatusCode, body, tt.status, tt.code)
			}
			if _, ok := resp.Headers["Retry-After"]; ok != tt.retryHdr {
				t.Errorf("Retry-After present = %v, want %v", ok, tt.retryHdr)
			}
			if strings.Contains(resp.Body, "i/o timeout") || strings.Contains(resp.Body, "boom") {
				t.Errorf("internal detail leaked: %s", resp.Body)
			}
		})
	}
}

func TestRoutes(t *testing.T) {
	svc := &stub{}
	key := map[string]string{"idempotency-key": "abc"}
	if code, body := do(t, svc, request("POST", "/reservations", `{"sku":"s","qty":2,"user_id":"u"}`, key)); code != 202 || body["status"] != "HELD" || body["expires_at"] == nil {
		t.Errorf("POST /reservations = %d %v", code, body)
	}
	if svc.last.IdempotencyKey != "abc" {
		t.Errorf("Idempotency-Key not passed (case-insensitively): %q", svc.last.IdempotencyKey)
	}
	// A named stage prefixes rawPath; the handler reads routeKey and
	// pathParameters, never the path.
	staged := request("GET", "/skus/s", "", nil)
	staged.RawPath, staged.RequestContext.HTTP.Path, staged.RequestContext.Stage = "/dev/skus/s", "/dev/skus/s", "dev"
	if code, body := do(t, svc, staged); code != 200 || body["sku"] != "s" {
		t.Errorf("GET /dev/skus/s on stage dev = %d %v, want the sku route", code, body)
	}
	// The parameter is API Gateway's (decoded), whatever the raw path says.
	odd := request("GET", "/skus/s", "", nil)
	odd.PathParameters = map[string]string{"sku": "a b"}
	if code, body := do(t, svc, odd); code != 200 || body["sku"] != "a b" {
		t.Errorf("GET with pathParameters sku=\"a b\" = %d %v, want the parameter as given", code, body)
	}
	b64 := base64.StdEncoding.EncodeToString([]byte(`{"sku":"s","qty":1,"user_id":"u"}`))
	req := request("POST", "/reservations", b64, nil)
	req.IsBase64Encoded = true
	if code, _ := do(t, svc, req); code != 202 {
		t.Errorf("base64 body = %d, want 202", code)
	}
	for _, c := range []struct {
		method, path, body string
		status             int
		key, want          string
	}{
		{"GET", "/reservations/r-1", "", 200, "status", "CONFIRMED"},
		{"DELETE", "/reservations/r-1", "", 200, "status", "CANCELLED"},
		{"POST", "/groups", `{"sku":"s","capacity":3}`, 201, "status", "OPEN"},
		{"GET", "/groups/g-1", "", 200, "group_id", "g-1"},
		{"GET", "/skus/s", "", 200, "sku", "s"},
		{"PUT", "/admin/skus/s/stock", `{"stock":9,"per_user_limit":1}`, 200, "sku", "s"},
		{"GET", "/admin/skus/s/stock", "", 200, "sku", "s"},
		{"GET", "/admin/skus/s/report", "", 200, "sku", "s"},
		{"POST", "/admin/reservations/s.aaaaaaaaaaaaaaaaaaaaaaaaaa/paid", "", 200, "status", "PAID"},
		{"POST", "/admin/reservations/s.aaaaaaaaaaaaaaaaaaaaaaaaaa/paid", "{}", 200, "status", "PAID"},
		{"POST", "/admin/reservations/s.aaaaaaaaaaaaaaaaaaaaaaaaaa/paid", " \n", 200, "status", "PAID"},
		{"POST", "/admin/reservations/s.aaaaaaaaaaaaaaaaaaaaaaaaaa/cancel", `{"reason":"fraud"}`, 200, "status", "CANCELLED"},
	} {
		if code, body := do(t, svc, request(c.method, c.path, c.body, nil)); code != c.status || body[c.key] != c.want {
			t.Errorf("%s %s = %d %v, want %d with %s=%s", c.method, c.path, code, body, c.status, c.key, c.want)
		}
	}
	if svc.groupUser != "u" {
		t.Errorf("POST /groups opened the group for %q, want the token's subject %q", svc.groupUser, "u")
	}
}

// The report sums the rows by status and by reason, and names the last
// audit's result.
func TestReportSumsRowsAndNamesTheLastAudit(t *testing.T) {
	code, body := do(t, &stub{}, anonymous("GET", "/admin/skus/s/report", "", nil))
	got, _ := json.Marshal(body)
	want := `{"by_reason":[{"count":2,"reason":"buyer_cancelled","units":3}],` +
		`"by_status":[{"count":2,"status":"CANCELLED","units":3},{"count":2,"status":"CONFIRMED","units":3}],` +
		`"drift":1,"held":0,"in_transfer":0,` +
		`"last_audit":{"at":"1970-01-01T00:01:00Z","clean":false,"drift":1,"ledger_mismatch":1,"mysql_available":6,"put_in":10,"sold":3},` +
		`"ledger_mismatch":1,"mysql_available":6,"paid":0,"put_in":10,"redis_available":5,"returned":2,"sku":"s","sold":3}`
	if code != 200 || string(got) != want {
		t.Errorf("report = %d %s\nwant %s", code, got, want)
	}
}

// FuzzHandle: any request gets a JSON response with a status; a request the
// API refuses as invalid never reaches the service, so it changes nothing.
// testdata/fuzz/FuzzHandle holds the corpus run by plain go test.
func FuzzHandle(f *testing.F) {
	f.Add("POST", "/reservations", `{"sku":"s","qty":1,"user_id":"u"}`, false)
	f.Add("POST", "/reservations", `{"sku":"s","qty":-1,"user_id":"u"}`, false)
	f.Add("POST", "/groups", `{"sku":"s","capacity":1e9}`, false)
	f.Add("PUT", "/admin/skus/s/stock", `{"stock":-5}`, false)
	f.Add("DELETE", "/reservations/", ``, false)
	f.Add("POST", "/reservations", `eyJza3UiOiJzIn0=`, true)
	f.Add("POST", "/admin/reservations/s.aaaaaaaaaaaaaaaaaaaaaaaaaa/paid", ``, false)
	f.Add("POST", "/admin/reservations/s.aaaaaaaaaaaaaaaaaaaaaaaaaa/cancel", `{"reason":"fraud"}`, false)
	f.Add("POST", "/skus/s/queue", ``, false)
	f.Add("GET", "/skus/s/queue/t", ``, false)
	f.Fuzz(func(t *testing.T, method, path, body string, b64 bool) {
		svc := &stub{}
		h := httpapi.New(svc, slog.New(slog.NewTextHandler(io.Discard, nil)))
		req := request(method, path, body, nil)
		req.IsBase64Encoded = b64
		resp, err := h.Handle(context.Background(), req)
		if err != nil {
			t.Fatalf("Handle error: %v", err)
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(resp.Body), &m); err != nil {
			t.Fatalf("%s %s: body %q is not JSON", method, path, resp.Body)
		}
		if resp.StatusCode < 200 || resp.StatusCode > 599 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		if resp.StatusCode >= 400 && resp.StatusCode < 500 && m["error"] == "invalid_request" && svc.calls != 0 {
			t.Fatalf("%s %s %q: refused as invalid but reached the service", method, path, body)
		}
	})
}

// The stock change's precondition comes from If-Match (as the ETag gives it)
// or the body; the domain errors map to 428, 412 and 409.
func TestStockChangePreconditions(t *testing.T) {
	svc := &stub{}
	code, body := do(t, svc, request("PUT", "/admin/skus/s/stock", `{"stock":9}`, map[string]string{"If-Match": `"3"`}))
	if code != 200 || svc.change.IfVersion == nil || *svc.change.IfVersion != 3 || body["version"] != float64(4) {
		t.Errorf("If-Match \"3\" = %d %v, change %+v", code, body, svc.change)
	}
	if code, _ := do(t, svc, request("PUT", "/admin/skus/s/stock", `{"add":-2}`, map[string]string{"Idempotency-Key": "k"})); code != 200 || *svc.change.Add != -2 || svc.change.Key != "k" {
		t.Errorf("add = %d, change %+v", code, svc.change)
	}
	for _, c := range []struct {
		name    string
		headers map[string]string
		body    string
		err     error
		status  int
		code    string
	}{
		{"bad If-Match", map[string]string{"If-Match": "abc"}, `{"stock":1}`, nil, 400, "invalid_request"},
		{"two versions disagree", map[string]string{"If-Match": `"2"`}, `{"stock":1,"version":3}`, nil, 400, "invalid_request"},
		{"no precondition", nil, `{"stock":1}`, reservation.ErrPreconditionRequired, 428, "precondition_required"},
		{"stale", map[string]string{"If-Match": `"1"`}, `{"stock":1}`, reservation.ErrPreconditionFailed, 412, "version_mismatch"},
		{"below zero", nil, `{"add":-100}`, reservation.ErrInsufficient, 409, "insufficient_stock"},
	} {
		svc := &stub{err: c.err}
		if code, body := do(t, svc, request("PUT", "/admin/skus/s/stock", c.body, c.headers)); code != c.status || body["error"] != c.code {
			t.Errorf("%s = %d %v, want %d %s", c.name, code, body, c.status, c.code)
		}
	}
}

// The sale window: not_open carries opens_at and a Retry-After of the
// seconds until it opens (rounded up, at least 1); the admin route takes
// RFC 3339 bounds ("" clears one) and answers the window it recorded;
// GET /skus/{sku} shows it with the server's time.
func TestSaleWindow(t *testing.T) {
	h := httpapi.New(&stub{err: &reservation.NotOpenError{OpensAt: time.UnixMilli(1_800_000_000_250), RetryAfter: 2100 * time.Millisecond}},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	resp, _ := h.Handle(context.Background(), request("POST", "/reservations", `{"sku":"s","qty":1}`, nil))
	var body map[string]string
	_ = json.Unmarshal([]byte(resp.Body), &body)
	if resp.StatusCode != 409 || body["error"] != "not_open" || body["opens_at"] != "2027-01-15T08:00:00.25Z" || resp.Headers["Retry-After"] != "3" {
		t.Errorf("not open = %d %v Retry-After %q, want 409 not_open with opens_at 2027-01-15T08:00:00.25Z and Retry-After 3", resp.StatusCode, body, resp.Headers["Retry-After"])
	}
	h = httpapi.New(&stub{err: &reservation.NotOpenError{OpensAt: time.UnixMilli(1_800_000_000_000), RetryAfter: time.Millisecond}},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if resp, _ := h.Handle(context.Background(), request("POST", "/reservations", `{"sku":"s","qty":1}`, nil)); resp.Headers["Retry-After"] != "1" {
		t.Errorf("a millisecond before opening: Retry-After %q, want 1 (at least a second)", resp.Headers["Retry-After"])
	}

	svc := &stub{}
	code, got := do(t, svc, request("PUT", "/admin/skus/s/stock", `{"add":0,"opens_at":"2027-01-15T09:00:00+01:00","closes_at":""}`, nil))
	if code != 200 || svc.change.OpensAt == nil || !svc.change.OpensAt.Equal(time.Unix(1_800_000_000, 0)) ||
		svc.change.ClosesAt == nil || !svc.change.ClosesAt.IsZero() {
		t.Errorf("PUT with a window = %d %v, change %+v; want opens_at 08:00Z and closes_at cleared", code, got, svc.change)
	}
	if code, _ := do(t, svc, request("PUT", "/admin/skus/s/stock", `{"add":1}`, nil)); code != 200 || svc.change.OpensAt != nil || svc.change.ClosesAt != nil {
		t.Errorf("PUT without a window = %d, change %+v; want the window left alone", code, svc.change)
	}
	code, got = do(t, svc, request("GET", "/skus/s", "", nil))
	if code != 200 || got["opens_at"] != "2027-01-15T08:00:00Z" || got["server_time"] != "2027-01-15T07:59:50.5Z" || got["closes_at"] != nil {
		t.Errorf("GET /skus/s = %d %v, want opens_at, no closes_at and the server's time", code, got)
	}
}

// The buyer is who the verified token says: every buyer route without
// claims is 401 and reaches nothing; the body's user_id may only repeat the
// token's; GET and DELETE ask for the caller's own reservation; admin routes
// (IAM in AWS) need no buyer token.
func TestIdentityComesFromTheToken(t *testing.T) {
	for _, r := range []struct{ method, path, body string }{
		{"POST", "/reservations", `{"sku":"s","qty":1}`},
		{"GET", "/reservations/r-1", ""},
		{"DELETE", "/reservations/r-1", ""},
		{"POST", "/groups", `{"sku":"s","capacity":2}`},
		{"GET", "/groups/g-1", ""},
		{"GET", "/skus/s", ""},
	} {
		svc := &stub{}
		if code, body := do(t, svc, anonymous(r.method, r.path, r.body, nil)); code != 401 || body["error"] != "unauthenticated" || svc.calls != 0 {
			t.Errorf("%s %s without a token = %d %v (%d calls), want 401 and no call", r.method, r.path, code, body, svc.calls)
		}
	}
	svc := &stub{}
	if code, _ := do(t, svc, request("POST", "/reservations", `{"sku":"s","qty":1}`, nil)); code != 202 || svc.last.UserID != "u" {
		t.Errorf("reserve = %d as %q, want 202 as the token's user u", code, svc.last.UserID)
	}
	if code, _ := do(t, svc, request("POST", "/reservations", `{"sku":"s","qty":1,"user_id":"u"}`, nil)); code != 202 {
		t.Errorf("reserve repeating the token's user = %d, want 202", code)
	}
	for _, m := range []string{"GET", "DELETE"} {
		svc := &stub{}
		if code, _ := do(t, svc, request(m, "/reservations/r-1", "", nil)); code != 200 || svc.user != "u" {
			t.Errorf("%s = %d as %q, want the token's user", m, code, svc.user)
		}
	}
	odd := request("POST", "/reservations", `{"sku":"s","qty":1}`, nil)
	odd.RequestContext.Authorizer.JWT.Claims["sub"] = "auth0|6412ab"
	if code, _ := do(t, svc, odd); code != 202 || !reservation.ValidID(svc.last.UserID) || svc.last.UserID == "auth0|6412ab" {
		t.Errorf("a subject that is not an id = %d as %q, want a stable derived id", code, svc.last.UserID)
	}
	for _, r := range []struct{ method, path, body string }{
		{"GET", "/admin/skus/s/stock", ""},
		{"POST", "/admin/reservations/s.aaaaaaaaaaaaaaaaaaaaaaaaaa/paid", ""},
		{"POST", "/admin/reservations/s.aaaaaaaaaaaaaaaaaaaaaaaaaa/cancel", `{"reason":"fraud"}`},
	} {
		if code, _ := do(t, &stub{}, anonymous(r.method, r.path, r.body, nil)); code != 200 {
			t.Errorf("%s %s without a buyer token = %d, want 200 (IAM guards it in AWS)", r.method, r.path, code)
		}
	}
}

// TestUnknownGroup: GET /groups/{id} names no SKU, so its 404 speaks of the
// group alone (the code stays unknown_group).
func TestUnknownGroup(t *testing.T) {
	svc := &stub{err: reservation.ErrUnknownGroup}
	code, body := do(t, svc, request("GET", "/groups/g-none", "", nil))
	if code != 404 || body["error"] != "unknown_group" {
		t.Fatalf("GET /groups/g-none = %d %v, want 404 unknown_group", code, body)
	}
	if msg := fmt.Sprint(body["message"]); strings.Contains(strings.ToLower(msg), "sku") {
		t.Errorf("message %q speaks of a sku the request never named", msg)
	}
}

// The order service's routes: POST .../paid records a payment (no body, or
// {}), POST .../cancel releases for the service's reason code; each answers
// the reservation (PAID with pay_by and paid_at; CANCELLED order_cancelled
// with the note) and maps the protocol's refusals to 409s that say what to
// do; a buyer's cancel of a PAID reservation is 409 paid.
func TestOrderServiceRoutes(t *testing.T) {
	const id = "s.aaaaaaaaaaaaaaaaaaaaaaaaaa"
	svc := &stub{}
	code, body := do(t, svc, anonymous("POST", "/admin/reservations/"+id+"/paid", "", nil))
	want := map[string]any{"reservation_id": id, "status": "PAID", "sku": "s", "qty": float64(1),
		"pay_by": "2027-01-15T08:15:00Z", "paid_at": "2027-01-15T08:01:00.5Z"}
	if code != 200 || fmt.Sprint(body) != fmt.Sprint(want) || svc.id != id {
		t.Errorf("paid = %d %v (asked for %q), want 200 %v", code, body, svc.id, want)
	}
	svc = &stub{}
	code, body = do(t, svc, anonymous("POST", "/admin/reservations/"+id+"/cancel", `{"reason":"fraud:card-7"}`, nil))
	want = map[string]any{"reservation_id": id, "status": "CANCELLED", "sku": "s", "qty": float64(1),
		"reason": "order_cancelled", "note": "fraud:card-7"}
	if code != 200 || fmt.Sprint(body) != fmt.Sprint(want) || svc.id != id || svc.note != "fraud:card-7" {
		t.Errorf("cancel = %d %v (asked for %q, note %q), want 200 %v", code, body, svc.id, svc.note, want)
	}

	for _, c := range []struct {
		name, route string
		err         error
		status      int
		code        string
		retryAfter  string
		reason      string
	}{
		{"paid: not found", "paid", reservation.ErrNotFound, 404, "not_found", "", ""},
		{"paid: held", "paid", fmt.Errorf("pay %s: %w", id, reservation.ErrNotConfirmed), 409, "not_confirmed", "1", ""},
		{"paid: cancelled", "paid", fmt.Errorf("pay %s: %w", id, &reservation.CancelledError{Reason: reservation.ReasonPaymentTimeout}), 409, "cancelled", "", "payment_timeout"},
		{"paid: group not formed", "paid", fmt.Errorf("pay %s: group g is \"OPEN\": %w", id, reservation.ErrGroupNotFormed), 409, "group_not_formed", "", ""},
		{"paid: unavailable", "paid", reservation.Unavailable("mysql pay", errors.New("i/o timeout")), 503, "unavailable", "1", ""},
		{"cancel: not found", "cancel", reservation.ErrNotFound, 404, "not_found", "", ""},
		{"cancel: paid", "cancel", fmt.Errorf("cancel %s: %w", id, reservation.ErrPaid), 409, "paid", "", ""},
		{"cancel: a bad reason", "cancel", &reservation.InvalidError{Field: "reason", Msg: "must be 1-64 characters"}, 400, "invalid_request", "", ""},
		{"cancel: unavailable", "cancel", reservation.Unavailable("mysql refund", errors.New("i/o timeout")), 503, "unavailable", "1", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			body := map[string]string{"paid": "", "cancel": `{"reason":"fraud"}`}[c.route]
			h := httpapi.New(&stub{err: c.err}, slog.New(slog.NewTextHandler(io.Discard, nil)))
			resp, _ := h.Handle(context.Background(), anonymous("POST", "/admin/reservations/"+id+"/"+c.route, body, nil))
			var got map[string]string
			_ = json.Unmarshal([]byte(resp.Body), &got)
			if resp.StatusCode != c.status || got["error"] != c.code || got["reason"] != c.reason {
				t.Errorf("%v -> %d %v, want %d %s (reason %q)", c.err, resp.StatusCode, got, c.status, c.code, c.reason)
			}
			if ra := resp.Headers["Retry-After"]; ra != c.retryAfter {
				t.Errorf("Retry-After = %q, want %q", ra, c.retryAfter)
			}
			if c.code == "invalid_request" && !strings.Contains(got["message"], "reason") {
				t.Errorf("message %q does not name the member reason", got["message"])
			}
		})
	}

	if code, body := do(t, &stub{err: fmt.Errorf("cancel %s: %w", id, reservation.ErrPaid)}, request("DELETE", "/reservations/"+id, "", nil)); code != 409 || body["error"] != "paid" {
		t.Errorf("buyer DELETE of a paid reservation = %d %v, want 409 paid", code, body)
	}
}

// A buyer sees PAID, and when the payment is due, as the order service does.
func TestReservationShowsPayment(t *testing.T) {
	svc := &paidStub{}
	h := httpapi.New(svc, slog.New(slog.NewTextHandler(io.Discard, nil)))
	for _, c := range []struct {
		r    reservation.Reservation
		want string
	}{
		{reservation.Reservation{ID: "s.a", SKU: "s", Qty: 1, Status: reservation.StatusConfirmed},
			`{"qty":1,"reservation_id":"s.a","sku":"s","status":"CONFIRMED"}`},
		{reservation.Reservation{ID: "s.a", SKU: "s", Qty: 1, Status: reservation.StatusConfirmed, PayBy: time.UnixMilli(1_800_000_000_123)},
			`{"pay_by":"2027-01-15T08:00:00.123Z","qty":1,"reservation_id":"s.a","sku":"s","status":"CONFIRMED"}`},
		{reservation.Reservation{ID: "s.a", SKU: "s", Qty: 1, Status: reservation.StatusConfirmed, PayBy: time.UnixMilli(1_800_000_000_123), PaidAt: time.UnixMilli(1_800_000_000_000)},
			`{"paid_at":"2027-01-15T08:00:00Z","pay_by":"2027-01-15T08:00:00.123Z","qty":1,"reservation_id":"s.a","sku":"s","status":"PAID"}`},
		{reservation.Reservation{ID: "s.a", SKU: "s", Qty: 1, Status: reservation.StatusCancelled, Reason: reservation.ReasonPaymentTimeout, PayBy: time.UnixMilli(1_800_000_000_000)},
			`{"pay_by":"2027-01-15T08:00:00Z","qty":1,"reason":"payment_timeout","reservation_id":"s.a","sku":"s","status":"CANCELLED"}`},
	} {
		svc.r = c.r
		resp, _ := h.Handle(context.Background(), request("GET", "/reservations/s.aaaaaaaaaaaaaaaaaaaaaaaaaa", "", nil))
		if resp.StatusCode != 200 || resp.Body != c.want {
			t.Errorf("GET of %+v = %d %s, want 200 %s", c.r, resp.StatusCode, resp.Body, c.want)
		}
	}
}

// paidStub answers Get with r.
type paidStub struct {
	stub
	r reservation.Reservation
}

func (s *paidStub) Get(context.Context, string, string) (reservation.Reservation, error) {
	return s.r, nil
}

// pay_within_seconds: whole seconds in, handed on as a Duration (a figure
// far outside the bounds as just outside them, for the service to refuse),
// and every stock answer shows the SKU's window.
func TestStockPayWindow(t *testing.T) {
	limit := int64(reservation.MaxPayWithin / time.Second)
	for _, c := range []struct {
		body string
		want *time.Duration
	}{
		{`{"add":0}`, nil},
		{`{"add":0,"pay_within_seconds":0}`, ptr(time.Duration(0))},
		{`{"add":0,"pay_within_seconds":900}`, ptr(15 * time.Minute)},
		{`{"add":0,"pay_within_seconds":-5}`, ptr(-time.Second)},
		{fmt.Sprintf(`{"add":0,"pay_within_seconds":%d}`, limit), ptr(reservation.MaxPayWithin)},
		{`{"add":0,"pay_within_seconds":9223372036854775807}`, ptr(reservation.MaxPayWithin + time.Second)},
	} {
		svc := &stub{}
		if code, body := do(t, svc, request("PUT", "/admin/skus/s/stock", c.body, nil)); code != 200 {
			t.Errorf("PUT %s = %d %v", c.body, code, body)
		}
		got := svc.change.PayWithin
		if (got == nil) != (c.want == nil) || (got != nil && *got != *c.want) {
			t.Errorf("PUT %s: PayWithin = %v, want %v", c.body, deref(got), deref(c.want))
		}
	}
	h := httpapi.New(&windowStub{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	for _, r := range []struct{ method, body string }{{"PUT", `{"add":0}`}, {"GET", ""}} {
		resp, _ := h.Handle(context.Background(), anonymous(r.method, "/admin/skus/s/stock", r.body, nil))
		var body map[string]any
		_ = json.Unmarshal([]byte(resp.Body), &body)
		if resp.StatusCode != 200 || body["pay_within_seconds"] != float64(900) {
			t.Errorf("%s /admin/skus/s/stock = %d %v, want pay_within_seconds 900", r.method, resp.StatusCode, body)
		}
	}
	if code, body := do(t, &stub{}, anonymous("GET", "/admin/skus/s/stock", "", nil)); code != 200 || body["pay_within_seconds"] != float64(0) {
		t.Errorf("GET of a SKU without a pay window = %d %v, want pay_within_seconds 0", code, body)
	}
}

// windowStub's SKU has a 15-minute pay window.
type windowStub struct{ stub }

func (s *windowStub) ChangeStock(context.Context, reservation.StockChange) (reservation.StockLevel, error) {
	return reservation.StockLevel{SKU: "s", Available: 1, Version: 2, PayWithin: 15 * time.Minute}, nil
}

func (s *windowStub) InspectStock(context.Context, string) (reservation.StockReport, error) {
	return reservation.StockReport{SKU: "s", PayWithin: 15 * time.Minute}, nil
}

func ptr[T any](v T) *T { return &v }

func deref(d *time.Duration) any {
	if d == nil {
		return nil
	}
	return *d
}
