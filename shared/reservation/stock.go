package reservation

import (
	"context"
	"errors"
	"time"
)

// ChangeStock applies an admin's change of a SKU's sellable stock in MySQL,
// then moves Redis by what MySQL recorded. An absolute figure (c.Set) on an
// existing SKU needs the version it was based on (c.IfVersion), because
// sales move the figure all the time: a stale one is ErrPreconditionFailed
// and changes nothing. A relative change (c.Add) commutes with sales and
// needs none. Redis follows MySQL's admin changes exactly once each, in any
// order: if it cannot follow now, the next sweep applies what is missing.
// c.Limit, when not nil, sets the per-user limit in units (0: none);
// c.OpensAt and c.ClosesAt the sale window, which every bucket's figures in
// Redis carry, so a change takes effect at the next reserve; c.PayWithin
// the pay window of the confirmations after it (MySQL's alone).
func (s *Service) ChangeStock(ctx context.Context, c StockChange) (StockLevel, error) {
	if err := c.normalizeWindow(); err != nil {
		return StockLevel{}, err
	}
	switch {
	case !ValidID(c.SKU):
		return StockLevel{}, invalid("sku", "must be 1-64 characters of letters, digits and ._:-")
	case (c.Set == nil) == (c.Add == nil):
		return StockLevel{}, invalid("stock", "give exactly one of stock (the new figure) and add (units to add or remove)")
	case c.Set != nil && (*c.Set < 0 || *c.Set > 1_000_000_000):
		return StockLevel{}, invalid("stock", "must be between 0 and 1000000000")
	case c.Add != nil && (*c.Add < -1_000_000_000 || *c.Add > 1_000_000_000):
		return StockLevel{}, invalid("add", "must be between -1000000000 and 1000000000")
	case c.Limit != nil && (*c.Limit < 0 || *c.Limit > 1_000_000):
		return StockLevel{}, invalid("per_user_limit", "must be between 0 and 1000000")
	case c.Rate != nil && (*c.Rate < 0 || *c.Rate > 10_000):
		return StockLevel{}, invalid("rate_per_second", "must be between 0 (the default) and 10000")
	case c.Burst != nil && (*c.Burst < 0 || *c.Burst > 10_000):
		return StockLevel{}, invalid("burst", "must be between 0 (the default) and 10000")
	case c.IfVersion != nil && *c.IfVersion < 0:
		return StockLevel{}, invalid("version", "must not be negative")
	case len(c.Key) > 128:
		return StockLevel{}, invalid("Idempotency-Key", "must be at most 128 characters")
	case c.Buckets != nil && (*c.Buckets < 1 || *c.Buckets > MaxBuckets):
		return StockLevel{}, invalid("buckets", "must be between 1 and %d", MaxBuckets)
	case c.PayWithin != nil && (*c.PayWithin < 0 || *c.PayWithin > MaxPayWithin || *c.PayWithin%time.Second != 0):
		return StockLevel{}, invalid("pay_within_seconds", "must be whole seconds between 0 (no pay window) and %d", int(MaxPayWithin/time.Second))
	}
	s.touch(ctx, c.SKU) // the sweeper applies the change if Redis cannot follow now
	level, err := s.ledger.ChangeStock(ctx, c)
	if err != nil {
		return StockLevel{}, err
	}
	s.soldOut.Delete(c.SKU)
	s.layouts.drop(c.SKU)
	s.unknown.drop(c.SKU) // buyable at once through this instance
	for b := range level.BucketCount() {
		res, err := s.figures.Sync(ctx, level.Bucket(b))
		if err == nil && res == SyncMissing && b == 0 {
			_, err = s.warmBucket(ctx, c.SKU, b, level.Created) // the others warm when first asked
		}
		if err != nil {
			// MySQL changed and Redis did not yet: the sweeper applies it.
			s.log.WarnContext(ctx, "stock change not in redis yet; the sweeper applies it", "sku", c.SKU, "bucket", b, "error", err)
		}
	}
	if level.BucketCount() > 1 {
		s.cover(ctx, c.SKU, level.BucketCount())
	}
	return level, nil
}

// ApplyRoom returns l with the waiting room c sets, or an *InvalidError:
// an admit factor is 1 to 100 (kept in thousandths), a factor without a
// room is refused, and a room needs one bucket. Each Ledger's ChangeStock
// applies it to the row it changes, after the bucket count.
func (c StockChange) ApplyRoom(l StockLevel) (StockLevel, error) {
	if c.AdmitFactor != nil && (*c.AdmitFactor < 1 || *c.AdmitFactor > 100) {
		return StockLevel{}, invalid("admit_factor", "must be between 1 and 100 (buyers admitted per unit left)")
	}
	on := l.WaitingRoom()
	if c.WaitingRoom != nil {
		on = *c.WaitingRoom
	}
	switch {
	case !on && c.AdmitFactor != nil:
		return StockLevel{}, invalid("admit_factor", "needs a waiting room (waiting_room: true)")
	case !on:
		l.AdmitPermille = 0
	case c.AdmitFactor != nil:
		l.AdmitPermille = int(*c.AdmitFactor*1000 + 0.5)
	case l.AdmitPermille == 0:
		l.AdmitPermille = 1000
	}
	if l.WaitingRoom() && l.BucketCount() > 1 {
		return StockLevel{}, invalid("waiting_room", "needs one bucket: the sku has %d (the room is what spreads its load)", l.BucketCount())
	}
	return l, nil
}

// MaxPayWithin is the longest pay window a SKU may have.
const MaxPayWithin = 30 * 24 * time.Hour

// Window bounds: a bound is a time after the Unix epoch and before the year
// 10000 (MySQL's DATETIME), kept to the millisecond.
var (
	minWindow = time.UnixMilli(1).UTC()
	maxWindow = time.Date(9999, 12, 31, 23, 59, 59, 999e6, time.UTC)
)

// normalizeWindow keeps c's window bounds in UTC milliseconds and checks
// them: each in range, and the window closing after it opens when the
// change gives both (ApplyWindow checks it against the bound it keeps).
func (c *StockChange) normalizeWindow() error {
	for _, b := range []struct {
		name string
		t    **time.Time
	}{{"opens_at", &c.OpensAt}, {"closes_at", &c.ClosesAt}} {
		if *b.t == nil || (*b.t).IsZero() {
			continue
		}
		t := (*b.t).UTC().Truncate(time.Millisecond)
		if t.Before(minWindow) || t.After(maxWindow) {
			return invalid(b.name, "must be a time after 1970-01-01T00:00:00Z and before the year 10000")
		}
		*b.t = &t
	}
	if c.OpensAt != nil && c.ClosesAt != nil && !c.OpensAt.IsZero() && !c.ClosesAt.IsZero() && !c.ClosesAt.After(*c.OpensAt) {
		return invalid("closes_at", "must be after opens_at")
	}
	return nil
}

// ApplyWindow returns l with the window bounds c sets (a zero time clears
// one), or an *InvalidError naming the bound c sets when the window would
// not close after it opens: each Ledger's ChangeStock applies it to the
// row it changes, so no stored window is ever empty or reversed.
func (c StockChange) ApplyWindow(l StockLevel) (StockLevel, error) {
	if c.OpensAt != nil {
		l.OpensAt = c.OpensAt.UTC().Truncate(time.Millisecond)
	}
	if c.ClosesAt != nil {
		l.ClosesAt = c.ClosesAt.UTC().Truncate(time.Millisecond)
	}
	if l.OpensAt.IsZero() || l.ClosesAt.IsZero() || l.ClosesAt.After(l.OpensAt) {
		return l, nil
	}
	if c.ClosesAt == nil {
		return StockLevel{}, invalid("opens_at", "must be before the sku's closes_at (%s)", l.ClosesAt.Format(time.RFC3339Nano))
	}
	if c.OpensAt == nil {
		return StockLevel{}, invalid("closes_at", "must be after the sku's opens_at (%s)", l.OpensAt.Format(time.RFC3339Nano))
	}
	return StockLevel{}, invalid("closes_at", "must be after opens_at")
}

// StockReport is a SKU's stock as both stores see it.
type StockReport struct {
	SKU            string
	MySQLAvailable int64
	RedisAvailable int64
	// Held is the units HELD in Redis, not yet decided. A transfer between
	// buckets credited ahead of its record holds its units in the giving
	// bucket and offers them in the receiving one: they count once, as
	// available, until the record.
	Held         int64
	Version      int64
	PerUserLimit int
	Buckets      int // K: the Redis figures are summed over the buckets
	// OpensAt and ClosesAt are MySQL's sale window (zero: no such bound).
	OpensAt, ClosesAt time.Time
	PayWithin         time.Duration // the SKU's pay window (0: none)
	AdmitPermille     int           // MySQL's waiting room (0: none; StockLevel.AdmitPermille)
}

// Drift is MySQL's figure minus what Redis accounts for; 0 at quiescence.
func (r StockReport) Drift() int64 { return r.MySQLAvailable - (r.RedisAvailable + r.Held) }

// InspectStock reads a SKU's stock from both stores, for operators and the
// load tool's invariant report.
func (s *Service) InspectStock(ctx context.Context, sku string) (StockReport, error) {
	if !ValidID(sku) {
		return StockReport{}, ErrUnknownSKU
	}
	level, err := s.ledger.Stock(ctx, sku)
	if err != nil {
		return StockReport{}, err
	}
	rep := StockReport{SKU: sku, MySQLAvailable: level.Available, Version: level.Version, PerUserLimit: level.PerUserLimit,
		Buckets: level.BucketCount(), OpensAt: level.OpensAt, ClosesAt: level.ClosesAt, PayWithin: level.PayWithin, AdmitPermille: level.AdmitPermille}
	for b := range level.BucketCount() {
		name := BucketName(sku, b)
		rs, err := s.figures.Stock(ctx, name)
		if errors.Is(err, ErrUnknownSKU) { // Redis lost it: warm it, as a buyer's request would
			if _, err := s.warm(ctx, sku, b); err != nil {
				return StockReport{}, err
			}
			rs, err = s.figures.Stock(ctx, name)
		}
		if err != nil {
			return StockReport{}, err
		}
		rep.RedisAvailable += rs.Available
		rep.Held += rs.Held - rs.Ahead
	}
	return rep, nil
}

// SetTo is the absolute change of sku to n units without a precondition:
// what creates a SKU (on an existing one ChangeStock asks for IfVersion).
func SetTo(sku string, n int64) StockChange { return StockChange{SKU: sku, Set: &n} }
