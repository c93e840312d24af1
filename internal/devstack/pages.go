package devstack

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/holdfast/holdfast/internal/samtemplate"
	"github.com/holdfast/holdfast/shared/reservation"
	"github.com/holdfast/holdfast/web/shop"
)

// Minter mints a buyer's JWT (internal/devauth's Issuer).
type Minter interface {
	Mint(sub string, ttl time.Duration) (string, error)
}

// SignInTTL is how long a token from the dev sign-in lasts.
const SignInTTL = time.Hour

// The paths the dev gateway serves besides the API: none is an API route,
// and none is deployed (template.yaml and api/openapi.yaml have neither; a
// test holds it).
const (
	ShopPath   = "/shop/"     // the buyer page (package web/shop)
	SignInPath = "/dev/token" // the dev sign-in
)

// Pages serves, in front of api, the buyer page at /shop/ and, when signIn
// is set, the dev sign-in: POST /dev/token {"sub": "ann"} answers 200
// {"token", "sub", "expires_in"}, a token of signIn's for that buyer. The
// sign-in trusts whoever asks, so it answers only a loopback client that
// named a loopback host (not a page of another site reached through DNS
// rebinding): 403 otherwise. Every other path goes to api untouched.
// routes are the API's: Pages refuses to shadow one.
func Pages(api http.Handler, routes []samtemplate.Route, signIn Minter, log *slog.Logger) (http.Handler, error) {
	for _, r := range routes {
		if strings.HasPrefix(r.Path+"/", ShopPath) || strings.HasPrefix(r.Path+"/", "/dev/") {
			return nil, fmt.Errorf("devstack: route %s is under the dev pages' paths (/shop, /dev)", r.Key())
		}
	}
	page := shop.Handler(shop.DevConfig)
	mint := mintHandler(signIn, log)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch p := r.URL.Path; {
		case p == "/shop" || strings.HasPrefix(p, ShopPath):
			page.ServeHTTP(w, r)
		case p == SignInPath && signIn != nil:
			mint.ServeHTTP(w, r)
		default:
			api.ServeHTTP(w, r)
		}
	}), nil
}

func mintHandler(signIn Minter, log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		answer := func(status int, body map[string]any) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Cache-Control", "no-store")
			w.WriteHeader(status)
			_ = json.NewEncoder(w).Encode(body)
			log.Info(r.Method+" "+r.URL.Path, "status", status, "route", "dev sign-in")
		}
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			answer(http.StatusMethodNotAllowed, map[string]any{"error": "method_not_allowed", "message": "POST {\"sub\": \"<user>\"}"})
			return
		}
		if !loopback(r) {
			answer(http.StatusForbidden, map[string]any{"error": "forbidden", "message": "the dev sign-in answers loopback clients of a loopback host only"})
			return
		}
		var body struct {
			Sub string `json:"sub"`
		}
		dec := json.NewDecoder(io.LimitReader(r.Body, 4096))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&body); err != nil || !reservation.ValidID(body.Sub) {
			answer(http.StatusBadRequest, map[string]any{"error": "invalid", "message": "body must be {\"sub\": \"<user>\"}, a user of 1 to 64 letters, digits and _.:-"})
			return
		}
		tok, err := signIn.Mint(body.Sub, SignInTTL)
		if err != nil {
			answer(http.StatusInternalServerError, map[string]any{"error": "internal", "message": err.Error()})
			return
		}
		answer(http.StatusOK, map[string]any{"token": tok, "sub": body.Sub, "expires_in": int(SignInTTL / time.Second)})
	})
}

// loopback reports whether the request came from a loopback address and
// named a loopback host (127.0.0.1, ::1, localhost).
func loopback(r *http.Request) bool {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
		return false
	}
	name := r.Host
	if h, _, err := net.SplitHostPort(r.Host); err == nil {
		name = h
	}
	name = strings.TrimSuffix(strings.TrimPrefix(name, "["), "]")
	if strings.EqualFold(name, "localhost") {
		return true
	}
	ip := net.ParseIP(name)
	return ip != nil && ip.IsLoopback()
}
