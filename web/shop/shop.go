// Package shop is the buyer page: plain HTML, CSS and JavaScript with no
// build step and nothing fetched from elsewhere (index.html, shop.css,
// shop.js), embedded so that make dev serves it at /shop/ beside the API
// (package devstack). In AWS the same files are served from S3 behind the
// API's CloudFront distribution, with a config.json naming the real
// identity provider (docs/operations.md, "The buyer page").
//
// The page takes its sign-in from config.json beside it:
//
//	{"sign_in": "dev", "token_url": "/dev/token"}            make dev's issuer
//	{"sign_in": "oidc", "authorize_url": "...", "token_endpoint": "...",
//	 "client_id": "...", "scope": "openid", "token": "access_token"}
package shop

import (
	"embed"
	"net/http"
	"strings"
)

//go:embed index.html shop.css shop.js
var files embed.FS

// Files are the page's files, as they are uploaded to S3.
func Files() embed.FS { return files }

// DevConfig is the config.json of make dev: sign in with the dev issuer's
// POST /dev/token.
const DevConfig = `{"sign_in":"dev","token_url":"/dev/token"}`

// Handler serves the page under /shop/ (/shop redirects there) and config
// as /shop/config.json. Every answer forbids framing and anything not from
// the page's own origin, and is revalidated on each load.
func Handler(config string) http.Handler {
	static := http.StripPrefix("/shop/", http.FileServerFS(files))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Cache-Control", "no-cache")
		switch {
		case r.Method != http.MethodGet && r.Method != http.MethodHead:
			h.Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		case r.URL.Path == "/shop":
			target := "/shop/"
			if r.URL.RawQuery != "" {
				target += "?" + r.URL.RawQuery
			}
			http.Redirect(w, r, target, http.StatusMovedPermanently)
		case r.URL.Path == "/shop/config.json":
			h.Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(config))
		case strings.HasPrefix(r.URL.Path, "/shop/"):
			static.ServeHTTP(w, r)
		default:
			http.NotFound(w, r)
		}
	})
}
