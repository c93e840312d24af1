// Package contract_test holds the running API to api/openapi.yaml, in both
// directions: every request the test sends and every response it gets is
// validated against the document (an undocumented route, status, header or
// field fails), and every documented operation, status and error code must
// be produced by the test (a documented answer the API never gives fails).
package contract_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
	"github.com/go-json-experiment/json/jsontext"
	_ "github.com/go-sql-driver/mysql"
	"github.com/holdfast/holdfast/internal/testkit/devstacktest"
	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/adapters/mysqlstore"
	"github.com/holdfast/holdfast/shared/reservation"
)

const document = "../../api/openapi.yaml"

// outcome is one documented answer: an operation, a status and, for an
// error, its code ("" for success bodies and API Gateway's own messages).
type outcome struct{ op, status, code string }

func (o outcome) String() string {
	if o.code == "" {
		return o.op + " " + o.status
	}
	return o.op + " " + o.status + " " + o.code
}

// notProducedLocally says why a documented answer cannot be produced by make
// dev ("" when it must be).
func notProducedLocally(o outcome) string {
	switch {
	case o.status == "403" && o.code == "":
		return "API Gateway's IAM check; make dev leaves /admin open on loopback"
	case o.status == "500":
		return "a fault: the function failing (API Gateway's message) or a bug (internal)"
	case (o.status == "429" || o.status == "503") && o.code == "":
		return "API Gateway's own throttling or outage answer"
	}
	return ""
}

// headersAnyResponse may come with any response (the transport's, not the API's).
var headersAnyResponse = map[string]bool{"Content-Type": true, "Content-Length": true, "Date": true, "Connection": true}

// checker validates traffic against the document and records what it saw.
type checker struct {
	t      *testing.T
	doc    *openapi3.T
	router routers.Router
	base   string

	mu   sync.Mutex
	seen map[outcome]bool
	// fields are the properties seen in responses, per component schema.
	fields map[string]map[string]bool
}

func newChecker(t *testing.T, base string) *checker {
	t.Helper()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromFile(document)
	if err != nil {
		t.Fatalf("load %s: %v", document, err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("%s is not valid OpenAPI: %v", document, err)
	}
	doc.Servers = openapi3.Servers{{URL: base}}
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	return &checker{t: t, doc: doc, router: router, base: base, seen: map[outcome]bool{}, fields: map[string]map[string]bool{}}
}

// on returns a checker of the same document for another stack at base,
// recording into k's tallies.
func (k *checker) on(base string) *checker {
	k.t.Helper()
	other := &checker{t: k.t, doc: k.doc, base: base, seen: k.seen, fields: k.fields}
	other.doc.Servers = openapi3.Servers{{URL: base}}
	var err error
	if other.router, err = gorillamux.NewRouter(other.doc); err != nil {
		k.t.Fatal(err)
	}
	return other
}

// reply is what the API answered.
type reply struct {
	Status int
	Body   map[string]any
	Header http.Header
}

func (r reply) str(k string) string { s, _ := r.Body[k].(string); return s }

type call struct {
	token  string
	method string
	path   string
	body   string
	header map[string]string
	// invalid marks a request the document itself rejects (the test sends
	// it on purpose): its validation must fail, and the API must refuse it.
	invalid bool
}

// do sends c and validates the request and the response.
func (k *checker) do(c call) reply {
	k.t.Helper()
	ctx := context.Background()
	req, err := http.NewRequestWithContext(ctx, c.method, k.base+c.path, strings.NewReader(c.body))
	if err != nil {
		k.t.Fatal(err)
	}
	if c.body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	for h, v := range c.header {
		req.Header.Set(h, v)
	}

	route, params, findErr := k.router.FindRoute(req)
	var in *openapi3filter.RequestValidationInput
	if findErr == nil {
		in = &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route,
			Options: &openapi3filter.Options{AuthenticationFunc: func(_ context.Context, a *openapi3filter.AuthenticationInput) error {
				if a.RequestValidationInput.Request.Header.Get("Authorization") == "" && a.SecuritySchemeName == "BuyerJwt" {
					return errors.New("no bearer token")
				}
				return nil
			}}}
		verr := openapi3filter.ValidateRequest(ctx, in)
		if verr == nil && c.body != "" && !jsontext.Value(c.body).IsValid() {
			// The document's bodies are I-JSON (RFC 7493): each member
			// name once, valid UTF-8. The validator reads a repeated
			// member as its last value; the document refuses the body.
			verr = errors.New("not I-JSON: a repeated member name or invalid UTF-8")
		}
		switch {
		case c.invalid && verr == nil:
			k.t.Errorf("%s %s %s: the document accepts this request, which the test sends as invalid", c.method, c.path, c.body)
		case !c.invalid && verr != nil:
			k.t.Errorf("%s %s: the request breaks the document: %v", c.method, c.path, verr)
		}
		req.Body = io.NopCloser(strings.NewReader(c.body))
	}

	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		k.t.Fatalf("%s %s: %v", c.method, c.path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	r := reply{Status: resp.StatusCode, Header: resp.Header}
	_ = json.Unmarshal(raw, &r.Body)

	if findErr != nil {
		// Not in the document: API Gateway answers, the function never runs.
		if r.Status != http.StatusNotFound || string(raw) != `{"message":"Not Found"}` {
			k.t.Errorf("%s %s is not in the document, yet answered %d %s", c.method, c.path, r.Status, raw)
		}
		return r
	}
	rin := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: r.Status, Header: r.Header,
		Body: io.NopCloser(bytes.NewReader(raw)), Options: &openapi3filter.Options{IncludeResponseStatus: true}}
	if err := openapi3filter.ValidateResponse(ctx, rin); err != nil {
		k.t.Errorf("%s %s answered %d %s, which the document does not allow: %v", c.method, c.path, r.Status, raw, err)
	}
	if r.Status == http.StatusTooManyRequests || r.Status == http.StatusServiceUnavailable {
		if n, err := strconv.Atoi(r.Header.Get("Retry-After")); err != nil || n < 1 {
			k.t.Errorf("%s %s answered %d without a Retry-After in seconds", c.method, c.path, r.Status)
		}
	}
	resp2 := route.Operation.Responses.Status(r.Status)
	if resp2 != nil && resp2.Value != nil {
		declared := map[string]bool{}
		for h := range resp2.Value.Headers {
			declared[strings.ToLower(h)] = true
		}
		for name := range r.Header {
			if !headersAnyResponse[http.CanonicalHeaderKey(name)] && !declared[strings.ToLower(name)] {
				k.t.Errorf("%s %s answered %d with header %s, which the document does not declare", c.method, c.path, r.Status, name)
			}
		}
	}
	k.mu.Lock()
	k.seen[outcome{route.Operation.OperationID, strconv.Itoa(r.Status), r.str("error")}] = true
	if resp2 != nil && resp2.Value != nil {
		if mt := resp2.Value.Content.Get("application/json"); mt != nil && mt.Schema != nil {
			k.recordFields(mt.Schema, r.Body)
		}
	}
	k.mu.Unlock()
	return r
}

// recordFields notes which properties of the body's component schema (the
// oneOf branch it matches) the response carried.
func (k *checker) recordFields(ref *openapi3.SchemaRef, body map[string]any) {
	refs := []*openapi3.SchemaRef{ref}
	if len(ref.Value.OneOf) > 0 {
		refs = ref.Value.OneOf
	}
	for _, b := range refs {
		if b.Ref == "" || b.Value.VisitJSON(toAny(body)) != nil {
			continue
		}
		name := b.Ref[strings.LastIndex(b.Ref, "/")+1:]
		if k.fields[name] == nil {
			k.fields[name] = map[string]bool{}
		}
		for f := range body {
			k.fields[name][f] = true
		}
	}
}

func toAny(m map[string]any) any {
	b, _ := json.Marshal(m)
	var v any
	_ = json.Unmarshal(b, &v)
	return v
}

// documented lists every answer the document promises: each operation's
// statuses and, where the body is an error, each code its schema allows.
func (k *checker) documented() []outcome {
	var out []outcome
	for _, item := range k.doc.Paths.Map() {
		for _, op := range item.Operations() {
			for status, ref := range op.Responses.Map() {
				codes := []string{""}
				if mt := ref.Value.Content.Get("application/json"); mt != nil && mt.Schema != nil {
					if c := errorCodes(mt.Schema.Value); len(c) > 0 {
						codes = c
					}
				}
				for _, c := range codes {
					out = append(out, outcome{op.OperationID, status, c})
				}
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// errorCodes are the values of an error body's "error" (none for a body
// without one, e.g. API Gateway's {"message"}).
func errorCodes(s *openapi3.Schema) []string {
	var out []string
	for _, alt := range s.OneOf {
		out = append(out, errorCodes(alt.Value)...)
	}
	if p := s.Properties["error"]; p != nil {
		for _, e := range p.Value.Enum {
			out = append(out, fmt.Sprint(e))
		}
	}
	if len(s.OneOf) > 0 && s.Properties["error"] == nil {
		// A oneOf with a branch without codes (API Gateway's message) is
		// documented as that answer too.
		for _, alt := range s.OneOf {
			if alt.Value.Properties["error"] == nil {
				out = append(out, "")
			}
		}
	}
	return out
}

// The API, served by make dev's stack over real HTTP with real tokens, is
// exactly api/openapi.yaml.
func TestTheAPIIsItsDocument(t *testing.T) {
	env := testservices.Require(t)
	ctx := context.Background()

	// A Redis and a MariaDB of the test's own, so it can take them down for
	// the 503s at the end.
	rds := testservices.StartRedis(t)
	maria := testservices.StartMariaDB(t)
	root, err := sql.Open("mysql", maria.RootDSN+"?parseTime=true")
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	if _, err := root.Exec("CREATE DATABASE holdfast CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci"); err != nil {
		t.Fatal(err)
	}
	dsn := strings.TrimSuffix(maria.RootDSN, "/") + "/holdfast?parseTime=true&interpolateParams=true"
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := mysqlstore.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}

	base := map[string]string{"HOLDFAST_REDIS_ADDR": rds.Addr, "HOLDFAST_DB_DSN": dsn, "HOLDFAST_USER_RATE": "0"}
	stack := devstacktest.Start(t, env, base)
	issuer := stack.Issuer
	k := newChecker(t, stack.URL)
	mint := func(sub string) string {
		tok, err := issuer.Mint(sub, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	ann, bob, cat := mint("ann"), mint("bob"), mint("cat")
	expect := func(r reply, status int, code string) {
		t.Helper()
		if r.Status != status || r.str("error") != code {
			t.Errorf("got %d %v, want %d %q", r.Status, r.Body, status, code)
		}
	}
	sku := testservices.Name("contract")
	put := func(sku, body string, header map[string]string) reply {
		return k.do(call{method: "PUT", path: "/admin/skus/" + sku + "/stock", body: body, header: header})
	}
	reserve := func(tok, body string, header map[string]string) reply {
		return k.do(call{token: tok, method: "POST", path: "/reservations", body: body, header: header})
	}

	// --- admin: stock
	expect(put(sku, `{"stock":5,"per_user_limit":2}`, nil), 200, "")
	expect(put(sku, `{"stock":6}`, nil), 428, "precondition_required")
	level := k.do(call{method: "GET", path: "/admin/skus/" + sku + "/stock"})
	expect(level, 200, "")
	etag := level.Header.Get("ETag")
	expect(put(sku, `{"stock":6}`, map[string]string{"If-Match": `"999"`}), 412, "version_mismatch")
	expect(put(sku, `{"stock":6}`, map[string]string{"If-Match": etag}), 200, "")
	expect(put(sku, `{"add":-1000}`, nil), 409, "insufficient_stock")
	expect(put(sku, `{"add":1}`, map[string]string{"Idempotency-Key": "admin-1"}), 200, "")
	expect(put(sku, `{"add":2}`, map[string]string{"Idempotency-Key": "admin-1"}), 422, "idempotency_mismatch")
	expect(k.do(call{method: "PUT", path: "/admin/skus/" + sku + "/stock", body: `{"stock":1,"add":1}`, invalid: true}), 400, "invalid_request")
	expect(k.do(call{method: "PUT", path: "/admin/skus/" + sku + "/stock", body: `{"stock":"many"}`, invalid: true}), 400, "invalid_request")
	expect(put(sku, `{"add":1,"per_user_limit":2,"rate_per_second":0,"burst":0,"version":1}`+strings.Repeat(" ", 5000), nil), 413, "invalid_request")
	expect(put(testservices.Name("nosuch"), `{"add":1}`, nil), 404, "unknown_sku")
	expect(k.do(call{method: "GET", path: "/admin/skus/" + testservices.Name("nosuch") + "/stock"}), 404, "unknown_sku")
	expect(k.do(call{method: "GET", path: "/admin/skus/bad%20sku/stock", invalid: true}), 404, "unknown_sku")
	// An admin change's key covers every field; If-Match: * is the SKU as it stands.
	expect(put(sku, `{"add":1,"rate_per_second":3}`, map[string]string{"Idempotency-Key": "admin-2"}), 200, "")
	expect(put(sku, `{"add":1,"rate_per_second":4}`, map[string]string{"Idempotency-Key": "admin-2"}), 422, "idempotency_mismatch")
	expect(put(sku, `{"add":1,"rate_per_second":0}`, nil), 200, "")
	expect(put(sku, `{"stock":7}`, map[string]string{"If-Match": "*"}), 200, "")
	expect(put(testservices.Name("nosuch"), `{"stock":7}`, map[string]string{"If-Match": "*"}), 412, "version_mismatch")

	// --- the sale window (issue 23, part 1): set with the stock, shown with
	// the server's time, not_open before it opens (opens_at, Retry-After),
	// sale_closed after it closes; a bad bound is 400; "" clears a bound.
	winSKU, closedSKU := testservices.Name("window"), testservices.Name("closed")
	opens := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	stamp := func(t time.Time) string { return t.Format(time.RFC3339) }
	if r := put(winSKU, `{"stock":5,"opens_at":"`+stamp(opens)+`","closes_at":"`+stamp(opens.Add(time.Hour))+`"}`, nil); r.Status != 200 ||
		r.str("opens_at") != stamp(opens) || r.str("closes_at") != stamp(opens.Add(time.Hour)) {
		t.Errorf("PUT a window = %d %v, want 200 with opens_at %s and closes_at an hour later", r.Status, r.Body, stamp(opens))
	}
	sk := k.do(call{token: ann, method: "GET", path: "/skus/" + winSKU})
	if st, err := time.Parse(time.RFC3339Nano, sk.str("server_time")); sk.Status != 200 || err != nil || time.Since(st).Abs() > time.Minute ||
		sk.str("opens_at") != stamp(opens) || sk.str("closes_at") == "" {
		t.Errorf("GET /skus with a window = %d %v, want the window and the server's time", sk.Status, sk.Body)
	}
	notOpen := reserve(ann, `{"sku":"`+winSKU+`","qty":1}`, nil)
	expect(notOpen, 409, "not_open")
	if n, err := strconv.Atoi(notOpen.Header.Get("Retry-After")); err != nil || n < 3500 || n > 3600 || notOpen.str("opens_at") != stamp(opens) {
		t.Errorf("not_open = %v with Retry-After %q, want opens_at %s and about 3600 s to wait", notOpen.Body, notOpen.Header.Get("Retry-After"), stamp(opens))
	}
	if r := k.do(call{method: "GET", path: "/admin/skus/" + winSKU + "/stock"}); r.str("opens_at") != stamp(opens) || r.str("closes_at") == "" {
		t.Errorf("admin GET with a window = %v, want MySQL's window", r.Body)
	}
	expect(put(winSKU, `{"add":0,"closes_at":"`+stamp(opens.Add(-time.Minute))+`"}`, nil), 400, "invalid_request")
	expect(k.do(call{method: "PUT", path: "/admin/skus/" + winSKU + "/stock", body: `{"add":0,"opens_at":"tomorrow"}`, invalid: true}), 400, "invalid_request")
	past := time.Now().Add(-2 * time.Hour).UTC().Truncate(time.Second)
	expect(put(closedSKU, `{"stock":5,"opens_at":"`+stamp(past)+`","closes_at":"`+stamp(past.Add(time.Hour))+`"}`, nil), 200, "")
	expect(reserve(ann, `{"sku":"`+closedSKU+`","qty":1}`, nil), 409, "sale_closed")
	if r := put(winSKU, `{"add":0,"opens_at":"","closes_at":""}`, nil); r.Status != 200 || r.Body["opens_at"] != nil || r.Body["closes_at"] != nil {
		t.Errorf("PUT clearing the window = %d %v, want 200 without a window", r.Status, r.Body)
	}
	expect(reserve(ann, `{"sku":"`+winSKU+`","qty":1}`, nil), 202, "")

	// --- every body is read as the document defines it, and only so: a
	// repeated, case-folded or unknown member is 400 naming it, and takes
	// nothing (issue 20, part 4).
	strictSKU := testservices.Name("strict")
	expect(put(strictSKU, `{"stock":5}`, nil), 200, "")
	for _, c := range []struct{ method, path, body, message string }{
		{"POST", "/reservations", `{"sku":"` + strictSKU + `","qty":1,"qty":3}`, `duplicate field "qty": each member may appear once`},
		{"POST", "/reservations", `{"sku":"` + strictSKU + `","qty":1,"Qty":3}`, `unknown field "Qty" (member names are case-sensitive: "qty")`},
		{"POST", "/reservations", `{"SKU":"` + strictSKU + `","qty":1}`, `unknown field "SKU" (member names are case-sensitive: "sku")`},
		{"POST", "/reservations", `{"sku":"` + strictSKU + `","qty":1,"colour":"red"}`, `unknown field "colour"`},
		{"POST", "/groups", `{"sku":"` + strictSKU + `","capacity":2,"capacity":1000}`, `duplicate field "capacity": each member may appear once`},
		{"POST", "/groups", `{"sku":"` + strictSKU + `","Capacity":2}`, `unknown field "Capacity" (member names are case-sensitive: "capacity")`},
		{"POST", "/groups", `{"sku":"` + strictSKU + `","capacity":2,"colour":"red"}`, `unknown field "colour"`},
		{"PUT", "/admin/skus/" + strictSKU + "/stock", `{"add":1,"add":-5}`, `duplicate field "add": each member may appear once`},
		{"PUT", "/admin/skus/" + strictSKU + "/stock", `{"add":1,"Add":-5}`, `unknown field "Add" (member names are case-sensitive: "add")`},
		{"PUT", "/admin/skus/" + strictSKU + "/stock", `{"add":1,"colour":"red"}`, `unknown field "colour"`},
	} {
		r := k.do(call{token: ann, method: c.method, path: c.path, body: c.body, invalid: true})
		if r.Status != 400 || r.str("error") != "invalid_request" || r.str("message") != c.message {
			t.Errorf("%s %s %s = %d %v, want 400 invalid_request %q", c.method, c.path, c.body, r.Status, r.Body, c.message)
		}
	}
	if r := k.do(call{token: ann, method: "GET", path: "/skus/" + strictSKU}); r.Body["available"] != float64(5) {
		t.Errorf("after the refused bodies %s has %v available, want all 5", strictSKU, r.Body["available"])
	}

	// --- buyers: reserve, poll, cancel
	r := reserve(ann, `{"sku":"`+sku+`","qty":1}`, map[string]string{"Idempotency-Key": "ann-1"})
	expect(r, 202, "")
	id := r.str("reservation_id")
	expect(reserve(ann, `{"sku":"`+sku+`","qty":2}`, map[string]string{"Idempotency-Key": "ann-1"}), 422, "idempotency_mismatch")
	testservices.Eventually(t, 20*time.Second, "the reservation is CONFIRMED", func() bool {
		return k.do(call{token: ann, method: "GET", path: "/reservations/" + id}).str("status") == "CONFIRMED"
	})
	expect(reserve(ann, `{"sku":"`+sku+`","qty":1}`, map[string]string{"Idempotency-Key": "ann-1"}), 200, "")
	expect(k.do(call{token: bob, method: "GET", path: "/reservations/" + id}), 404, "not_found")
	expect(k.do(call{token: bob, method: "DELETE", path: "/reservations/" + id}), 404, "not_found")
	// Not an id at all: as unknown as any other.
	expect(k.do(call{token: ann, method: "GET", path: "/reservations/bad%20id"}), 404, "not_found")
	expect(k.do(call{token: ann, method: "DELETE", path: "/reservations/bad%20id"}), 404, "not_found")
	expect(k.do(call{token: ann, method: "DELETE", path: "/reservations/" + id}), 200, "")
	expect(k.do(call{token: ann, method: "DELETE", path: "/reservations/" + id}), 200, "")

	expect(reserve(ann, `{"sku":"`+sku+`","qty":1,"user_id":"bob"}`, nil), 400, "user_mismatch")
	expect(k.do(call{token: ann, method: "POST", path: "/reservations", body: `{"sku":"` + sku + `"}`, invalid: true}), 400, "invalid_request")
	expect(reserve(ann, `{"sku":"`+sku+`","qty":1,"group_id":"`+strings.Repeat("g", 5000)+`"}`, nil), 413, "invalid_request")
	expect(reserve(ann, `{"sku":"`+testservices.Name("nosuch")+`","qty":1}`, nil), 404, "unknown_sku")
	expect(reserve(ann, `{"sku":"`+sku+`","qty":1,"group_id":"g-nosuchgroup"}`, nil), 404, "unknown_group")
	expect(reserve(bob, `{"sku":"`+sku+`","qty":2}`, nil), 202, "")
	expect(reserve(bob, `{"sku":"`+sku+`","qty":1}`, nil), 409, "limit_exceeded")

	// --- groups
	expect(k.do(call{token: ann, method: "POST", path: "/groups", body: `{"sku":"` + sku + `","capacity":1}`, invalid: true}), 400, "invalid_request")
	expect(k.do(call{token: ann, method: "POST", path: "/groups", body: `{"sku":"` + sku + `"}`, invalid: true}), 400, "invalid_request")
	expect(k.do(call{token: ann, method: "POST", path: "/groups", body: `{"sku":"` + strings.Repeat("s", 5000) + `","capacity":2}`, invalid: true}), 413, "invalid_request")
	expect(k.do(call{token: ann, method: "POST", path: "/groups", body: `{"sku":"` + testservices.Name("nosuch") + `","capacity":2}`}), 404, "unknown_sku")
	g := k.do(call{token: ann, method: "POST", path: "/groups", body: `{"sku":"` + sku + `","capacity":2,"ttl_seconds":3600}`})
	expect(g, 201, "")
	gid := g.str("group_id")
	join := func(tok string) reply {
		return reserve(tok, `{"sku":"`+sku+`","qty":1,"group_id":"`+gid+`"}`, nil)
	}
	expect(join(ann), 202, "")
	expect(join(ann), 409, "already_joined")
	expect(join(cat), 202, "")
	expect(join(mint("dan")), 409, "group_full")
	testservices.Eventually(t, 20*time.Second, "the group is FORMED", func() bool {
		return k.do(call{token: ann, method: "GET", path: "/groups/" + gid}).str("status") == "FORMED"
	})
	expect(join(mint("eve")), 409, "group_full")
	expect(k.do(call{token: ann, method: "GET", path: "/groups/g-nosuchgroup"}), 404, "unknown_group")
	expect(k.do(call{token: ann, method: "GET", path: "/groups/bad%20group"}), 404, "unknown_group")

	// A group whose deadline passed takes no join.
	late := k.do(call{token: ann, method: "POST", path: "/groups", body: `{"sku":"` + sku + `","capacity":2,"ttl_seconds":1}`})
	expect(late, 201, "")
	deadline, err := time.Parse(time.RFC3339Nano, late.str("deadline"))
	if err != nil {
		t.Fatal(err)
	}
	testservices.Eventually(t, 5*time.Second, "the group's deadline passes", func() bool { return time.Now().After(deadline.Add(100 * time.Millisecond)) })
	expect(reserve(mint("gus"), `{"sku":"`+sku+`","qty":1,"group_id":"`+late.str("group_id")+`"}`, nil), 409, "group_closed")

	// --- the order service pays or releases (issue 23, part 3): a SKU with
	// a pay window; a confirmed reservation is due by pay_by; POST .../paid
	// makes it PAID (final: no cancel moves it), POST .../cancel releases
	// it for the order service's reason code (its note).
	paySKU := testservices.Name("pay")
	if r := put(paySKU, `{"stock":10,"pay_within_seconds":900}`, nil); r.Status != 200 || r.Body["pay_within_seconds"] != float64(900) {
		t.Errorf("PUT a pay window = %d %v, want 200 with pay_within_seconds 900", r.Status, r.Body)
	}
	if r := k.do(call{method: "GET", path: "/admin/skus/" + paySKU + "/stock"}); r.Status != 200 || r.Body["pay_within_seconds"] != float64(900) {
		t.Errorf("GET the stock of a SKU with a pay window = %d %v, want pay_within_seconds 900", r.Status, r.Body)
	}
	for _, b := range []string{`{"add":0,"pay_within_seconds":-1}`, `{"add":0,"pay_within_seconds":2592001}`, `{"add":0,"pay_within_seconds":"900"}`} {
		r := k.do(call{method: "PUT", path: "/admin/skus/" + paySKU + "/stock", body: b, invalid: true})
		if r.Status != 400 || r.str("error") != "invalid_request" || !strings.Contains(r.str("message"), "pay_within_seconds") {
			t.Errorf("PUT %s = %d %v, want 400 naming pay_within_seconds", b, r.Status, r.Body)
		}
	}
	paid := func(id, body string) reply {
		return k.do(call{method: "POST", path: "/admin/reservations/" + id + "/paid", body: body})
	}
	release := func(id, body string) reply {
		return k.do(call{method: "POST", path: "/admin/reservations/" + id + "/cancel", body: body})
	}
	confirmed := func(tok, body string) string {
		t.Helper()
		r := reserve(tok, body, nil)
		expect(r, 202, "")
		id := r.str("reservation_id")
		testservices.Eventually(t, 20*time.Second, "the reservation is CONFIRMED", func() bool {
			return k.do(call{token: tok, method: "GET", path: "/reservations/" + id}).str("status") == "CONFIRMED"
		})
		return id
	}
	before := time.Now()
	payID := confirmed(ann, `{"sku":"`+paySKU+`","qty":1}`)
	due := k.do(call{token: ann, method: "GET", path: "/reservations/" + payID})
	if at, err := time.Parse(time.RFC3339Nano, due.str("pay_by")); err != nil ||
		at.Before(before.Add(900*time.Second-time.Second)) || at.After(time.Now().Add(900*time.Second+time.Second)) {
		t.Errorf("confirmed with a 900 s pay window: %v, want pay_by 900 s after the confirmation", due.Body)
	}
	r = paid(payID, "")
	if r.Status != 200 || r.str("status") != "PAID" || r.str("paid_at") == "" || r.str("pay_by") != due.str("pay_by") {
		t.Errorf("paid = %d %v, want 200 PAID with paid_at and the pay_by it had", r.Status, r.Body)
	}
	if g := k.do(call{token: ann, method: "GET", path: "/reservations/" + payID}); g.str("status") != "PAID" || g.str("paid_at") != r.str("paid_at") {
		t.Errorf("the buyer's GET after the payment = %v, want PAID with paid_at %s", g.Body, r.str("paid_at"))
	}
	// Idempotent: a repeat (with the empty object a JSON client sends) is
	// answered with the first payment.
	if again := paid(payID, `{}`); again.Status != 200 || again.str("status") != "PAID" || again.str("paid_at") != r.str("paid_at") {
		t.Errorf("paid again = %d %v, want 200 PAID with the first paid_at %s", again.Status, again.Body, r.str("paid_at"))
	}
	expect(k.do(call{token: ann, method: "DELETE", path: "/reservations/" + payID}), 409, "paid")
	expect(release(payID, `{"reason":"checkout:abandoned"}`), 409, "paid")
	if g := k.do(call{token: ann, method: "GET", path: "/reservations/" + payID}); g.str("status") != "PAID" {
		t.Errorf("after the refused cancels: %v, want PAID still", g.Body)
	}
	// The order service releases a CONFIRMED reservation: CANCELLED
	// order_cancelled, its note kept; a repeat is answered as it stands; it
	// can no longer be paid.
	relID := confirmed(bob, `{"sku":"`+paySKU+`","qty":2}`)
	r = release(relID, `{"reason":"checkout:abandoned"}`)
	if r.Status != 200 || r.str("status") != "CANCELLED" || r.str("reason") != "order_cancelled" || r.str("note") != "checkout:abandoned" {
		t.Errorf("order cancel = %d %v, want 200 CANCELLED order_cancelled with note checkout:abandoned", r.Status, r.Body)
	}
	if again := release(relID, `{"reason":"fraud.check"}`); again.Status != 200 || again.str("reason") != "order_cancelled" || again.str("note") != "checkout:abandoned" {
		t.Errorf("order cancel again = %d %v, want 200 as it stands (the first note)", again.Status, again.Body)
	}
	if g := k.do(call{token: bob, method: "GET", path: "/reservations/" + relID}); g.str("reason") != "order_cancelled" || g.str("note") != "checkout:abandoned" {
		t.Errorf("the buyer's GET of the released reservation = %v, want order_cancelled with its note", g.Body)
	}
	if c := paid(relID, ""); c.Status != 409 || c.str("error") != "cancelled" || c.str("reason") != "order_cancelled" {
		t.Errorf("paid after the release = %d %v, want 409 cancelled, reason order_cancelled", c.Status, c.Body)
	}
	expect(k.do(call{token: bob, method: "DELETE", path: "/reservations/" + relID}), 200, "")
	if st := k.do(call{token: ann, method: "GET", path: "/skus/" + paySKU}); st.Body["available"] != float64(9) {
		t.Errorf("%s after one paid and one released: %v available, want 9", paySKU, st.Body["available"])
	}
	// A reason that is not a code, or none, is 400 naming reason; a member
	// in the payment's body is 400; nothing changed.
	for _, b := range []string{`{"reason":"no spaces allowed"}`, `{"reason":""}`, `{"reason":"` + strings.Repeat("r", 65) + `"}`, `{}`, `{"reason":"x","note":"y"}`, ``} {
		r := k.do(call{method: "POST", path: "/admin/reservations/" + payID + "/cancel", body: b, invalid: true})
		if r.Status != 400 || r.str("error") != "invalid_request" || (b != `` && !strings.Contains(r.str("message"), "reason") && !strings.Contains(r.str("message"), "note")) {
			t.Errorf("order cancel %q = %d %v, want 400 invalid_request naming the member", b, r.Status, r.Body)
		}
	}
	expect(k.do(call{method: "POST", path: "/admin/reservations/" + payID + "/paid", body: `{"amount":1}`, invalid: true}), 400, "invalid_request")
	expect(paid(payID, `{}`+strings.Repeat(" ", 5000)), 413, "invalid_request")
	expect(release(payID, `{"reason":"x"}`+strings.Repeat(" ", 5000)), 413, "invalid_request")
	// Unknown ids, of a real SKU or of none, and not ids at all.
	for _, id := range []string{paySKU + ".aaaaaaaaaaaaaaaaaaaaaaaaaa", testservices.Name("nosuch") + ".aaaaaaaaaaaaaaaaaaaaaaaaaa", "bad%20id"} {
		expect(paid(id, ""), 404, "not_found")
		expect(release(id, `{"reason":"checkout:abandoned"}`), 404, "not_found")
	}
	// A HELD reservation (taken through a stack that persists nothing, on
	// the same stores) is not paid yet: 409 not_confirmed with Retry-After;
	// the order service may release it all the same.
	k3 := k.on(devstacktest.StartAPIOnly(t, env, base, issuer).URL)
	heldR := k3.do(call{token: cat, method: "POST", path: "/reservations", body: `{"sku":"` + paySKU + `","qty":1}`})
	expect(heldR, 202, "")
	heldID := heldR.str("reservation_id")
	notYet := paid(heldID, "")
	expect(notYet, 409, "not_confirmed")
	if ra := notYet.Header.Get("Retry-After"); ra != "1" {
		t.Errorf("not_confirmed with Retry-After %q, want 1", ra)
	}
	r = release(heldID, `{"reason":"checkout:timeout"}`)
	if r.Status != 200 || r.str("status") != "CANCELLED" || r.str("reason") != "order_cancelled" || r.str("note") != "checkout:timeout" {
		t.Errorf("order cancel of a HELD reservation = %d %v, want 200 CANCELLED order_cancelled with its note", r.Status, r.Body)
	}
	// A join is paid once its group formed: before, 409 group_not_formed,
	// and it has no pay_by yet.
	pg := k.do(call{token: cat, method: "POST", path: "/groups", body: `{"sku":"` + paySKU + `","capacity":2,"ttl_seconds":3600}`})
	expect(pg, 201, "")
	joinID := confirmed(cat, `{"sku":"`+paySKU+`","qty":1,"group_id":"`+pg.str("group_id")+`"}`)
	if j := k.do(call{token: cat, method: "GET", path: "/reservations/" + joinID}); j.Body["pay_by"] != nil {
		t.Errorf("a join whose group has not formed = %v, want no pay_by yet", j.Body)
	}
	expect(paid(joinID, ""), 409, "group_not_formed")
	if rep := k.do(call{method: "GET", path: "/admin/skus/" + paySKU + "/report"}); rep.Body["paid"] != float64(1) || rep.Body["sold"] != float64(2) {
		t.Errorf("report of %s = %v, want 1 unit paid of 2 sold", paySKU, rep.Body)
	}

	// --- the sku, sold out, rate limited
	expect(k.do(call{token: ann, method: "GET", path: "/skus/" + sku}), 200, "")
	expect(k.do(call{token: ann, method: "GET", path: "/skus/" + testservices.Name("nosuch")}), 404, "unknown_sku")
	expect(k.do(call{token: ann, method: "GET", path: "/skus/bad%20sku", invalid: true}), 404, "unknown_sku")
	// Over the per-user limit and over the stock: the limit answers (it is judged first).
	expect(reserve(mint("fay"), `{"sku":"`+sku+`","qty":9}`, nil), 409, "limit_exceeded")
	dry := testservices.Name("dry")
	expect(put(dry, `{"stock":1}`, nil), 200, "")
	expect(reserve(mint("fay"), `{"sku":"`+dry+`","qty":2}`, nil), 409, "sold_out")
	slow := testservices.Name("slow")
	expect(put(slow, `{"stock":100,"rate_per_second":1,"burst":1}`, nil), 200, "")
	slowID := reserve(ann, `{"sku":"`+slow+`","qty":1}`, nil)
	expect(slowID, 202, "")
	expect(reserve(ann, `{"sku":"`+slow+`","qty":1}`, nil), 429, "rate_limited")
	// A cancel is an attempt on the same budget.
	expect(k.do(call{token: ann, method: "DELETE", path: "/reservations/" + slowID.str("reservation_id")}), 429, "rate_limited")
	// Opening a group is an attempt on the same budget, and a buyer's open groups per SKU are capped (3).
	expect(k.do(call{token: ann, method: "POST", path: "/groups", body: `{"sku":"` + slow + `","capacity":2}`}), 429, "rate_limited")
	hal := mint("hal")
	for range 3 {
		expect(k.do(call{token: hal, method: "POST", path: "/groups", body: `{"sku":"` + sku + `","capacity":2}`}), 201, "")
	}
	expect(k.do(call{token: hal, method: "POST", path: "/groups", body: `{"sku":"` + sku + `","capacity":2}`}), 429, "too_many_groups")

	// --- the waiting room (issue 24): a SKU with a room opening in a few
	// seconds. Join (again: the same ticket), the public status (no token,
	// cacheable for a second), another buyer's ticket is unknown, a reserve
	// without an admission or with a forged one is 403; once admitted, the
	// ticket's token buys once, and its retry is a replay.
	roomSKU := testservices.Name("room")
	roomOpens := time.Now().Add(4 * time.Second).UTC().Truncate(time.Second)
	if r := put(roomSKU, `{"stock":3,"waiting_room":true,"opens_at":"`+stamp(roomOpens)+`","closes_at":"`+stamp(roomOpens.Add(time.Hour))+`"}`, nil); r.Status != 200 ||
		r.Body["waiting_room"] != true || r.Body["admit_factor"] != float64(1) {
		t.Errorf("PUT a SKU with a waiting room = %d %v, want 200 waiting_room true, admit_factor 1", r.Status, r.Body)
	}
	if r := k.do(call{token: ann, method: "GET", path: "/skus/" + roomSKU}); r.Status != 200 || r.Body["waiting_room"] != true {
		t.Errorf("GET /skus of a SKU with a room = %d %v, want waiting_room true", r.Status, r.Body)
	}
	if r := k.do(call{method: "GET", path: "/admin/skus/" + roomSKU + "/stock"}); r.Status != 200 || r.Body["waiting_room"] != true {
		t.Errorf("admin GET of a SKU with a room = %d %v, want waiting_room true", r.Status, r.Body)
	}
	if r := k.do(call{method: "GET", path: "/admin/skus/" + sku + "/stock"}); r.Body["waiting_room"] != false {
		t.Errorf("admin GET of a SKU without a room = %v, want waiting_room false", r.Body)
	}
	joinQ := func(tok, sku, body string) reply {
		return k.do(call{token: tok, method: "POST", path: "/skus/" + sku + "/queue", body: body})
	}
	first := joinQ(ann, roomSKU, "")
	expect(first, 200, "")
	ticket := first.str("ticket")
	if st, _ := time.Parse(time.RFC3339Nano, first.str("server_time")); ticket == "" || first.str("status") != "WAITING" || first.Header.Get("Cache-Control") != "no-store" ||
		(st.Before(roomOpens) && first.Body["position"] != nil) {
		t.Errorf("join = %v (Cache-Control %q), want a WAITING ticket, no-store, and no position before the opening", first.Body, first.Header.Get("Cache-Control"))
	}
	if again := joinQ(ann, roomSKU, "{}"); again.Status != 200 || again.str("ticket") != ticket {
		t.Errorf("join again = %d %v, want 200 with the same ticket %s", again.Status, again.Body, ticket)
	}
	statusPath := "/skus/" + roomSKU + "/queue"
	polled := time.Now()
	st1 := k.do(call{method: "GET", path: statusPath}) // no token: public
	st2 := k.do(call{method: "GET", path: statusPath + "?poll=2"})
	expect(st1, 200, "")
	if st1.Header.Get("Cache-Control") != "public, max-age=1" || st1.Body["length"] != float64(1) {
		t.Errorf("public status = %v (Cache-Control %q), want one ticket, public, max-age=1", st1.Body, st1.Header.Get("Cache-Control"))
	}
	if time.Since(polled) < time.Second && st2.str("server_time") != st1.str("server_time") {
		t.Errorf("the status twice within a second = %v then %v, want the kept answer (the gateway caches it as CloudFront does)", st1.Body, st2.Body)
	}
	expect(k.do(call{token: bob, method: "GET", path: statusPath + "/" + ticket}), 404, "unknown_ticket")
	expect(k.do(call{token: ann, method: "GET", path: statusPath + "/not-a-ticket"}), 404, "unknown_ticket")
	if r := k.do(call{token: ann, method: "GET", path: statusPath + "/" + ticket}); r.Status != 200 || r.Header.Get("Cache-Control") != "no-store" {
		t.Errorf("GET the ticket = %d %v (Cache-Control %q), want 200, no-store", r.Status, r.Body, r.Header.Get("Cache-Control"))
	}
	roomBuy := `{"sku":"` + roomSKU + `","qty":1}`
	expect(reserve(ann, roomBuy, map[string]string{"Admission-Token": "1999999999999.AAAAAAAAAAAAAAAAAAAAAA"}), 403, "admission_invalid")
	var admitted reply
	testservices.Eventually(t, 20*time.Second, "the ticket is ADMITTED at the opening", func() bool {
		admitted = k.do(call{token: ann, method: "GET", path: statusPath + "/" + ticket})
		return admitted.str("status") == "ADMITTED"
	})
	token := admitted.str("admission_token")
	if admitted.Body["position"] != float64(1) || token == "" || admitted.str("admission_expires_at") == "" {
		t.Errorf("admitted ticket = %v, want position 1 with an admission token and its expiry", admitted.Body)
	}
	expect(reserve(cat, roomBuy, nil), 403, "admission_required")
	expect(reserve(bob, roomBuy, map[string]string{"Admission-Token": token}), 403, "admission_invalid")
	bought := reserve(ann, roomBuy, map[string]string{"Admission-Token": token})
	expect(bought, 202, "")
	replay := reserve(ann, roomBuy, map[string]string{"Admission-Token": token, "Idempotency-Key": "ignored"})
	if (replay.Status != 202 && replay.Status != 200) || replay.str("reservation_id") != bought.str("reservation_id") {
		t.Errorf("reserve again with the same token = %d %v, want the replay of %s", replay.Status, replay.Body, bought.str("reservation_id"))
	}
	if r := k.do(call{token: ann, method: "GET", path: "/skus/" + roomSKU}); r.Body["available"] != float64(2) {
		t.Errorf("%s after the buy and its replay: %v available, want 2 (one hold)", roomSKU, r.Body["available"])
	}
	if r := k.do(call{token: ann, method: "GET", path: statusPath + "/" + ticket}); r.str("status") != "RESERVED" {
		t.Errorf("the ticket after its buy = %v, want RESERVED", r.Body)
	}
	// The queue's refusals. The public status asked of the API's own
	// endpoint, around the CDN (which sends the edge secret), even with a
	// forged edge header.
	origin := k.on(stack.OriginURL)
	expect(origin.do(call{method: "GET", path: "/skus/" + roomSKU + "/queue"}), 403, "edge_only")
	expect(origin.do(call{method: "GET", path: "/skus/" + roomSKU + "/queue", header: map[string]string{"X-Holdfast-Edge": "guess"}}), 403, "edge_only")
	if r := origin.do(call{token: ann, method: "GET", path: statusPath + "/" + ticket}); r.Status != 200 {
		t.Errorf("the own ticket from the API's own endpoint = %d %v, want 200 (only the public status is the CDN's)", r.Status, r.Body)
	}
	expect(joinQ(ann, sku, ""), 404, "no_waiting_room")
	expect(k.do(call{method: "GET", path: "/skus/" + sku + "/queue"}), 404, "no_waiting_room")
	expect(joinQ(ann, testservices.Name("nosuch"), ""), 404, "unknown_sku")
	expect(k.do(call{method: "GET", path: "/skus/" + testservices.Name("nosuch") + "/queue"}), 404, "unknown_sku")
	expect(k.do(call{token: ann, method: "POST", path: "/skus/bad%20sku/queue", invalid: true}), 404, "unknown_sku")
	expect(k.do(call{token: ann, method: "POST", path: statusPath, body: `{"ticket":"x"}`, invalid: true}), 400, "invalid_request")
	expect(joinQ(ann, roomSKU, `{}`+strings.Repeat(" ", 5000)), 413, "invalid_request")
	laterSKU, pastSKU, slowRoom := testservices.Name("roomlater"), testservices.Name("roompast"), testservices.Name("roomslow")
	later := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	expect(put(laterSKU, `{"stock":3,"waiting_room":true,"opens_at":"`+stamp(later)+`"}`, nil), 200, "")
	queueShut := joinQ(ann, laterSKU, "")
	expect(queueShut, 409, "queue_not_open")
	if n, _ := strconv.Atoi(queueShut.Header.Get("Retry-After")); queueShut.str("queue_opens_at") != stamp(later.Add(-15*time.Minute)) || n < 2600 || n > 2700 {
		t.Errorf("queue_not_open = %v, Retry-After %q; want queue_opens_at 15 min before %s and about 2700 s", queueShut.Body, queueShut.Header.Get("Retry-After"), stamp(later))
	}
	expect(put(pastSKU, `{"stock":3,"waiting_room":true,"opens_at":"`+stamp(past)+`","closes_at":"`+stamp(past.Add(time.Hour))+`"}`, nil), 200, "")
	expect(joinQ(ann, pastSKU, ""), 409, "sale_closed")
	expect(put(slowRoom, `{"stock":3,"waiting_room":true,"rate_per_second":1,"burst":1}`, nil), 200, "")
	slowTicket := joinQ(ann, slowRoom, "")
	expect(slowTicket, 200, "")
	expect(joinQ(ann, slowRoom, ""), 429, "rate_limited")
	// A look at the own ticket is an attempt too (the budget is spent).
	expect(k.do(call{token: ann, method: "GET", path: "/skus/" + slowRoom + "/queue/" + slowTicket.str("ticket")}), 429, "rate_limited")
	// The settings: a factor out of 1..100 or without a room, a room on
	// more than one bucket, are 400, nothing changed.
	expect(k.do(call{method: "PUT", path: "/admin/skus/" + roomSKU + "/stock", body: `{"add":0,"admit_factor":0.5}`, invalid: true}), 400, "invalid_request")
	expect(k.do(call{method: "PUT", path: "/admin/skus/" + roomSKU + "/stock", body: `{"add":0,"admit_factor":101}`, invalid: true}), 400, "invalid_request")
	expect(put(sku, `{"add":0,"admit_factor":2}`, nil), 400, "invalid_request")
	expect(put(testservices.Name("roomk3"), `{"stock":5,"buckets":3,"waiting_room":true}`, nil), 400, "invalid_request")
	spread := testservices.Name("spread")
	expect(put(spread, `{"stock":5,"buckets":3}`, nil), 200, "")
	if r := put(spread, `{"add":0,"waiting_room":true}`, nil); r.Status != 400 || !strings.Contains(r.str("message"), "waiting_room") {
		t.Errorf("a room on 3 buckets = %d %v, want 400 naming waiting_room", r.Status, r.Body)
	}
	// A factor is kept; turned off, the SKU has no room, and its tickets
	// are gone with it.
	if r := put(slowRoom, `{"add":0,"admit_factor":2.5}`, nil); r.Status != 200 || r.Body["admit_factor"] != 2.5 {
		t.Errorf("PUT admit_factor 2.5 = %d %v, want it kept", r.Status, r.Body)
	}
	if r := put(roomSKU, `{"add":0,"waiting_room":false}`, nil); r.Status != 200 || r.Body["waiting_room"] != false || r.Body["admit_factor"] != nil {
		t.Errorf("PUT waiting_room false = %d %v, want no room, no admit_factor", r.Status, r.Body)
	}
	expect(k.do(call{token: ann, method: "GET", path: statusPath + "/" + ticket}), 404, "no_waiting_room")

	// An admission lasts HOLDFAST_ADMIT_FOR (a second on this stack): used
	// later, it is 403 admission_expired, nothing held.
	short := map[string]string{"HOLDFAST_ADMIT_FOR": "1s"}
	for k, v := range base {
		short[k] = v
	}
	kShort := k.on(devstacktest.StartTrusting(t, env, short, issuer).URL)
	quickSKU := testservices.Name("roomquick")
	expect(kShort.do(call{method: "PUT", path: "/admin/skus/" + quickSKU + "/stock", body: `{"stock":3,"waiting_room":true}`}), 200, "")
	quick := kShort.do(call{token: ann, method: "POST", path: "/skus/" + quickSKU + "/queue"})
	expect(quick, 200, "")
	lapsing := kShort.do(call{token: ann, method: "GET", path: "/skus/" + quickSKU + "/queue/" + quick.str("ticket")})
	if lapsing.str("status") != "ADMITTED" || lapsing.str("admission_token") == "" {
		t.Fatalf("a ticket on a SKU open with stock = %v, want ADMITTED at once", lapsing.Body)
	}
	testservices.Eventually(t, 10*time.Second, "the admission lapses", func() bool {
		return kShort.do(call{token: ann, method: "GET", path: "/skus/" + quickSKU + "/queue/" + quick.str("ticket")}).str("status") == "EXPIRED"
	})
	expect(kShort.do(call{token: ann, method: "POST", path: "/reservations", body: `{"sku":"` + quickSKU + `","qty":1}`,
		header: map[string]string{"Admission-Token": lapsing.str("admission_token")}}), 403, "admission_expired")
	if r := kShort.do(call{token: ann, method: "GET", path: "/skus/" + quickSKU}); r.Body["available"] != float64(3) {
		t.Errorf("after the expired admission %s has %v available, want all 3", quickSKU, r.Body["available"])
	}

	// --- authentication: no token (API Gateway's 401); a verified token
	// without the buyer's claim (the function's 401).
	for _, c := range []call{
		{method: "POST", path: "/reservations", body: `{"sku":"` + sku + `","qty":1}`},
		{method: "GET", path: "/reservations/" + id}, {method: "DELETE", path: "/reservations/" + id},
		{method: "POST", path: "/groups", body: `{"sku":"` + sku + `","capacity":2}`},
		{method: "GET", path: "/groups/" + gid}, {method: "GET", path: "/skus/" + sku},
		{method: "POST", path: "/skus/" + roomSKU + "/queue"}, {method: "GET", path: statusPath + "/" + ticket},
	} {
		c.invalid = true // the document requires the token
		expect(k.do(c), 401, "")
	}
	// Its buyers are named by a claim the dev issuer does not write.
	base["HOLDFAST_USER_CLAIM"] = "buyer_id"
	other := devstacktest.StartTrusting(t, env, base, issuer)
	k2 := k.on(other.URL)
	for _, c := range []call{
		{token: ann, method: "POST", path: "/reservations", body: `{"sku":"` + sku + `","qty":1}`},
		{token: ann, method: "GET", path: "/reservations/" + id}, {token: ann, method: "DELETE", path: "/reservations/" + id},
		{token: ann, method: "POST", path: "/groups", body: `{"sku":"` + sku + `","capacity":2}`},
		{token: ann, method: "GET", path: "/groups/" + gid}, {token: ann, method: "GET", path: "/skus/" + sku},
		{token: ann, method: "POST", path: "/skus/" + roomSKU + "/queue"}, {token: ann, method: "GET", path: statusPath + "/" + ticket},
	} {
		expect(k2.do(c), 401, "unauthenticated")
	}

	// --- API Gateway's quotas, kept by make dev's gateway: request line
	// plus headers up to 10,240 bytes, a payload up to 10 MB. A body the
	// function refuses is still read whole and answered, never reset.
	expect(reserve(ann, `{"sku":"`+sku+`","qty":1,"group_id":"`+strings.Repeat("g", 1<<20)+`"}`, nil), 413, "invalid_request")
	expect(put(sku, `{"add":1,"version":1}`+strings.Repeat(" ", 10<<20-len(`{"add":1,"version":1}`)), nil), 413, "invalid_request")
	overQuota := strings.Repeat(" ", 10<<20)
	for _, c := range []call{
		{token: ann, method: "POST", path: "/reservations", body: `{"sku":"` + sku + `","qty":1}` + overQuota},
		{token: ann, method: "POST", path: "/groups", body: `{"sku":"` + sku + `","capacity":2}` + overQuota},
		{method: "PUT", path: "/admin/skus/" + sku + "/stock", body: `{"add":1}` + overQuota},
		{method: "POST", path: "/admin/reservations/" + id + "/paid", body: `{}` + overQuota},
		{method: "POST", path: "/admin/reservations/" + id + "/cancel", body: `{"reason":"x"}` + overQuota},
		{token: ann, method: "POST", path: "/skus/" + slowRoom + "/queue", body: `{}` + overQuota},
	} {
		if r := k.do(c); r.Status != 413 || r.Body["message"] != "Request Entity Too Large" || r.Body["error"] != nil {
			t.Errorf("%s %s with a body over 10 MB = %d %v, want API Gateway's 413", c.method, c.path, r.Status, r.Body)
		}
	}
	pad := map[string]string{"X-Pad": strings.Repeat("p", 10240)}
	for _, c := range []call{
		{token: ann, method: "POST", path: "/reservations", body: `{"sku":"` + sku + `","qty":1}`, header: pad},
		{token: ann, method: "GET", path: "/reservations/" + id, header: pad}, {token: ann, method: "DELETE", path: "/reservations/" + id, header: pad},
		{token: ann, method: "POST", path: "/groups", body: `{"sku":"` + sku + `","capacity":2}`, header: pad},
		{token: ann, method: "GET", path: "/groups/" + gid, header: pad}, {token: ann, method: "GET", path: "/skus/" + sku, header: pad},
		{method: "PUT", path: "/admin/skus/" + sku + "/stock", body: `{"add":1}`, header: pad},
		{method: "GET", path: "/admin/skus/" + sku + "/stock", header: pad},
		{method: "GET", path: "/admin/skus/" + sku + "/report", header: pad},
		{method: "POST", path: "/admin/reservations/" + id + "/paid", header: pad},
		{method: "POST", path: "/admin/reservations/" + id + "/cancel", body: `{"reason":"x"}`, header: pad},
		{token: ann, method: "POST", path: "/skus/" + slowRoom + "/queue", header: pad},
		{method: "GET", path: "/skus/" + slowRoom + "/queue", header: pad},
		{token: ann, method: "GET", path: statusPath + "/" + ticket, header: pad},
	} {
		if r := k.do(c); r.Status != 431 || r.Body["message"] != "Request Header Fields Too Large" {
			t.Errorf("%s %s with a 10 KiB header = %d %v, want API Gateway's 431", c.method, c.path, r.Status, r.Body)
		}
	}

	// --- not in the document: API Gateway's 404, in either direction.
	k.do(call{token: ann, method: "GET", path: "/reservations"})
	k.do(call{token: ann, method: "PATCH", path: "/reservations/" + id})
	k.do(call{method: "DELETE", path: "/admin/skus/" + sku + "/stock"})
	// --- admin: the report, before and after an audit (the sweeper's, recorded here directly).
	report := func(sku string) reply { return k.do(call{method: "GET", path: "/admin/skus/" + sku + "/report"}) }
	if r := report(sku); r.Status != 200 || r.Body["last_audit"] != nil || r.Body["ledger_mismatch"] != float64(0) {
		t.Errorf("report before an audit = %d %v, want 200, balanced, no last_audit", r.Status, r.Body)
	}
	if err := mysqlstore.New(db).RecordAudit(ctx, reservation.AuditResult{SKU: sku, At: time.Now(), PutIn: 7, Available: 7}); err != nil {
		t.Fatal(err)
	}
	if r := report(sku); r.Status != 200 || r.Body["last_audit"] == nil {
		t.Errorf("report after an audit = %d %v, want 200 with last_audit", r.Status, r.Body)
	}
	expect(report(testservices.Name("nosuch")), 404, "unknown_sku")
	k.do(call{token: ann, method: "GET", path: "/skus/" + sku + "/"})
	k.do(call{token: ann, method: "POST", path: "/reservations/", body: `{"sku":"` + sku + `","qty":1}`})

	// --- the stores down: 503 with Retry-After, on every route.
	rds.Stop()
	maria.Stop()
	held := testservices.Name("held")
	for _, c := range []call{
		// (not the sold-out SKU: an instance answers sold_out from memory for a moment)
		{token: ann, method: "POST", path: "/reservations", body: `{"sku":"` + slow + `","qty":1}`},
		{token: ann, method: "GET", path: "/reservations/" + held + ".aaaaaaaaaaaaaaaaaaaaaaaaaa"},
		{token: ann, method: "DELETE", path: "/reservations/" + id},
		{token: ann, method: "POST", path: "/groups", body: `{"sku":"` + sku + `","capacity":2}`},
		{token: ann, method: "GET", path: "/groups/" + gid}, {token: ann, method: "GET", path: "/skus/" + sku},
		{method: "PUT", path: "/admin/skus/" + sku + "/stock", body: `{"add":1}`},
		{method: "GET", path: "/admin/skus/" + sku + "/stock"},
		{method: "GET", path: "/admin/skus/" + sku + "/report"},
		{method: "POST", path: "/admin/reservations/" + id + "/paid"},
		{method: "POST", path: "/admin/reservations/" + id + "/cancel", body: `{"reason":"checkout:abandoned"}`},
		{token: ann, method: "POST", path: "/skus/" + slowRoom + "/queue"},
		{method: "GET", path: "/skus/" + held + "/queue"}, // a path the gateway has not kept an answer of
		{token: ann, method: "GET", path: "/skus/" + slowRoom + "/queue/" + slowTicket.str("ticket")},
	} {
		if r := k.do(c); r.Status != 503 || r.str("error") != "unavailable" {
			t.Errorf("%s %s with the stores down = %d %v, want 503 unavailable", c.method, c.path, r.Status, r.Body)
		}
	}

	// Every documented answer was given.
	var missing []string
	for _, o := range k.documented() {
		if !k.seen[o] && notProducedLocally(o) == "" {
			missing = append(missing, o.String())
		}
	}
	// Every property of every schema the API answered with was seen at
	// least once: a documented field the API never sends fails.
	for name, seen := range k.fields {
		for prop := range k.doc.Components.Schemas[name].Value.Properties {
			if !seen[prop] {
				t.Errorf("schema %s documents %q, which no response carried", name, prop)
			}
		}
	}
	if len(missing) > 0 {
		t.Errorf("documented but never answered (document them away or produce them here):\n  %s", strings.Join(missing, "\n  "))
	}
	for o := range k.seen {
		if !slices.Contains(k.documented(), o) {
			t.Errorf("answered %s, which the document does not list", o)
		}
	}
}
