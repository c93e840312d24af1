package system_test

// Review 7h (a hostile client): admission tokens after today's pooled
// HMACs (reservation.Service.mac reuses keyed HMAC-SHA256s from a pool).
// Every request goes through the reserve function's handler as API Gateway
// passes it; Redis and MariaDB are read straight after.

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/testkit/invariant"
	"github.com/holdfast/holdfast/shared/reservation"
)

// r7hAnswer is one reserve's answer.
type r7hAnswer struct {
	code int
	body map[string]any
	raw  string
}

// r7hReserve sends POST /reservations as user with headers. It is safe
// from many goroutines: it reports instead of failing the test.
func (p *promise) r7hReserve(user, sku string, qty int, headers map[string]string) (r7hAnswer, error) {
	b, _ := json.Marshal(map[string]any{"sku": sku, "qty": qty})
	resp, err := p.api.Handle(context.Background(), apiRequest(user, "POST", "/reservations", string(b), headers))
	if err != nil {
		return r7hAnswer{}, err
	}
	a := r7hAnswer{code: resp.StatusCode, raw: resp.Body}
	if err := json.Unmarshal([]byte(resp.Body), &a.body); err != nil {
		return a, fmt.Errorf("body %q is not JSON: %v", resp.Body, err)
	}
	if ct := resp.Headers["Content-Type"]; !strings.HasPrefix(ct, "application/json") {
		return a, fmt.Errorf("Content-Type %q", ct)
	}
	return a, nil
}

// r7hAdmissionID is the reservation id an admission of user on sku fixes.
func (p *promise) r7hAdmissionID(sku, user string) string {
	return reservation.ReservationID(reservation.ReserveRequest{SKU: sku, UserID: user,
		IdempotencyKey: "admission:" + p.app.Service.TicketOf(sku, user)}, p.idSecret)
}

// r7hAlphabet is base64url's alphabet, the admission MAC's.
const r7hAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"

// r7hMutations are tokens made from tok by a client who holds it: each
// must be refused (403 admission_invalid) by the handler.
func r7hMutations(tok string) map[string]string {
	ms, sig, _ := strings.Cut(tok, ".")
	n, _ := strconv.ParseInt(ms, 10, 64)
	swap := func(s string) string {
		var b strings.Builder
		for _, c := range s {
			switch {
			case c >= 'a' && c <= 'z':
				b.WriteRune(c - 32)
			case c >= 'A' && c <= 'Z':
				b.WriteRune(c + 32)
			default:
				b.WriteRune(c)
			}
		}
		return b.String()
	}
	std := strings.NewReplacer("-", "+", "_", "/").Replace(sig)
	if std == sig {
		std = "+" + sig[1:]
	}
	m := map[string]string{
		"truncated by one":        tok[:len(tok)-1],
		"truncated by five":       tok[:len(tok)-5],
		"the expiry alone":        ms,
		"the expiry and a dot":    ms + ".",
		"the MAC alone":           "." + sig,
		"a character appended":    tok + "A",
		"a third part":            tok + ".x",
		"expiry + 1 ms":           strconv.FormatInt(n+1, 10) + "." + sig,
		"expiry + 1 day":          strconv.FormatInt(n+86400000, 10) + "." + sig,
		"expiry with a leading 0": "0" + tok,
		"expiry with a + sign":    "+" + tok,
		"expiry negated":          "-" + tok,
		"far future expiry":       "9999999999999." + sig,
		"std base64 alphabet":     ms + "." + std,
		"padded":                  tok + "==",
		"space before":            " " + tok,
		"tab after":               tok + "\t",
		"NUL in the MAC":          ms + ".\x00" + sig,
		"non-ASCII appended":      tok + "é",
		"non-ASCII expiry":        "١٧" + tok,
		"1 MiB expiry":            strings.Repeat("9", 1<<20) + "." + sig,
		"4 KiB MAC":               ms + "." + sig + strings.Repeat("A", 4096),
		"duplicate, comma-joined": tok + "," + tok,
		"MAC case swapped":        ms + "." + swap(sig),
		"MAC of zeros":            ms + "." + strings.Repeat("A", len(sig)),
		"two dots":                ms + ".." + sig,
	}
	// Each character changed in turn, to another of its kind (a digit of the
	// expiry; a base64url character 32 places on, which changes the
	// character's high bit: data in every position, the last one's too).
	for i := 0; i < len(tok); i++ {
		c := tok[i]
		var r byte
		switch {
		case c == '.':
			continue
		case c >= '0' && c <= '9' && i < len(ms):
			r = '0' + (c-'0'+5)%10
		default:
			r = r7hAlphabet[(strings.IndexByte(r7hAlphabet, c)+32)%64]
		}
		m[fmt.Sprintf("character %d changed", i)] = tok[:i] + string(r) + tok[i+1:]
	}
	return m
}

// A client holding a genuine admission, another buyer's and another SKU's
// of their own tries every mutation of them: each is 403
// admission_invalid as JSON, nothing is held or charged anywhere, the
// ticket stays ADMITTED, and the genuine token then buys once (any header
// casing; a retry is a replay of the same id).
func TestReview7hAdmissionMutationsAreRefused(t *testing.T) {
	ctx := context.Background()
	p := newPromise(t)
	svc := p.app.Service
	sku := p.roomSKU(5, 1, 0)
	other := p.roomSKU(5, 1, 0)
	for _, s := range []string{sku, other} {
		for _, u := range []string{"ann", "bob"} {
			if _, err := svc.JoinQueue(ctx, u, s); err != nil {
				t.Fatal(err)
			}
		}
	}
	ann, bob, annOther := p.admit(sku, "ann"), p.admit(sku, "bob"), p.admit(other, "ann")

	refuse := func(name, user, tok string) {
		t.Helper()
		a, err := p.r7hReserve(user, sku, 1, map[string]string{"Admission-Token": tok})
		if err != nil {
			t.Errorf("%s: %v", name, err)
			return
		}
		if a.code != http.StatusForbidden || a.body["error"] != "admission_invalid" {
			t.Errorf("%s (%.60q): %d %s, want 403 admission_invalid", name, tok, a.code, a.raw)
		}
	}
	for name, tok := range r7hMutations(ann.Token) {
		refuse("ann's token, "+name, "ann", tok)
	}
	refuse("bob's token sent by ann", "ann", bob.Token)
	refuse("ann's token sent by bob", "bob", ann.Token)
	refuse("ann's token of another SKU", "ann", annOther.Token)
	refuse("ann's token for another user named ann ", "ann.", ann.Token)
	p.wantStores("after the refusals", sku, 5, 0, 5)
	for _, u := range []string{"ann", "bob"} {
		if q, _, err := svc.Ticket(ctx, u, sku, svc.TicketOf(sku, u)); err != nil || q.State != reservation.TicketAdmitted {
			t.Errorf("%s's ticket after the refusals = %s %v, want ADMITTED", u, q.State, err)
		}
	}

	// The genuine tokens, in odd casings: one hold each, retries replay it.
	var ids []string
	for i, h := range []string{"admission-token", "ADMISSION-TOKEN", "aDmIsSiOn-ToKeN"} {
		a, err := p.r7hReserve("ann", sku, 1, map[string]string{h: ann.Token})
		if err != nil || a.code != http.StatusAccepted || a.body["reservation_id"] != p.r7hAdmissionID(sku, "ann") {
			t.Fatalf("ann's genuine token as %q (try %d) = %d %s %v, want 202 with %s", h, i, a.code, a.raw, err, p.r7hAdmissionID(sku, "ann"))
		}
		if i == 0 {
			ids = append(ids, a.body["reservation_id"].(string))
		}
	}
	a, err := p.r7hReserve("bob", sku, 1, map[string]string{"Admission-Token": bob.Token, "Idempotency-Key": "ignored"})
	if err != nil || a.code != http.StatusAccepted || a.body["reservation_id"] != p.r7hAdmissionID(sku, "bob") {
		t.Fatalf("bob's genuine token = %d %s %v", a.code, a.raw, err)
	}
	ids = append(ids, a.body["reservation_id"].(string))
	p.wantStores("two held", sku, 3, 2, 5)
	p.persistMsgs(ids...)
	p.wantStores("two sold", sku, 3, 0, 3)
	p.wantStores("the other SKU untouched", other, 5, 0, 5)
}

// Claim: an admission token cannot be forged or mutated. Its MAC is 16
// bytes in 22 base64url characters: the last carries 2 bits of data and 4
// spare ones, which Go's decoder ignores unless Strict, and the decoder
// skips CR and LF anywhere (the hole devauth's review found in d9da304).
// So a token never issued — the last character changed (15 other
// spellings, each reachable over plain HTTP), or line breaks inserted (a
// crafted event only) — is accepted and holds stock. The id is the
// ticket's either way, so no unit is taken twice; the token is malleable.
// Fails now; passes with base64.RawURLEncoding.Strict() and a refusal of
// CR/LF (or comparing the re-encoded MAC with the token's text).
func TestReview7hAdmissionTokenIsMalleable(t *testing.T) {
	ctx := context.Background()
	p := newPromise(t)
	svc := p.app.Service
	sku := p.roomSKU(3, 1, 0)
	if _, err := svc.JoinQueue(ctx, "ann", sku); err != nil {
		t.Fatal(err)
	}
	ann := p.admit(sku, "ann")
	last := ann.Token[len(ann.Token)-1]
	spare := r7hAlphabet[strings.IndexByte(r7hAlphabet, last)^1] // a spare bit flipped
	for name, tok := range map[string]string{
		"last character's spare bit flipped": ann.Token[:len(ann.Token)-1] + string(spare),
		"a line feed in the MAC":             ann.Token[:20] + "\n" + ann.Token[20:],
		"a CR LF at the end":                 ann.Token + "\r\n",
	} {
		if tok == ann.Token {
			t.Fatalf("%s: not a mutation", name)
		}
		a, err := p.r7hReserve("ann", sku, 1, map[string]string{"Admission-Token": tok})
		if err != nil {
			t.Fatal(err)
		}
		if a.code != http.StatusForbidden {
			t.Errorf("a token never issued (%s: %q, issued %q) = %d %s, want 403 admission_invalid", name, tok, ann.Token, a.code, a.raw)
		}
	}
	p.wantAgree("whatever was answered", sku, 3)
}

// A flood of valid and invalid admissions, interleaved on 8 goroutines
// over two room SKUs, with queue looks and joins (which MAC too) mixed in:
// every genuine token is answered its own id (any try, any casing), every
// other token 403 admission_invalid, every look its own ticket; each
// admitted buyer holds exactly one unit per SKU, and Redis and MySQL end
// exact.
func TestReview7hAdmissionFloodKeepsEveryMACApart(t *testing.T) {
	ctx := context.Background()
	p := newPromise(t)
	svc := p.app.Service
	const units, buyers = 24, 48
	skus := []string{p.roomSKU(units, 1, 0), p.roomSKU(units, 1, 0)}
	users := make([]string, buyers)
	for i := range users {
		users[i] = fmt.Sprintf("u%02d", i)
	}
	tokens := map[[2]string]string{} // (sku, user) -> token, admitted only
	for _, s := range skus {
		for _, u := range users {
			if _, err := svc.JoinQueue(ctx, u, s); err != nil {
				t.Fatal(err)
			}
		}
		for _, u := range users {
			q, a, err := svc.Ticket(ctx, u, s, svc.TicketOf(s, u))
			if err != nil {
				t.Fatal(err)
			}
			if q.State == reservation.TicketAdmitted {
				tokens[[2]string{s, u}] = a.Token
			}
		}
	}
	if len(tokens) != 2*units {
		t.Fatalf("%d admitted, want %d", len(tokens), 2*units)
	}
	type job struct {
		user, sku, tok, header, want string // want: an id, "invalid", or "look"
	}
	var jobs []job
	casings := []string{"Admission-Token", "admission-token", "ADMISSION-TOKEN"}
	for k, tok := range tokens {
		s, u := k[0], k[1]
		for i := range 5 {
			jobs = append(jobs, job{u, s, tok, casings[i%3], p.r7hAdmissionID(s, u)})
		}
		// The same token by someone else, on the other SKU, mutated.
		ui, _ := strconv.Atoi(u[1:])
		v := users[(ui+7)%buyers]
		jobs = append(jobs, job{v, s, tok, "Admission-Token", "invalid"})
		o := skus[0]
		if s == o {
			o = skus[1]
		}
		jobs = append(jobs, job{u, o, tok, "Admission-Token", "invalid"})
		for name, m := range r7hMutations(tok) {
			if !strings.HasPrefix(name, "1 MiB") {
				jobs = append(jobs, job{u, s, m, "Admission-Token", "invalid"})
			}
		}
	}
	for _, s := range skus {
		for _, u := range users {
			jobs = append(jobs, job{u, s, "", "", "look"}, job{u, s, "", "", "join"})
		}
	}
	rand.Shuffle(len(jobs), func(i, j int) { jobs[i], jobs[j] = jobs[j], jobs[i] })

	work := make(chan job)
	var wg sync.WaitGroup
	var mu sync.Mutex
	bad := 0
	report := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if bad++; bad <= 20 {
			t.Errorf(format, args...)
		}
	}
	for range 8 {
		wg.Go(func() {
			for j := range work {
				switch j.want {
				case "look", "join":
					method, path := "GET", "/skus/"+j.sku+"/queue/"+svc.TicketOf(j.sku, j.user)
					if j.want == "join" {
						method, path = "POST", "/skus/"+j.sku+"/queue"
					}
					resp, err := p.api.Handle(ctx, apiRequest(j.user, method, path, "", nil))
					var b map[string]any
					if err == nil {
						err = json.Unmarshal([]byte(resp.Body), &b)
					}
					if err != nil || resp.StatusCode != 200 || b["ticket"] != svc.TicketOf(j.sku, j.user) {
						report("%s %s as %s = %d %s %v, want 200 with ticket %s", method, path, j.user, resp.StatusCode, resp.Body, err, svc.TicketOf(j.sku, j.user))
					}
				default:
					a, err := p.r7hReserve(j.user, j.sku, 1, map[string]string{j.header: j.tok})
					switch {
					case err != nil:
						report("%s on %s with %.40q: %v", j.user, j.sku, j.tok, err)
					case j.want == "invalid" && (a.code != 403 || a.body["error"] != "admission_invalid"):
						report("%s on %s with a token not theirs %.40q = %d %s, want 403 admission_invalid", j.user, j.sku, j.tok, a.code, a.raw)
					case j.want != "invalid" && (a.code != 202 || a.body["reservation_id"] != j.want):
						report("%s on %s with their token = %d %s, want 202 with %s", j.user, j.sku, a.code, a.raw, j.want)
					}
				}
			}
		})
	}
	start := time.Now()
	for _, j := range jobs {
		work <- j
	}
	close(work)
	wg.Wait()
	t.Logf("%d requests in %v", len(jobs), time.Since(start))

	var ids []string
	for k := range tokens {
		ids = append(ids, p.r7hAdmissionID(k[0], k[1]))
	}
	for _, s := range skus {
		p.wantStores("after the flood", s, 0, units, units)
	}
	// Each id once (a HELD replay sends its message again).
	p.rec.mu.Lock()
	seen := map[string]bool{}
	var msgs []reservation.Reservation
	for _, m := range p.rec.msgs {
		if !seen[m.ID] {
			seen[m.ID] = true
			msgs = append(msgs, m)
		}
	}
	p.rec.msgs = nil
	p.rec.mu.Unlock()
	if len(msgs) != len(ids) {
		t.Errorf("%d distinct messages, want %d", len(msgs), len(ids))
	}
	for i, err := range svc.PersistBatch(ctx, msgs) {
		if err != nil {
			t.Fatalf("persist %s: %v", msgs[i].ID, err)
		}
	}
	for _, s := range skus {
		p.wantStores("settled", s, 0, 0, 0)
	}
	for k := range tokens {
		if n := p.confirmedUnits(k[0], k[1]); n != 1 {
			t.Errorf("%s holds %d units of %s, want 1", k[1], n, k[0])
		}
	}
	p.check(invariant.Expect{Sellable: map[string]int64{skus[0]: units, skus[1]: units}, Accepted: ids, Quiescent: true})
}
