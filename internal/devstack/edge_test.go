package devstack

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"
)

// The dev gateway keeps what the CloudFront distribution keeps, as long: a
// GET answered public with a max-age, by path alone, for at most a second;
// nothing else (no-store, private, no max-age, another method).
func TestEdgeCacheKeepsPublicAnswersForASecond(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	calls := 0
	origin := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		w.Header().Set("Cache-Control", r.URL.Query().Get("cc"))
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, strconv.Itoa(calls))
	})
	h := newEdgeCache(func() time.Time { return now }, slog.New(slog.DiscardHandler)).wrap(origin)
	get := func(method, target string, header map[string]string) (string, string) {
		t.Helper()
		req := httptest.NewRequest(method, target, nil)
		for k, v := range header {
			req.Header.Set(k, v)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w.Body.String(), w.Header().Get("Cache-Control")
	}

	const public = "/skus/s/queue?cc=public,+max-age=1"
	if body, cc := get("GET", public, nil); body != "1" || cc != "public, max-age=1" {
		t.Fatalf("first GET = %q (Cache-Control %q), want the origin's answer 1", body, cc)
	}
	// The same path, another query string and other headers: the kept answer.
	now = now.Add(999 * time.Millisecond)
	if body, cc := get("GET", "/skus/s/queue?cc=no-store&bust=7", map[string]string{"Authorization": "Bearer x", "Cookie": "a=b"}); body != "1" || cc != "public, max-age=1" {
		t.Errorf("GET within the second = %q (Cache-Control %q), want the kept answer 1", body, cc)
	}
	if body, _ := get("POST", public, nil); body != "2" {
		t.Errorf("POST = %q, want the origin (2): only GETs are kept", body)
	}
	// A second after it was kept, it is asked anew.
	now = now.Add(time.Millisecond)
	if body, _ := get("GET", public, nil); body != "3" {
		t.Errorf("GET a second later = %q, want the origin's new answer 3", body)
	}
	// max-age=60 is kept a second, the distribution's most.
	now = now.Add(time.Second)
	if body, _ := get("GET", "/skus/long/queue?cc=public,+max-age=60", nil); body != "4" {
		t.Fatalf("GET = %q, want 4", body)
	}
	now = now.Add(time.Second)
	if body, _ := get("GET", "/skus/long/queue?cc=public,+max-age=60", nil); body != "5" {
		t.Errorf("GET a second after a max-age=60 answer = %q, want the origin (5): kept at most EdgeMaxAge", body)
	}
	for i, cc := range []string{"no-store", "public", "private,+max-age=1", "public,+max-age=1,+no-store", "max-age=1", ""} {
		first, _ := get("GET", "/x"+strconv.Itoa(i)+"?cc="+cc, nil)
		again, _ := get("GET", "/x"+strconv.Itoa(i)+"?cc="+cc, nil)
		if first == again {
			t.Errorf("Cache-Control %q: the second GET was answered from memory (%s), want the origin", cc, again)
		}
	}
}
