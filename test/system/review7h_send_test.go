package system_test

// Review 7h (a hostile client): today's pooled SigV4 signer (awsjson) and
// hand-built EMF line (metrics), reached the way a buyer reaches them:
// the reserve function as its main wires it (metrics.Flushing around
// Handler.Invoke, API Gateway's payload 2.0 as JSON), its SendMessage
// going through a loopback proxy that checks every signature against
// the SDK's own signer before passing the request on to the SQS server.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/holdfast/holdfast/internal/testkit/awstest"
	"github.com/holdfast/holdfast/internal/testkit/invariant"
	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/app"
	"github.com/holdfast/holdfast/shared/message"
	"github.com/holdfast/holdfast/shared/metrics"
	"github.com/holdfast/holdfast/shared/reservation"
)

// r7hSigProxy checks each request's SigV4 against the SDK's signer with
// creds, then forwards it to upstream.
type r7hSigProxy struct {
	upstream string
	creds    aws.Credentials
	mu       sync.Mutex
	checked  int
	wrong    []string
	sent     map[string]int // reservation id -> SendMessages that carried it
}

func (p *r7hSigProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	problem := p.verify(r, body)
	p.mu.Lock()
	p.checked++
	if problem != "" {
		p.wrong = append(p.wrong, problem)
	}
	if strings.HasSuffix(r.Header.Get("X-Amz-Target"), ".SendMessage") {
		var in struct{ MessageBody string }
		if json.Unmarshal(body, &in) == nil {
			if m, err := message.Decode([]byte(in.MessageBody)); err == nil {
				p.sent[m.ID]++
			}
		}
	}
	p.mu.Unlock()
	if problem != "" {
		w.WriteHeader(http.StatusForbidden)
		_, _ = w.Write([]byte(`{"__type":"com.amazonaws.sqs#IncompleteSignature","message":"review7h: signature differs from the SDK's"}`))
		return
	}
	req, _ := http.NewRequestWithContext(r.Context(), http.MethodPost, p.upstream+r.URL.RequestURI(), bytes.NewReader(body))
	for k, v := range r.Header {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		w.WriteHeader(http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}

func (p *r7hSigProxy) verify(r *http.Request, body []byte) string {
	date := r.Header.Get("X-Amz-Date")
	at, err := parseAmzDate(date)
	if err != nil {
		return fmt.Sprintf("X-Amz-Date %q: %v", date, err)
	}
	sdk, _ := http.NewRequest(http.MethodPost, "http://"+r.Host+r.URL.RequestURI(), bytes.NewReader(body))
	sdk.Header.Set("Content-Type", r.Header.Get("Content-Type"))
	sdk.Header.Set("X-Amz-Target", r.Header.Get("X-Amz-Target"))
	sum := sha256.Sum256(body)
	if err := v4.NewSigner().SignHTTP(context.Background(), p.creds, sdk, hex.EncodeToString(sum[:]), "sqs", awstest.Region, at); err != nil {
		return err.Error()
	}
	for _, h := range []string{"Authorization", "X-Amz-Security-Token"} {
		if got, want := r.Header.Get(h), sdk.Header.Get(h); got != want {
			return fmt.Sprintf("%s %s:\n got %.200q\n SDK %.200q", r.Header.Get("X-Amz-Target"), h, got, want)
		}
	}
	return ""
}

// r7hLines is a writer many goroutines share (the function's stdout).
type r7hLines struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *r7hLines) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(b)
}

// A flood of buyers on 8 goroutines through the function as main wires
// it, with a session token (the signer's pooled buffer outgrows its 2 KiB)
// and pooled HMACs: each keyed buy in three header casings, keys full of
// quotes, backslashes, control and non-ASCII characters, a per-user limit
// of 2 raced by three keys, and hostile bodies (SKUs with quotes,
// backslashes, control and non-ASCII characters, odd quantities, broken
// JSON) interleaved. Every SendMessage is signed as the SDK signs it; every
// bad input is a 4xx JSON error; each key is one id; the limit holds; every
// stdout line is JSON and the EMF lines count every hold once; Redis and
// MySQL end exact.
func TestReview7hFloodIsSignedAndCountedExactly(t *testing.T) {
	ctx := context.Background()
	s := newStack(t)
	env := testservices.Require(t)
	token := strings.Repeat("IQoJb3JpZ2luX2VjE/+=", 70) // 1.4 KB, base64 as STS's
	proxy := &r7hSigProxy{upstream: env.SQSEndpoint, sent: map[string]int{},
		creds: aws.Credentials{AccessKeyID: awstest.AccessKeyID, SecretAccessKey: awstest.SecretAccessKey, SessionToken: token}}
	srv := httptest.NewServer(proxy) // 127.0.0.1
	defer srv.Close()
	t.Setenv("AWS_ENDPOINT_URL_SQS", srv.URL)
	t.Setenv("AWS_SESSION_TOKEN", token)
	out := &r7hLines{}
	a, err := app.Build(ctx, s.cfg, app.Options{Function: "reserve", Out: out, Clock: s.clock, ScriptClock: s.clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	invoke := metrics.Flushing(a.Metrics, a.Handlers(nil).API.Invoke)

	sku := testservices.Name("r7h")
	if code, body := s.call("PUT", "/admin/skus/"+sku+"/stock", `{"stock":100,"per_user_limit":2}`, nil); code != 200 {
		t.Fatalf("create = %d %v", code, body)
	}
	const buyers = 33
	// The last three are claims the handler hashes into an id ("h:…").
	names := make([]string, buyers)
	for i := range names {
		names[i] = fmt.Sprintf("buyer%02d", i)
	}
	names[30], names[31], names[32] = `auth0|"q\b"`, "é\u2028\x01", "h:buyer00"
	userOf := func(claim string) string {
		if reservation.ValidID(claim) && !strings.HasPrefix(claim, "h:") {
			return claim
		}
		sum := sha256.Sum256([]byte(claim))
		return "h:" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(sum[:16]))
	}
	keys := []string{"k1", "q\"b\\s\x01\x7fé\u2028</>&", strings.Repeat("ü", 64)} // the last is 128 bytes
	type call struct {
		user, body string
		headers    map[string]string
		key        int // index in keys, or -1: a bad input
	}
	var calls []call
	body := func(m map[string]any) string { b, _ := json.Marshal(m); return string(b) }
	casings := []string{"Idempotency-Key", "idempotency-key", "IDEMPOTENCY-KEY"}
	bad := []struct {
		body    string
		headers map[string]string
	}{
		{body(map[string]any{"sku": `a"b`, "qty": 1}), nil},
		{body(map[string]any{"sku": `a\b`, "qty": 1}), nil},
		{body(map[string]any{"sku": "a\x01b\x00", "qty": 1}), nil},
		{body(map[string]any{"sku": "é\u2028<script>", "qty": 1}), nil},
		{body(map[string]any{"sku": strings.Repeat("s", 65), "qty": 1}), nil},
		{body(map[string]any{"sku": sku + "\n", "qty": 1}), nil},
		{body(map[string]any{"sku": sku, "qty": 0}), nil},
		{body(map[string]any{"sku": sku, "qty": -1}), nil},
		{body(map[string]any{"sku": sku, "qty": 1 << 40}), nil},
		{`{"sku":"` + sku + `","qty":1.5}`, nil},
		{`{"sku":"` + sku + `","qty":"1"}`, nil},
		{`{"sku":"` + sku + `","qty":1,"qty":1}`, nil},
		{`{"sku":"` + sku + `","qty":1,"evil":true}`, nil},
		{`{"sku":"` + sku + `","qty":1`, nil},
		{"{\"sku\":\"" + sku + "\xff\",\"qty\":1}", nil},
		{`{"sku":"` + sku + `","qty":1,"user_id":"someone-else"}`, nil},
		{`{"sku":"` + sku + `","qty":1,"pad":"` + strings.Repeat("x", 5000) + `"}`, nil},
		{body(map[string]any{"sku": sku, "qty": 1}), map[string]string{"Idempotency-Key": strings.Repeat("k", 129)}},
		{body(map[string]any{"sku": sku, "qty": 1, "group_id": ""}), nil},
		{body(map[string]any{"sku": sku, "qty": 1, "group_id": `g"\`}), nil},
	}
	for i := range buyers {
		u := names[i]
		for k, key := range keys {
			for try := range 3 - k { // k1 three times, the others fewer
				calls = append(calls, call{u, body(map[string]any{"sku": sku, "qty": 1}), map[string]string{casings[try]: key}, k})
			}
		}
		for _, b := range bad {
			calls = append(calls, call{u, b.body, b.headers, -1})
		}
	}
	// Interleave: round-robin over buyers, so each buyer's keys race.
	perm := make([]call, 0, len(calls))
	per := len(calls) / buyers
	for j := range per {
		for i := range buyers {
			perm = append(perm, calls[i*per+(j*7)%per])
		}
	}
	calls = perm

	type result struct {
		code int
		id   string
	}
	var mu sync.Mutex
	got := map[string][]result{} // user + key index -> answers
	errs := 0
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if errs++; errs <= 20 {
			t.Errorf(format, args...)
		}
	}
	work := make(chan call)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for c := range work {
				ev := apiRequest(c.user, "POST", "/reservations", c.body, c.headers)
				payload, _ := json.Marshal(ev)
				raw, err := invoke(ctx, payload)
				if err != nil {
					fail("invoke: %v", err)
					continue
				}
				var resp struct {
					StatusCode int               `json:"statusCode"`
					Headers    map[string]string `json:"headers"`
					Body       string            `json:"body"`
				}
				var b map[string]any
				if err := json.Unmarshal(raw, &resp); err != nil || json.Unmarshal([]byte(resp.Body), &b) != nil {
					fail("%s %.80q: response %q is not JSON", c.user, c.body, raw)
					continue
				}
				if c.key < 0 {
					if resp.StatusCode < 400 || resp.StatusCode >= 500 || b["error"] == nil || b["message"] == nil {
						fail("bad input %.80q %v = %d %s, want a 4xx JSON error", c.body, c.headers, resp.StatusCode, resp.Body)
					}
					continue
				}
				id, _ := b["reservation_id"].(string)
				switch {
				case resp.StatusCode == 202 && id != "":
				case resp.StatusCode == 409 && b["error"] == "limit_exceeded":
				default:
					fail("%s key %d = %d %s, want 202 or 409 limit_exceeded", c.user, c.key, resp.StatusCode, resp.Body)
				}
				mu.Lock()
				got[fmt.Sprint(c.user, "/", c.key)] = append(got[fmt.Sprint(c.user, "/", c.key)], result{resp.StatusCode, id})
				mu.Unlock()
			}
		})
	}
	for _, c := range calls {
		work <- c
	}
	close(work)
	wg.Wait()

	// Each key one id (or refused throughout), two keys held per buyer.
	var accepted []string
	for i := range buyers {
		u := names[i]
		held := 0
		for k, key := range keys {
			rs := got[fmt.Sprint(u, "/", k)]
			want := reservation.ReservationID(reservation.ReserveRequest{SKU: sku, UserID: userOf(u), IdempotencyKey: key}, s.idSecret)
			for _, r := range rs {
				if r.code != rs[0].code || (r.code == 202 && r.id != want) {
					t.Errorf("%s key %q answered %v, want one answer (202 with %s, or 409)", u, key, rs, want)
					break
				}
			}
			if len(rs) > 0 && rs[0].code == 202 {
				held++
				accepted = append(accepted, want)
			}
		}
		if held != 2 {
			t.Errorf("%s holds %d keys, want 2 (per_user_limit 2)", u, held)
		}
	}
	avail, held := s.redisStock(sku)
	if avail != 100-2*buyers || held != 2*buyers {
		t.Errorf("redis available %d held %d, want %d and %d", avail, held, 100-2*buyers, 2*buyers)
	}

	// The signer: every request as the SDK signs it; every accepted id sent.
	proxy.mu.Lock()
	if len(proxy.wrong) > 0 {
		t.Errorf("%d of %d requests signed unlike the SDK; the first: %s", len(proxy.wrong), proxy.checked, proxy.wrong[0])
	}
	for _, id := range accepted {
		if proxy.sent[id] == 0 {
			t.Errorf("%s was told 202 and never sent", id)
		}
	}
	if len(proxy.sent) != len(accepted) {
		t.Errorf("%d ids sent, %d accepted", len(proxy.sent), len(accepted))
	}
	t.Logf("%d requests checked against the SDK's signer, %d ids sent", proxy.checked, len(proxy.sent))
	proxy.mu.Unlock()

	// stdout: every line JSON; the EMF lines count each hold once.
	reserved, emf := 0, 0
	for _, line := range bytes.Split(bytes.TrimSpace(out.buf.Bytes()), []byte("\n")) {
		var m map[string]any
		if err := json.Unmarshal(line, &m); err != nil {
			t.Errorf("stdout line is not JSON: %q", line)
			continue
		}
		awsm, ok := m["_aws"].(map[string]any)
		if !ok {
			continue
		}
		emf++
		if m["Function"] != "reserve" {
			t.Errorf("EMF line without Function=reserve: %s", line)
		}
		cwm := awsm["CloudWatchMetrics"].([]any)[0].(map[string]any)
		for _, d := range cwm["Metrics"].([]any) {
			name := d.(map[string]any)["Name"].(string)
			if _, ok := m[name].(float64); !ok {
				t.Errorf("EMF line defines %q without its value: %s", name, line)
			}
		}
		if n, ok := m["reserved"].(float64); ok {
			reserved += int(n)
		}
	}
	if reserved != 2*buyers {
		t.Errorf("the EMF lines count %d reserved over %d lines, want %d", reserved, emf, 2*buyers)
	}

	// Settle what reached the queue: MySQL agrees, each buyer 2 units.
	seen := map[string]bool{}
	var msgs []reservation.Reservation
	for {
		o, err := s.sqs.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(s.queues.URL), MaxNumberOfMessages: 10})
		if err != nil {
			t.Fatal(err)
		}
		if len(o.Messages) == 0 {
			break
		}
		for _, m := range o.Messages {
			r, err := message.Decode([]byte(aws.ToString(m.Body)))
			if err != nil {
				t.Fatalf("a message the queue got does not decode: %v", err)
			}
			if !seen[r.ID] {
				seen[r.ID] = true
				msgs = append(msgs, r)
			}
			_, _ = s.sqs.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(s.queues.URL), ReceiptHandle: m.ReceiptHandle})
		}
	}
	for i, err := range s.app.Service.PersistBatch(ctx, msgs) {
		if err != nil {
			t.Fatalf("persist %s: %v", msgs[i].ID, err)
		}
	}
	if n := s.mysqlAvailable(sku); n != 100-2*buyers {
		t.Errorf("mysql available %d, want %d", n, 100-2*buyers)
	}
	s.check(invariant.Expect{Sellable: map[string]int64{sku: 100}, Accepted: accepted, Quiescent: true})
}

// parseAmzDate reads X-Amz-Date.
func parseAmzDate(s string) (at time.Time, err error) {
	return time.Parse("20060102T150405Z", s)
}
