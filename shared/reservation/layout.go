package reservation

// The per-instance layout cache: layouts remembers, per SKU, how its stock
// sits in Redis (K buckets, group-buys or not), unknowns the SKUs MySQL said
// it does not have; layoutOf and bucketsOf read through them, and
// crossBucketMismatch checks a keyed request against the other bucket it
// could be held in.

import (
	"context"
	"errors"
	"sync"
	"time"
)

// layouts caches, per SKU, its layout as Redis has it, for touchEvery: one
// read per SKU per instance per period, not per request.
type layouts struct {
	mu sync.Mutex
	m  map[string]cachedLayout
}

type cachedLayout struct {
	layout
	until time.Time
}

// layout is how a SKU's stock sits in Redis.
type layout struct {
	k      int  // buckets
	groups bool // the SKU has group-buys (in bucket 0)
}

func (c *layouts) get(sku string, now time.Time) (layout, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[sku]
	return e.layout, ok && now.Before(e.until)
}

func (c *layouts) put(sku string, l layout, until time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= maxTouched {
		c.m = make(map[string]cachedLayout)
	}
	c.m[sku] = cachedLayout{layout: l, until: until}
}

// drop forgets sku: the next request reads its layout again.
func (c *layouts) drop(sku string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, sku)
}

// unknownTTL is how long an instance answers unknown_sku for a SKU MySQL
// said it does not have, without asking again: a probe of made-up SKUs costs
// MySQL one lookup per SKU per instance per period, not one per request. A
// SKU the admin creates through this instance is buyable at once (ChangeStock
// drops the entry); through another, within unknownTTL.
const unknownTTL = 2 * time.Second

// unknowns remembers, per SKU, until when this instance takes MySQL's "no
// such SKU" as the answer (bounded: past maxTouched entries it starts
// afresh).
type unknowns struct {
	mu    sync.Mutex
	m     map[string]time.Time
	epoch uint64 // moves on every drop: a lookup that began before it does not record
}

// known reports whether sku may exist at now (no recent "unknown" here).
func (u *unknowns) known(sku string, now time.Time) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	until, ok := u.m[sku]
	return !ok || !now.Before(until)
}

// begin returns the epoch a lookup starts in (for put).
func (u *unknowns) begin() uint64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.epoch
}

// put records that MySQL had no sku, unless a drop came since epoch (the
// admin may have created it meanwhile).
func (u *unknowns) put(sku string, until time.Time, epoch uint64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if epoch != u.epoch {
		return
	}
	if u.m == nil || len(u.m) >= maxTouched {
		u.m = make(map[string]time.Time)
	}
	u.m[sku] = until
}

// drop forgets sku: it exists now (or may).
func (u *unknowns) drop(sku string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.epoch++
	delete(u.m, sku)
}

// bucketsOf returns K of sku.
func (s *Service) bucketsOf(ctx context.Context, sku string) (int, error) {
	l, err := s.layoutOf(ctx, sku)
	return l.k, err
}

// layoutOf returns the layout of sku, warming its bucket 0 if Redis lost it
// (ErrUnknownSKU: MySQL has no such SKU; said again without asking for
// unknownTTL).
func (s *Service) layoutOf(ctx context.Context, sku string) (layout, error) {
	now := s.clock.Now()
	if l, ok := s.layouts.get(sku, now); ok {
		return l, nil
	}
	if !s.unknown.known(sku, now) {
		return layout{}, ErrUnknownSKU
	}
	k, groups, err := s.figures.Buckets(ctx, sku)
	if errors.Is(err, ErrUnknownSKU) {
		epoch := s.unknown.begin()
		if _, err = s.warm(ctx, sku, 0); err != nil {
			if errors.Is(err, ErrUnknownSKU) {
				s.unknown.put(sku, now.Add(unknownTTL).Round(0), epoch)
			}
			return layout{}, err
		}
		k, groups, err = s.figures.Buckets(ctx, sku)
	}
	if err != nil {
		return layout{}, err
	}
	l := layout{k: k, groups: groups}
	s.layouts.put(sku, l, now.Add(touchEvery).Round(0))
	return l, nil
}

// crossBucketMismatch reports whether a keyed request's id is held in
// Redis, for another request, in the other bucket a request with this key
// could be held in: a join's id in the buyer's home bucket, a buy's in
// bucket 0 (where a SKU with group-buys holds its joins). The id names the
// buyer, the SKU and the key, not the group, so a join and a buy under one
// key are one id in two buckets, and neither bucket's script sees the other.
func (s *Service) crossBucketMismatch(ctx context.Context, r Reservation, l layout) (bool, error) {
	other := HomeBucket(r.UserID, "", l.k)
	if r.GroupID == "" {
		if !l.groups {
			return false, nil
		}
		other = 0
	}
	if other == r.Bucket {
		return false, nil
	}
	h, err := s.holds.Hold(ctx, r.ID, other)
	if errors.Is(err, ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return h.Qty != r.Qty || h.UserID != r.UserID || h.GroupID != r.GroupID, nil
}
