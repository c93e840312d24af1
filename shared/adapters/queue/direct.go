package queue

import (
	"context"
	"crypto/md5" //nolint:gosec // SQS's own body checksum, not a security measure
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/holdfast/holdfast/shared/message"
	"github.com/holdfast/holdfast/shared/reservation"
)

// HTTPDoer sends an HTTP request (the SDK's BuildableClient, *http.Client).
type HTTPDoer interface {
	Do(*http.Request) (*http.Response, error)
}

// DirectConfig configures a DirectPublisher.
type DirectConfig struct {
	QueueURL string
	// Endpoint is the SQS endpoint the request goes to ("": the queue URL's
	// scheme and host, which is the regional endpoint, or its VPC
	// endpoint's private DNS name).
	Endpoint    string
	Region      string
	Credentials aws.CredentialsProvider // cached (LoadDefaultConfig's is)
	HTTPClient  HTTPDoer
	// Attempts bounds the tries of one send (default 3, as the SDK's
	// standard retryer); Sleep waits between them (tests stub it).
	Attempts int
	Sleep    func(context.Context, time.Duration)
	Now      func() time.Time
}

// DirectPublisher sends each reservation message with one signed request in
// SQS's JSON protocol: the request the SDK's SendMessage sends (the same
// target, body, headers and Signature Version 4), without its per-call
// middleware stack, which cost this path about 2.5 times the CPU of the
// request itself (docs/benchmarks.md). Persist, compensate and the tools
// keep using the SDK; only reserve's send, the hot path, goes direct.
type DirectPublisher struct {
	c        DirectConfig
	endpoint string
	signer   *Signer
	// skew is SQS's clock minus this process's (ns), learnt from the Date
	// of an answer refusing the signature's time, as the SDK's retryer
	// does: a function whose clock is off still sends.
	skew atomic.Int64
}

var _ reservation.Enqueuer = (*DirectPublisher)(nil)

// NewDirectPublisher returns a DirectPublisher, or an error if the
// configuration cannot work.
func NewDirectPublisher(c DirectConfig) (*DirectPublisher, error) {
	u, err := url.Parse(c.QueueURL)
	if err != nil || u.Scheme == "" || u.Host == "" {
		return nil, fmt.Errorf("sqs direct publisher: queue url %q is not an absolute URL", c.QueueURL)
	}
	endpoint := strings.TrimSuffix(c.Endpoint, "/")
	if endpoint == "" {
		endpoint = u.Scheme + "://" + u.Host
	}
	if c.Region == "" || c.Credentials == nil || c.HTTPClient == nil {
		return nil, errors.New("sqs direct publisher: region, credentials and an HTTP client are required")
	}
	if c.Attempts < 1 {
		c.Attempts = 3
	}
	if c.Sleep == nil {
		c.Sleep = func(ctx context.Context, d time.Duration) {
			t := time.NewTimer(d)
			defer t.Stop()
			select {
			case <-ctx.Done():
			case <-t.C:
			}
		}
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return &DirectPublisher{c: c, endpoint: endpoint, signer: NewSigner(c.Region, c.Credentials)}, nil
}

// sendMessage is SendMessage's input in the JSON protocol.
type sendMessage struct {
	QueueURL          string                    `json:"QueueUrl"`
	MessageBody       string                    `json:"MessageBody"`
	MessageAttributes map[string]attributeValue `json:"MessageAttributes"`
}

type attributeValue struct {
	DataType    string `json:"DataType"`
	StringValue string `json:"StringValue"`
}

// attributes are the message attributes of r's message: its type and version.
func attributes(r reservation.Reservation) map[string]attributeValue {
	return map[string]attributeValue{
		"type":    {DataType: "String", StringValue: message.TypeOf(r)},
		"version": {DataType: "Number", StringValue: strconv.Itoa(message.Version)},
	}
}

// skewCodes are the refusals of a signature whose time is too far from
// SQS's (the SDK's retryer treats the same as clock skew).
var skewCodes = map[string]bool{
	"InvalidSignatureException": true, "SignatureDoesNotMatch": true, "RequestExpired": true,
	"RequestTimeTooSkewed": true, "RequestInTheFuture": true, "AuthFailure": true,
}

// SendError is SQS's refusal of a send.
type SendError struct {
	Status  int
	Code    string // the error type without its namespace, e.g. QueueDoesNotExist
	Message string
}

func (e *SendError) Error() string {
	return fmt.Sprintf("sqs SendMessage: %d %s: %s", e.Status, e.Code, e.Message)
}

// retryable reports whether another attempt may succeed: SQS's server
// errors and throttling (as the SDK's standard retryer decides).
func (e *SendError) retryable() bool {
	return e.Status >= 500 || e.Status == http.StatusTooManyRequests || strings.Contains(e.Code, "Throttl") ||
		e.Code == "RequestThrottled" || e.Code == "KmsThrottled"
}

// Enqueue implements reservation.Enqueuer. An error means the message may or
// may not have been enqueued (a lost answer); the caller settles that
// through the fence, and a duplicate is harmless (persist takes each id
// once). Attempts after a transport error or a retryable refusal wait
// reservation.Backoff, within ctx.
func (p *DirectPublisher) Enqueue(ctx context.Context, r reservation.Reservation) error {
	body, err := message.Encode(r)
	if err != nil {
		return fmt.Errorf("encode %s: %w", r.ID, err)
	}
	payload, err := json.Marshal(sendMessage{QueueURL: p.c.QueueURL, MessageBody: string(body), MessageAttributes: attributes(r)})
	if err != nil {
		return fmt.Errorf("encode %s: %w", r.ID, err)
	}
	sum := md5.Sum(body) //nolint:gosec // SQS's checksum of the body
	wantMD5 := hex.EncodeToString(sum[:])
	for attempt := 1; ; attempt++ {
		retry, err := p.send(ctx, payload, wantMD5)
		if err == nil {
			return nil
		}
		if !retry || attempt >= p.c.Attempts || ctx.Err() != nil {
			return reservation.Unavailable("sqs send", err)
		}
		p.c.Sleep(ctx, reservation.Backoff(attempt))
	}
}

// send makes one attempt; retry says whether another may succeed.
func (p *DirectPublisher) send(ctx context.Context, payload []byte, wantMD5 string) (retry bool, err error) {
	req, err := p.signer.Request(ctx, p.endpoint, "SendMessage", payload, p.c.Now().Add(time.Duration(p.skew.Load())))
	if err != nil {
		return false, err
	}
	resp, err := p.c.HTTPClient.Do(req)
	if err != nil {
		return true, err // the request may or may not have arrived: a duplicate is harmless
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return true, fmt.Errorf("read answer: %w", err)
	}
	if resp.StatusCode/100 != 2 {
		code, msg := Refusal(resp.StatusCode, data)
		se := &SendError{Status: resp.StatusCode, Code: code, Message: msg}
		if skewCodes[code] {
			if server, err := http.ParseTime(resp.Header.Get("Date")); err == nil {
				p.skew.Store(int64(server.Sub(p.c.Now())))
				return true, se // signed again with SQS's time
			}
		}
		return se.retryable(), se
	}
	var out struct {
		MD5OfMessageBody string `json:"MD5OfMessageBody"`
		MessageID        string `json:"MessageId"`
	}
	if err := json.Unmarshal(data, &out); err != nil || out.MessageID == "" {
		return true, fmt.Errorf("sqs SendMessage: unexpected answer %.200q", data)
	}
	if !strings.EqualFold(out.MD5OfMessageBody, wantMD5) {
		return true, fmt.Errorf("sqs SendMessage: body checksum %s, want %s", out.MD5OfMessageBody, wantMD5)
	}
	return false, nil
}

// Endpoint is where the sends go.
func (p *DirectPublisher) Endpoint() string { return p.endpoint }
