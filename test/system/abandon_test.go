package system_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/reservation"
)

// switchEnqueuer records every message; while fail is set it reports the
// send failed (nothing sent) and first runs before (a fault to inject).
type switchEnqueuer struct {
	rec    *recordingEnqueuer
	fail   atomic.Bool
	before func()
}

func (e *switchEnqueuer) Enqueue(ctx context.Context, r reservation.Reservation) error {
	if e.fail.Load() {
		if e.before != nil {
			e.before()
		}
		return reservation.Unavailable("sqs send", errInjected)
	}
	return e.rec.Enqueue(ctx, r)
}

var errInjected = &injectedError{}

type injectedError struct{}

func (*injectedError) Error() string { return "injected send failure" }

// TestUnkeyedReserveWithLostReplyIsFencedAtOnce: an unkeyed reserve whose
// Redis reply is lost (the script ran and took the hold) answers 503, and
// reserve fences it hold_failed at once and releases the hold (at once, or
// by the outbox): the units are not held from everybody for a hold TTL.
// (Found by the adversarial review of issue 20: the fence was built from the
// request, whose zero CreatedAt MySQL refused, so it never worked.)
func TestUnkeyedReserveWithLostReplyIsFencedAtOnce(t *testing.T) {
	p := newPromiseBehindProxy(t)
	sku := testservices.Name("zaband")
	p.createSKU(sku, 10, 0)
	p.reserved(sku, "warm", 1, "") // layout cached, pool warm

	p.proxy.DropReplies(true)
	code, body := p.reserve(sku, "ann", 2, "")
	p.proxy.DropReplies(false)
	if code != http.StatusServiceUnavailable {
		t.Fatalf("reserve with the reply lost = %d %v, want 503", code, body)
	}
	fenced := p.count(`SELECT COUNT(*) FROM reservations WHERE sku = ? AND reason = 'hold_failed'`, sku)
	p.clock.Advance(3 * time.Second) // past the sweep grace: the release outbox drains; the hold (60 s) is not due
	p.sweep()
	avail, held := p.redisStock(sku)
	if fenced != 1 || avail != 9 || held != 1 {
		t.Errorf("after the 503 and one sweep: %d hold_failed fences in MySQL, redis available %d held %d; want 1 fence and 9/1 (the lost hold fenced at once, released at once or by the outbox)",
			fenced, avail, held)
	}
}
