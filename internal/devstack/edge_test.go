package devstack

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"sync"
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

// As CloudFront collapses concurrent requests for one object, the GETs of a
// public path that miss together (its answer just expired) reach the API
// once; the rest are answered with what that one brought back.
func TestEdgeCacheCollapsesConcurrentMisses(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	var mu sync.Mutex
	calls := 0
	release := make(chan struct{})
	asking := make(chan struct{}, 100)
	origin := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		calls++
		n := calls
		mu.Unlock()
		if n > 1 {
			asking <- struct{}{}
			<-release // the refresh is slow: the others arrive meanwhile
		}
		w.Header().Set("Cache-Control", "public, max-age=1")
		_, _ = io.WriteString(w, strconv.Itoa(n))
	})
	c := newEdgeCache(func() time.Time { mu.Lock(); defer mu.Unlock(); return now }, slog.New(slog.DiscardHandler))
	h := c.wrap(origin)
	get := func() string {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "/skus/s/queue", nil))
		return w.Body.String()
	}
	if got := get(); got != "1" {
		t.Fatalf("first GET = %q", got)
	}
	mu.Lock()
	now = now.Add(2 * time.Second) // expired
	mu.Unlock()
	const herd = 20
	answers := make(chan string, herd)
	go func() { answers <- get() }() // the one that asks
	<-asking
	var waiting sync.WaitGroup
	for range herd - 1 {
		waiting.Add(1)
		go func() { defer waiting.Done(); answers <- get() }()
	}
	// The refresh is released once every other GET of the herd waits on it
	// (or, were they not collapsed, asked the origin too).
	for {
		c.mu.Lock()
		n := c.waiting
		c.mu.Unlock()
		if n+len(asking) >= herd-1 {
			break
		}
		runtime.Gosched()
	}
	close(release)
	waiting.Wait()
	for range herd {
		if got := <-answers; got != "2" {
			t.Errorf("a GET of the herd = %q, want the one refresh's answer 2", got)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if calls != 2 {
		t.Errorf("the origin was asked %d times, want 2 (the first, and one refresh for the herd of %d)", calls, herd)
	}
}
