package shop_test

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/holdfast/holdfast/web/shop"
)

// fakeRoom is the waiting room's HTTP API as the contract has it (ROOM_API:
// the queue, ticket and reservation bodies) for one SKU whose units all go
// to the first in line, a factor of 1: the page's side of the protocol,
// without the services. It records what the page asked, so a test can hold
// the page to polling the public state and fetching its ticket only when
// its turn may have come.
type fakeRoom struct {
	sku     string
	units   int
	opensAt time.Time
	config  string // the page's config.json (shop.DevConfig unless set)

	mu       sync.Mutex
	queue    []string // users in order (drawn at the opening: join order here)
	reserved map[string]time.Time
	// ticketGets counts each buyer's GET of their ticket; early counts
	// those before the opening.
	ticketGets map[string]int
	early      int
	publicGets int
}

func newFakeRoom(sku string, units int, opensAt time.Time) *fakeRoom {
	return &fakeRoom{sku: sku, units: units, opensAt: opensAt, reserved: map[string]time.Time{}, ticketGets: map[string]int{}}
}

const confirmAfter = 300 * time.Millisecond

func (f *fakeRoom) handler() http.Handler {
	mux := http.NewServeMux()
	config := f.config
	if config == "" {
		config = shop.DevConfig
	}
	mux.Handle("/shop/", shop.Handler(config))
	mux.HandleFunc("POST /dev/token", func(w http.ResponseWriter, r *http.Request) {
		var b struct{ Sub string }
		_ = json.NewDecoder(r.Body).Decode(&b)
		reply(w, 200, map[string]any{"token": fakeToken(b.Sub), "sub": b.Sub})
	})
	sku := "/skus/" + f.sku
	mux.HandleFunc("GET "+sku, func(w http.ResponseWriter, r *http.Request) {
		if user(r) == "" {
			reply(w, 401, map[string]any{"message": "Unauthorized"})
			return
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		reply(w, 200, map[string]any{"sku": f.sku, "available": f.units - len(f.reserved), "server_time": stamp(time.Now()),
			"opens_at": stamp(f.opensAt), "waiting_room": true})
	})
	mux.HandleFunc("POST "+sku+"/queue", func(w http.ResponseWriter, r *http.Request) {
		u := user(r)
		f.mu.Lock()
		defer f.mu.Unlock()
		if !contains(f.queue, u) {
			f.queue = append(f.queue, u)
		}
		reply(w, 200, f.ticket(u))
	})
	mux.HandleFunc("GET "+sku+"/queue", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.publicGets++
		w.Header().Set("Cache-Control", "public, max-age=1")
		reply(w, 200, f.public())
	})
	mux.HandleFunc("GET "+sku+"/queue/{ticket}", func(w http.ResponseWriter, r *http.Request) {
		u := user(r)
		f.mu.Lock()
		defer f.mu.Unlock()
		if r.PathValue("ticket") != "t-"+u || !contains(f.queue, u) {
			reply(w, 404, map[string]any{"error": "unknown_ticket"})
			return
		}
		f.ticketGets[u]++
		if time.Now().Before(f.opensAt) {
			f.early++
		}
		w.Header().Set("Cache-Control", "no-store")
		reply(w, 200, f.ticket(u))
	})
	mux.HandleFunc("POST /reservations", func(w http.ResponseWriter, r *http.Request) {
		u := user(r)
		f.mu.Lock()
		defer f.mu.Unlock()
		if r.Header.Get("Admission-Token") != "adm-"+u || f.ticket(u)["status"] != "ADMITTED" {
			reply(w, 403, map[string]any{"error": "admission_invalid"})
			return
		}
		f.reserved[u] = time.Now()
		reply(w, 202, map[string]any{"reservation_id": "r-" + u, "status": "HELD", "sku": f.sku, "qty": 1})
	})
	mux.HandleFunc("GET /reservations/{id}", func(w http.ResponseWriter, r *http.Request) {
		u := user(r)
		f.mu.Lock()
		defer f.mu.Unlock()
		at, ok := f.reserved[u]
		if !ok || r.PathValue("id") != "r-"+u {
			reply(w, 404, map[string]any{"error": "not_found"})
			return
		}
		status := "HELD"
		if time.Since(at) > confirmAfter {
			status = "CONFIRMED"
		}
		reply(w, 200, map[string]any{"reservation_id": "r-" + u, "status": status, "sku": f.sku, "qty": 1})
	})
	return mux
}

// public is GET /skus/{sku}/queue's body; the caller holds mu.
func (f *fakeRoom) public() map[string]any {
	open := !time.Now().Before(f.opensAt)
	through := 0
	if open {
		through = min(len(f.queue), f.units)
	}
	held := 0
	for _, at := range f.reserved {
		if time.Since(at) <= confirmAfter {
			held++
		}
	}
	left := f.units - len(f.reserved)
	return map[string]any{"sku": f.sku, "server_time": stamp(time.Now()), "opens_at": stamp(f.opensAt), "open": open,
		"admitted_through": through, "length": len(f.queue), "sold_out": left <= 0 && held == 0, "may_return": left <= 0 && held > 0}
}

// ticket is u's ticket body; the caller holds mu.
func (f *fakeRoom) ticket(u string) map[string]any {
	b := f.public()
	b["ticket"] = "t-" + u
	pos := 0
	for i, q := range f.queue {
		if q == u {
			pos = i + 1
		}
	}
	switch {
	case !b["open"].(bool):
		b["status"] = "WAITING"
	case f.reserved[u] != time.Time{}:
		b["status"], b["position"] = "RESERVED", pos
	case pos <= b["admitted_through"].(int):
		b["status"], b["position"] = "ADMITTED", pos
		b["admission_token"], b["admission_expires_at"] = "adm-"+u, stamp(time.Now().Add(time.Minute))
	case b["sold_out"].(bool):
		b["status"], b["position"] = "SOLD_OUT", pos
	default:
		b["status"], b["position"] = "WAITING", pos
	}
	return b
}

// fakeToken is a JWT-shaped token for sub (the fake checks no signature).
func fakeToken(sub string) string {
	claims, _ := json.Marshal(map[string]any{"sub": sub, "exp": time.Now().Add(time.Hour).Unix()})
	return "e30." + base64.RawURLEncoding.EncodeToString(claims) + ".fake"
}

// user is the fake token's sub (the page decodes the same claims).
func user(r *http.Request) string {
	parts := strings.Split(strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "), ".")
	if len(parts) != 3 {
		return ""
	}
	b, _ := base64.RawURLEncoding.DecodeString(parts[1])
	var c struct{ Sub string }
	_ = json.Unmarshal(b, &c)
	return c.Sub
}

func reply(w http.ResponseWriter, status int, body any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
