package queue_test

import (
	"context"
	"crypto/md5" //nolint:gosec // SQS's checksum
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/holdfast/holdfast/internal/testkit/awstest"
	"github.com/holdfast/holdfast/shared/adapters/queue"
	"github.com/holdfast/holdfast/shared/awsjson"
	"github.com/holdfast/holdfast/shared/reservation"
)

// sqsStandIn answers SendMessage as SQS does (or with the statuses in
// fail, one per attempt, first), recording every request.
type sqsStandIn struct {
	awstest.Recorder
	mu   sync.Mutex
	fail []int
	md5  string // a wrong checksum to answer with, if set
}

func (s *sqsStandIn) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body := s.Record(r).Body
	s.mu.Lock()
	var status int
	if len(s.fail) > 0 {
		status, s.fail = s.fail[0], s.fail[1:]
	}
	wrong := s.md5
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-amz-json-1.0")
	switch {
	case status == http.StatusBadRequest:
		w.WriteHeader(status)
		fmt.Fprint(w, `{"__type":"com.amazonaws.sqs#QueueDoesNotExist","message":"The specified queue does not exist."}`)
		return
	case status != 0:
		w.WriteHeader(status)
		fmt.Fprint(w, `{"__type":"com.amazonaws.sqs#InternalError","message":"oops"}`)
		return
	}
	var in struct{ MessageBody string }
	_ = json.Unmarshal(body, &in)
	sum := md5.Sum([]byte(in.MessageBody)) //nolint:gosec // SQS's checksum
	got := hex.EncodeToString(sum[:])
	if wrong != "" {
		got = wrong
	}
	fmt.Fprintf(w, `{"MD5OfMessageBody":%q,"MessageId":"m-%d"}`, got, time.Now().UnixNano())
}

var testRes = reservation.Reservation{ID: "s.aaaaaaaaaaaaaaaaaaaaaaaaaa", SKU: "s", Qty: 2, UserID: "u", GroupID: "g", Token: "tok",
	CreatedAt: time.Date(2026, 11, 11, 0, 0, 0, 0, time.UTC), ExpiresAt: time.Date(2026, 11, 11, 0, 5, 0, 0, time.UTC)}

func direct(t *testing.T, srv *httptest.Server, creds aws.CredentialsProvider, attempts int) *queue.DirectPublisher {
	t.Helper()
	p, err := queue.NewDirectPublisher(queue.DirectConfig{QueueURL: srv.URL + "/000000000000/q", Config: awsjson.Config{Region: "eu-west-1",
		Credentials: creds, HTTPClient: srv.Client(), Attempts: attempts, Sleep: func(context.Context, time.Duration) {}}})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// The direct request is the SDK's SendMessage: the same target, content
// type and body, signed correctly (checked from the spec), with the session
// token when the credentials have one.
func TestDirectSendIsTheSDKsRequestSignedCorrectly(t *testing.T) {
	for _, token := range []string{"", "a-session-token"} {
		standIn := &sqsStandIn{}
		srv := httptest.NewServer(standIn)
		creds := credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", token)
		if err := direct(t, srv, creds, 3).Enqueue(context.Background(), testRes); err != nil {
			t.Fatal(err)
		}
		client := sqs.New(sqs.Options{Region: "eu-west-1", Credentials: creds, BaseEndpoint: aws.String(srv.URL), HTTPClient: srv.Client()})
		if err := queue.NewPublisher(client, srv.URL+"/000000000000/q").Enqueue(context.Background(), testRes); err != nil {
			t.Fatal(err)
		}
		srv.Close()
		reqs := standIn.Requests()
		if len(reqs) != 2 {
			t.Fatalf("%d requests, want 2", len(reqs))
		}
		awstest.SameRequest(t, reqs[0], reqs[1], "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "eu-west-1", "sqs")
	}
}

// Server errors and a bad checksum are retried (a duplicate message is
// harmless); a refusal that cannot change is not; either way the error
// is ErrUnavailable, which reserve settles through the fence.
func TestDirectSendRetriesWhatMaySucceed(t *testing.T) {
	creds := credentials.NewStaticCredentialsProvider("AKID", "secret", "")
	for _, tc := range []struct {
		name     string
		fail     []int
		md5      string
		wantErr  bool
		attempts int
	}{
		{"two server errors, then sent", []int{500, 503}, "", false, 3},
		{"throttled every time", []int{429, 429, 429}, "", true, 3},
		{"the queue does not exist", []int{400}, "", true, 1},
		{"the checksum does not match", nil, "00000000000000000000000000000000", true, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			standIn := &sqsStandIn{fail: tc.fail, md5: tc.md5}
			srv := httptest.NewServer(standIn)
			defer srv.Close()
			err := direct(t, srv, creds, 3).Enqueue(context.Background(), testRes)
			if (err != nil) != tc.wantErr || (err != nil && !errors.Is(err, reservation.ErrUnavailable)) {
				t.Errorf("Enqueue = %v, want error %v (ErrUnavailable)", err, tc.wantErr)
			}
			if n := len(standIn.Requests()); n != tc.attempts {
				t.Errorf("%d attempts, want %d", n, tc.attempts)
			}
			var se *awsjson.Error
			if tc.name == "the queue does not exist" && (!errors.As(err, &se) || se.Code != "QueueDoesNotExist") {
				t.Errorf("error %v, want the *awsjson.Error QueueDoesNotExist", err)
			}
		})
	}
}
