package reservation

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"strings"
	"sync"
	"time"
)

// Config holds the protocol's tunables.
type Config struct {
	HoldTTL         time.Duration // how long a hold may stay HELD before the sweeper decides it
	MaxQty          int           // per-request quantity limit
	GroupTTL        time.Duration // default group deadline
	MaxGroupTTL     time.Duration // longest group deadline a caller may ask for
	PersistAttempts int           // optimistic attempts per message before it is redelivered
	SweepGrace      time.Duration // allowance for clock skew before a deadline counts as passed
	SweepBatch      int           // holds, groups and events handled per SKU per sweep
	ReconcileAfter  time.Duration // how long a Redis–MySQL drift must persist before the sweeper heals it
	// SoldOutTTL is how long an instance answers sold_out for a SKU without
	// asking Redis after Redis said so (0: always ask). A restock or cancel
	// through the same instance clears it at once; elsewhere it is at most
	// this stale.
	SoldOutTTL time.Duration
}

// DefaultConfig is what production runs unless told otherwise.
func DefaultConfig() Config {
	return Config{
		HoldTTL:         5 * time.Minute,
		MaxQty:          10,
		GroupTTL:        24 * time.Hour,
		MaxGroupTTL:     7 * 24 * time.Hour,
		PersistAttempts: 8,
		SweepGrace:      5 * time.Second,
		SweepBatch:      500,
		ReconcileAfter:  50 * time.Second,
		SoldOutTTL:      500 * time.Millisecond,
	}
}

// Service runs the protocol. Its methods are what the handlers call.
type Service struct {
	cfg      Config
	holds    Holds
	ledger   Ledger
	queue    Enqueuer
	notifier Notifier
	metrics  Metrics
	clock    Clock
	log      *slog.Logger
	hooks    Hooks
	sleep    func(context.Context, time.Duration)
	soldOut  sync.Map // sku -> time.Time until which this instance answers sold_out
}

// Deps are the Service's collaborators.
type Deps struct {
	Holds    Holds
	Ledger   Ledger
	Queue    Enqueuer // may be nil where no reservation is enqueued (persist, compensate, sweeper)
	Notifier Notifier
	Metrics  Metrics
	Clock    Clock
	Log      *slog.Logger
	Hooks    Hooks
}

// Hooks are crash points for fault-injection tests; production wiring leaves
// them nil. An error from a hook stops the operation on the spot, as a crash
// of the process there would: nothing after it runs.
type Hooks struct {
	// AfterHold runs in Reserve between the Redis deduct and the SQS send.
	AfterHold func(Reservation) error
	// AfterCommit runs in Persist after the MySQL commit, before Redis is
	// told and before the message is deleted.
	AfterCommit func(Reservation) error
}

// NewService returns a Service with the given collaborators.
func NewService(cfg Config, d Deps) *Service {
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	if d.Clock == nil {
		d.Clock = SystemClock{}
	}
	if d.Metrics == nil {
		d.Metrics = nopMetrics{}
	}
	return &Service{
		cfg: cfg, holds: d.Holds, ledger: d.Ledger, queue: d.Queue, notifier: d.Notifier,
		metrics: d.Metrics, clock: d.Clock, log: d.Log, hooks: d.Hooks, sleep: sleepCtx,
	}
}

type nopMetrics struct{}

func (nopMetrics) Count(string, int) {}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// ReserveRequest is a buyer's "buy" or "join group".
type ReserveRequest struct {
	SKU            string
	Qty            int
	UserID         string
	GroupID        string
	IdempotencyKey string // optional; the same key from the same user for the same SKU is the same reservation
}

// ReservationID returns the id of a request — "<sku>.<26 base32>" — derived
// from the idempotency key when there is one (so a retry lands on the same
// hold), random otherwise. The id names its SKU: see SKUOf.
func ReservationID(req ReserveRequest) string {
	var b [16]byte
	if req.IdempotencyKey == "" {
		_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	} else {
		sum := sha256.Sum256([]byte(req.UserID + "\x00" + req.SKU + "\x00" + req.IdempotencyKey))
		copy(b[:], sum[:16])
	}
	return req.SKU + "." + idEncoding.EncodeToString(b[:])
}

// idEncoding is base32 in lower case without padding: 26 characters for 128 bits.
var idEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// Reserve holds stock for a buyer and hands the reservation to persist.
// The result is HELD, or, for a replayed request, the reservation's current
// state (replayed true). If the hand-off fails the reservation is cancelled
// through the fenced decision before Reserve returns ErrUnavailable, so the
// caller holds nothing; if even that cannot be decided (MySQL down) the hold
// stays for the sweeper.
func (s *Service) Reserve(ctx context.Context, req ReserveRequest) (Reservation, bool, error) {
	if len(req.IdempotencyKey) > 128 {
		return Reservation{}, false, invalid("Idempotency-Key", "must be at most 128 characters")
	}
	now := s.clock.Now()
	r := Reservation{
		ID: ReservationID(req), SKU: req.SKU, Qty: req.Qty, UserID: req.UserID, GroupID: req.GroupID,
		Status: StatusHeld, ExpiresAt: now.Add(s.cfg.HoldTTL), CreatedAt: now,
	}
	if err := r.Validate(s.cfg.MaxQty); err != nil {
		return Reservation{}, false, err
	}
	// A sold-out SKU is answered here for a short while. Not for a request
	// with an idempotency key: it may be the replay of a reservation that exists.
	if until, ok := s.soldOut.Load(r.SKU); ok && req.IdempotencyKey == "" && now.Before(until.(time.Time)) {
		s.metrics.Count("sold_out", 1)
		return Reservation{}, false, ErrSoldOut
	}
	held, replayed, err := s.holds.Reserve(ctx, r, now)
	if errors.Is(err, ErrUnknownSKU) {
		// Redis may have lost the SKU (failover, flush): warm it from MySQL
		// once and try again; MySQL says whether the SKU exists at all.
		if werr := s.warm(ctx, r.SKU); werr != nil {
			return Reservation{}, false, werr
		}
		held, replayed, err = s.holds.Reserve(ctx, r, now)
	}
	if err != nil {
		if errors.Is(err, ErrSoldOut) {
			s.metrics.Count("sold_out", 1)
			if s.cfg.SoldOutTTL > 0 && r.GroupID == "" {
				s.soldOut.Store(r.SKU, now.Add(s.cfg.SoldOutTTL))
			}
		}
		if errors.Is(err, ErrUnavailable) {
			s.abandon(ctx, r)
		}
		return Reservation{}, false, err
	}
	if replayed && held.Status.Final() {
		return held, true, nil
	}
	if h := s.hooks.AfterHold; h != nil {
		if err := h(held); err != nil {
			return Reservation{}, false, err
		}
	}
	// A replay of a HELD hold sends again: the first attempt may have crashed
	// between the deduct and the send. Persist takes each id at most once.
	// If that re-send fails, the first send (or, failing it, the sweeper)
	// still decides the hold, so the replay answers HELD and cancels nothing.
	if err := s.queue.Enqueue(ctx, held); err != nil {
		s.metrics.Count("publish_failed", 1)
		if replayed {
			s.log.WarnContext(ctx, "reserve: re-send of a replayed hold failed", "reservation_id", held.ID, "error", err)
			return held, true, nil
		}
		final, serr := s.settle(ctx, held, ReasonPublishFailed)
		if serr != nil {
			s.log.ErrorContext(ctx, "reserve: enqueue failed and the hold is left to the sweeper",
				"reservation_id", held.ID, "enqueue_error", err, "settle_error", serr)
			return Reservation{}, false, Unavailable("reserve enqueue", err)
		}
		if final.Status == StatusConfirmed {
			// The send that reported failure went through and was persisted.
			return final, true, nil
		}
		return Reservation{}, false, Unavailable("reserve enqueue", err)
	}
	if !replayed {
		s.metrics.Count("reserved", 1)
	}
	return held, replayed, nil
}

// abandon settles a reservation whose Redis call failed with an unknown
// outcome (a timeout, a reset): the script may have run and left a hold that
// no message will ever settle. Fence and release it now, within a short
// bound, so the 503 holds nothing; if Redis or MySQL is still down the
// sweeper finds the hold at its deadline.
func (s *Service) abandon(ctx context.Context, r Reservation) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	if _, err := s.settle(ctx, r, ReasonHoldFailed); err != nil {
		s.log.WarnContext(ctx, "reserve: abandoned hold left to the sweeper", "reservation_id", r.ID, "error", err)
	}
}

func (s *Service) warm(ctx context.Context, sku string) error {
	level, err := s.ledger.Stock(ctx, sku)
	if err != nil {
		return err
	}
	warmed, err := s.holds.Warm(ctx, level)
	if err != nil {
		return err
	}
	if warmed {
		s.metrics.Count("warmed", 1)
		s.log.InfoContext(ctx, "warmed sku from mysql", "sku", sku, "available", level.Available)
	}
	return nil
}

// Get returns a reservation's current state: HELD from Redis until MySQL
// has decided it. ErrNotFound if neither store knows the id.
func (s *Service) Get(ctx context.Context, id string) (Reservation, error) {
	if !ValidReservationID(id, "") {
		return Reservation{}, ErrNotFound
	}
	h, herr := s.holds.Hold(ctx, id)
	if herr == nil && h.Status.Final() {
		return h, nil
	}
	row, err := s.ledger.Reservation(ctx, id)
	switch {
	case err == nil:
		if herr == nil {
			row.ExpiresAt = h.ExpiresAt
		}
		return row, nil
	case !errors.Is(err, ErrNotFound):
		if herr == nil {
			return h, nil // MySQL unreachable: Redis still knows it is HELD
		}
		return Reservation{}, err
	case herr == nil:
		return h, nil
	case errors.Is(herr, ErrNotFound):
		return Reservation{}, ErrNotFound
	default:
		return Reservation{}, herr
	}
}

// Cancel is the buyer's cancel. A HELD reservation is fenced and released;
// a CONFIRMED one is refunded in MySQL and then in Redis. Idempotent: a
// repeat returns the final state and returns no stock twice.
func (s *Service) Cancel(ctx context.Context, id string) (Reservation, error) {
	if !ValidReservationID(id, "") {
		return Reservation{}, ErrNotFound
	}
	row, err := s.ledger.Reservation(ctx, id)
	if errors.Is(err, ErrNotFound) {
		h, herr := s.holds.Hold(ctx, id)
		if herr != nil {
			return Reservation{}, herr
		}
		row, err = s.settle(ctx, h, ReasonBuyer)
	}
	if err != nil {
		return Reservation{}, err
	}
	if row.Status == StatusConfirmed {
		return s.refund(ctx, id, ReasonBuyer)
	}
	return s.finishCancel(ctx, row)
}

// Persist settles one reservation message in MySQL, exactly once per id.
// Attempts are optimistic (version-checked update, retried in a fresh
// transaction on a conflict); the last one locks the stock row first, so
// contention alone cannot exhaust them. It returns the decided reservation.
// An error means the message must be redelivered (MySQL unreachable, or
// even the locking attempt deadlocked); it is never a reason to cancel.
func (s *Service) Persist(ctx context.Context, r Reservation) (Reservation, error) {
	for attempt := 1; ; attempt++ {
		lock := Optimistic
		if attempt == s.cfg.PersistAttempts {
			lock = Pessimistic
		}
		res, row, err := s.ledger.Apply(ctx, r, lock, s.clock.Now())
		if errors.Is(err, ErrVersionConflict) {
			s.metrics.Count("persist_retries", 1)
			if attempt >= s.cfg.PersistAttempts {
				return r, fmt.Errorf("persist %s after %d attempts: %w", r.ID, attempt, ErrContended)
			}
			s.sleep(ctx, backoff(attempt))
			if ctx.Err() != nil {
				return r, fmt.Errorf("persist %s: %w", r.ID, ctx.Err())
			}
			continue
		}
		if err != nil {
			return r, fmt.Errorf("persist %s: %w", r.ID, err)
		}
		return s.decided(ctx, r, res, row)
	}
}

// PersistBatch settles a batch of reservation messages: the hot-SKU path.
// Messages without a group are grouped by SKU and each group is settled with
// ApplyBatch — one transaction, one version-checked update for the summed
// quantity under the row lock — retried on a conflict; if the SKU cannot cover the sum, exactly
// the reservations that fit (in message order) are confirmed and the rest are
// cancelled through the fence. Group joins, and a batch that keeps
// conflicting, go through Persist one by one. It returns one error per message: nil once decided, else the
// message must be redelivered.
func (s *Service) PersistBatch(ctx context.Context, rs []Reservation) []error {
	errs := make([]error, len(rs))
	bySKU := map[string][]int{}
	var order []string
	for i, r := range rs {
		if r.GroupID != "" {
			_, errs[i] = s.Persist(ctx, r)
			continue
		}
		if _, ok := bySKU[r.SKU]; !ok {
			order = append(order, r.SKU)
		}
		bySKU[r.SKU] = append(bySKU[r.SKU], i)
	}
	for _, sku := range order {
		idx := bySKU[sku]
		batch := make([]Reservation, len(idx))
		for j, i := range idx {
			batch[j] = rs[i]
		}
		results, err := s.applyBatch(ctx, sku, batch)
		if errors.Is(err, ErrVersionConflict) {
			for _, i := range idx { // still contended: one by one, the last attempt locking
				_, errs[i] = s.Persist(ctx, rs[i])
			}
			continue
		}
		if err != nil {
			for _, i := range idx {
				errs[i] = fmt.Errorf("persist %s: %w", rs[i].ID, err)
			}
			continue
		}
		for j, i := range idx {
			_, errs[i] = s.decided(ctx, rs[i], results[j].Result, results[j].Row)
		}
	}
	return errs
}

// applyBatch runs the batch attempts for one SKU.
func (s *Service) applyBatch(ctx context.Context, sku string, batch []Reservation) ([]BatchResult, error) {
	var err error
	for attempt := 1; attempt < max(2, s.cfg.PersistAttempts); attempt++ {
		var results []BatchResult
		results, err = s.ledger.ApplyBatch(ctx, sku, batch, s.clock.Now())
		if !errors.Is(err, ErrVersionConflict) {
			return results, err
		}
		s.metrics.Count("persist_retries", 1)
		s.sleep(ctx, backoff(attempt))
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	return nil, err
}

// decided acts on what MySQL decided for one message.
func (s *Service) decided(ctx context.Context, r Reservation, res ApplyResult, row Reservation) (Reservation, error) {
	switch res {
	case Applied, AlreadyConfirmed:
		if res == Applied {
			s.metrics.Count("confirmed", 1)
		}
		if h := s.hooks.AfterCommit; h != nil {
			if err := h(r); err != nil {
				return r, err
			}
		}
		r.Status = StatusConfirmed
		if err := s.holds.Confirm(ctx, r); err != nil {
			// The row decided it; the sweeper marks the hold later.
			s.log.WarnContext(ctx, "persist: hold not marked confirmed", "reservation_id", r.ID, "error", err)
		}
		return r, nil
	case AlreadyCancelled:
		// Fenced before it arrived: take nothing; make sure the hold is
		// released (the fencer may have crashed before releasing).
		return s.finishCancel(ctx, row)
	default:
		return s.settle(ctx, r, reasonOf(res))
	}
}

func reasonOf(res ApplyResult) Reason {
	switch res {
	case NoSuchSKU:
		return ReasonUnknownSKU
	case GroupNotOpen:
		return ReasonGroupClosed
	case GroupNoSlot:
		return ReasonGroupFull
	case GroupDuplicate:
		return ReasonAlreadyJoined
	default:
		return ReasonInsufficient
	}
}

// backoff is full jitter over an exponential ceiling: 2ms, 4ms, … capped at 100ms.
func backoff(attempt int) time.Duration {
	ceiling := min(time.Duration(1<<attempt)*time.Millisecond, 100*time.Millisecond)
	return time.Duration(mrand.Int64N(int64(ceiling)) + 1)
}

// Compensate decides a reservation whose message reached the dead-letter
// queue. MySQL first: a CONFIRMED row (persist committed after all) only
// marks the hold confirmed; otherwise the reservation is fenced CANCELLED,
// its hold released once, and the cancellation published. Idempotent.
func (s *Service) Compensate(ctx context.Context, r Reservation) (Reservation, error) {
	return s.settle(ctx, r, ReasonDeadLetter)
}

// settle is the fenced decision every cancelling path shares: write the
// CANCELLED fence unless MySQL already decided, then act on the row.
func (s *Service) settle(ctx context.Context, r Reservation, reason Reason) (Reservation, error) {
	row, inserted, err := s.ledger.Fence(ctx, r, reason, s.clock.Now())
	if err != nil {
		return r, fmt.Errorf("fence %s: %w", r.ID, err)
	}
	if row.Status == StatusConfirmed {
		if err := s.holds.Confirm(ctx, row); err != nil {
			return row, fmt.Errorf("confirm hold %s: %w", r.ID, err)
		}
		return row, nil
	}
	if inserted {
		s.metrics.Count("cancelled_"+string(row.Reason), 1)
	}
	return s.finishCancel(ctx, row)
}

// refund cancels a CONFIRMED reservation: stock back to MySQL, then Redis.
func (s *Service) refund(ctx context.Context, id string, reason Reason) (Reservation, error) {
	row, refunded, err := s.ledger.Refund(ctx, id, reason, s.clock.Now())
	if err != nil {
		return Reservation{}, fmt.Errorf("refund %s: %w", id, err)
	}
	if refunded {
		s.metrics.Count("cancelled_"+string(reason), 1)
	}
	return s.finishCancel(ctx, row)
}

// finishCancel brings Redis in line with a CANCELLED row and sends its event
// once (the row's notified flag is the outbox; the sweeper resends what a
// crash left unsent). Safe to repeat.
func (s *Service) finishCancel(ctx context.Context, row Reservation) (Reservation, error) {
	if row.Status != StatusCancelled {
		return row, nil
	}
	returned, err := s.holds.Release(ctx, row, row.Refunded)
	if err != nil {
		return row, fmt.Errorf("release %s: %w", row.ID, err)
	}
	if returned {
		s.soldOut.Delete(row.SKU) // stock came back: ask Redis again
	}
	if returned {
		s.metrics.Count("released", 1)
	}
	if !row.Notified {
		if err := s.notify(ctx, row); err != nil {
			return row, err
		}
		row.Notified = true
	}
	return row, nil
}

func (s *Service) notify(ctx context.Context, row Reservation) error {
	if err := s.notifier.Cancelled(ctx, row); err != nil {
		return fmt.Errorf("publish cancellation %s: %w", row.ID, err)
	}
	if err := s.ledger.MarkNotified(ctx, row.ID); err != nil {
		return fmt.Errorf("mark notified %s: %w", row.ID, err)
	}
	return nil
}

// CreateGroup opens a group-buy of capacity slots on sku. ttl 0 means the
// default deadline.
func (s *Service) CreateGroup(ctx context.Context, sku string, capacity int, ttl time.Duration) (Group, error) {
	switch {
	case !ValidID(sku):
		return Group{}, invalid("sku", "must be 1-64 characters of letters, digits and ._:-")
	case capacity < 2 || capacity > 1000:
		return Group{}, invalid("capacity", "must be between 2 and 1000")
	case ttl < 0 || ttl > s.cfg.MaxGroupTTL:
		return Group{}, invalid("ttl_seconds", "must be between 1 and %d", int(s.cfg.MaxGroupTTL.Seconds()))
	}
	if ttl == 0 {
		ttl = s.cfg.GroupTTL
	}
	now := s.clock.Now()
	g := Group{
		ID: "g-" + strings.TrimPrefix(ReservationID(ReserveRequest{}), "."), SKU: sku, Capacity: capacity, Remaining: capacity,
		Status: GroupOpen, Deadline: now.Add(ttl).Truncate(time.Millisecond), CreatedAt: now,
	}
	if err := s.ledger.CreateGroup(ctx, g); err != nil {
		return Group{}, err
	}
	if err := s.holds.CreateGroup(ctx, g); err != nil {
		// MySQL has an OPEN group nobody can join; the sweeper fails it at
		// its deadline with no members.
		return Group{}, err
	}
	return g, nil
}

// Group returns a group: status and confirmed members from MySQL, free
// slots from Redis.
func (s *Service) Group(ctx context.Context, id string) (Group, error) {
	if !ValidID(id) {
		return Group{}, ErrUnknownGroup
	}
	g, err := s.ledger.Group(ctx, id)
	if err != nil {
		return Group{}, err
	}
	g.Remaining = g.Capacity - g.Members
	if g.Status == GroupOpen {
		if rg, err := s.holds.Group(ctx, g.SKU, id); err == nil {
			g.Remaining = rg.Remaining
		}
	}
	return g, nil
}

// Available returns the units buyers can still reserve (the Redis figure).
func (s *Service) Available(ctx context.Context, sku string) (int64, error) {
	if !ValidID(sku) {
		return 0, ErrUnknownSKU
	}
	available, _, err := s.holds.Stock(ctx, sku)
	if errors.Is(err, ErrUnknownSKU) {
		if werr := s.warm(ctx, sku); werr != nil {
			return 0, werr
		}
		available, _, err = s.holds.Stock(ctx, sku)
	}
	return available, err
}

// SetStock sets a SKU's sellable stock in MySQL and moves Redis by the same
// amount, so live holds stay counted exactly once. limit, when not nil, sets
// the per-user limit in units (1 means one unit per buyer; 0 means none).
func (s *Service) SetStock(ctx context.Context, sku string, stock int64, limit *int) (StockLevel, error) {
	switch {
	case !ValidID(sku):
		return StockLevel{}, invalid("sku", "must be 1-64 characters of letters, digits and ._:-")
	case stock < 0 || stock > 1_000_000_000:
		return StockLevel{}, invalid("stock", "must be between 0 and 1000000000")
	case limit != nil && (*limit < 0 || *limit > 1_000_000):
		return StockLevel{}, invalid("per_user_limit", "must be between 0 and 1000000")
	}
	level, delta, err := s.ledger.SetStock(ctx, sku, stock, limit)
	if err != nil {
		return StockLevel{}, err
	}
	s.soldOut.Delete(sku)
	if err := s.holds.AdjustStock(ctx, level, delta); err != nil {
		// MySQL changed and Redis did not: the drift shows in the sweeper's
		// metric and reconciliation heals it.
		return StockLevel{}, err
	}
	return level, nil
}

// StockReport is a SKU's stock as both stores see it.
type StockReport struct {
	SKU            string
	MySQLAvailable int64
	RedisAvailable int64
	Held           int64 // units HELD in Redis, not yet decided
	Version        int64
	PerUserLimit   int
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
	available, held, err := s.holds.Stock(ctx, sku)
	if err != nil {
		return StockReport{}, err
	}
	return StockReport{
		SKU: sku, MySQLAvailable: level.Available, RedisAvailable: available, Held: held,
		Version: level.Version, PerUserLimit: level.PerUserLimit,
	}, nil
}
