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

// touches remembers, per SKU, until when this instance need not mark it
// live again.
type touches struct {
	mu    sync.Mutex
	until map[string]time.Time
}

// due reports whether sku must be marked at now.
func (t *touches) due(sku string, now time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	until, ok := t.until[sku]
	return !ok || !now.Before(until)
}

func (t *touches) done(sku string, until time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.until == nil || len(t.until) >= maxTouched {
		t.until = make(map[string]time.Time)
	}
	t.until[sku] = until
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
	if err := s.holds.Touch(ctx, sku, s.liveFor()); err != nil {
		s.metrics.Count("live_mark_errors", 1)
		s.log.WarnContext(ctx, "could not mark sku live; the catalog pass reaches it", "sku", sku, "error", err)
		return
	}
	s.touched.done(sku, now.Add(touchEvery))
}
