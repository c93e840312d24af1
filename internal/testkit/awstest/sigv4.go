package awstest

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
)

// Request is one request a stand-in server received.
type Request struct {
	Header http.Header
	Host   string
	Body   []byte
}

// Recorder keeps the requests a stand-in server receives.
type Recorder struct {
	mu   sync.Mutex
	reqs []Request
}

// Record reads r's body and keeps the request.
func (rec *Recorder) Record(r *http.Request) Request {
	body, _ := io.ReadAll(r.Body)
	c := Request{Header: r.Header.Clone(), Host: r.Host, Body: body}
	rec.mu.Lock()
	rec.reqs = append(rec.reqs, c)
	rec.mu.Unlock()
	return c
}

// Requests are the requests recorded so far.
func (rec *Recorder) Requests() []Request {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return append([]Request(nil), rec.reqs...)
}

// VerifySigV4 checks a request's Signature Version 4 from the
// specification, not from the SDK's signer: the canonical request, the
// string to sign and the key derived from secret for region and service.
func VerifySigV4(t testing.TB, c Request, secret, region, service string) {
	t.Helper()
	auth := c.Header.Get("Authorization")
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
	date := c.Header.Get("X-Amz-Date")
	if want := date[:8] + "/" + region + "/" + service + "/aws4_request"; scope[1] != want {
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
		v := c.Header.Get(n)
		if n == "host" {
			v = c.Host
		}
		canon.WriteString(n + ":" + strings.TrimSpace(v) + "\n")
	}
	payload := sha256.Sum256(c.Body)
	creq := "POST\n/\n\n" + canon.String() + "\n" + signed + "\n" + hex.EncodeToString(payload[:])
	creqHash := sha256.Sum256([]byte(creq))
	toSign := "AWS4-HMAC-SHA256\n" + date + "\n" + scope[1] + "\n" + hex.EncodeToString(creqHash[:])
	mac := func(key []byte, s string) []byte {
		h := hmac.New(sha256.New, key)
		h.Write([]byte(s))
		return h.Sum(nil)
	}
	key := mac(mac(mac(mac([]byte("AWS4"+secret), date[:8]), region), service), "aws4_request")
	if want := hex.EncodeToString(mac(key, toSign)); sig != want {
		t.Errorf("signature %s, want %s (canonical request:\n%s)", sig, want, creq)
	}
}

// SameRequest checks that mine is the request the SDK sent (sdk): the
// same target, content type and session token, and the same JSON body
// (member order aside); both signed correctly with secret.
func SameRequest(t testing.TB, mine, sdk Request, secret, region, service string) {
	t.Helper()
	VerifySigV4(t, mine, secret, region, service)
	VerifySigV4(t, sdk, secret, region, service) // the verifier itself is right
	for _, h := range []string{"Content-Type", "X-Amz-Target", "X-Amz-Security-Token"} {
		if mine.Header.Get(h) != sdk.Header.Get(h) {
			t.Errorf("%s: %q, the SDK sends %q", h, mine.Header.Get(h), sdk.Header.Get(h))
		}
	}
	var a, b any
	if json.Unmarshal(mine.Body, &a) != nil || json.Unmarshal(sdk.Body, &b) != nil || !reflect.DeepEqual(a, b) {
		t.Errorf("body %s, the SDK sends %s", mine.Body, sdk.Body)
	}
}
