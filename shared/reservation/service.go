package reservation

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"log/slog"
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
	SweepLive       int           // live SKUs (marked by a reserve or a stock change) visited per sweep
	SweepCatalog    int           // SKUs of the catalog pass visited per sweep (the rest wait for later sweeps)
	ReconcileAfter  time.Duration // how long a Redis–MySQL drift must persist before the sweeper heals it
	// SoldOutTTL is how long an instance answers sold_out for a SKU without
	// asking Redis after Redis said so (0: always ask). A restock or cancel
	// through the same instance clears it at once; elsewhere it is at most
	// this stale.
	SoldOutTTL time.Duration
	// WarmLead is how long before a SKU's sale window opens the sweeper
	// warms it (every bucket), so the first buyers never wait on MySQL; at
	// least the sweep period, so one sweep lands within it (0: never).
	WarmLead time.Duration
	// MaxOpenGroups bounds the groups one buyer may have open on one SKU
	// (0: no cap): a group counts from its creation until its deadline plus
	// the time the sweeper may take to end it (groupCountsAfter).
	MaxOpenGroups int
	// QueueLead is how long before a waiting-room SKU's sale opens its
	// queue opens (tickets taken before the opening are shuffled);
	// AdmitFor how long an admission lasts unused.
	QueueLead, AdmitFor time.Duration
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
		SweepLive:       10_000,
		SweepCatalog:    1_000,
		ReconcileAfter:  50 * time.Second,
		SoldOutTTL:      500 * time.Millisecond,
		MaxOpenGroups:   3,
		WarmLead:        2 * time.Minute,
		QueueLead:       15 * time.Minute,
		AdmitFor:        2 * time.Minute,
	}
}

// Service runs the protocol. Its methods are what the handlers call.
type Service struct {
	cfg           Config
	holds         Holds        // Redis, by role: the holds,
	figures       StockFigures // the buckets' figures,
	slots         GroupSlots   // the groups' slots,
	marks         LiveMarks    // what the sweeper visits
	room          WaitingRoom  // the waiting rooms' queues
	ledger        Ledger
	queue         Enqueuer
	notifier      Notifier
	metrics       Metrics
	clock         Clock
	log           *slog.Logger
	hooks         Hooks
	sleep         func(context.Context, time.Duration)
	soldOut       sync.Map  // sku -> time.Time until which this instance answers sold_out
	touched       touches   // SKUs this instance marked live, and until when it need not again
	layouts       layouts   // each SKU's layout (K, group-buys) as Redis had it lately
	unknown       unknowns  // SKUs MySQL said it does not have, lately
	refills       sync.Map  // bucket name -> *sync.Mutex: one refill of a bucket at a time here
	unknownGroups unknowns  // group ids MySQL said it does not have, lately
	idSecret      []byte    // the key of ids derived from an Idempotency-Key
	macs          sync.Pool // HMAC-SHA256s keyed by idSecret, for mac: New derives the key's pads, Reset restores them
}

// Deps are the Service's collaborators.
type Deps struct {
	Redis    Redis
	Ledger   Ledger
	Queue    Enqueuer // may be nil where no reservation is enqueued (persist, compensate, sweeper)
	Notifier Notifier
	Metrics  Metrics
	Clock    Clock
	Log      *slog.Logger
	Hooks    Hooks
	// IDSecret keys the MAC that derives a reservation id from an
	// Idempotency-Key (Secrets Manager in AWS, a local file in make dev).
	IDSecret []byte
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
	// RecordFormed runs before a full group is recorded FORMED; an error
	// fails that recording (as a MySQL blip would).
	RecordFormed func(Group) error
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
	s := &Service{
		cfg: cfg, holds: d.Redis, figures: d.Redis, slots: d.Redis, marks: d.Redis, room: d.Redis, ledger: d.Ledger, queue: d.Queue, notifier: d.Notifier,
		metrics: d.Metrics, clock: d.Clock, log: d.Log, hooks: d.Hooks, sleep: sleepCtx, idSecret: d.IDSecret,
	}
	s.macs.New = func() any { return hmac.New(sha256.New, s.idSecret) }
	return s
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
