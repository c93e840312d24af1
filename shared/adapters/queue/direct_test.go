package queue_test

import (
	"context"
	"crypto/hmac"
	"crypto/md5" //nolint:gosec // SQS's checksum
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/holdfast/holdfast/shared/adapters/queue"
	"github.com/holdfast/holdfast/shared/reservation"
)

// captured is one request an SQS stand-in received.
type captured struct {
	header http.Header
	host   string
	body   []byte
}

// sqsStandIn answers SendMessage as SQS does (or with the statuses in
// fail, one per attempt, first), recording every request.
type sqsStandIn struct {
	mu   sync.Mutex
	reqs []captured
	fail []int
	md5  string // a wrong checksum to answer with, if set
}

func (s *sqsStandIn) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	s.reqs = append(s.reqs, captured{header: r.Header.Clone(), host: r.Host, body: body})
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
	p, err := queue.NewDirectPublisher(queue.DirectConfig{QueueURL: srv.URL + "/000000000000/q", Region: "eu-west-1",
		Credentials: creds, HTTPClient: srv.Client(), Attempts: attempts, Sleep: func(context.Context, time.Duration) {}})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// verifySigV4 checks a request's Signature Version 4 from the spec, not
// from the SDK's signer: the canonical request, the string to sign and the
// derived key, for secret.
func verifySigV4(t *testing.T, c captured, secret, region string) {
	t.Helper()
	auth := c.header.Get("Authorization")
	var cred, signed, sig string
	for _, part := range strings.Split(strings.TrimPrefix(auth, "AWS4-HMAC-SHA256 "), ", ") {
		k, v, _ := strings.Cut(part, "=")
		switch k {
		case "Credential":
			cred = v
		case "SignedHeaders":
			signed = v
		case "Signature":
			sig = v
		}
	}
	scope := strings.SplitN(cred, "/", 2)
	if !strings.HasPrefix(auth, "AWS4-HMAC-SHA256 ") || len(scope) != 2 || sig == "" {
		t.Fatalf("Authorization %q is not SigV4", auth)
	}
	date := c.header.Get("X-Amz-Date")
	if want := date[:8] + "/" + region + "/sqs/aws4_request"; scope[1] != want {
		t.Errorf("scope %s, want %s", scope[1], want)
	}
	names := strings.Split(signed, ";")
	if !sort.StringsAreSorted(names) {
		t.Errorf("signed headers %s not sorted", signed)
	}
	for _, must := range []string{"content-type", "host", "x-amz-date", "x-amz-target"} {
		if !strings.Contains(";"+signed+";", ";"+must+";") {
			t.Errorf("signed headers %s lack %s", signed, must)
		}
	}
	var canon strings.Builder
	for _, n := range names {
		v := c.header.Get(n)
		if n == "host" {
			v = c.host
		}
		canon.WriteString(n + ":" + strings.TrimSpace(v) + "\n")
	}
	payload := sha256.Sum256(c.body)
	creq := "POST\n/\n\n" + canon.String() + "\n" + signed + "\n" + hex.EncodeToString(payload[:])
	creqHash := sha256.Sum256([]byte(creq))
	toSign := "AWS4-HMAC-SHA256\n" + date + "\n" + scope[1] + "\n" + hex.EncodeToString(creqHash[:])
	mac := func(key []byte, s string) []byte {
		h := hmac.New(sha256.New, key)
		h.Write([]byte(s))
		return h.Sum(nil)
	}
	key := mac(mac(mac(mac([]byte("AWS4"+secret), date[:8]), region), "sqs"), "aws4_request")
	if want := hex.EncodeToString(mac(key, toSign)); sig != want {
		t.Errorf("signature %s, want %s (canonical request:\n%s)", sig, want, creq)
	}
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
		if len(standIn.reqs) != 2 {
			t.Fatalf("%d requests, want 2", len(standIn.reqs))
		}
		mine, sdk := standIn.reqs[0], standIn.reqs[1]
		verifySigV4(t, mine, "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "eu-west-1")
		verifySigV4(t, sdk, "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "eu-west-1") // the verifier itself is right
		for _, h := range []string{"Content-Type", "X-Amz-Target", "X-Amz-Security-Token"} {
			if mine.header.Get(h) != sdk.header.Get(h) {
				t.Errorf("%s: %q, the SDK sends %q", h, mine.header.Get(h), sdk.header.Get(h))
			}
		}
		var a, b any
		if json.Unmarshal(mine.body, &a) != nil || json.Unmarshal(sdk.body, &b) != nil || fmt.Sprint(a) != fmt.Sprint(b) {
			t.Errorf("body %s, the SDK sends %s", mine.body, sdk.body)
		}
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
			if len(standIn.reqs) != tc.attempts {
				t.Errorf("%d attempts, want %d", len(standIn.reqs), tc.attempts)
			}
			var se *queue.SendError
			if tc.name == "the queue does not exist" && (!errors.As(err, &se) || se.Code != "QueueDoesNotExist") {
				t.Errorf("error %v, want the SendError QueueDoesNotExist", err)
			}
		})
	}
}

// skewedSQS refuses signatures more than 5 minutes from its clock, which
// runs ahead of this process's, as SQS does, with its time in Date.
type skewedSQS struct {
	ahead time.Duration
	mu    sync.Mutex
	reqs  int
}

func (s *skewedSQS) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.reqs++
	s.mu.Unlock()
	body, _ := io.ReadAll(r.Body)
	now := time.Now().Add(s.ahead).UTC()
	w.Header().Set("Date", now.Format(http.TimeFormat))
	signed, err := time.Parse("20060102T150405Z", r.Header.Get("X-Amz-Date"))
	if err != nil || signed.Before(now.Add(-5*time.Minute)) || signed.After(now.Add(5*time.Minute)) {
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprintf(w, `{"__type":"com.amazon.coral.service#InvalidSignatureException","message":"Signature expired: %s"}`, r.Header.Get("X-Amz-Date"))
		return
	}
	var in struct{ MessageBody string }
	_ = json.Unmarshal(body, &in)
	sum := md5.Sum([]byte(in.MessageBody)) //nolint:gosec // SQS's checksum
	fmt.Fprintf(w, `{"MD5OfMessageBody":%q,"MessageId":"m-1"}`, hex.EncodeToString(sum[:]))
}

// A function whose clock is 10 minutes off still sends, as with the SDK:
// the refusal's Date corrects the signing time, and later sends use it.
func TestDirectSendCorrectsClockSkew(t *testing.T) {
	standIn := &skewedSQS{ahead: 10 * time.Minute}
	srv := httptest.NewServer(standIn)
	defer srv.Close()
	p := direct(t, srv, credentials.NewStaticCredentialsProvider("AKID", "secret", ""), 3)
	if err := p.Enqueue(context.Background(), testRes); err != nil {
		t.Fatalf("first send with a skewed clock: %v", err)
	}
	if err := p.Enqueue(context.Background(), testRes); err != nil {
		t.Fatalf("second send: %v", err)
	}
	if standIn.reqs != 3 {
		t.Errorf("%d requests, want 3 (one refused, then two at SQS's time)", standIn.reqs)
	}
}
