package shop_test

import (
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"html"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/holdfast/holdfast/internal/testkit/browser"
)

// fakeIdP is an OpenID Connect provider's authorization code flow with
// PKCE, as Cognito's hosted UI answers it: /authorize shows a login form,
// which redirects back with a code; /token trades the code and the PKCE
// verifier for tokens, once, and only if the verifier matches the
// challenge and the redirect URI is the one the code was given for.
type fakeIdP struct {
	clientID string
	mu       sync.Mutex
	codes    map[string]grant
	redeemed []string // users whose code was redeemed
	refused  []string // why a token request was refused
}

type grant struct{ user, challenge, redirect string }

func (p *fakeIdP) register(mux *http.ServeMux) {
	mux.HandleFunc("GET /idp/authorize", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if q.Get("response_type") != "code" || q.Get("client_id") != p.clientID || q.Get("code_challenge_method") != "S256" || q.Get("code_challenge") == "" {
			http.Error(w, "bad authorize request: "+r.URL.RawQuery, 400)
			return
		}
		fmt.Fprintf(w, `<!doctype html><form action="/idp/login"><input id="idp-user" name="user">
<input type="hidden" name="q" value="%s"><button id="idp-ok">Log in</button></form>`, html.EscapeString(r.URL.RawQuery))
	})
	mux.HandleFunc("GET /idp/login", func(w http.ResponseWriter, r *http.Request) {
		q, _ := url.ParseQuery(r.URL.Query().Get("q"))
		code := fmt.Sprintf("code-%d", time.Now().UnixNano())
		p.mu.Lock()
		p.codes[code] = grant{user: r.URL.Query().Get("user"), challenge: q.Get("code_challenge"), redirect: q.Get("redirect_uri")}
		p.mu.Unlock()
		http.Redirect(w, r, q.Get("redirect_uri")+"?"+url.Values{"code": {code}, "state": {q.Get("state")}}.Encode(), http.StatusFound)
	})
	mux.HandleFunc("POST /idp/token", func(w http.ResponseWriter, r *http.Request) {
		_ = r.ParseForm()
		p.mu.Lock()
		defer p.mu.Unlock()
		g, ok := p.codes[r.PostForm.Get("code")]
		delete(p.codes, r.PostForm.Get("code"))
		sum := sha256.Sum256([]byte(r.PostForm.Get("code_verifier")))
		switch {
		case !ok:
			p.refused = append(p.refused, "unknown or reused code")
		case r.PostForm.Get("grant_type") != "authorization_code" || r.PostForm.Get("client_id") != p.clientID:
			p.refused = append(p.refused, "grant "+r.PostForm.Encode())
		case base64.RawURLEncoding.EncodeToString(sum[:]) != g.challenge:
			p.refused = append(p.refused, "the verifier does not match the challenge")
		case r.PostForm.Get("redirect_uri") != g.redirect:
			p.refused = append(p.refused, "redirect_uri "+r.PostForm.Get("redirect_uri")+" != "+g.redirect)
		default:
			p.redeemed = append(p.redeemed, g.user)
			reply(w, 200, map[string]any{"access_token": fakeToken(g.user), "id_token": fakeToken(g.user), "token_type": "Bearer", "expires_in": 3600})
			return
		}
		reply(w, 400, map[string]any{"error": "invalid_grant"})
	})
}

// With config.json naming an OpenID Connect provider (as in AWS), the page
// has no name field: Sign in goes to the provider, and back on the page
// (the SKU kept across the round trip, the code gone from the address) the
// buyer is the token's sub, its token the API's bearer token.
func TestBuyerPageSignsInWithOIDC(t *testing.T) {
	idp := &fakeIdP{clientID: "shop-client", codes: map[string]grant{}}
	f := newFakeRoom("fake-tee", 2, time.Now().Add(time.Hour))
	mux := http.NewServeMux()
	idp.register(mux)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	f.config = fmt.Sprintf(`{"sign_in":"oidc","authorize_url":"%[1]s/idp/authorize","token_endpoint":"%[1]s/idp/token",`+
		`"client_id":"shop-client","scope":"openid","token":"access_token","user_claim":"sub"}`, srv.URL)
	mux.Handle("/", f.handler())
	dir := screenshotDir(t)

	tab := browser.Tab(t, browser.Start(t))
	const step = 30 * time.Second
	if err := browser.Do(tab, step, chromedp.Navigate(srv.URL+"/shop/?sku="+f.sku)); err != nil {
		t.Fatal(err)
	}
	if _, err := browser.WaitAttr(tab, step, "#state", "data-state", "SIGNED_OUT"); err != nil {
		t.Fatal(err)
	}
	if hidden, err := chromedp.Run(tab, chromedp.Evaluate[bool](`document.getElementById("user").hidden`)); err != nil || !hidden {
		t.Errorf("the name field is shown (%v) with an identity provider, want hidden", err)
	}
	browser.Screenshot(t, tab, dir, "1-signed-out-oidc")
	if err := browser.Do(tab, step, chromedp.Click("#signin-button"), chromedp.WaitVisible("#idp-user"),
		chromedp.SendKeys("#idp-user", "eve"), chromedp.Click("#idp-ok"), chromedp.WaitVisible("#sale")); err != nil {
		t.Fatal(err)
	}
	if _, err := browser.WaitAttr(tab, step, "#state", "data-state", "COUNTDOWN"); err != nil {
		idp.mu.Lock()
		defer idp.mu.Unlock()
		t.Fatalf("%v (the provider refused: %v)", err, idp.refused)
	}
	browser.Screenshot(t, tab, dir, "2-signed-in-oidc")
	who, _ := chromedp.Run(tab, chromedp.Text("#who"))
	loc, _ := chromedp.Run(tab, chromedp.Location())
	if who != "eve" {
		t.Errorf("signed in as %q, want eve (the token's sub)", who)
	}
	if u, err := url.Parse(loc); err != nil || u.Query().Get("sku") != f.sku || u.Query().Has("code") || u.Query().Has("state") {
		t.Errorf("the page's address after sign-in is %s, want /shop/?sku=%s without the code", loc, f.sku)
	}
	idp.mu.Lock()
	defer idp.mu.Unlock()
	if len(idp.redeemed) != 1 || idp.redeemed[0] != "eve" || len(idp.refused) != 0 {
		t.Errorf("the provider redeemed %v and refused %v, want eve's one code", idp.redeemed, idp.refused)
	}
	if !strings.HasPrefix(loc, srv.URL+"/shop/") {
		t.Errorf("ended at %s", loc)
	}
}
