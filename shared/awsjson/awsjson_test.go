package awsjson_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/holdfast/holdfast/shared/awsjson"
)

var creds = credentials.NewStaticCredentialsProvider("AKID", "secret", "")

func client(t *testing.T, api awsjson.API, endpoint string, hc awsjson.HTTPDoer) *awsjson.Client {
	t.Helper()
	c, err := awsjson.NewClient(api, awsjson.Config{Endpoint: endpoint, Region: "eu-west-1", Credentials: creds, HTTPClient: hc,
		Sleep: func(context.Context, time.Duration) {}})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func accept([]byte) error { return nil }

// scripted answers each attempt with the next of its answers (status,
// X-Amzn-ErrorType header, body); past the last, 200 {}.
type scripted struct {
	mu      sync.Mutex
	answers [][3]string
	n       int
}

func (s *scripted) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.n++
	var a [3]string
	if len(s.answers) > 0 {
		a, s.answers = s.answers[0], s.answers[1:]
	}
	s.mu.Unlock()
	if a[0] == "" {
		fmt.Fprint(w, `{}`)
		return
	}
	var status int
	_, _ = fmt.Sscan(a[0], &status)
	if a[1] != "" {
		w.Header().Set("X-Amzn-ErrorType", a[1])
	}
	w.WriteHeader(status)
	fmt.Fprint(w, a[2])
}

// What is tried again is what the SDK's standard retryer tries again:
// server errors and throttling, whatever the body's error type, up to
// three attempts; a refusal that cannot change is returned at once, as
// an *Error read as the SDK reads it (header first, namespace stripped).
func TestCallRetriesAsTheSDK(t *testing.T) {
	for _, tc := range []struct {
		name     string
		answers  [][3]string
		attempts int
		code     string // of the error; "" for success
	}{
		{"a server error, then success", [][3]string{{"500", "", `{"__type":"InternalFailure"}`}}, 2, ""},
		{"EventBridge throttles (JSON 1.1, no namespace)", [][3]string{{"400", "", `{"__type":"ThrottlingException","message":"Rate exceeded"}`},
			{"400", "", `{"__type":"ThrottlingException"}`}, {"400", "", `{"__type":"ThrottlingException"}`}}, 3, "ThrottlingException"},
		{"SQS throttles (JSON 1.0, namespaced)", [][3]string{{"400", "", `{"__type":"com.amazonaws.sqs#RequestThrottled"}`}}, 2, ""},
		{"the error type in the header", [][3]string{{"400", "ValidationException:http://internal.amazon.com/", `{"__type":"Other","Message":"bad"}`}}, 1, "ValidationException"},
		{"access denied", [][3]string{{"400", "", `{"__type":"AccessDeniedException"}`}}, 1, "AccessDeniedException"},
		{"a 503 with no body", [][3]string{{"503", "", ``}, {"503", "", ``}, {"503", "", ``}}, 3, "Service Unavailable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &scripted{answers: tc.answers}
			srv := httptest.NewServer(s)
			defer srv.Close()
			err := client(t, awsjson.EventBridge, srv.URL, srv.Client()).Call(context.Background(), "PutEvents", []byte(`{}`), accept)
			var e *awsjson.Error
			switch {
			case tc.code == "" && err != nil:
				t.Errorf("Call = %v, want success", err)
			case tc.code != "" && (!errors.As(err, &e) || e.Code != tc.code || e.Op != "PutEvents" || e.API != "eventbridge"):
				t.Errorf("Call = %v, want an *Error %s", err, tc.code)
			}
			if s.n != tc.attempts {
				t.Errorf("%d attempts, want %d", s.n, tc.attempts)
			}
		})
	}
}

// A dropped connection is tried again (the request may or may not have
// arrived: the callers' messages are safe to receive twice).
func TestCallRetriesADroppedConnection(t *testing.T) {
	var mu sync.Mutex
	n := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		n++
		first := n == 1
		mu.Unlock()
		if first {
			conn, _, _ := w.(http.Hijacker).Hijack()
			_ = conn.Close()
			return
		}
		fmt.Fprint(w, `{}`)
	}))
	defer srv.Close()
	if err := client(t, awsjson.SQS, srv.URL, srv.Client()).Call(context.Background(), "SendMessageBatch", []byte(`{}`), accept); err != nil {
		t.Fatalf("Call = %v, want success on the second attempt", err)
	}
	if n != 2 {
		t.Errorf("%d attempts, want 2", n)
	}
}

// An answer the caller rejects is tried again, and reported if it stays.
func TestCallRetriesARejectedAnswer(t *testing.T) {
	s := &scripted{}
	srv := httptest.NewServer(s)
	defer srv.Close()
	bad := errors.New("checksum")
	err := client(t, awsjson.SQS, srv.URL, srv.Client()).Call(context.Background(), "SendMessage", []byte(`{}`), func([]byte) error { return bad })
	if !errors.Is(err, bad) || s.n != 3 {
		t.Errorf("Call = %v after %d attempts, want the answer's error after 3", err, s.n)
	}
}

// No attempt starts after the context's deadline: a refused server that
// keeps failing costs no more than the caller allowed.
func TestCallStopsAtTheDeadline(t *testing.T) {
	s := &scripted{answers: [][3]string{{"500", "", ``}, {"500", "", ``}, {"500", "", ``}}}
	srv := httptest.NewServer(s)
	defer srv.Close()
	c, err := awsjson.NewClient(awsjson.SQS, awsjson.Config{Endpoint: srv.URL, Region: "eu-west-1", Credentials: creds, HTTPClient: srv.Client(),
		Attempts: 10})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := c.Call(ctx, "SendMessage", []byte(`{}`), accept); err == nil {
		t.Fatal("Call with a done context succeeded")
	}
	if s.n != 0 {
		t.Errorf("%d attempts after the deadline, want 0", s.n)
	}
}

// skewed refuses signatures more than 5 minutes from its clock, which runs
// ahead of this process's, as AWS does, with its time in Date.
type skewed struct {
	ahead time.Duration
	mu    sync.Mutex
	reqs  int
}

func (s *skewed) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.reqs++
	s.mu.Unlock()
	now := time.Now().Add(s.ahead).UTC()
	w.Header().Set("Date", now.Format(http.TimeFormat))
	signed, err := time.Parse("20060102T150405Z", r.Header.Get("X-Amz-Date"))
	if err != nil || signed.Before(now.Add(-5*time.Minute)) || signed.After(now.Add(5*time.Minute)) {
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprintf(w, `{"__type":"InvalidSignatureException","message":"Signature expired: %s"}`, r.Header.Get("X-Amz-Date"))
		return
	}
	fmt.Fprint(w, `{}`)
}

// A function whose clock is 10 minutes off still sends, as with the SDK:
// the refusal's Date corrects the signing time, and later calls use it.
func TestCallCorrectsClockSkew(t *testing.T) {
	for _, api := range []awsjson.API{awsjson.SQS, awsjson.EventBridge} {
		s := &skewed{ahead: 10 * time.Minute}
		srv := httptest.NewServer(s)
		c := client(t, api, srv.URL, srv.Client())
		for i := range 2 {
			if err := c.Call(context.Background(), "Op", []byte(`{}`), accept); err != nil {
				t.Fatalf("%s call %d with a skewed clock: %v", api.Name, i, err)
			}
		}
		srv.Close()
		if s.reqs != 3 {
			t.Errorf("%s: %d requests, want 3 (one refused, then two at the service's time)", api.Name, s.reqs)
		}
	}
}

// A configuration missing what a call needs is refused at start.
func TestNewClientNeedsAnEndpoint(t *testing.T) {
	if _, err := awsjson.NewClient(awsjson.SQS, awsjson.Config{Region: "eu-west-1", Credentials: creds, HTTPClient: http.DefaultClient}); err == nil {
		t.Error("NewClient without an endpoint succeeded")
	}
}
