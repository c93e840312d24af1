package reservation

import (
	"context"
	"sync"
	"time"
)

// touchEvery is how often an instance marks a SKU it takes holds on live
// again: one Redis call per SKU per instance per period, not per request.
const touchEvery = 5 * time.Second

// maxTouched bounds the SKUs an instance remembers marking; past it the
// memory starts afresh (the cost is one more mark per SKU).
const maxTouched = 4096

// touches remembers, per SKU, the mark this instance made and until when
// it need not mark the SKU again.
type touches struct {
	mu sync.Mutex
	m  map[string]touched
}

type touched struct {
	mark  LiveSKU   // as Redis recorded it
	until time.Time // by this instance's clock
}

// due reports whether sku must be marked at now.
func (t *touches) due(sku string, now time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.m[sku]
	return !ok || !now.Before(e.until)
}

func (t *touches) done(mark LiveSKU, until time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil || len(t.m) >= maxTouched {
		t.m = make(map[string]touched)
	}
	t.m[mark.SKU] = touched{mark: mark, until: until}
}

// forget removes sku and returns the mark this instance made, if any.
func (t *touches) forget(sku string) (LiveSKU, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.m[sku]
	delete(t.m, sku)
	return e.mark, ok
}

// liveFor is how long a mark keeps a SKU live: every hold taken while this
// instance relies on the mark (up to touchEvery after it) has its deadline,
// plus the sweeper's grace, before the mark passes. Both are measured on
// Redis's clock from the moment of the call, so no clock skew enters.
func (s *Service) liveFor() time.Duration {
	return touchEvery + s.cfg.HoldTTL + s.cfg.SweepGrace + touchEvery
}

// touch marks sku live before a hold can be taken on it (or a stock change
// made), so the sweeper visits it every sweep until its holds are decided.
// A failed mark does not stop the request: the catalog pass still reaches
// the SKU, later (docs/design.md states both bounds).
func (s *Service) touch(ctx context.Context, sku string) {
	now := s.clock.Now()
	if !s.touched.due(sku, now) {
		return
	}
	mark, err := s.marks.Touch(ctx, sku, s.liveFor())
	if err != nil {
		s.metrics.Count("live_mark_errors", 1)
		s.log.WarnContext(ctx, "could not mark sku live; the catalog pass reaches it", "sku", sku, "error", err)
		return
	}
	// By the wall clock (Round(0) drops the monotonic reading): a Lambda
	// environment frozen between invocations may not count the frozen time
	// on its monotonic clock, and must not trust a mark that long gone.
	s.touched.done(mark, now.Add(touchEvery).Round(0))
}

// withdraw ends this instance's mark of a SKU MySQL does not have, unless
// someone marked it since (a stock change creating it): made-up SKUs leave
// no marks for the sweeper to visit.
func (s *Service) withdraw(ctx context.Context, sku string) {
	mark, ok := s.touched.forget(sku)
	if !ok {
		return
	}
	if _, err := s.marks.Withdraw(ctx, mark); err != nil {
		s.log.WarnContext(ctx, "could not withdraw the live mark of an unknown sku", "sku", sku, "error", err)
	}
}
