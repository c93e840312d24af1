package devstack_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/holdfast/holdfast/internal/devauth"
	"github.com/holdfast/holdfast/internal/devstack"
	"github.com/holdfast/holdfast/internal/samtemplate"
)

// recorder is the function behind the gateway: it keeps every event.
type recorder struct {
	mu     sync.Mutex
	events []events.APIGatewayV2HTTPRequest
}

func (r *recorder) handle(_ context.Context, ev events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, ev)
	return events.APIGatewayV2HTTPResponse{StatusCode: http.StatusTeapot, Headers: map[string]string{"Content-Type": "application/json"},
		Body: `{"from":"handler"}`}, nil
}

func (r *recorder) take() []events.APIGatewayV2HTTPRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	evs := r.events
	r.events = nil
	return evs
}

// templateAndIssuer loads template.yaml and opens a dev issuer of the test's own.
func templateAndIssuer(t *testing.T) (*samtemplate.Template, *devauth.Issuer) {
	t.Helper()
	tpl, err := samtemplate.Load("../../template.yaml")
	if err != nil {
		t.Fatal(err)
	}
	iss, err := devauth.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return tpl, iss
}

// gateway serves the template's routes over real HTTP with a dev issuer's
// verifier in front of a recorder.
func gateway(t *testing.T) (*httptest.Server, *devauth.Issuer, *recorder) {
	t.Helper()
	tpl, iss := templateAndIssuer(t)
	rec := &recorder{}
	srv := httptest.NewServer(devstack.Gateway(rec.handle, tpl.Routes(), iss.Verifier(), slog.New(slog.DiscardHandler)))
	t.Cleanup(srv.Close)
	return srv, iss, rec
}

func send(t *testing.T, srv *httptest.Server, method, path, authorization, body string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if authorization != "" {
		req.Header.Set("Authorization", authorization)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

func TestGatewayAnswers401ForEveryBadToken(t *testing.T) {
	srv, iss, rec := gateway(t)
	mint := func(change func(*devauth.Issuer)) string {
		c := *iss
		change(&c)
		tok, err := c.Mint("ann", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	good := mint(func(*devauth.Issuer) {})
	parts := strings.Split(good, ".")
	sig, _ := base64.RawURLEncoding.DecodeString(parts[2])
	sig[0] ^= 0x80
	other, err := devauth.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	otherTok, err := other.Mint("ann", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	none := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","kid":"`+iss.KeyID()+`"}`)) + "." + parts[1] + "."

	bad := map[string]string{
		"missing":         "",
		"empty bearer":    "Bearer ",
		"basic":           "Basic YW5uOnB3",
		"not a jwt":       "Bearer not-a-jwt",
		"bad signature":   "Bearer " + parts[0] + "." + parts[1] + "." + base64.RawURLEncoding.EncodeToString(sig),
		"alg none":        "Bearer " + none,
		"unknown key":     "Bearer " + otherTok,
		"expired":         "Bearer " + mint(func(c *devauth.Issuer) { c.Now = func() time.Time { return time.Now().Add(-3 * time.Hour) } }),
		"not yet valid":   "Bearer " + mint(func(c *devauth.Issuer) { c.Now = func() time.Time { return time.Now().Add(time.Hour) } }),
		"wrong audience":  "Bearer " + mint(func(c *devauth.Issuer) { c.Audience = "another-api" }),
		"wrong issuer":    "Bearer " + mint(func(c *devauth.Issuer) { c.Issuer = "https://evil.example/" }),
		"two tokens":      "Bearer " + good + " " + good,
		"bearer, no jwt":  "Bearer",
		"token in scheme": "Token " + good,
	}
	buyerRoutes := []struct{ method, path, body string }{
		{"POST", "/reservations", `{"sku":"demo-phone","qty":1}`},
		{"GET", "/reservations/r-1", ""},
		{"DELETE", "/reservations/r-1", ""},
		{"POST", "/groups", `{"sku":"demo-phone","capacity":3}`},
		{"GET", "/groups/g-1", ""},
		{"GET", "/skus/demo-phone", ""},
	}
	for name, auth := range bad {
		for _, r := range buyerRoutes {
			resp, body := send(t, srv, r.method, r.path, auth, r.body)
			if resp.StatusCode != http.StatusUnauthorized || body != `{"message":"Unauthorized"}` {
				t.Errorf("%s %s with %s token = %d %s, want 401 {\"message\":\"Unauthorized\"}", r.method, r.path, name, resp.StatusCode, body)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("%s token: Content-Type = %q", name, ct)
			}
			if !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("%s token: WWW-Authenticate = %q", name, resp.Header.Get("WWW-Authenticate"))
			}
		}
	}
	if evs := rec.take(); len(evs) != 0 {
		t.Errorf("the handler was called %d times for rejected tokens: %+v", len(evs), evs[0])
	}
}

func TestGatewayPassesClaimsRouteKeyAndPathParameters(t *testing.T) {
	srv, iss, rec := gateway(t)
	tok, err := iss.Mint("ann", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		method, path, auth, key string
		params                  map[string]string
	}{
		{"POST", "/reservations", "Bearer " + tok, "POST /reservations", nil},
		{"GET", "/reservations/demo-phone.abc", "bearer " + tok, "GET /reservations/{id}", map[string]string{"id": "demo-phone.abc"}},
		{"GET", "/skus/demo-phone", tok, "GET /skus/{sku}", map[string]string{"sku": "demo-phone"}}, // a bare token, as API Gateway takes it
	}
	for _, c := range cases {
		resp, body := send(t, srv, c.method, c.path, c.auth, `{"sku":"demo-phone","qty":1}`)
		if resp.StatusCode != http.StatusTeapot || body != `{"from":"handler"}` {
			t.Fatalf("%s %s = %d %s, want the handler's 418", c.method, c.path, resp.StatusCode, body)
		}
		evs := rec.take()
		if len(evs) != 1 {
			t.Fatalf("%s %s: handler called %d times", c.method, c.path, len(evs))
		}
		ev := evs[0]
		if ev.RouteKey != c.key || ev.RequestContext.RouteKey != c.key {
			t.Errorf("RouteKey = %q / %q, want %q", ev.RouteKey, ev.RequestContext.RouteKey, c.key)
		}
		if len(ev.PathParameters) != len(c.params) || (c.params != nil && ev.PathParameters["id"]+ev.PathParameters["sku"] != c.params["id"]+c.params["sku"]) {
			t.Errorf("%s: PathParameters = %v, want %v", c.path, ev.PathParameters, c.params)
		}
		a := ev.RequestContext.Authorizer
		if a == nil || a.JWT == nil {
			t.Fatalf("%s %s: no JWT authorizer context: %+v", c.method, c.path, ev.RequestContext)
		}
		if a.JWT.Claims["sub"] != "ann" || a.JWT.Claims["aud"] != devauth.Audience || a.JWT.Claims["iss"] != devauth.IssuerURL || a.JWT.Scopes != nil {
			t.Errorf("claims = %v scopes %v, want sub ann, aud %s, iss %s, no scopes", a.JWT.Claims, a.JWT.Scopes, devauth.Audience, devauth.IssuerURL)
		}
		if ev.Headers["authorization"] != c.auth || ev.RequestContext.HTTP.Method != c.method || ev.RawPath != c.path {
			t.Errorf("event headers/method/path = %q %s %s", ev.Headers["authorization"], ev.RequestContext.HTTP.Method, ev.RawPath)
		}
	}
	// The event is what the Lambda receives: it survives the JSON round trip.
	ev := events.APIGatewayV2HTTPRequest{}
	_, _ = send(t, srv, "GET", "/groups/g-1", "Bearer "+tok, "")
	b, _ := json.Marshal(rec.take()[0])
	if err := json.Unmarshal(b, &ev); err != nil || ev.RequestContext.Authorizer.JWT.Claims["sub"] != "ann" {
		t.Errorf("event JSON %s: %v", b, err)
	}
	if !strings.Contains(string(b), `"authorizer":{"jwt":{"claims":{`) {
		t.Errorf("event JSON lacks requestContext.authorizer.jwt.claims: %s", b)
	}
}

func TestGatewayLeavesAdminRoutesToIAM(t *testing.T) {
	srv, _, rec := gateway(t)
	const id = "demo-phone.o5huxqhfb5dp3mwp34lmcopv7e"
	for _, c := range []struct{ method, path, auth, key, param, value string }{
		// SigV4 in AWS; not a JWT authorizer's business
		{"PUT", "/admin/skus/demo-phone/stock", "", "PUT /admin/skus/{sku}/stock", "sku", "demo-phone"},
		{"GET", "/admin/skus/demo-phone/stock", "", "GET /admin/skus/{sku}/stock", "sku", "demo-phone"},
		{"GET", "/admin/skus/demo-phone/stock", "Bearer not-a-jwt", "GET /admin/skus/{sku}/stock", "sku", "demo-phone"},
		// the order service's routes
		{"POST", "/admin/reservations/" + id + "/paid", "", "POST /admin/reservations/{id}/paid", "id", id},
		{"POST", "/admin/reservations/" + id + "/cancel", "Bearer not-a-jwt", "POST /admin/reservations/{id}/cancel", "id", id},
	} {
		resp, body := send(t, srv, c.method, c.path, c.auth, `{"stock":5}`)
		if resp.StatusCode != http.StatusTeapot {
			t.Errorf("%s %s (auth %q) = %d %s, want the handler's 418", c.method, c.path, c.auth, resp.StatusCode, body)
			continue
		}
		ev := rec.take()[0]
		if ev.RouteKey != c.key || ev.PathParameters[c.param] != c.value || ev.RequestContext.Authorizer != nil {
			t.Errorf("admin event = key %q params %v authorizer %+v, want %s with %s=%s and no authorizer",
				ev.RouteKey, ev.PathParameters, ev.RequestContext.Authorizer, c.key, c.param, c.value)
		}
	}
}

func TestGatewayAnswers404ForUnknownRoutes(t *testing.T) {
	srv, iss, rec := gateway(t)
	tok, err := iss.Mint("ann", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ method, path string }{
		{"GET", "/nope"}, {"PATCH", "/reservations/r-1"}, {"GET", "/reservations"}, {"GET", "/reservations/"},
		{"GET", "/admin/skus/demo-phone"}, {"GET", "/skus/demo-phone/extra"},
	} {
		resp, body := send(t, srv, c.method, c.path, "Bearer "+tok, "")
		if resp.StatusCode != http.StatusNotFound || body != `{"message":"Not Found"}` {
			t.Errorf("%s %s = %d %s, want 404 {\"message\":\"Not Found\"}", c.method, c.path, resp.StatusCode, body)
		}
	}
	if evs := rec.take(); len(evs) != 0 {
		t.Errorf("the handler was called for unknown routes: %d", len(evs))
	}
}

// Without a verifier, a JWT route can never be reached.
func TestGatewayWithoutVerifierRejects(t *testing.T) {
	tpl, iss := templateAndIssuer(t)
	tok, err := iss.Mint("ann", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	srv := httptest.NewServer(devstack.Gateway(rec.handle, tpl.Routes(), nil, slog.New(slog.DiscardHandler)))
	defer srv.Close()
	if resp, _ := send(t, srv, "GET", "/skus/demo-phone", "Bearer "+tok, ""); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("status = %d, want 401", resp.StatusCode)
	}
	if len(rec.take()) != 0 {
		t.Error("the handler was called")
	}
}

// The waiting room's routes: joining and a ticket are the buyer's (JWT);
// the queue's status is public (no authorizer, no claims in the event), and
// its public answer is kept a second, as CloudFront keeps it in AWS.
func TestGatewayServesTheWaitingRoom(t *testing.T) {
	srv, iss, rec := gateway(t)
	tok, err := iss.Mint("ann", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ method, path string }{{"POST", "/skus/demo-phone/queue"}, {"GET", "/skus/demo-phone/queue/t1"}} {
		if resp, body := send(t, srv, c.method, c.path, "", ""); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s %s without a token = %d %s, want 401", c.method, c.path, resp.StatusCode, body)
		}
		if resp, _ := send(t, srv, c.method, c.path, "Bearer "+tok, ""); resp.StatusCode != http.StatusTeapot {
			t.Errorf("%s %s with a token = %d, want the handler's 418", c.method, c.path, resp.StatusCode)
		}
	}
	evs := rec.take()
	if len(evs) != 2 || evs[0].RouteKey != "POST /skus/{sku}/queue" || evs[1].RouteKey != "GET /skus/{sku}/queue/{ticket}" ||
		evs[1].PathParameters["ticket"] != "t1" || evs[1].RequestContext.Authorizer == nil {
		t.Fatalf("events = %+v, want the join and the ticket, with claims", evs)
	}
	if resp, _ := send(t, srv, "GET", "/skus/demo-phone/queue", "", ""); resp.StatusCode != http.StatusTeapot {
		t.Errorf("GET /skus/demo-phone/queue without a token = %d, want the handler's 418", resp.StatusCode)
	}
	if evs := rec.take(); len(evs) != 1 || evs[0].RouteKey != "GET /skus/{sku}/queue" || evs[0].RequestContext.Authorizer != nil {
		t.Errorf("public status events = %+v, want one, without an authorizer", evs)
	}

	tpl, err := samtemplate.Load("../../template.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var calls int
	var mu sync.Mutex
	public := func(_ context.Context, ev events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		return events.APIGatewayV2HTTPResponse{StatusCode: 200, Headers: map[string]string{"Content-Type": "application/json", "Cache-Control": "public, max-age=1"},
			Body: `{"n":` + strconv.Itoa(calls) + `}`}, nil
	}
	cached := httptest.NewServer(devstack.Gateway(public, tpl.Routes(), iss.Verifier(), slog.New(slog.DiscardHandler)))
	defer cached.Close()
	start := time.Now()
	_, first := send(t, cached, "GET", "/skus/demo-phone/queue", "", "")
	resp, second := send(t, cached, "GET", "/skus/demo-phone/queue?poll=2", "", "")
	if time.Since(start) < devstack.EdgeMaxAge && (first != `{"n":1}` || second != first || resp.Header.Get("Cache-Control") != "public, max-age=1") {
		t.Errorf("two GETs within a second = %s, %s (Cache-Control %q), want the first answer twice", first, second, resp.Header.Get("Cache-Control"))
	}
}

// A client that goes away mid-request does not cut the function short, as
// API Gateway's invocation of a Lambda runs on: a reserve that took a hold
// still hands it to persist. The function's Timeout (template.yaml) is its
// deadline instead.
func TestGatewayInvocationOutlivesItsClient(t *testing.T) {
	tpl, iss := templateAndIssuer(t)
	reqCtx := make(chan context.Context, 1)
	fnCtx := make(chan context.Context, 1)
	release := make(chan struct{})
	fn := func(ctx context.Context, _ events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
		fnCtx <- ctx
		<-release
		return events.APIGatewayV2HTTPResponse{StatusCode: http.StatusAccepted}, nil
	}
	gw := devstack.Gateway(fn, tpl.Routes(), iss.Verifier(), slog.New(slog.DiscardHandler))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reqCtx <- r.Context()
		gw.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	defer close(release)
	tok, err := iss.Mint("ann", time.Hour)
	if err != nil {
		t.Fatal(err)
	}

	clientCtx, hangUp := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(clientCtx, "POST", srv.URL+"/reservations", strings.NewReader(`{"sku":"demo-phone","qty":1}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	sent := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		sent <- err
	}()
	rctx, ctx := <-reqCtx, <-fnCtx
	hangUp()
	if err := <-sent; err == nil {
		t.Fatal("the client's request succeeded after it hung up")
	}
	<-rctx.Done() // the server saw the client go
	if err := ctx.Err(); err != nil {
		t.Errorf("the function's context ended with its client: %v", err)
	}
	var reserve time.Duration
	for _, r := range tpl.Routes() {
		if r.Key() == "POST /reservations" {
			reserve = r.Timeout
		}
	}
	if reserve <= 0 {
		t.Fatalf("POST /reservations carries no function Timeout: %v", reserve)
	}
	if d, ok := ctx.Deadline(); !ok || time.Until(d) > reserve || time.Until(d) < reserve-time.Minute {
		t.Errorf("the function's deadline = %v (ok %t), want about its Timeout %v from the request", d, ok, reserve)
	}
}
