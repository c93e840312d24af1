package provision

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func event(t *testing.T, kind, url string) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(map[string]any{
		"RequestType": kind, "ResponseURL": url, "StackId": "stack", "RequestId": "r1",
		"LogicalResourceId": "Schema", "ResourceType": "AWS::CloudFormation::CustomResource",
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A database that never answers (the proxy's target not registered yet)
// must not leave the stack waiting: the handler answers FAILED with the
// margin still left before the function's deadline.
func TestAnswersBeforeTheDeadline(t *testing.T) {
	var got atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got.Store(string(b))
	}))
	defer srv.Close()
	h := NewHandler(func(ctx context.Context) (Report, error) {
		<-ctx.Done()
		return Report{}, ctx.Err()
	}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	h.margin = 300 * time.Millisecond
	deadline := time.Now().Add(600 * time.Millisecond)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	if _, err := h.Handle(ctx, event(t, "Create", srv.URL)); err != nil {
		t.Fatalf("handle: %v", err)
	}
	if time.Now().After(deadline) {
		t.Errorf("answered after the function's deadline")
	}
	body, _ := got.Load().(string)
	if !strings.Contains(body, `"Status":"FAILED"`) || !strings.Contains(body, "did not become ready in time") {
		t.Errorf("answer = %s, want FAILED saying the database was not ready", body)
	}
}

// S3 answering 5xx once does not lose the answer; a refused signature is
// not retried (it will not get better) and fails the invocation.
func TestRetriesTheAnswer(t *testing.T) {
	var calls atomic.Int32
	status := []int{http.StatusServiceUnavailable, http.StatusOK}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		w.WriteHeader(status[min(int(n)-1, len(status)-1)])
	}))
	defer srv.Close()
	ok := func(context.Context) (Report, error) { return Report{SchemaVersion: 5}, nil }
	h := NewHandler(ok, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if _, err := h.Handle(context.Background(), event(t, "Update", srv.URL)); err != nil || calls.Load() != 2 {
		t.Errorf("handle = %v after %d calls, want success on the second", err, calls.Load())
	}

	calls.Store(0)
	status = []int{http.StatusForbidden}
	if _, err := h.Handle(context.Background(), event(t, "Delete", srv.URL)); err == nil || calls.Load() != 1 {
		t.Errorf("handle = %v after %d calls, want one try and an error", err, calls.Load())
	}
}

// Delete touches nothing: the data outlives the stack.
func TestDeletePreparesNothing(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	called := false
	h := NewHandler(func(context.Context) (Report, error) { called = true; return Report{}, nil }, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if out, err := h.Handle(context.Background(), event(t, "Delete", srv.URL)); err != nil || called {
		t.Errorf("delete = %v, %v, prepared = %v", out, err, called)
	}
}

// CloudFormation takes an answer of at most 4096 bytes: a reason full of
// characters JSON escapes (<, >, &) is shortened until it fits.
func TestAnswerStaysUnder4KiB(t *testing.T) {
	var size atomic.Int64
	var body atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		size.Store(int64(len(b)))
		body.Store(string(b))
	}))
	defer srv.Close()
	msg := "Error 1064 (42000): You have an error in your SQL syntax near '" + strings.Repeat("a<>b&&", 300) + "'"
	h := NewHandler(func(context.Context) (Report, error) { return Report{}, errors.New(msg) }, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if _, err := h.Handle(context.Background(), event(t, "Update", srv.URL)); err != nil {
		t.Fatal(err)
	}
	if n := size.Load(); n > 4096 || !strings.Contains(body.Load().(string), `"Status":"FAILED"`) || !strings.Contains(body.Load().(string), "Error 1064") {
		t.Fatalf("the answer is %d bytes (limit 4096): %.200s", n, body.Load())
	}
}
