package reservation

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"errors"
	"time"
)

// Reserve: the buyer's path (one script call, one send), and the reads a
// buyer makes (Get, Available).

// ReserveRequest is a buyer's "buy" or "join group".
type ReserveRequest struct {
	SKU            string
	Qty            int
	UserID         string
	GroupID        string
	IdempotencyKey string // optional; the same key from the same user for the same SKU is the same reservation
	// Admission is the waiting room's admission token (Admission-Token),
	// needed on a SKU with a waiting room. It fixes the reservation's id
	// (the ticket's, as if it were the key): one ticket, one reservation,
	// and a retry is a replay.
	Admission string
}

// ReservationID returns the id of a request — "<sku>.<26 base32>" —
// derived from the idempotency key when there is one (so a retry lands on
// the same hold), random otherwise. A derived id is a keyed MAC of the
// buyer, the SKU and the key with the server's secret, so nobody can compute
// another buyer's id from a guessable key. The id names its SKU: see SKUOf.
func ReservationID(req ReserveRequest, secret []byte) string {
	var b [16]byte
	if req.IdempotencyKey == "" {
		_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	} else {
		mac := hmac.New(sha256.New, secret)
		mac.Write([]byte(req.UserID + "\x00" + req.SKU + "\x00" + req.IdempotencyKey))
		copy(b[:], mac.Sum(nil)[:16])
	}
	return req.SKU + "." + idEncoding.EncodeToString(b[:])
}

// idEncoding is base32 in lower case without padding: 26 characters for 128 bits.
var idEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// newToken names one incarnation of a hold (see Reservation.Token).
func newToken() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Reserve holds stock for a buyer and hands the reservation to persist.
// The result is HELD, or, for a replayed request, the reservation's current
// state (replayed true). A keyed request is judged against MySQL whenever
// Redis has no answer of its own (a new hold, a refusal, or a tombstone of
// the row in a bucket that had no hold of it: judgeTombstone): once MySQL
// has the row, the same request answers its decided state and takes
// nothing (a hold Redis took again is returned), and a different one is
// ErrIdempotencyMismatch, however long Redis has forgotten the hold. A
// keyed buy whose bucket holds every reservation of the SKU
// (ReserveOutcome.Whole) asks MySQL nothing: Redis's answer is whole. The
// buyer's attempt rate is charged before MySQL is asked, one token an
// attempt from one budget per buyer and SKU, joins and buys alike; the
// script charges a request that mismatches the id's hold before it answers
// ErrIdempotencyMismatch (over the rate: *RateLimitedError). If the
// hand-off of a request without a key fails, the reservation is cancelled
// through the fenced decision before Reserve returns ErrUnavailable, so the
// caller holds nothing (if even that cannot be decided, MySQL down, the hold
// stays for the sweeper); a keyed request's hold stays for its retry. A keyed
// join whose check in MySQL cannot be made is ErrUnavailable, nothing taken.
func (s *Service) Reserve(ctx context.Context, req ReserveRequest) (Reservation, bool, error) {
	var ticket string
	var ends time.Time
	if req.Admission != "" {
		// A genuine admission past its time still names its id: a retry of
		// a reserve held in time replays it (Redis's hold, else MySQL's row:
		// judgeKeyed), and a new hold is refused by the script.
		var err error
		if ticket, ends, err = s.admitted(req.Admission, req.SKU, req.UserID); err != nil && !errors.Is(err, ErrAdmissionExpired) {
			return Reservation{}, false, err
		}
		req.IdempotencyKey = "admission:" + ticket
	}
	r, err := s.newReservation(req)
	if err != nil {
		return Reservation{}, false, err
	}
	r.Ticket, r.TicketExpires = ticket, ends
	keyed := req.IdempotencyKey != ""
	now := s.clock.Now()
	// A sold-out SKU is answered here for a short while. Not for a request
	// with an idempotency key: it may be the replay of a reservation that exists.
	if until, ok := s.soldOut.Load(r.SKU); ok && !keyed && now.Before(until.(time.Time)) {
		s.metrics.Count("sold_out", 1)
		return Reservation{}, false, ErrSoldOut
	}
	l, err := s.layoutOf(ctx, r.SKU)
	if err != nil {
		return Reservation{}, false, err
	}
	r.Bucket = HomeBucket(r.UserID, r.GroupID, l.k)
	if err := s.chargeAway(ctx, &r, keyed, l.k); err != nil {
		return Reservation{}, false, err
	}
	// A keyed buy runs the script first, so the buyer's attempt rate is
	// charged before any MySQL read: a scalper's thousands of fresh keys cost
	// Redis, not the arbiter; MySQL is asked only when Redis has no final
	// answer (judgeKeyed), and not while the bucket holds every reservation
	// of the SKU (out.Whole: an id it has no hold of has no row either), so
	// neither a sale's new holds nor a sold-out crowd's refusals read MySQL. A keyed join, charged above, asks MySQL first: a
	// hold the script took again for a decided id would be told 202 and hold
	// a slot in this request's group until returning the stray frees it, and
	// the group might form on it first.
	checked := false
	if keyed && r.GroupID != "" {
		if row, ok, err := s.decidedRow(ctx, r, true); ok || err != nil {
			if err != nil {
				return Reservation{}, false, err
			}
			return row, true, nil
		}
		checked = true
	}
	if keyed && l.k > 1 {
		if mismatch, err := s.crossBucketMismatch(ctx, r, l); err != nil || mismatch {
			if err == nil {
				err = s.chargeMismatch(ctx, r, l.k)
			}
			return Reservation{}, false, err
		}
	}
	held, out, err, failed := s.hold(ctx, r, l.k)
	if failed != nil {
		return Reservation{}, false, failed
	}
	whole := out.Whole && r.GroupID == "" && l.k == 1
	if keyed && !checked && !whole {
		if row, ok, jerr := s.judgeKeyed(ctx, r, held, err); ok || jerr != nil {
			return row, jerr == nil, jerr
		}
	}
	if err != nil {
		return Reservation{}, false, s.refused(ctx, r, keyed, now, err)
	}
	if out.Replayed && held.Status.Final() {
		if out.Tombstone && !checked {
			return s.judgeTombstone(ctx, r, held)
		}
		return held, true, nil
	}
	if h := s.hooks.AfterHold; h != nil {
		if err := h(held); err != nil {
			return Reservation{}, false, err
		}
	}
	return s.handOff(ctx, held, out, keyed)
}

// newReservation is the HELD reservation a request asks for, with its id
// and a fresh token, or the request's first problem.
func (s *Service) newReservation(req ReserveRequest) (Reservation, error) {
	if len(req.IdempotencyKey) > 128 {
		return Reservation{}, invalid("Idempotency-Key", "must be at most 128 characters")
	}
	r := Reservation{
		ID: ReservationID(req, s.idSecret), SKU: req.SKU, Qty: req.Qty, UserID: req.UserID, GroupID: req.GroupID,
		Token: newToken(), Status: StatusHeld,
	}
	return r, r.Validate(s.cfg.MaxQty)
}

// chargeAway charges a join's attempt before its script runs, when the
// script cannot: one attempt, one token of the buyer's one budget on the
// SKU, which lives in their home bucket, and a buy's script charges it in
// the same call. A join is held in bucket 0, so when the buyer's home is
// another bucket it is charged there first — joins and buys draw on one
// budget on any K. A keyed join is charged first too, even at home: it asks
// MySQL before the script, and an attempt over the rate reads nothing.
func (s *Service) chargeAway(ctx context.Context, r *Reservation, keyed bool, k int) error {
	home := HomeBucket(r.UserID, "", k)
	if r.GroupID == "" || (!keyed && home == r.Bucket) {
		return nil
	}
	if err := s.holds.Charge(ctx, Attempt{SKU: r.SKU, Bucket: home, UserID: r.UserID, Token: r.Token}); err != nil {
		if errors.Is(err, ErrRateLimited) {
			s.metrics.Count("rate_limited", 1)
		}
		return err
	}
	r.AlreadyCharged = true
	return nil
}

// chargeMismatch answers a keyed request that crossBucketMismatch found
// held for another request: an attempt like any other, charged to the
// buyer's budget before it is answered ErrIdempotencyMismatch (the script,
// which would charge it, never runs; a storm of them was free), or
// *RateLimitedError past the budget. A join was charged already
// (chargeAway).
func (s *Service) chargeMismatch(ctx context.Context, r Reservation, k int) error {
	if r.AlreadyCharged {
		return ErrIdempotencyMismatch
	}
	err := s.holds.Charge(ctx, Attempt{SKU: r.SKU, Bucket: HomeBucket(r.UserID, "", k), UserID: r.UserID, Token: r.Token})
	switch {
	case errors.Is(err, ErrRateLimited):
		s.metrics.Count("rate_limited", 1)
		return err
	case err != nil:
		return err
	}
	return ErrIdempotencyMismatch
}

// hold runs the reserve script for r: once, again after warming a bucket
// Redis lost, and again after each refill of a bucket that ran dry (bounded),
// so no buyer hears sold out while the SKU has stock anywhere. The buyer's
// attempt is charged once, by the first call that ran. err is the script's
// last answer; failed ends the request as it is (the warm-up or a refill
// failed: nothing is held for the buyer, and MySQL is not asked again).
func (s *Service) hold(ctx context.Context, r Reservation, k int) (held Reservation, out ReserveOutcome, err, failed error) {
	s.touch(ctx, r.SKU)
	held, out, err = s.holds.Reserve(ctx, r, s.cfg.HoldTTL)
	if errors.Is(err, ErrUnknownSKU) {
		// Redis may have lost the bucket (failover, flush): warm it from
		// MySQL once and try again; MySQL says whether the SKU exists at all.
		if _, werr := s.warm(ctx, r.SKU, r.Bucket); werr != nil {
			if errors.Is(werr, ErrUnknownSKU) {
				s.withdraw(ctx, r.SKU)
			}
			return Reservation{}, ReserveOutcome{}, nil, werr
		}
		r.AlreadyCharged = true // the script charged this attempt before it found no stock
		held, out, err = s.holds.Reserve(ctx, r, s.cfg.HoldTTL)
	}
	for round := 0; k > 1 && errors.Is(err, ErrSoldOut) && round < maxRefills; round++ {
		ok, rerr := s.refill(ctx, r.SKU, r.Bucket, k, r.Qty)
		if rerr != nil {
			// A store failed mid-refill: not the stock's answer. Nothing
			// is held for this buyer; the client retries.
			s.log.WarnContext(ctx, "reserve: refill failed", "sku", r.SKU, "bucket", r.Bucket, "error", rerr)
			return Reservation{}, ReserveOutcome{}, nil, Unavailable("reserve refill", rerr)
		}
		if !ok {
			break
		}
		r.AlreadyCharged = true // one attempt of the buyer's, charged once
		held, out, err = s.holds.Reserve(ctx, r, s.cfg.HoldTTL)
	}
	return held, out, err, nil
}

// judgeKeyed asks MySQL about a keyed request when Redis had no answer of
// its own: ok with the row when MySQL decided the id for this request (the
// answer is the row), or ErrIdempotencyMismatch. Redis may have forgotten a
// reservation MySQL decided: a replay of it is answered with its row, not
// refused for today's stock (a refusal), and a hold the script took again
// is a stray, which follows the row back (a new hold). MySQL unreachable:
// not ok; persist recognises a stray by its token and returns it.
func (s *Service) judgeKeyed(ctx context.Context, r, held Reservation, err error) (Reservation, bool, error) {
	newHold := err == nil && !held.Status.Final()
	if !newHold && (err == nil || !refusal(err)) {
		return Reservation{}, false, nil
	}
	row, ok, rerr := s.decidedRow(ctx, r, false)
	if !ok && rerr == nil {
		return Reservation{}, false, nil
	}
	if newHold {
		s.followStray(ctx, row, held.Bucket) // the row's hold was in another bucket
		s.carryOut(ctx, row, 0)
	}
	if rerr != nil {
		return Reservation{}, false, rerr
	}
	return row, true, nil
}

// judgeTombstone answers a keyed replay that found a final tombstone of
// the row in a bucket that held no hold of the row's own: the row's hold
// was in another bucket (K changed since, or a twin) or Redis lost it. Such
// a tombstone is a copy of the row as it stood when it was written; the
// row's own bucket follows its later changes (a refund), this one does not.
// So MySQL answers, by primary key (the replay was charged an attempt
// first, so these reads are rate-bound). A replay of a final hold a bucket
// took itself — every replay while K is unchanged and Redis kept the hold —
// is answered by Redis alone. MySQL unreachable: ErrUnavailable, never the
// stale copy (the client retries; nothing was taken).
func (s *Service) judgeTombstone(ctx context.Context, r, tomb Reservation) (Reservation, bool, error) {
	row, ok, err := s.decidedRow(ctx, r, true)
	switch {
	case err != nil:
		return Reservation{}, false, err
	case !ok: // MySQL has no row: the tombstone is all there is
		return tomb, true, nil
	}
	return row, true, nil
}

// refused counts a refusal and returns it. A buy of one unit refused as
// sold out is remembered for a while (a bigger one may be refused while
// smaller ones can still be served); a request without a key whose Redis
// call failed is abandoned (it may have left a hold).
func (s *Service) refused(ctx context.Context, r Reservation, keyed bool, now time.Time, err error) error {
	switch {
	case errors.Is(err, ErrRateLimited):
		s.metrics.Count("rate_limited", 1)
	case errors.Is(err, ErrNotOpen):
		s.metrics.Count("not_open", 1)
	case errors.Is(err, ErrSaleClosed):
		s.metrics.Count("sale_closed", 1)
	}
	if errors.Is(err, ErrSoldOut) {
		s.metrics.Count("sold_out", 1)
		if s.cfg.SoldOutTTL > 0 && r.GroupID == "" && r.Qty == 1 {
			s.soldOut.Store(r.SKU, now.Add(s.cfg.SoldOutTTL))
		}
	}
	if errors.Is(err, ErrUnavailable) && !keyed {
		s.abandon(ctx, r)
	}
	return err
}

// handOff sends a hold to persist and answers the buyer. A replay of a HELD
// hold sends again: the first attempt may have crashed between the deduct
// and the send. Persist takes each id at most once. A join is accepted —
// told 202 — only once its hold is marked so (AcceptJoin: its slot counts
// from then on; until then it may be a send in flight, which may still
// fail). If the mark fails, it is answered as a failed send (sendFailed).
func (s *Service) handOff(ctx context.Context, held Reservation, out ReserveOutcome, keyed bool) (Reservation, bool, error) {
	err := s.queue.Enqueue(ctx, held)
	var full bool
	if err == nil && held.GroupID != "" {
		full, err = s.holds.AcceptJoin(ctx, held)
	}
	if err != nil {
		return s.sendFailed(ctx, held, out, keyed, err)
	}
	if !out.Replayed {
		s.metrics.Count("reserved", 1)
	}
	if held.GroupID != "" && (full || out.Full) {
		// An accepted join that leaves no slot free forms the group — once
		// every join holding a slot is accepted too (recordFormed): the last
		// of them to be accepted, or persist, or the sweeper records it.
		// MySQL records it (unless a member's cancellation is still on its
		// way to Redis), then Redis.
		s.formGroup(ctx, Group{ID: held.GroupID, SKU: held.SKU}, held.CreatedAt, full)
	}
	return held, out.Replayed, nil
}

// sendFailed answers a hold whose send (or a join's mark) failed.
//   - A replay of an accepted hold answers HELD and cancels nothing: the
//     first send (or, failing it, the sweeper) still decides the hold.
//   - A keyed request's hold is not fenced: the 503 tells the client to
//     retry with the same key, and that retry replays and re-sends this hold
//     (or the sweeper expires it). Fencing would turn the retry into a
//     CANCELLED answer for good, and could cancel a reservation an earlier
//     attempt with the key was told 202 for. A replayed join never accepted
//     before (its first send failed, or its reserve died first) is not
//     accepted now either: its retry is answered as its first attempt was.
//   - Otherwise the hold is fenced at once (publish_failed), so the 503
//     holds nothing; if the send went through after all and persist
//     confirmed it first, the answer is the CONFIRMED row.
func (s *Service) sendFailed(ctx context.Context, held Reservation, out ReserveOutcome, keyed bool, err error) (Reservation, bool, error) {
	s.metrics.Count("publish_failed", 1)
	if out.Replayed && (held.GroupID == "" || held.Sent) {
		s.log.WarnContext(ctx, "reserve: re-send of a replayed hold failed", "reservation_id", held.ID, "error", err)
		return held, true, nil
	}
	if keyed {
		s.log.WarnContext(ctx, "reserve: send failed; the hold waits for a retry with the same key", "reservation_id", held.ID, "error", err)
		return Reservation{}, false, Unavailable("reserve enqueue", err)
	}
	final, ferr := s.fence(ctx, held, ReasonPublishFailed)
	if ferr != nil {
		s.log.ErrorContext(ctx, "reserve: enqueue failed and the hold is left to the sweeper",
			"reservation_id", held.ID, "enqueue_error", err, "fence_error", ferr)
		return Reservation{}, false, Unavailable("reserve enqueue", err)
	}
	if final.Status == StatusConfirmed {
		return final, true, nil // the send that reported failure went through and was persisted
	}
	return Reservation{}, false, Unavailable("reserve enqueue", err)
}

// refusal reports the script's answers that refuse a request for the state
// of the SKU or group today (not a fault, not the buyer's rate). A closed
// sale is one: a keyed replay of a reservation MySQL decided, whose hold
// Redis has forgotten, answers its row after the close too. A sale not open
// yet is not: before it opens nothing has been decided (unless an admin
// moved the window back after selling, and the hold is gone too), and a
// crowd waiting with keys must cost MySQL nothing.
func refusal(err error) bool {
	for _, e := range []error{ErrSoldOut, ErrGroupFull, ErrGroupClosed, ErrAlreadyJoined, ErrLimitExceeded, ErrUnknownGroup, ErrSaleClosed,
		ErrAdmissionExpired} { // a ticket's admission lapsed in Redis, which may have lost its hold
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// decidedRow looks a keyed request's id up in MySQL: ok with the row when
// MySQL decided it for the same request, ErrIdempotencyMismatch when for
// another; not ok (and no error) when MySQL has no row. When MySQL cannot be
// asked it is not ok with no error too, unless must: then ErrUnavailable.
// A keyed join must know (the caller answers 503 and takes nothing): the id
// names the buyer, the SKU and the key but not the group, so a join taken
// again for a decided id in another group would hold a slot there until
// returning the stray frees it, and the group might form on it first.
// Found by an adversarial review of issue 22: such a phantom member kept
// the other group one slot short for good (the stray's follow did not free
// it then).
func (s *Service) decidedRow(ctx context.Context, r Reservation, must bool) (Reservation, bool, error) {
	row, err := s.ledger.Reservation(ctx, r.ID)
	switch {
	case err == nil:
		if row.Qty != r.Qty || row.UserID != r.UserID || row.GroupID != r.GroupID {
			return row, false, ErrIdempotencyMismatch
		}
		return row, true, nil
	case errors.Is(err, ErrNotFound):
	case must:
		return Reservation{}, false, Unavailable("reserve: idempotency check in mysql", err)
	default:
		s.log.WarnContext(ctx, "reserve: idempotency check in mysql failed", "reservation_id", r.ID, "error", err)
	}
	return Reservation{}, false, nil
}

// abandon fences a reservation without an idempotency key whose Redis call
// failed with an unknown outcome (a timeout, a reset): the script may have
// run and left a hold that no message will ever settle. Its id is random, so
// no earlier attempt can have been accepted under it: fence and release it
// now, within a short bound, so the 503 holds nothing; if Redis or MySQL is
// still down the sweeper finds the hold at its deadline. A keyed request is
// never abandoned: an earlier attempt with the same key may have been told
// 202, and its hold must stand.
func (s *Service) abandon(ctx context.Context, r Reservation) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	if _, err := s.fence(ctx, r, ReasonHoldFailed); err != nil {
		s.log.WarnContext(ctx, "reserve: abandoned hold left to the sweeper", "reservation_id", r.ID, "error", err)
	}
}

// maxWarmHolds bounds the HELD holds a warm-up checks against MySQL; past
// it the warm-up counts them all as undecided (Redis shows fewer units until
// their confirms arrive: the safe side).
const maxWarmHolds = 5000

// warm loads bucket b of a SKU Redis has no stock for from MySQL, counting
// every unit once: the HELD holds Redis still has are read first, then
// MySQL's level (the bucket's share) and which of them it has confirmed in
// one consistent read, then the script refuses a level older than a
// confirm it has already seen (it would miss that confirm's deduction):
// read again.
func (s *Service) warm(ctx context.Context, sku string, b int) (warmed bool, err error) {
	return s.warmBucket(ctx, sku, b, false)
}

// warmBucket is warm; created says it is the warm-up of the change that
// created the SKU. Only that one may make a bucket that holds every
// reservation of the SKU (checkFirst): any other may follow a loss of
// Redis while holds were on their way to persist, whose rows MySQL does
// not have yet, and whose decisions may never reach Redis (an adversarial
// review reproduced both).
func (s *Service) warmBucket(ctx context.Context, sku string, b int, created bool) (warmed bool, err error) {
	name := BucketName(sku, b)
	if !created {
		// Counted before it may load the bucket: a creation's warm-up that
		// loaded it first sees this one and ends its whole (checkFirst).
		if _, _, err := s.ledger.CountWarmUp(ctx, sku); err != nil {
			return false, err
		}
	}
	for range 3 {
		ids, err := s.figures.HeldIDs(ctx, name, maxWarmHolds)
		if err != nil {
			return false, err
		}
		level, confirmed, err := s.ledger.Snapshot(ctx, sku, ids)
		if err != nil {
			return false, err
		}
		level.Created = created
		share := level.Bucket(b)
		res, err := s.figures.Warm(ctx, share, ids, confirmed)
		if err != nil {
			return false, err
		}
		if res == SyncWarmed {
			s.metrics.Count("warmed", 1)
			s.log.InfoContext(ctx, "warmed sku from mysql", "sku", sku, "bucket", b, "available", share.Available, "holds", len(ids))
			if created {
				return true, s.checkFirst(ctx, sku, name)
			}
		}
		if res != SyncStale {
			return res == SyncWarmed, nil
		}
	}
	return false, Unavailable("warm "+sku, errors.New("mysql level keeps moving"))
}

// checkFirst keeps the whole a creation's warm-up gave bucket name only if
// it was the SKU's first warm-up, counted after it loaded the bucket, and
// MySQL has no reservation row of the SKU (a SKU of the same name removed
// by hand leaves its rows). A buyer may have warmed the SKU between the
// creation's commit and its warm-up, taken a hold, and Redis may have lost
// both since, the hold's message still on its way to persist (an
// adversarial review reproduced it). Every other warm-up counts itself
// before it loads a bucket, so such a one is seen here. If the count or
// the end fails, the error says so.
func (s *Service) checkFirst(ctx context.Context, sku, name string) error {
	n, reserved, err := s.ledger.CountWarmUp(ctx, sku)
	if err == nil && n == 1 && !reserved {
		return nil
	}
	if eerr := s.figures.EndWhole(ctx, name); eerr != nil {
		s.log.ErrorContext(ctx, "warm: a bucket left whole after a warm-up that may not be the sku's first", "sku", sku, "count_error", err, "error", eerr)
		return eerr
	}
	return err
}

// Get returns a reservation of user's: MySQL's row once MySQL has decided
// it, the Redis hold (HELD) until then. ErrNotFound if neither store knows
// the id, or it is another user's (the same answer, so ids cannot be
// probed); an id naming a SKU MySQL does not have is answered without
// reading the row (unknownSKUOf). With MySQL unreachable, Redis's view is
// the answer.
func (s *Service) Get(ctx context.Context, id, user string) (Reservation, error) {
	if !ValidReservationID(id, "") || s.unknownSKUOf(ctx, id) {
		return Reservation{}, ErrNotFound
	}
	row, err := s.ledger.Reservation(ctx, id)
	if err == nil {
		return owned(row, user)
	}
	h, herr := s.holdOf(ctx, id, user)
	switch {
	case herr == nil:
		return owned(h, user)
	case !errors.Is(err, ErrNotFound):
		return Reservation{}, err
	default:
		return Reservation{}, herr
	}
}

// owned returns r if user owns it, else ErrNotFound (never "forbidden":
// another buyer's id must look like an unknown one).
func owned(r Reservation, user string) (Reservation, error) {
	if r.UserID != user {
		return Reservation{}, ErrNotFound
	}
	return r, nil
}

// holdOf finds user's hold of id in Redis: in their home bucket, in bucket
// 0 (a group join's), or — held before K was raised — in any other.
func (s *Service) holdOf(ctx context.Context, id, user string) (Reservation, error) {
	sku, _ := SKUOf(id)
	k, err := s.bucketsOf(ctx, sku)
	if errors.Is(err, ErrUnknownSKU) {
		return Reservation{}, ErrNotFound
	}
	if err != nil {
		return Reservation{}, err
	}
	home := HomeBucket(user, "", k)
	order := []int{home}
	for b := range k {
		if b != home {
			order = append(order, b)
		}
	}
	for _, b := range order {
		h, err := s.holds.Hold(ctx, id, b)
		if !errors.Is(err, ErrNotFound) {
			return h, err
		}
	}
	return Reservation{}, ErrNotFound
}

// SKUState is what a buyer's page shows of a SKU: the units it can still
// reserve, its sale window (zero: no such bound) and Redis's clock, the one
// the window is judged by, so a page counts down without trusting the
// buyer's clock.
type SKUState struct {
	SKU               string
	Available         int64
	OpensAt, ClosesAt time.Time
	Now               time.Time
	WaitingRoom       bool // buyers queue first (bucket 0's figures say so)
}

// SKU returns the SKU's state as Redis has it (warmed from MySQL when Redis
// lost it): Available summed over its buckets, the window bucket 0 carries.
func (s *Service) SKU(ctx context.Context, sku string) (SKUState, error) {
	if !ValidID(sku) {
		return SKUState{}, ErrUnknownSKU
	}
	k, err := s.bucketsOf(ctx, sku)
	if err != nil {
		return SKUState{}, err
	}
	st := SKUState{SKU: sku}
	for b := range k {
		rs, err := s.bucketFigures(ctx, sku, b)
		if err != nil {
			return SKUState{}, err
		}
		st.Available += rs.Available
		if b == 0 {
			st.OpensAt, st.ClosesAt, st.WaitingRoom = rs.OpensAt, rs.ClosesAt, rs.AdmitPermille > 0
		}
	}
	if st.Now, err = s.slots.Now(ctx); err != nil {
		return SKUState{}, err
	}
	return st, nil
}

// Available returns the units buyers can still reserve (the Redis figure,
// summed over the SKU's buckets).
func (s *Service) Available(ctx context.Context, sku string) (int64, error) {
	if !ValidID(sku) {
		return 0, ErrUnknownSKU
	}
	k, err := s.bucketsOf(ctx, sku)
	if err != nil {
		return 0, err
	}
	var sum int64
	for b := range k {
		n, err := s.bucketStock(ctx, sku, b)
		if err != nil {
			return 0, err
		}
		sum += n
	}
	return sum, nil
}
