package system_test

// Adversarial review of "a bucket that holds every id" (meta.whole):
// sequences in which the bucket says whole while MySQL has a row of an id
// the bucket has no hold or tombstone of.

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/reservation"
)

// Redis loses the SKU while a keyed hold's message is in flight; the next
// buy warms the bucket from a MySQL read that has no row yet (the message is
// not persisted), so it is recorded whole. Persist then commits the id; in
// the gap before Redis is told (AfterCommit: no fault, just the order), the
// buyer retries with the same key. MySQL has decided the id, so the same
// request must answer the decided row and a different qty 422
// idempotency_mismatch ("however long ago Redis forgot the hold"). The
// bucket says whole, so MySQL is not asked.
func TestReviewWholeWarmedBeforeAnInFlightCommit(t *testing.T) {
	for _, tc := range keyedRetries {
		t.Run(tc.name, func(t *testing.T) {
			var at atCommit
			p := newPromise(t, withHooks(at.hooks()))
			sku := testservices.Name("rvwhole")
			p.createSKU(sku, 5, 0)
			id := p.reserved(sku, "ann", 1, "k1")
			p.loseSKU(sku)
			p.reserved(sku, "bob", 1, "") // warms the bucket: MySQL has no row yet
			tc.check(t, p, &at, sku, id)
		})
	}
}

// keyedRetries are ann's two keyed retries (key k1, qty 1 first) once
// MySQL has decided her id and before Redis is told: another qty is
// 422 idempotency_mismatch, the same request 200 with the CONFIRMED row.
var keyedRetries = []keyedRetry{
	{"a different qty", 2, func(code int, b map[string]any, _ string) bool {
		return code == http.StatusUnprocessableEntity && b["error"] == "idempotency_mismatch"
	}, "422 idempotency_mismatch"},
	{"the same request", 1, func(code int, b map[string]any, id string) bool {
		return code == http.StatusOK && b["reservation_id"] == id && b["status"] == string(reservation.StatusConfirmed)
	}, "200 CONFIRMED (MySQL's decided row)"},
}

type keyedRetry struct {
	name string
	qty  int
	want func(code int, b map[string]any, id string) bool
	says string
}

// check persists ann's reservation id of sku, retrying at its commit (at),
// and checks the retry's answer.
func (tc keyedRetry) check(t *testing.T, p *promise, at *atCommit, sku, id string) {
	t.Helper()
	var code int
	var body map[string]any
	at.arm(id, func() { code, body = p.reserve(sku, "ann", tc.qty, "k1") })
	p.persistMsgs(id)
	if st, _, _ := p.row(id); st != "CONFIRMED" {
		t.Fatalf("row %s = %s, want CONFIRMED", id, st)
	}
	if !tc.want(code, body, id) {
		t.Errorf("ann's retry (qty %d, key k1) after MySQL committed %s = %d %v; want %s", tc.qty, id, code, body, tc.says)
	}
}

// atCommit runs a request once, right after persist commits a given id and
// before Redis is told (Hooks.AfterCommit).
type atCommit struct {
	mu     sync.Mutex
	target string
	retry  func()
}

func (a *atCommit) hooks() reservation.Hooks {
	return reservation.Hooks{AfterCommit: func(r reservation.Reservation) error {
		a.mu.Lock()
		f := a.retry
		if r.ID == a.target {
			a.retry = nil
		} else {
			f = nil
		}
		a.mu.Unlock()
		if f != nil {
			f()
		}
		return nil
	}}
}

// arm runs f when id commits.
func (a *atCommit) arm(id string, f func()) {
	a.mu.Lock()
	a.target, a.retry = id, f
	a.mu.Unlock()
}

// The same order with a fault instead of a race: Redis is unreachable while
// persist tells it of the commit. A CONFIRMED row's follow that fails is
// only logged ("the sweeper retries"), yet no sweep writes a tombstone of a
// CONFIRMED row whose hold Redis lost, so the bucket goes on saying whole
// for the retention. Here the SKU is sold out in Redis meanwhile (another
// buyer took the unit the warm-up loaded): the buyer whose reservation
// MySQL CONFIRMED retries with her key and is told 409 sold_out.
func TestReviewWholeFollowFailedSoldOutRetry(t *testing.T) {
	p := newPromiseBehindProxy(t)
	sku := testservices.Name("rvwhole")
	p.createSKU(sku, 1, 0)
	id := p.reserved(sku, "ann", 1, "k1")
	p.loseSKU(sku)
	p.reserved(sku, "bob", 1, "") // warms the bucket whole (MySQL: available 1, no row) and takes its unit

	p.proxy.Refuse(true)
	p.persistMsgs(id) // MySQL confirms ann's reservation; Redis is not told
	p.proxy.Refuse(false)
	if st, _, _ := p.row(id); st != "CONFIRMED" {
		t.Fatalf("row %s = %s, want CONFIRMED", id, st)
	}
	p.clock.Advance(5 * time.Second)
	p.sweep()
	p.sweep()

	code, b := p.reserve(sku, "ann", 1, "k1")
	if code != http.StatusOK || b["reservation_id"] != id || b["status"] != string(reservation.StatusConfirmed) {
		t.Errorf("ann's keyed retry of her CONFIRMED reservation = %d %v; want 200 CONFIRMED %s (MySQL's row)", code, b, id)
	}
	if code, b := p.reserve(sku, "ann", 3, "k1"); code != http.StatusUnprocessableEntity || b["error"] != "idempotency_mismatch" {
		t.Errorf("ann's retry with key k1 and qty 3 = %d %v; want 422 idempotency_mismatch", code, b)
	}

	// An hour of sweeps later (bob's hold expired and was returned) nothing
	// has told the bucket of ann's row: her retry is a new hold.
	for range 6 {
		p.clock.Advance(10 * time.Minute)
		p.sweep()
	}
	if code, b := p.reserve(sku, "ann", 1, "k1"); code != http.StatusOK || b["status"] != string(reservation.StatusConfirmed) {
		t.Errorf("ann's keyed retry an hour of sweeps later = %d %v; want 200 CONFIRMED %s", code, b, id)
	}
}

// meta.wholefor is the retention in milliseconds, but a finished hold's
// TTL is the retention truncated to whole seconds (EXPIRE, int64 of
// Seconds()): with HOLDFAST_HOLD_RETENTION=2500ms a confirmed hold is gone
// after 2 s while the bucket says whole until 2.5 s, so a keyed retry with
// another qty in between is a new hold (202), not 422 idempotency_mismatch.
// (A retention of whole seconds, the default 24h, has no such gap.)
func TestReviewWholeOutlivesATruncatedRetention(t *testing.T) {
	p := newPromise(t, withVars(map[string]string{"HOLDFAST_HOLD_RETENTION": "2500ms"}))
	sku := testservices.Name("rvwhole")
	p.createSKU(sku, 5, 0)
	start := time.Now()
	id := p.reserved(sku, "ann", 1, "k1")
	p.persistMsgs(id)
	p.wantStatus(id, reservation.StatusConfirmed, "")
	testservices.Eventually(t, 5*time.Second, "the confirmed hold's TTL passes", func() bool {
		return p.rdb.Exists(context.Background(), "hf:{"+sku+"}:r:"+id).Val() == 0
	})
	elapsed := time.Since(start)
	if elapsed >= 2400*time.Millisecond {
		t.Skipf("too slow to land inside the gap: %v", elapsed)
	}
	p.clock.Advance(elapsed) // the scripts' clock keeps up with Redis's TTLs
	if code, b := p.reserve(sku, "ann", 2, "k1"); code != http.StatusUnprocessableEntity || b["error"] != "idempotency_mismatch" {
		t.Errorf("ann's retry with key k1 and qty 2, %v after her hold was taken (retention 2.5 s) = %d %v; want 422 idempotency_mismatch", elapsed, code, b)
	}
}

// Held: an instance whose layout cache still says K = 1 after the admin
// raised K (within touchEvery) reaches bucket 0, whose whole the raise ended
// (stock.lua), so its keyed retry of a reservation Redis lost is judged in
// MySQL: 422 for another qty.
func TestReviewWholeStaleLayoutAfterARaiseOfK(t *testing.T) {
	p := newPromise(t)
	sku := testservices.Name("rvwhole")
	p.createSKU(sku, 9, 0)
	other := p.twin(p.clock, p.rec) // another instance, its layout cache its own
	id := p.reserved(sku, "ann", 1, "k1")
	if _, _, err := other.Reserve(context.Background(), reservation.ReserveRequest{SKU: sku, Qty: 1, UserID: "bob", IdempotencyKey: "b1"}); err != nil {
		t.Fatalf("bob through the other instance: %v", err)
	}
	p.persistMsgs(id)
	p.raiseK(sku, 3)
	// Redis loses ann's hold (a failover's lost write), not the meta hash.
	if err := p.rdb.Del(context.Background(), "hf:{"+sku+"}:r:"+id).Err(); err != nil {
		t.Fatal(err)
	}
	_, _, err := other.Reserve(context.Background(), reservation.ReserveRequest{SKU: sku, Qty: 2, UserID: "ann", IdempotencyKey: "k1"})
	if !errors.Is(err, reservation.ErrIdempotencyMismatch) {
		t.Errorf("ann's retry with qty 2 through an instance that cached K = 1 = %v; want ErrIdempotencyMismatch", err)
	}
}
