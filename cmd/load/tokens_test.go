package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/holdfast/holdfast/internal/devauth"
	"github.com/holdfast/holdfast/internal/devstack"
	"github.com/holdfast/holdfast/internal/loadgen"
	"github.com/holdfast/holdfast/internal/samtemplate"
)

// Each simulated buyer reaches the function as itself: through the dev
// gateway (template routes, dev issuer's verifier), the tool's default
// tokens arrive as distinct subs, and no body names a user. The function
// behind the gateway is a stand-in that sells nothing.
func TestBuyersSendTheirOwnTokens(t *testing.T) {
	tpl, err := samtemplate.Load("../../template.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	tokenFor, _, err := tokenSource(context.Background(), dir, "", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	issuer, err := devauth.Open(dir) // as make dev opens it
	if err != nil {
		t.Fatal(err)
	}
	verifier := issuer.Verifier()
	var mu sync.Mutex
	subs := map[string]int{}
	var bodies []string
	fn := func(_ context.Context, ev events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
		reply := func(status int, body string) (events.APIGatewayV2HTTPResponse, error) {
			return events.APIGatewayV2HTTPResponse{StatusCode: status, Headers: map[string]string{"Content-Type": "application/json"}, Body: body}, nil
		}
		switch ev.RouteKey {
		case "POST /reservations":
			mu.Lock()
			subs[ev.RequestContext.Authorizer.JWT.Claims["sub"]]++
			bodies = append(bodies, ev.Body)
			mu.Unlock()
			return reply(http.StatusConflict, `{"error":"sold_out","message":"not enough stock left"}`)
		case "GET /admin/skus/{sku}/stock":
			return reply(http.StatusOK, `{"mysql_available":0,"redis_available":0,"held":0,"drift":0,"version":1}`)
		case "PUT /admin/skus/{sku}/stock":
			return reply(http.StatusOK, `{"stock":0,"version":2}`)
		}
		return reply(http.StatusInternalServerError, `{"error":"unexpected"}`)
	}
	srv := httptest.NewServer(devstack.Gateway(fn, tpl.Routes(), verifier, slog.New(slog.DiscardHandler)))
	defer srv.Close()

	rep, err := loadgen.Run(context.Background(), loadgen.Config{BaseURL: srv.URL, N: 40, Concurrency: 8, SKU: "s", Stock: 0,
		Settle: time.Second, TokenFor: tokenFor})
	if err != nil {
		t.Fatal(err)
	}
	if rep.SoldOut != 40 {
		t.Errorf("sold out %d of 40 (accepted %d, rejected %d, failed %d): some requests did not get through the authorizer",
			rep.SoldOut, rep.Accepted, rep.Rejected, rep.Failed)
	}
	if len(subs) != 40 {
		t.Errorf("%d distinct subs reached the function, want 40: %v", len(subs), subs)
	}
	for sub, n := range subs {
		if !strings.HasPrefix(sub, "buyer-") || n != 1 {
			t.Errorf("sub %q reserved %d times", sub, n)
		}
	}
	for _, b := range bodies {
		var m map[string]any
		if err := json.Unmarshal([]byte(b), &m); err != nil || m["user_id"] != nil || m["sku"] != "s" {
			t.Errorf("reservation body %s: want sku and no user_id", b)
		}
	}
}

func TestTokenCommand(t *testing.T) {
	ctx := context.Background()
	cases := []struct{ cmd, want string }{
		{"printf 'tok-%s\\n'", "tok-o'brien"},                // the user as the last argument
		{"printf '  %s-%s-x  ' pre {user}", "pre-o'brien-x"}, // {user} replaced, output trimmed
	}
	for _, c := range cases {
		got, err := runTokenCmd(ctx, c.cmd, "o'brien", io.Discard)
		if err != nil || got != c.want {
			t.Errorf("runTokenCmd(%q) = %q, %v; want %q", c.cmd, got, err, c.want)
		}
	}
	for _, cmd := range []string{"true", "exit 3", "printf '  \\n'"} {
		if got, err := runTokenCmd(ctx, cmd, "ann", io.Discard); err == nil {
			t.Errorf("runTokenCmd(%q) = %q, want an error", cmd, got)
		}
	}
	// The tool's source with -token-cmd runs the command for each user.
	tokenFor, _, err := tokenSource(ctx, t.TempDir(), "echo", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := tokenFor("ann"); err != nil || got != "ann" {
		t.Errorf("tokenFor(ann) with -token-cmd echo = %q, %v", got, err)
	}
}

func TestTokenFlagsConflict(t *testing.T) {
	if _, err := run(context.Background(), []string{"-token", "x", "-token-cmd", "echo", "-url", "http://127.0.0.1:1"}, io.Discard, io.Discard); err == nil {
		t.Error("load -token and -token-cmd ran")
	}
}

// TestTokenCache: a second run reuses the tokens the first minted (one RSA
// signature per buyer was most of a short run), and only while they are of
// the dev issuer's key and have tokenReuse left.
func TestTokenCache(t *testing.T) {
	dir := t.TempDir()
	tokenFor, save, err := tokenSource(context.Background(), dir, "", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	first, err := tokenFor("ann")
	if err != nil {
		t.Fatal(err)
	}
	if err := save(); err != nil {
		t.Fatal(err)
	}
	iss, err := devauth.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "load-tokens.json")
	now := time.Now()
	if c := loadTokenCache(path, iss.KeyID(), now); c.Tokens["ann"] != first {
		t.Errorf("the next run's cache holds %q for ann, want the token minted before", c.Tokens["ann"])
	}
	// The next run's source answers from the cache: no new signature.
	again, _, _ := tokenSource(context.Background(), dir, "", io.Discard)
	if tok, _ := again("ann"); tok != first {
		t.Errorf("second run's token for ann differs from the cached one")
	}
	if c := loadTokenCache(path, "another-key", now); len(c.Tokens) != 0 {
		t.Errorf("a cache of another key was reused: %d tokens", len(c.Tokens))
	}
	if c := loadTokenCache(path, iss.KeyID(), now.Add(tokenTTL-tokenReuse)); len(c.Tokens) != 0 {
		t.Errorf("tokens with less than %v left were reused", tokenReuse)
	}
}
