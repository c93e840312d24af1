package reservation

// The moves between buckets: refill (with its per-bucket lock, refilling,
// and the reads bucketStock and bucketFigures), cover and coverAfterReturn,
// transfer and its constants, carryOutTransfer and followStray.
//
// Buckets: one SKU's sellable stock split over K Redis buckets, each with
// its own hash tag, so that a cluster spreads one hot SKU over K shards.
//
// A buy is held in its buyer's home bucket (a hash of the user), so the
// per-user limit, the attempt rate and the idempotency record stay in one
// script call on one slot; a group join in bucket 0, where the SKU's groups
// live, so a group's slots stay exact. A bucket that runs dry is refilled from
// another through a transfer MySQL records (Service.refill): no buyer is told
// sold out while any bucket has the units. MySQL keeps each bucket's share of
// the SKU's available units (bucket 0's is the rest), so one bucket Redis
// lost is warmed alone. K = 1 is the layout of a SKU without buckets.

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"
)

// transferTTL is how long a transfer's hold may wait for MySQL before the
// sweeper fences it and its units return to the giving bucket. The
// transfer itself takes milliseconds.
const transferTTL = 10 * time.Second

// maxRefills bounds the rounds of refill and retry one reserve makes.
const maxRefills = 3

// transitWait and transitWaits bound how long a refill waits for units on
// their way between buckets that it needs (a transfer takes milliseconds;
// behind persist's batch on the stock row, longer): past it the buyer hears
// 503 and retries.
const (
	transitWait  = 5 * time.Millisecond
	transitWaits = 20
)

// transferTimeout bounds one transfer, which runs to its end even when the
// buyer who started it goes away: a transfer left half-way holds units until
// the sweeper decides it.
const transferTimeout = 5 * time.Second

// transferPause is how long an instance makes no transfer after MySQL
// failed to record one: each attempt holds units in the giving bucket until
// a fence decides them, so a MySQL outage must not freeze the stock one
// buyer at a time. Buyers of a dry bucket hear 503 meanwhile.
const transferPause = time.Second

// refill moves units into bucket home of sku from the other buckets, the
// fullest first, until home has need units: at least need from a bucket,
// and half of what it has, so that a bucket drained by its buyers draws
// once, not once per buyer. Buyers of one instance refill a bucket one at a
// time. Nothing moves when all the buckets together have fewer than need
// units (a request that cannot be served costs no transfer); with need 0
// (cover: home owes units) whatever the others have moves. Units on their
// way between buckets (another transfer, not decided yet) count: while they
// would make up the need it waits for them briefly, then answers 503, never
// sold out. A donor drained between the read and the move is read again: up
// to maxRefills passes. It reports whether home has need units now; an
// error (a store failed, or units still on their way) ends it.
func (s *Service) refill(ctx context.Context, sku string, home, k, need int) (bool, error) {
	mu := s.refilling(BucketName(sku, home))
	mu.Lock()
	defer mu.Unlock()
	waits := 0
	for pass := 0; pass < maxRefills; {
		mine, err := s.bucketFigures(ctx, sku, home)
		if err != nil {
			return false, err
		}
		have := mine.Available
		if have >= int64(need) {
			return true, nil // enough, perhaps refilled while this buyer waited
		}
		type donor struct {
			b     int
			avail int64
		}
		var donors []donor
		total, transit := have, mine.Moving
		for b := range k {
			if b == home {
				continue
			}
			rs, err := s.bucketFigures(ctx, sku, b)
			if err != nil {
				return false, err
			}
			total, transit = total+rs.Available, transit+rs.Moving
			if rs.Available > 0 {
				donors = append(donors, donor{b, rs.Available})
			}
		}
		if need > 0 && total < int64(need) {
			if total+transit < int64(need) {
				return false, nil // the buckets together cannot serve it: sold out
			}
			if waits++; waits > transitWaits {
				return false, Unavailable("refill", errors.New("units still on their way between buckets"))
			}
			s.sleep(ctx, transitWait)
			continue
		}
		if len(donors) == 0 {
			return false, nil // cover: nothing to pay the debt with yet
		}
		pass++
		sort.Slice(donors, func(i, j int) bool { return donors[i].avail > donors[j].avail })
		for _, d := range donors {
			want := max(int64(need)-have, 1)
			n := min(d.avail, max(want, (d.avail+1)/2))
			moved, err := s.transfer(ctx, sku, d.b, home, n)
			if err != nil {
				s.metrics.Count("transfer_failed", 1)
				return false, err
			}
			if moved {
				have += n
			}
			if have >= int64(need) {
				return true, nil
			}
		}
	}
	return false, nil
}

// cover refills the buckets of sku that owe units (below zero: an admin
// removal landed in bucket 0 while its units sat in other buckets) from the
// others, so that the buckets never offer more than the SKU has free.
func (s *Service) cover(ctx context.Context, sku string, k int) {
	for b := range k {
		rs, err := s.figures.Stock(ctx, BucketName(sku, b))
		if err == nil && rs.Available < 0 {
			if _, err := s.refill(ctx, sku, b, k, 0); err != nil {
				s.log.WarnContext(ctx, "cover: a bucket still owes units; the next sweep tries again", "sku", sku, "bucket", b, "error", err)
			}
		}
	}
}

// coverAfterReturn is told that units came back to a bucket of sku: with
// several buckets, they first pay what a bucket owes (cover).
func (s *Service) coverAfterReturn(ctx context.Context, sku string) {
	if l, err := s.layoutOf(ctx, sku); err == nil && l.k > 1 {
		s.cover(ctx, sku, l.k)
	}
}

// refilling returns the lock of one bucket's refills in this instance.
func (s *Service) refilling(name string) *sync.Mutex {
	mu, _ := s.refills.LoadOrStore(name, &sync.Mutex{})
	return mu.(*sync.Mutex)
}

// bucketStock returns the units bucket b of sku has free in Redis,
// warming it if Redis lost it.
func (s *Service) bucketStock(ctx context.Context, sku string, b int) (int64, error) {
	rs, err := s.bucketFigures(ctx, sku, b)
	return rs.Available, err
}

// bucketFigures returns bucket b of sku as Redis has it, warming it if
// Redis lost it.
func (s *Service) bucketFigures(ctx context.Context, sku string, b int) (RedisStock, error) {
	name := BucketName(sku, b)
	rs, err := s.figures.Stock(ctx, name)
	if errors.Is(err, ErrUnknownSKU) {
		if _, err = s.warm(ctx, sku, b); err != nil {
			return RedisStock{}, err
		}
		rs, err = s.figures.Stock(ctx, name)
	}
	return rs, err
}

// transfer moves n units of sku from bucket from to bucket into: the giving
// bucket holds them (TakeOut), MySQL records the move (Transfer), and Redis
// follows it — the hold confirmed, the units credited to into once. A crash
// anywhere leaves a hold the sweeper fences (its units go back) or a row
// whose credit the outbox completes. moved is false when the giving bucket
// no longer had n units.
func (s *Service) transfer(ctx context.Context, sku string, from, into int, n int64) (moved bool, err error) {
	if until, ok := s.transfersPaused.Load().(time.Time); ok && s.clock.Now().Before(until) {
		return false, Unavailable("transfer", errors.New("paused after mysql failed to record one"))
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), transferTimeout)
	defer cancel()
	t := Reservation{
		ID: ReservationID(ReserveRequest{SKU: sku}, nil), SKU: sku, Qty: int(n), Bucket: from,
		Transfer: true, Into: into, Token: newToken(), Status: StatusHeld,
	}
	held, err := s.holds.TakeOut(ctx, t, transferTTL)
	if errors.Is(err, ErrSoldOut) || errors.Is(err, ErrUnknownSKU) {
		return false, nil // drained, or lost, since it was read: read again
	}
	if err != nil {
		s.abandon(ctx, t) // the script may have run: its hold, if any, goes back now
		return false, fmt.Errorf("transfer %s: take out: %w", t.ID, err)
	}
	row, err := s.ledger.Transfer(ctx, held, s.clock.Now())
	if err != nil {
		// The record's outcome is unknown (it may have committed): decide
		// it through the fence at once, as an abandoned hold is, so the
		// units go back now rather than at the hold's deadline — or, if
		// MySQL cannot be asked either, the sweeper's.
		s.abandon(ctx, held)
		s.transfersPaused.Store(s.clock.Now().Add(transferPause))
		return false, fmt.Errorf("transfer %s: record: %w", t.ID, err)
	}
	if err := s.carryOutTransfer(ctx, row, row.TransferVersion); err != nil {
		// MySQL moved the units; the outbox completes the move in Redis.
		s.metrics.Count("follow_failed", 1)
		return false, fmt.Errorf("transfer %s: follow: %w", t.ID, err)
	}
	if row.Status != StatusConfirmed {
		return false, nil // fenced first: the units went back
	}
	s.metrics.Count("transfers", 1)
	s.soldOut.Delete(sku)
	return true, nil
}

// carryOutTransfer makes Redis follow a transfer's row: the units credited
// to the receiving bucket once, then its hold in the giving bucket confirmed
// (or, fenced, its units returned there); the row is released when both are
// done. The credit comes first: until the hold is decided its units count as
// on their way (meta.moving), so at no moment are they counted nowhere —
// for an instant they count twice, which only makes a refill wait. version
// is the record's commit version right after the commit (a hold the giving
// bucket lost is then taken from its stock, as persist's confirm does), 0
// later: from the outbox the hold may be gone for having finished
// (retention), not for having been lost, and taking again would take twice;
// reconciliation repairs the rare loss instead.
func (s *Service) carryOutTransfer(ctx context.Context, row Reservation, version int64) error {
	if row.Status == StatusConfirmed && row.Release == ReleaseOwed {
		_, err := s.holds.Credit(ctx, row)
		if errors.Is(err, ErrUnknownSKU) {
			if _, err = s.warm(ctx, row.SKU, row.Into); err == nil {
				_, err = s.holds.Credit(ctx, row)
			}
		}
		if err != nil {
			return fmt.Errorf("credit transfer %s: %w", row.ID, err)
		}
	}
	if _, err := s.holds.Follow(ctx, row, version); err != nil {
		return fmt.Errorf("follow transfer %s: %w", row.ID, err)
	}
	if row.Release != ReleaseOwed {
		return nil
	}
	if err := s.ledger.MarkReleased(ctx, row.ID); err != nil {
		return fmt.Errorf("mark released %s: %w", row.ID, err)
	}
	return nil
}

// followStray makes the hold of a reservation in bucket b follow MySQL's
// row when the row was decided for a hold in another bucket (K changed
// between the two holds): the hold there is a stray, returned if HELD, and
// nothing else moves — the row's own bucket follows it as always.
func (s *Service) followStray(ctx context.Context, row Reservation, b int) {
	if row.Bucket == b {
		return
	}
	stray := row
	stray.Bucket, stray.Release = b, ReleaseDone // the row's own give-back is not this bucket's
	if _, err := s.holds.Follow(ctx, stray, 0); err != nil {
		s.log.WarnContext(ctx, "a stray in another bucket did not follow mysql; the sweeper retries",
			"reservation_id", row.ID, "bucket", b, "error", err)
	}
}
