package eventbus_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	ebtypes "github.com/aws/aws-sdk-go-v2/service/eventbridge/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/holdfast/holdfast/internal/testkit/awstest"
	"github.com/holdfast/holdfast/shared/adapters/eventbus"
	"github.com/holdfast/holdfast/shared/awsjson"
	"github.com/holdfast/holdfast/shared/reservation"
)

const secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"

// standIn records every request and answers it with answer (status, body).
type standIn struct {
	awstest.Recorder
	answer          func(n int, r awstest.Request) (int, string)
	n, now, maxSeen atomic.Int32
}

func (s *standIn) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	req := s.Record(r)
	n := s.n.Add(1)
	if c := s.now.Add(1); c > s.maxSeen.Load() {
		s.maxSeen.Store(c)
	}
	time.Sleep(2 * time.Millisecond) // calls overlap when they can
	s.now.Add(-1)
	status, body := s.answer(int(n), req)
	w.WriteHeader(status)
	fmt.Fprint(w, body)
}

func events(n int) []reservation.Event {
	at := time.Date(2026, 11, 11, 12, 0, 0, 123e6, time.UTC)
	evs := make([]reservation.Event, n)
	for i := range evs {
		r := reservation.Reservation{ID: fmt.Sprintf("s.ffffffffffffffffffffffff%02d", i), SKU: "s", Qty: 1, UserID: "u"}
		evs[i] = reservation.ConfirmedEvent(r, at)
	}
	return evs
}

func config(srv *httptest.Server, token string) awsjson.Config {
	return awsjson.Config{Endpoint: srv.URL, Region: "eu-west-1", Credentials: credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", secret, token),
		HTTPClient: srv.Client(), Sleep: func(context.Context, time.Duration) {}}
}

func ok(int, awstest.Request) (int, string) {
	return http.StatusOK, `{"FailedEntryCount":0,"Entries":[],"Successful":[],"Failed":[]}`
}

// The direct requests are the SDK's PutEvents and SendMessageBatch: the
// same target, content type and body (Time as epoch seconds, the queue's
// envelope), signed correctly for the service (checked from the spec),
// with the session token when the credentials have one.
func TestDirectRequestsAreTheSDKs(t *testing.T) {
	evs := events(2)
	for _, token := range []string{"", "a-session-token"} {
		s := &standIn{answer: ok}
		srv := httptest.NewServer(s)
		cfg := config(srv, token)
		bus, err := eventbus.NewEventBridge(cfg, "holdfast")
		if err != nil {
			t.Fatal(err)
		}
		if errs := bus.Publish(context.Background(), evs); errors.Join(errs...) != nil {
			t.Fatal(errs)
		}
		entries := make([]ebtypes.PutEventsRequestEntry, len(evs))
		for i, e := range evs {
			detail, _ := json.Marshal(e)
			entries[i] = ebtypes.PutEventsRequestEntry{EventBusName: aws.String("holdfast"), Source: aws.String(eventbus.Source),
				DetailType: aws.String(string(e.Type)), Detail: aws.String(string(detail)), Time: aws.Time(e.OccurredAt)}
		}
		eb := eventbridge.New(eventbridge.Options{Region: cfg.Region, Credentials: cfg.Credentials, BaseEndpoint: aws.String(srv.URL), HTTPClient: srv.Client()})
		if _, err := eb.PutEvents(context.Background(), &eventbridge.PutEventsInput{Entries: entries}); err != nil {
			t.Fatal(err)
		}

		q, err := eventbus.NewQueue(cfg, srv.URL+"/000000000000/events")
		if err != nil {
			t.Fatal(err)
		}
		if errs := q.Publish(context.Background(), evs); errors.Join(errs...) != nil {
			t.Fatal(errs)
		}
		batch := make([]sqstypes.SendMessageBatchRequestEntry, len(evs))
		for i, e := range evs {
			body, _ := json.Marshal(eventbus.Envelope{Source: eventbus.Source, DetailType: string(e.Type), Time: e.OccurredAt, Detail: e})
			batch[i] = sqstypes.SendMessageBatchRequestEntry{Id: aws.String(fmt.Sprint(i)), MessageBody: aws.String(string(body))}
		}
		sq := sqs.New(sqs.Options{Region: cfg.Region, Credentials: cfg.Credentials, BaseEndpoint: aws.String(srv.URL), HTTPClient: srv.Client()})
		if _, err := sq.SendMessageBatch(context.Background(), &sqs.SendMessageBatchInput{QueueUrl: aws.String(srv.URL + "/000000000000/events"), Entries: batch}); err != nil {
			t.Fatal(err)
		}
		srv.Close()

		reqs := s.Requests()
		if len(reqs) != 4 {
			t.Fatalf("%d requests, want 4", len(reqs))
		}
		awstest.SameRequest(t, reqs[0], reqs[1], secret, "eu-west-1", "events")
		awstest.SameRequest(t, reqs[2], reqs[3], secret, "eu-west-1", "sqs")
		if got := reqs[0].Header.Get("X-Amz-Target"); got != "AWSEvents.PutEvents" {
			t.Errorf("X-Amz-Target %q, want AWSEvents.PutEvents", got)
		}
		if got := reqs[0].Header.Get("Content-Type"); got != "application/x-amz-json-1.1" {
			t.Errorf("Content-Type %q, want application/x-amz-json-1.1", got)
		}
	}
}

// An entry the service refuses fails its event alone (PutEvents'
// Entries[i].ErrorCode, SendMessageBatch's Failed); a call refused as a
// whole fails every event of that call and no other; either way the error
// is ErrUnavailable, which leaves the event in the outbox for the sweeper.
func TestDirectPublishFailsPerEvent(t *testing.T) {
	for _, tc := range []struct {
		name    string
		newPub  func(awsjson.Config) (reservation.Notifier, error)
		answer  func(n int, r awstest.Request) (int, string)
		evs     int
		failing []int
	}{
		{"PutEvents entry 1 throttled", func(c awsjson.Config) (reservation.Notifier, error) { return eventbus.NewEventBridge(c, "b") },
			func(int, awstest.Request) (int, string) {
				return 200, `{"FailedEntryCount":1,"Entries":[{"EventId":"e0"},{"ErrorCode":"ThrottlingException","ErrorMessage":"slow"},{"EventId":"e2"}]}`
			}, 3, []int{1}},
		{"PutEvents answers fewer entries", func(c awsjson.Config) (reservation.Notifier, error) { return eventbus.NewEventBridge(c, "b") },
			func(int, awstest.Request) (int, string) {
				return 200, `{"FailedEntryCount":1,"Entries":[{"ErrorCode":"InternalFailure"}]}`
			}, 2, []int{0, 1}},
		{"PutEvents entry 2 failed though FailedEntryCount says 0", func(c awsjson.Config) (reservation.Notifier, error) { return eventbus.NewEventBridge(c, "b") },
			func(int, awstest.Request) (int, string) {
				return 200, `{"FailedEntryCount":0,"Entries":[{"EventId":"e0"},{"EventId":"e1"},{"ErrorCode":"InternalFailure"}]}`
			}, 3, []int{2}},
		{"SendMessageBatch entry 0 failed", func(c awsjson.Config) (reservation.Notifier, error) { return eventbus.NewQueue(c, "http://q/1/e") },
			func(int, awstest.Request) (int, string) {
				return 200, `{"Successful":[],"Failed":[{"Id":"0","Code":"InternalError","SenderFault":false}]}`
			}, 2, []int{0}},
		{"the second call refused as a whole", func(c awsjson.Config) (reservation.Notifier, error) { return eventbus.NewEventBridge(c, "b") },
			func(_ int, r awstest.Request) (int, string) {
				if strings.Contains(string(r.Body), "ffffffffffffffffffffffff1") { // events 10 to 14
					return 400, `{"__type":"AccessDeniedException","message":"no"}`
				}
				return 200, `{"FailedEntryCount":0,"Entries":[]}`
			}, 15, []int{10, 11, 12, 13, 14}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(&standIn{answer: tc.answer})
			defer srv.Close()
			p, err := tc.newPub(config(srv, ""))
			if err != nil {
				t.Fatal(err)
			}
			errs := p.Publish(context.Background(), events(tc.evs))
			want := map[int]bool{}
			for _, i := range tc.failing {
				want[i] = true
			}
			for i, err := range errs {
				if (err != nil) != want[i] || (err != nil && !errors.Is(err, reservation.ErrUnavailable)) {
					t.Errorf("event %d: %v, want failed %v (ErrUnavailable)", i, err, want[i])
				}
			}
		})
	}
}

// A server error or throttling is tried again (up to 3 attempts), a
// refusal that cannot change is not, and a SendMessageBatch answer whose
// checksum does not match its entry is sent again, as the SDK checks it.
func TestDirectPublishRetries(t *testing.T) {
	for _, tc := range []struct {
		name     string
		queue    bool
		answers  []string // per attempt: status and body
		attempts int
		fail     bool
	}{
		{"throttled, then sent", false, []string{`400 {"__type":"ThrottlingException"}`}, 2, false},
		{"server errors every time", false, []string{`500 {}`, `502 {}`, `503 {}`}, 3, true},
		{"a bad request", false, []string{`400 {"__type":"ValidationException"}`}, 1, true},
		{"a wrong checksum, then right", true, []string{`200 {"Successful":[{"Id":"0","MD5OfMessageBody":"00000000000000000000000000000000"}]}`}, 2, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &standIn{answer: func(n int, r awstest.Request) (int, string) {
				if n <= len(tc.answers) {
					var status int
					code, body, _ := strings.Cut(tc.answers[n-1], " ")
					_, _ = fmt.Sscan(code, &status)
					return status, body
				}
				return ok(n, r)
			}}
			srv := httptest.NewServer(s)
			defer srv.Close()
			var p reservation.Notifier
			var err error
			if tc.queue {
				p, err = eventbus.NewQueue(config(srv, ""), "http://q/1/e")
			} else {
				p, err = eventbus.NewEventBridge(config(srv, ""), "b")
			}
			if err != nil {
				t.Fatal(err)
			}
			errs := p.Publish(context.Background(), events(1))
			if (errs[0] != nil) != tc.fail {
				t.Errorf("Publish = %v, want failure %v", errs[0], tc.fail)
			}
			if int(s.n.Load()) != tc.attempts {
				t.Errorf("%d attempts, want %d", s.n.Load(), tc.attempts)
			}
		})
	}
}

// A persist batch's 500 events go out as 50 calls of 10, at most 8 at once.
func TestDirectPublishChunks(t *testing.T) {
	var mu sync.Mutex
	sizes := map[int]int{}
	s := &standIn{answer: func(_ int, r awstest.Request) (int, string) {
		var in struct{ Entries []json.RawMessage }
		_ = json.Unmarshal(r.Body, &in)
		mu.Lock()
		sizes[len(in.Entries)]++
		mu.Unlock()
		return ok(0, r)
	}}
	srv := httptest.NewServer(s)
	defer srv.Close()
	p, err := eventbus.NewEventBridge(config(srv, ""), "b")
	if err != nil {
		t.Fatal(err)
	}
	if errs := p.Publish(context.Background(), events(500)[:500]); errors.Join(errs...) != nil {
		t.Fatal(errs)
	}
	if sizes[10] != 50 || len(sizes) != 1 {
		t.Errorf("calls by entries %v, want 50 of 10", sizes)
	}
	if m := s.maxSeen.Load(); m > 8 || m < 2 {
		t.Errorf("%d calls at once, want 2 to 8", m)
	}
}
