package devstack_test

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/holdfast/holdfast/internal/devauth"
	"github.com/holdfast/holdfast/internal/devstack"
	"github.com/holdfast/holdfast/internal/samtemplate"
)

func pages(t *testing.T) (*httptest.Server, *devauth.Issuer, *recorder) {
	t.Helper()
	tpl, err := samtemplate.Load("../../template.yaml")
	if err != nil {
		t.Fatal(err)
	}
	iss, err := devauth.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	log := slog.New(slog.DiscardHandler)
	h, err := devstack.Pages(devstack.Gateway(rec.handle, tpl.Routes(), iss.Verifier(), log), tpl.Routes(), iss, log)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv, iss, rec
}

// make dev serves the buyer page at /shop/ (its config naming the dev
// sign-in) and the sign-in at POST /dev/token, whose token the gateway
// takes as the buyer's; the API's routes and 404s are the gateway's as
// before.
func TestPagesServeTheShopAndTheDevSignIn(t *testing.T) {
	srv, iss, rec := pages(t)
	for _, c := range []struct{ path, contentType, has string }{
		{"/shop/?sku=demo-phone", "text/html", `id="state"`},
		{"/shop/shop.js", "text/javascript", "admitted_through"},
		{"/shop/shop.css", "text/css", "#state"},
		{"/shop/config.json", "application/json", `"sign_in":"dev"`},
	} {
		resp, body := send(t, srv, "GET", c.path, "", "")
		if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), c.contentType) || !strings.Contains(body, c.has) {
			t.Errorf("GET %s = %d %s, want 200 %s with %q", c.path, resp.StatusCode, resp.Header.Get("Content-Type"), c.contentType, c.has)
		}
		if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") {
			t.Errorf("GET %s: Content-Security-Policy %q, want default-src 'self'", c.path, csp)
		}
	}
	if resp, _ := send(t, srv, "GET", "/shop/nothing.js", "", ""); resp.StatusCode != 404 {
		t.Errorf("GET /shop/nothing.js = %d, want 404", resp.StatusCode)
	}

	resp, body := send(t, srv, "POST", "/dev/token", "", `{"sub":"ann"}`)
	var tok struct {
		Token, Sub string
		ExpiresIn  int `json:"expires_in"`
	}
	if err := json.Unmarshal([]byte(body), &tok); err != nil || resp.StatusCode != 200 || tok.Sub != "ann" || tok.ExpiresIn != 3600 {
		t.Fatalf("POST /dev/token = %d %s, want 200 with ann's token", resp.StatusCode, body)
	}
	claims, err := iss.Verifier().Verify(tok.Token)
	if err != nil || claims["sub"] != "ann" {
		t.Errorf("the sign-in's token: claims %v, %v; want ann's, valid", claims, err)
	}
	if resp, _ := send(t, srv, "GET", "/skus/demo-phone", "Bearer "+tok.Token, ""); resp.StatusCode != http.StatusTeapot {
		t.Errorf("GET /skus/demo-phone with the sign-in's token = %d, want the function invoked", resp.StatusCode)
	} else if evs := rec.take(); len(evs) != 1 || evs[0].RequestContext.Authorizer.JWT.Claims["sub"] != "ann" {
		t.Errorf("the function got %+v, want one event of ann's", evs)
	}
	for _, c := range []struct {
		method, body string
		want         int
	}{
		{"GET", "", 405},
		{"POST", `{}`, 400},
		{"POST", `{"sub":""}`, 400},
		{"POST", `{"sub":"a{b}"}`, 400},
		{"POST", `{"sub":"ann","admin":true}`, 400},
		{"POST", `not json`, 400},
	} {
		if resp, body := send(t, srv, c.method, "/dev/token", "", c.body); resp.StatusCode != c.want {
			t.Errorf("%s /dev/token %s = %d %s, want %d", c.method, c.body, resp.StatusCode, body, c.want)
		}
	}
	// The API's own answers are untouched.
	if resp, body := send(t, srv, "GET", "/dev/other", "", ""); resp.StatusCode != 404 || !strings.Contains(body, `"Not Found"`) {
		t.Errorf("GET /dev/other = %d %s, want API Gateway's 404", resp.StatusCode, body)
	}
	if resp, _ := send(t, srv, "GET", "/skus/demo-phone", "", ""); resp.StatusCode != 401 {
		t.Errorf("GET /skus/demo-phone without a token = %d, want 401", resp.StatusCode)
	}
}

// The dev sign-in mints for anyone who asks, so it answers only a loopback
// client that named a loopback host: a page of another site that reached
// 127.0.0.1 through DNS rebinding (Host: its own name) gets 403, as does a
// client from another address.
func TestDevSignInAnswersLoopbackOnly(t *testing.T) {
	srv, _, _ := pages(t)
	h := srv.Config.Handler
	for _, c := range []struct {
		remote, host string
		want         int
	}{
		{"127.0.0.1:5000", "127.0.0.1:3000", 200},
		{"127.0.0.1:5000", "localhost:3000", 200},
		{"[::1]:5000", "[::1]:3000", 200},
		{"127.0.0.1:5000", "attacker.example:3000", 403},
		{"192.0.2.7:5000", "127.0.0.1:3000", 403},
		{"10.0.0.2:5000", "localhost", 403},
	} {
		req := httptest.NewRequest("POST", "http://"+c.host+"/dev/token", strings.NewReader(`{"sub":"ann"}`))
		req.RemoteAddr, req.Host = c.remote, c.host
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != c.want {
			t.Errorf("from %s to Host %s: %d %s, want %d", c.remote, c.host, w.Code, w.Body, c.want)
		}
	}
	if resp, _ := send(t, srv, "POST", "/dev/token", "", `{"sub":"ann"}`); resp.StatusCode != http.StatusOK {
		t.Errorf("over real loopback = %d, want 200", resp.StatusCode)
	}
}

// Pages refuses to shadow an API route.
func TestPagesRefuseToShadowARoute(t *testing.T) {
	routes := []samtemplate.Route{{Function: "ReserveFunction", Method: "GET", Path: "/shop/{id}", AuthType: "NONE"}}
	if _, err := devstack.Pages(http.NotFoundHandler(), routes, nil, slog.New(slog.DiscardHandler)); err == nil {
		t.Error("Pages over a route GET /shop/{id}: no error, want one")
	}
}
