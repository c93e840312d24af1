package reservation

import (
	"context"
	"errors"
	"time"
)

// Probes: what a buyer's reads and cancels cost the arbiter. A cancel is a
// buyer write, so it is metered like a reserve; a read or cancel of an id
// naming a SKU MySQL does not have, and a read of a group MySQL does not
// have, are answered from short per-instance memories, so a prober costs
// Redis, not MySQL.

// meterCancel charges a buyer's cancel of id to their attempt budget on the
// SKU the id names (in their home bucket, as a reserve is), before anything
// is read from MySQL: past the rate it is *RateLimitedError and nothing is
// read or changed. The caller is charged, whoever owns the id: it is their
// budget they spend. ErrNotFound when MySQL has no such SKU (no reservation
// of it can exist; said from the unknown-SKU memory when it can). When Redis
// cannot be asked the budget cannot be kept: the cancel goes on unmetered,
// for MySQL decides a cancel without the cache (metric "unmetered").
func (s *Service) meterCancel(ctx context.Context, id, user string) error {
	sku, _ := SKUOf(id)
	l, err := s.layoutOf(ctx, sku)
	if err == nil {
		err = s.holds.Charge(ctx, Attempt{SKU: sku, Bucket: HomeBucket(user, "", l.k), UserID: user, Token: newToken()})
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrUnknownSKU):
		return ErrNotFound
	case errors.Is(err, ErrRateLimited):
		s.metrics.Count("rate_limited", 1)
		return err
	}
	s.metrics.Count("unmetered", 1)
	s.log.WarnContext(ctx, "cancel: the attempt budget could not be charged; mysql decides the cancel unmetered",
		"reservation_id", id, "error", err)
	return nil
}

// unknownSKUOf reports whether the SKU id names is one MySQL does not have,
// so that no reservation of it can exist (SKUs are never deleted): from the
// unknown-SKU memory, else Redis, else MySQL once (which fills the memory).
// false when a store could not say: the caller reads the row as before.
func (s *Service) unknownSKUOf(ctx context.Context, id string) bool {
	sku, _ := SKUOf(id)
	_, err := s.layoutOf(ctx, sku)
	return errors.Is(err, ErrUnknownSKU)
}

// unknownGroupTTL is how long an instance answers unknown_group for a group
// id MySQL said it does not have, without asking again. A remembered id is
// never a group created meanwhile: a group's id is 128 random bits, handed
// out only after MySQL committed its row (CreateGroup writes MySQL first),
// so nobody can ask for it before it exists but by guessing it. The memory
// only bounds what a repeated probe costs; its size is bounded like the
// unknown-SKU memory's.
const unknownGroupTTL = 5 * time.Second

// groupRow reads group id from MySQL unless this instance heard lately that
// MySQL has no such group (ErrUnknownGroup, from memory).
func (s *Service) groupRow(ctx context.Context, id string) (Group, error) {
	now := s.clock.Now()
	if !s.unknownGroups.known(id, now) {
		return Group{}, ErrUnknownGroup
	}
	epoch := s.unknownGroups.begin()
	g, err := s.ledger.Group(ctx, id)
	if errors.Is(err, ErrUnknownGroup) {
		s.unknownGroups.put(id, now.Add(unknownGroupTTL).Round(0), epoch)
	}
	return g, err
}
