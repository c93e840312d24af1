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

// transferTTL is how long a transfer's hold waits for persist to record it
// before the sweeper records it instead (it is completed forward, never
// fenced). Persist takes milliseconds to seconds.
const transferTTL = 10 * time.Second

// maxRefills bounds the rounds of refill and retry one reserve makes.
const maxRefills = 3

// transitWait and transitWaits bound how long a refill waits for units on
// their way between buckets that it needs: another instance's transfer,
// between its take-out and its credit (two Redis round trips). Past it the
// buyer hears 503 and retries.
const (
	transitWait  = time.Millisecond
	transitWaits = 50
)

// transferTimeout bounds one transfer's Redis calls and send, which run to
// their end even when the buyer who started it goes away: a transfer left
// half-way holds units until persist or the sweeper records it.
const transferTimeout = 5 * time.Second

// refill moves units into bucket home of sku from the other buckets, the
// fullest first, until home has need units: at least need from a bucket,
// and half of what it has, so that a bucket drained by its buyers draws
// once, not once per buyer. Buyers of one instance refill a bucket one at a
// time. Nothing moves when all the buckets together have fewer than need
// units (a request that cannot be served costs no transfer); with need 0
// (cover: home owes units) whatever the others have moves. Units on their
// way between buckets (another instance's transfer, taken out and not
// credited yet: a round trip) count: while they would make up the need it
// waits for them briefly, then answers 503, never sold out. A donor drained
// between the read and the move is read again: up to maxRefills passes,
// then 503 (the buckets had the units). It reports whether home has need
// units now; an error (a store failed, or units still on their way) ends it.
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
	if need > 0 {
		// The buckets had the units, but their donors drained (or the
		// moves did not land) faster than this refill could move them:
		// not sold out, a retry may be served.
		return false, Unavailable("refill", errors.New("the buckets drained while refilling"))
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

// transfer moves n units of sku from bucket from to bucket into without
// MySQL: the giving bucket holds them (TakeOut), the receiving bucket is
// credited at once (Credit, ahead of the record) and the giving bucket told
// they landed, and the transfer goes to persist like a buyer's reservation,
// which records it in MySQL (Ledger.Transfer) and confirms the hold. A
// transfer is completed forward, never fenced: the units are in the
// receiving bucket already. If the send fails it is recorded here; if that
// fails too, or the process dies on the way, the sweeper records it at the
// hold's deadline (completeTransfer). moved is false when the giving bucket
// no longer had n units, or the credit did not land.
func (s *Service) transfer(ctx context.Context, sku string, from, into int, n int64) (moved bool, err error) {
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
		// The script may have run: its hold, if any, is recorded by the
		// sweeper at its deadline and its units then credited.
		return false, fmt.Errorf("transfer %s: take out: %w", t.ID, err)
	}
	moved, err = s.creditAhead(ctx, held)
	switch {
	case err != nil:
		s.metrics.Count("follow_failed", 1)
		s.log.WarnContext(ctx, "a transfer's credit did not land; its record credits it", "transfer_id", held.ID, "error", err)
	case !moved:
		// The receiving shard's clock is past the hold's deadline already
		// (shard clocks apart by more than transferTTL): no credit ahead,
		// so the record now, with MySQL on this path, credits it.
		_, err := s.completeTransfer(ctx, held)
		if err != nil {
			s.log.WarnContext(ctx, "a transfer is not recorded yet; the sweeper records it", "transfer_id", held.ID, "error", err)
		}
		moved = err == nil
		return moved, nil
	}
	if s.queue == nil || s.queue.Enqueue(ctx, held) != nil {
		// No queue here (persist, the sweeper: MySQL is at hand), or the
		// send failed: record it now. If MySQL fails too, the sweeper does.
		if _, err := s.completeTransfer(ctx, held); err != nil {
			s.log.WarnContext(ctx, "a transfer is not recorded yet; the sweeper records it", "transfer_id", held.ID, "error", err)
		}
	}
	if !moved {
		return false, nil
	}
	s.metrics.Count("transfers", 1)
	s.soldOut.Delete(sku)
	return true, nil
}

// creditAhead credits a transfer's units to its receiving bucket before
// MySQL records it, warming the bucket if Redis lost it, then tells the
// giving bucket they landed. credited is false when the credit came too
// late (the hold's deadline passed: its record credits it).
func (s *Service) creditAhead(ctx context.Context, held Reservation) (credited bool, err error) {
	ahead := held
	ahead.TransferVersion = 0
	credited, err = s.credit(ctx, ahead)
	if err != nil || !credited {
		return false, err
	}
	// Landed failing only leaves the units counted as on their way until
	// the record's confirm: a refill short of them answers 503 meanwhile.
	if err := s.holds.Landed(ctx, held); err != nil {
		s.log.WarnContext(ctx, "a transfer's giving bucket did not hear it landed; its confirm tells it", "transfer_id", held.ID, "error", err)
	}
	return true, nil
}

// credit credits the transfer t to its receiving bucket (Holds.Credit),
// warming the bucket first if Redis lost it.
func (s *Service) credit(ctx context.Context, t Reservation) (bool, error) {
	credited, err := s.holds.Credit(ctx, t)
	if errors.Is(err, ErrUnknownSKU) {
		if _, err = s.warm(ctx, t.SKU, t.Into); err == nil {
			credited, err = s.holds.Credit(ctx, t)
		}
	}
	return credited, err
}

// persistTransfer completes the transfer a message names (persist and
// compensate) when Redis backs it: its giving bucket holds it under the
// message's token, quantity and receiving bucket. A transfer MySQL recorded
// already is carried out again (a redelivery). One neither Redis nor MySQL
// knows is dropped, nothing moved: a forged message, or a transfer whose
// giving bucket forgot the hold before anything else happened — if its units
// were credited ahead, the receiving bucket's sweep records it from there.
func (s *Service) persistTransfer(ctx context.Context, t Reservation) (Reservation, error) {
	h, err := s.holds.Hold(ctx, t.ID, t.Bucket)
	if err == nil && h.Transfer && h.Token == t.Token && h.Into == t.Into && h.Qty == t.Qty {
		return s.completeTransfer(ctx, t)
	}
	if err != nil && !errors.Is(err, ErrNotFound) {
		return t, fmt.Errorf("transfer %s: read its hold: %w", t.ID, err)
	}
	row, err := s.ledger.Reservation(ctx, t.ID)
	if errors.Is(err, ErrNotFound) || (err == nil && !row.Transfer) {
		s.metrics.Count("transfers_unbacked", 1)
		s.log.WarnContext(ctx, "a transfer message no hold backs; dropped, nothing moved", "transfer_id", t.ID)
		return t, nil
	}
	if err != nil {
		return t, fmt.Errorf("transfer %s: read its row: %w", t.ID, err)
	}
	if err := s.carryOutTransfer(ctx, row, 0); err != nil {
		s.metrics.Count("follow_failed", 1)
		s.log.WarnContext(ctx, "redis did not follow a recorded transfer yet; the sweeper retries", "transfer_id", row.ID, "error", err)
	}
	return row, nil
}

// completeTransfer records the transfer t in MySQL (a repeat finds its row)
// and makes Redis follow the row: persist, compensate and the sweeper
// complete every transfer forward this way. An error means MySQL did not
// record it (the message is redelivered, or the next sweep tries again); a
// failure of Redis to follow is left to the outbox.
func (s *Service) completeTransfer(ctx context.Context, t Reservation) (Reservation, error) {
	row, recorded, err := s.ledger.Transfer(ctx, t, s.clock.Now())
	if err != nil {
		return t, fmt.Errorf("record transfer %s: %w", t.ID, err)
	}
	var version int64
	if recorded {
		// Right after the commit the giving bucket's hold is HELD, or lost
		// with its bucket (then its units are taken from stock, as persist's
		// confirm does); later, from a repeat, it may be gone with retention.
		version = row.TransferVersion
	}
	if err := s.carryOutTransfer(ctx, row, version); err != nil {
		s.metrics.Count("follow_failed", 1)
		s.log.WarnContext(ctx, "redis did not follow a recorded transfer yet; the sweeper retries", "transfer_id", row.ID, "error", err)
	}
	return row, nil
}

// carryOutTransfer makes Redis follow a transfer's row: the units credited
// to the receiving bucket once (a no-op after the credit ahead of the
// record, unless that bucket lost it), then its hold in the giving bucket
// confirmed; the row is released when both are done. A transfer row fenced
// CANCELLED (only a release before transfers were completed forward wrote
// one) has its units returned to the giving bucket and credits nothing.
// version is the record's commit version right after the commit (a hold
// the giving bucket lost is then taken from its stock, as persist's confirm
// does), 0 later: from the outbox or a repeat the hold may be gone for
// having finished (retention), not for having been lost, and taking again
// would take twice; reconciliation repairs the rare loss instead.
func (s *Service) carryOutTransfer(ctx context.Context, row Reservation, version int64) error {
	if row.Status == StatusConfirmed && row.Release == ReleaseOwed {
		if _, err := s.credit(ctx, row); err != nil {
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
	stray.PayBy = time.Time{}                    // nor its unpaid units, counted in its own bucket
	if _, err := s.holds.Follow(ctx, stray, 0); err != nil {
		s.log.WarnContext(ctx, "a stray in another bucket did not follow mysql; the sweeper retries",
			"reservation_id", row.ID, "bucket", b, "error", err)
	}
}
