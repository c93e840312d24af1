// Package awsjson sends operations of the AWS JSON protocols (SQS's JSON
// 1.0, EventBridge's JSON 1.1) as one signed HTTP request each: the request
// the SDK's client sends (the same target, content type, body and Signature
// Version 4, by the SDK's own signer), without the SDK's per-call
// middleware stack, which cost more CPU than the request itself
// (docs/benchmarks.md). A Client retries what the SDK's standard retryer
// retries (transport errors, server errors, throttling), a bounded number
// of times within the context's deadline, and learns the service's clock
// from a refusal of the signature's time, as the SDK does.
package awsjson

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/holdfast/holdfast/shared/reservation"
)

// API names one service's JSON protocol.
type API struct {
	Name         string // in errors: "sqs", "eventbridge"
	SigningName  string // Signature Version 4's service name
	TargetPrefix string // X-Amz-Target is TargetPrefix.<operation>
	ContentType  string // the protocol's version
}

// The APIs holdfast sends to directly.
var (
	SQS         = API{Name: "sqs", SigningName: "sqs", TargetPrefix: "AmazonSQS", ContentType: "application/x-amz-json-1.0"}
	EventBridge = API{Name: "eventbridge", SigningName: "events", TargetPrefix: "AWSEvents", ContentType: "application/x-amz-json-1.1"}
)

// HTTPDoer sends an HTTP request (the SDK's BuildableClient, *http.Client).
type HTTPDoer interface {
	Do(*http.Request) (*http.Response, error)
}

// Signer signs requests of one API's JSON protocol as the SDK does.
type Signer struct {
	api         API
	region      string
	credentials aws.CredentialsProvider // cached (LoadDefaultConfig's is)
	v4          *v4.Signer
	key         atomic.Pointer[signingKey] // the last day's derived key
	token       atomic.Pointer[string]     // the last session token canSign checked and took
	scope       string                     // the credential scope after its day: /region/service/aws4_request
}

// signingKey is Signature Version 4's key of one day and secret: HMACs
// keyed by it (New derives the key's pads, Reset restores them).
type signingKey struct {
	day, secret string
	macs        sync.Pool
}

// NewSigner returns a Signer of api's requests in region with creds.
func NewSigner(api API, region string, creds aws.CredentialsProvider) *Signer {
	return &Signer{api: api, region: region, credentials: creds, v4: v4.NewSigner(), scope: "/" + region + "/" + api.SigningName + "/aws4_request"}
}

// Request returns op's request to endpoint carrying payload, signed at
// the time at.
func (s *Signer) Request(ctx context.Context, endpoint, op string, payload []byte, at time.Time) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint+"/", bytes.NewReader(payload))
	if err != nil {
		return nil, err
	}
	req.Header["Content-Type"] = []string{s.api.ContentType}
	req.Header["X-Amz-Target"] = []string{s.api.TargetPrefix + "." + op}
	creds, err := s.credentials.Retrieve(ctx)
	if err != nil {
		return nil, fmt.Errorf("credentials: %w", err)
	}
	hash := sha256.Sum256(payload)
	if !s.canSign(req, creds) {
		if err := s.v4.SignHTTP(ctx, creds, req, hex.EncodeToString(hash[:]), s.api.SigningName, s.region, at); err != nil {
			return nil, fmt.Errorf("sign: %w", err)
		}
		return req, nil
	}
	s.sign(req, creds, hash, at)
	return req, nil
}

// canSign says whether sign signs req as the SDK's signer would: a
// request to the path "/", without a query or a default port (which the
// SDK leaves out of the host it signs), whose session token is base64 (as
// STS's are: nothing the SDK would trim or fold). Anything else goes to
// the SDK's signer.
func (s *Signer) canSign(req *http.Request, creds aws.Credentials) bool {
	if req.URL.Path != "/" || req.URL.RawQuery != "" || req.URL.Port() == "80" || req.URL.Port() == "443" {
		return false
	}
	if t := s.token.Load(); t != nil && *t == creds.SessionToken {
		return true // checked already: a function's token lasts hours
	}
	if strings.ContainsFunc(creds.SessionToken, notTokenChar) {
		return false
	}
	s.token.Store(&creds.SessionToken)
	return true
}

// notTokenChar is a character of a session token sign leaves to the SDK.
func notTokenChar(r rune) bool { return r >= 128 || !tokenChars[r] }

// tokenChars marks the characters of a session token sign takes: base64's
// and base64url's.
var tokenChars = func() (set [128]bool) {
	for _, c := range "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=_-" {
		set[c] = true
	}
	return set
}()

// signBufs are sign's scratch buffers: a session token is a kilobyte, and
// a request's canonical form, string to sign and Authorization are built
// in one.
var signBufs = sync.Pool{New: func() any { b := make([]byte, 0, 2048); return &b }}

// sign adds Signature Version 4 to req, a POST of a body whose SHA-256 is
// body, with the headers the SDK's signer signs for it: content-length,
// content-type, host, x-amz-date, x-amz-security-token (with a session
// token) and x-amz-target. It does what the SDK's does for this one shape
// of request, without its general canonicalization, which cost a quarter
// of a send's CPU (docs/benchmarks.md). The day's key is derived once.
func (s *Signer) sign(req *http.Request, creds aws.Credentials, body [sha256.Size]byte, at time.Time) {
	var dateBuf [16]byte
	date := at.UTC().AppendFormat(dateBuf[:0], "20060102T150405Z")
	names := "content-type;host;x-amz-date;x-amz-target"
	switch {
	case req.ContentLength > 0 && creds.SessionToken != "":
		names = "content-length;content-type;host;x-amz-date;x-amz-security-token;x-amz-target"
	case req.ContentLength > 0:
		names = "content-length;content-type;host;x-amz-date;x-amz-target"
	case creds.SessionToken != "":
		names = "content-type;host;x-amz-date;x-amz-security-token;x-amz-target"
	}
	bp := signBufs.Get().(*[]byte)
	defer signBufs.Put(bp)
	// The canonical request.
	b := append((*bp)[:0], "POST\n/\n\n"...)
	if req.ContentLength > 0 {
		b = strconv.AppendInt(append(b, "content-length:"...), req.ContentLength, 10)
		b = append(b, '\n')
	}
	b = append(append(b, "content-type:"...), req.Header.Get("Content-Type")...)
	b = append(append(b, "\nhost:"...), req.URL.Host...)
	b = append(append(b, "\nx-amz-date:"...), date...)
	b = append(b, '\n')
	if creds.SessionToken != "" {
		b = append(append(b, "x-amz-security-token:"...), creds.SessionToken...)
		b = append(b, '\n')
		req.Header["X-Amz-Security-Token"] = []string{creds.SessionToken}
	}
	b = append(append(b, "x-amz-target:"...), req.Header.Get("X-Amz-Target")...)
	b = append(append(append(b, "\n\n"...), names...), '\n')
	canonical := sha256.Sum256(hex.AppendEncode(b, body[:]))
	// The string to sign, after the scope's place in it.
	b = append(append(append(b[:0], "AWS4-HMAC-SHA256\n"...), date...), '\n')
	scopeAt := len(b)
	b = append(append(b, date[:8]...), s.scope...)
	scope := b[scopeAt:]
	b = hex.AppendEncode(append(b, '\n'), canonical[:])
	key := s.dayKey(date[:8], creds.SecretAccessKey)
	mac := key.macs.Get().(hash.Hash)
	mac.Reset()
	mac.Write(b)
	var sum [sha256.Size]byte
	mac.Sum(sum[:0])
	key.macs.Put(mac)
	// The Authorization, after the string to sign (scope is in it).
	a := append(append(append(b, "AWS4-HMAC-SHA256 Credential="...), creds.AccessKeyID...), '/')
	a = append(a, scope...)
	a = append(append(append(a, ", SignedHeaders="...), names...), ", Signature="...)
	a = hex.AppendEncode(a, sum[:])
	req.Header["X-Amz-Date"] = []string{string(date)}
	req.Header["Authorization"] = []string{string(a[len(b):])}
	*bp = a
}

// dayKey is the signing key of day (yyyymmdd) for secret, derived once,
// with HMACs keyed by it to reuse.
func (s *Signer) dayKey(day []byte, secret string) *signingKey {
	if k := s.key.Load(); k != nil && k.day == string(day) && k.secret == secret {
		return k
	}
	key := []byte("AWS4" + secret)
	for _, part := range []string{string(day), s.region, s.api.SigningName, "aws4_request"} {
		mac := hmac.New(sha256.New, key)
		mac.Write([]byte(part))
		key = mac.Sum(nil)
	}
	k := &signingKey{day: string(day), secret: secret}
	k.macs.New = func() any { return hmac.New(sha256.New, key) }
	s.key.Store(k)
	return k
}

// Error is the service's refusal of a request.
type Error struct {
	API     string // API.Name
	Op      string
	Status  int
	Code    string // the error type without its namespace, e.g. QueueDoesNotExist
	Message string
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s %s: %d %s: %s", e.API, e.Op, e.Status, e.Code, e.Message)
}

// Retryable reports whether another attempt may succeed: server errors and
// throttling, as the SDK's standard retryer decides (its lists of codes).
func (e *Error) Retryable() bool {
	_, transient := retry.DefaultRetryableErrorCodes[e.Code]
	return e.Status >= 500 || transient || e.Throttled()
}

// Throttled reports a refusal for the caller's rate (the SDK's throttle
// codes, 429, SQS's KmsThrottled and kin): its retry waits longer
// (backoff).
func (e *Error) Throttled() bool {
	_, throttled := retry.DefaultThrottleErrorCodes[e.Code]
	return e.Status == http.StatusTooManyRequests || throttled || strings.Contains(e.Code, "Throttl")
}

// skewCodes are the refusals of a signature whose time is too far from the
// service's (the SDK's retryer treats the same as clock skew).
var skewCodes = map[string]bool{
	"InvalidSignatureException": true, "SignatureDoesNotMatch": true, "RequestExpired": true,
	"RequestTimeTooSkewed": true, "RequestInTheFuture": true, "AuthFailure": true,
}

// Refusal reads a refused answer as the SDK does: the error type from
// X-Amzn-ErrorType, else the body's __type or code, without its namespace
// or suffix (the status's text if none is named), and the body's message.
func Refusal(api API, op string, status int, header http.Header, body []byte) *Error {
	var e struct {
		Type    string `json:"__type"`
		Code    string `json:"code"`
		Message string `json:"message"` // encoding/json also takes "Message"
	}
	_ = json.Unmarshal(body, &e)
	code := header.Get("X-Amzn-ErrorType")
	for _, c := range []string{e.Type, e.Code} {
		if code == "" {
			code = c
		}
	}
	code, _, _ = strings.Cut(code, ":")
	code = code[strings.LastIndexByte(code, '#')+1:]
	if code == "" {
		code = http.StatusText(status)
	}
	return &Error{API: api.Name, Op: op, Status: status, Code: code, Message: e.Message}
}

// Config configures a Client.
type Config struct {
	Endpoint    string // the service's endpoint, as the SDK client resolved it
	Region      string
	Credentials aws.CredentialsProvider // cached (LoadDefaultConfig's is)
	HTTPClient  HTTPDoer
	// Attempts bounds the tries of one call (default 3, as the SDK's
	// standard retryer); Sleep waits between them (tests stub it).
	Attempts int
	Sleep    func(context.Context, time.Duration)
	Now      func() time.Time
}

// Client sends one API's operations.
type Client struct {
	api    API
	c      Config
	signer *Signer
	// skew is the service's clock minus this process's (ns), learnt from
	// the Date of an answer refusing the signature's time: a function whose
	// clock is off still sends.
	skew atomic.Int64
}

// NewClient returns a Client of api, or an error if c cannot work.
func NewClient(api API, c Config) (*Client, error) {
	c.Endpoint = strings.TrimSuffix(c.Endpoint, "/")
	if c.Endpoint == "" || c.Region == "" || c.Credentials == nil || c.HTTPClient == nil {
		return nil, fmt.Errorf("%s client: endpoint, region, credentials and an HTTP client are required", api.Name)
	}
	if c.Attempts < 1 {
		c.Attempts = retry.DefaultMaxAttempts
	}
	if c.Sleep == nil {
		c.Sleep = sleep
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return &Client{api: api, c: c, signer: NewSigner(api, c.Region, c.Credentials)}, nil
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// Endpoint is where the calls go.
func (c *Client) Endpoint() string { return c.c.Endpoint }

// Call sends op with payload and hands the body of a 2xx answer to answer.
// It tries again, after backoff and within ctx, after a
// transport error, a retryable refusal (*Error), a refusal of the
// signature's time (signing again at the service's time) or an answer
// that answer rejects: so an operation may arrive more than once, which
// holdfast's at-least-once consumers take. The error is the last
// attempt's: an *Error for a refusal.
func (c *Client) Call(ctx context.Context, op string, payload []byte, answer func([]byte) error) error {
	for attempt := 1; ; attempt++ {
		retry, err := c.try(ctx, op, payload, answer)
		if err == nil {
			return nil
		}
		if !retry || attempt >= c.c.Attempts || ctx.Err() != nil {
			return err
		}
		c.c.Sleep(ctx, backoff(attempt, err))
	}
}

// throttleBase is the first wait after a throttle: the quota is the
// caller's, so trying again within milliseconds (as after a lost
// connection) only adds to it. The SDK's standard retryer waits a random
// time of up to seconds; this waits half of base·2^(attempt-1) and up to as
// much again (100–200 ms, then 200–400 ms): it outlasts a short throttle
// for certain, and holds a persist batch or a buyer for at most 600 ms.
const throttleBase = 200 * time.Millisecond

// backoff is the wait before attempt+1 after err: reservation.Backoff's
// milliseconds, longer after a throttle (throttleBase).
func backoff(attempt int, err error) time.Duration {
	var e *Error
	if !errors.As(err, &e) || !e.Throttled() {
		return reservation.Backoff(attempt)
	}
	ceiling := throttleBase << (attempt - 1)
	return ceiling/2 + time.Duration(mrand.Int64N(int64(ceiling/2))+1)
}

// try makes one attempt; retry says whether another may succeed.
func (c *Client) try(ctx context.Context, op string, payload []byte, answer func([]byte) error) (retry bool, err error) {
	req, err := c.signer.Request(ctx, c.c.Endpoint, op, payload, c.c.Now().Add(time.Duration(c.skew.Load())))
	if err != nil {
		return false, fmt.Errorf("%s %s: %w", c.api.Name, op, err)
	}
	resp, err := c.c.HTTPClient.Do(req)
	if err != nil {
		return true, fmt.Errorf("%s %s: %w", c.api.Name, op, err) // it may or may not have arrived
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return true, fmt.Errorf("%s %s: read answer: %w", c.api.Name, op, err)
	}
	if resp.StatusCode/100 != 2 {
		e := Refusal(c.api, op, resp.StatusCode, resp.Header, data)
		if skewCodes[e.Code] {
			if server, err := http.ParseTime(resp.Header.Get("Date")); err == nil {
				c.skew.Store(int64(server.Sub(c.c.Now())))
				return true, e // signed again with the service's time
			}
		}
		return e.Retryable(), e
	}
	if err := answer(data); err != nil {
		return true, fmt.Errorf("%s %s: unexpected answer %.200q: %w", c.api.Name, op, data, err)
	}
	return false, nil
}
