package reservation

import (
	"context"
	"fmt"
	"time"
)

// Holds is the Redis side of the protocol: the stock buyers see, the holds
// and the group slots. Every method is safe to repeat: a retried call (go-redis
// retries on timeouts and failovers) returns the first call's effect, never
// applies twice.
type Holds interface {
	// Reserve atomically checks and deducts r.Qty units (and, for a group
	// join, one slot and the one-join-per-user rule), records the hold HELD
	// with deadline r.ExpiresAt and indexes it by deadline. If a hold with
	// r.ID exists, it returns that hold with replayed true and takes nothing.
	// Errors: ErrSoldOut, ErrUnknownSKU, ErrLimitExceeded, ErrUnknownGroup,
	// ErrGroupClosed, ErrGroupFull, ErrAlreadyJoined, ErrIdempotencyMismatch,
	// ErrUnavailable.
	Reserve(ctx context.Context, r Reservation, now time.Time) (held Reservation, replayed bool, err error)
	// Release ends the hold CANCELLED with reason. Stock (and the group slot)
	// returns from a HELD hold, and also from a CONFIRMED one when refund is
	// true. A missing hold leaves a tombstone so a replay cannot take stock.
	// returned reports whether this call gave stock back.
	Release(ctx context.Context, r Reservation, refund bool) (returned bool, err error)
	// Confirm marks a HELD hold CONFIRMED; the stock stays deducted.
	Confirm(ctx context.Context, r Reservation) error
	// Hold returns the hold recorded for id, or ErrNotFound.
	Hold(ctx context.Context, id string) (Reservation, error)
	// Expired returns up to limit HELD holds of sku whose deadline is before t.
	Expired(ctx context.Context, sku string, t time.Time, limit int) ([]Reservation, error)
	// Stock returns the units buyers can still reserve and the units held
	// but not yet confirmed. ErrUnknownSKU if Redis has no stock for sku.
	Stock(ctx context.Context, sku string) (available, held int64, err error)
	// Warm loads level into Redis if Redis has no stock for the SKU
	// (available = level.Available − units held); it reports whether it did.
	Warm(ctx context.Context, level StockLevel) (bool, error)
	// AdjustStock applies delta units once per level.Version (a replay is a
	// no-op) and sets the per-user limit; it warms a missing SKU instead.
	AdjustStock(ctx context.Context, level StockLevel, delta int64) error
	// Heal moves the SKU's stock by drift if the same drift was measured at
	// least after ago and Redis still shows seenAvailable and seenHeld (no
	// reserve or release since the measurement); otherwise it records or
	// forgets the sighting. healed reports whether the stock moved.
	Heal(ctx context.Context, sku string, seenAvailable, seenHeld, drift int64, now time.Time, after time.Duration) (healed bool, err error)
	// CreateGroup records an OPEN group with all its slots free.
	CreateGroup(ctx context.Context, g Group) error
	// Group returns the group's slots and status as Redis has them.
	Group(ctx context.Context, sku, id string) (Group, error)
	// CloseGroup marks the group FAILED (no more joins) and returns the ids
	// of the reservations holding its slots.
	CloseGroup(ctx context.Context, g Group) ([]string, error)
}

// ApplyResult is what one persist attempt found in MySQL.
type ApplyResult int

// Outcomes of Ledger.Apply.
const (
	Applied          ApplyResult = iota // row inserted CONFIRMED, stock deducted
	AlreadyConfirmed                    // a redelivery: the row exists CONFIRMED
	AlreadyCancelled                    // fenced before it arrived: the row exists CANCELLED
	Insufficient                        // MySQL cannot cover the quantity
	NoSuchSKU                           // the SKU is not in MySQL
	GroupNotOpen                        // the group is FORMED or FAILED in MySQL
	GroupNoSlot                         // the group is full in MySQL
	GroupDuplicate                      // the user is already a member in MySQL
)

// Locking says how Apply reads the stock row.
type Locking bool

// Apply modes: optimistic attempts read the row without a lock and lose to a
// concurrent writer (ErrVersionConflict); the last attempt of a contended
// message reads it FOR UPDATE, so its version-checked update cannot lose and
// a hot SKU never starves a message into the dead-letter queue.
const (
	Optimistic  Locking = false
	Pessimistic Locking = true
)

// BatchResult is ApplyBatch's outcome for one reservation.
type BatchResult struct {
	Result ApplyResult
	Row    Reservation // the existing row for AlreadyConfirmed and AlreadyCancelled
}

// Ledger is the MySQL side, the arbiter. A reservation's row decides its fate.
type Ledger interface {
	// Apply makes one attempt, in one transaction, to insert r's row
	// CONFIRMED and take its stock with a version-checked update (and its
	// group slot). ErrVersionConflict: nothing written, try again in a fresh
	// transaction. When the row already exists it is returned with
	// AlreadyConfirmed or AlreadyCancelled.
	Apply(ctx context.Context, r Reservation, lock Locking, now time.Time) (ApplyResult, Reservation, error)
	// ApplyBatch makes one attempt to settle reservations of one SKU without
	// group joins, in one transaction: a row that already exists is returned
	// as it stands (AlreadyConfirmed, AlreadyCancelled); of the others, those
	// that fit the available stock in the order given are inserted CONFIRMED
	// in one statement and their summed quantity taken with one
	// version-checked update under the row lock (Applied); the rest are
	// Insufficient and nothing is written for them. ErrVersionConflict (a
	// fence raced the insert, or a deadlock): nothing written, try again.
	ApplyBatch(ctx context.Context, sku string, rs []Reservation, now time.Time) ([]BatchResult, error)
	// Fence inserts r's row CANCELLED with reason unless a row exists, and
	// returns the row as it stands; inserted reports whether this call wrote it.
	Fence(ctx context.Context, r Reservation, reason Reason, now time.Time) (row Reservation, inserted bool, err error)
	// Refund turns a CONFIRMED row CANCELLED and returns its stock (and group
	// slot) in one transaction; refunded reports whether this call did it.
	Refund(ctx context.Context, id string, reason Reason, now time.Time) (row Reservation, refunded bool, err error)
	// Reservation returns the row for id, or ErrNotFound.
	Reservation(ctx context.Context, id string) (Reservation, error)
	// MarkNotified records that the cancellation event of id went out.
	MarkNotified(ctx context.Context, id string) error
	// Unnotified returns CANCELLED rows last changed before t whose event
	// has not gone out (the outbox the sweeper drains).
	Unnotified(ctx context.Context, t time.Time, limit int) ([]Reservation, error)
	// SetStock sets the sellable stock (creating the SKU if new) and the
	// per-user limit when limit is not nil; it returns the new level and the
	// change in available units.
	SetStock(ctx context.Context, sku string, stock int64, limit *int) (StockLevel, int64, error)
	// Stock returns the SKU's level, or ErrUnknownSKU.
	Stock(ctx context.Context, sku string) (StockLevel, error)
	// Stocks returns every SKU's level.
	Stocks(ctx context.Context) ([]StockLevel, error)
	// CreateGroup inserts an OPEN group; ErrUnknownSKU if the SKU is unknown.
	CreateGroup(ctx context.Context, g Group) error
	// Group returns the group, or ErrUnknownGroup.
	Group(ctx context.Context, id string) (Group, error)
	// DueGroups returns groups OPEN past t, and FAILED groups whose members
	// have not all been cancelled yet.
	DueGroups(ctx context.Context, t time.Time, limit int) ([]Group, error)
	// FailGroup turns an OPEN group FAILED and returns it as it stands
	// (FORMED if it filled first).
	FailGroup(ctx context.Context, id string, now time.Time) (Group, error)
	// GroupMembers returns the CONFIRMED reservations of a group.
	GroupMembers(ctx context.Context, id string) ([]Reservation, error)
	// GroupSettled records that every member of a FAILED group is cancelled.
	GroupSettled(ctx context.Context, id string) error
}

// Enqueuer hands an accepted reservation to persist (SQS in production).
type Enqueuer interface {
	Enqueue(ctx context.Context, r Reservation) error
}

// Notifier tells the order service that a reservation was cancelled
// (EventBridge in production). Delivery is at least once: consumers
// deduplicate by reservation id.
type Notifier interface {
	Cancelled(ctx context.Context, r Reservation) error
}

// Metrics counts protocol events (CloudWatch EMF in production).
type Metrics interface {
	Count(name string, n int)
}

// Clock tells the time. Tests move it.
type Clock interface {
	Now() time.Time
}

// SystemClock is the wall clock.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// Unavailable wraps a store or queue failure of op so that it matches
// ErrUnavailable and still carries the cause.
func Unavailable(op string, err error) error {
	return fmt.Errorf("%s: %w: %w", op, ErrUnavailable, err)
}
