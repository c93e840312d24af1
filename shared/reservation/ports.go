package reservation

import (
	"context"
	"fmt"
	"time"
)

// Redis is the Redis side of the protocol: the stock buyers see, the holds
// and the group slots, in four roles by what each part of the protocol needs.
// Redis is a fast, forgetful cache of MySQL's decisions: every method is safe
// to repeat (go-redis retries on timeouts and failovers), and none of them
// gives stock back on its own authority — a give-back is always the effect of
// a MySQL row (Holds.Follow; the rule is React). Scripts read the time from
// Redis (TIME), so no caller's clock moves a deadline.
type Redis interface {
	Holds
	StockFigures
	GroupSlots
	LiveMarks
	WaitingRoom
}

// WaitingRoom is a SKU's waiting room in Redis (bucket 0): its queue of
// tickets and whom it admitted.
type WaitingRoom interface {
	// Queue admits, in queue order, the tickets the stock can serve
	// (while the admitted who have not reserved ≤ ⌈(available + held + unpaid) ×
	// the SKU's admit factor⌉, by Redis's clock, from the opening on), lapses
	// admissions older than op.AdmitFor, and answers the queue's state and
	// ticket's ("" for none). With op.Join it first gives ticket its place
	// if it has none: before the opening a random one (op.Place), after it
	// the next. Errors: ErrNoWaitingRoom, ErrUnknownSKU (Redis has no stock
	// figure: warm bucket 0), *QueueNotOpenError and ErrSaleClosed (a join
	// outside the queue's time), ErrUnavailable.
	Queue(ctx context.Context, sku, ticket string, op QueueOp) (QueueState, error)
}

// Holds is a reservation's hold in Redis: taken, replayed, followed to
// MySQL's decision, found, expired. Methods that take a reservation use its
// SKU and Bucket.
type Holds interface {
	// Reserve atomically checks and deducts r.Qty units (and, for a group
	// join, one slot and the one-join-per-user rule), records the hold HELD
	// with token r.Token and a deadline ttl after Redis's now, and indexes it
	// by deadline. The returned hold carries that deadline. If a hold with
	// r.ID exists it is returned with Replayed and nothing is taken; a
	// tombstone Follow wrote where the bucket had no hold is also Tombstone.
	// Errors: ErrSoldOut, ErrUnknownSKU, ErrLimitExceeded, ErrUnknownGroup,
	// ErrGroupClosed, ErrGroupFull, ErrAlreadyJoined, ErrIdempotencyMismatch,
	// ErrUnavailable. Outside the SKU's sale window (the level Sync or Warm
	// last applied to the bucket), by Redis's clock: *NotOpenError before it
	// opens, ErrSaleClosed from its close; a replay of an existing hold is
	// answered all the same, and every refusal but a mismatch is charged.
	// A new hold, ErrSoldOut, ErrLimitExceeded, ErrSaleClosed and
	// ErrAdmissionExpired come with the outcome's Whole.
	Reserve(ctx context.Context, r Reservation, ttl time.Duration) (Reservation, ReserveOutcome, error)

	// Follow makes the hold of row.ID follow MySQL's decided row, once:
	//   - a HELD hold of another token is a stray (Redis took the id again
	//     after forgetting the hold MySQL decided): its stock is returned,
	//     and its slot and member entry in its own group when that is
	//     another than the row's and still OPEN;
	//   - CONFIRMED: a HELD hold becomes CONFIRMED (its units leave held);
	//     version is the stock row's version after the commit (0: unknown);
	//   - CANCELLED: a HELD hold's stock returns; a refunded row's stock
	//     returns from a CONFIRMED or missing hold only while row.Release
	//     is ReleaseOwed (the release outbox), and at most once per token.
	// A missing hold becomes a tombstone of the row, so a replay takes
	// nothing. returned reports whether stock came back. ErrUnknownSKU: a
	// refund's stock must come back but Redis has no stock for the SKU;
	// nothing changed: warm it and follow again.
	Follow(ctx context.Context, row Reservation, version int64) (returned bool, err error)

	// FollowAll is Follow of many rows at once, with one version for all
	// (persist's batch: one round trip per shard, not one per row). Its
	// effect is that of Follow on each row in turn; returned[i] and errs[i]
	// are row i's.
	FollowAll(ctx context.Context, rows []Reservation, version int64) (returned []bool, errs []error)

	// Charge charges one attempt of a.UserID's on a.SKU to the buyer's one
	// attempt budget, in a.Bucket (their home bucket: Reserve charges a buy
	// there in the same call), and, with a.Group, claims one of their open
	// groups on the SKU: at most a.MaxOpen (0: no cap) count until their
	// Until. A repeat of the call (a.Token) is not charged again; a group is
	// claimed once. Errors: *RateLimitedError (nothing charged or claimed),
	// *TooManyGroupsError (charged, nothing claimed), ErrUnavailable.
	Charge(ctx context.Context, a Attempt) error

	// AcceptJoin marks a join's HELD hold (of r's token) accepted, once its
	// message is sent (a CONFIRMED one is accepted already); full reports
	// that the group has no free slot left. ErrNotFound if Redis has no such
	// hold of that token or it is CANCELLED: the join is not accepted.
	AcceptJoin(ctx context.Context, r Reservation) (full bool, err error)

	// Hold returns the hold recorded for id in bucket, or ErrNotFound.
	Hold(ctx context.Context, id string, bucket int) (Reservation, error)

	// Expired returns up to limit HELD holds of sku whose deadline passed
	// more than grace ago by Redis's clock.
	Expired(ctx context.Context, sku string, grace time.Duration, limit int) ([]Reservation, error)

	// TakeOut holds t.Qty units of bucket t.Bucket for the transfer t (its
	// id, token, Into) until ttl after Redis's now, as Reserve holds a
	// buyer's: stock down, held up, the hold indexed by deadline, and the
	// units counted as on their way (moving) until they land. A hold with
	// t.ID is returned as it is and nothing is taken. ErrSoldOut if the
	// bucket has fewer units, ErrUnknownSKU if it has no stock figure.
	TakeOut(ctx context.Context, t Reservation, ttl time.Duration) (Reservation, error)

	// Credit adds the units of the transfer t to bucket t.Into once: not
	// again for a repeat. With t.TransferVersion 0 it is the credit ahead of
	// MySQL's record, refused (credited false) from the hold's deadline
	// t.ExpiresAt on, when the sweeper may record it; with the version
	// MySQL recorded it at, it credits nothing into a bucket warmed from a
	// level at or past that version. credited reports whether stock moved.
	// ErrUnknownSKU if the bucket has no stock figure: nothing changed;
	// warm it and credit again.
	Credit(ctx context.Context, t Reservation) (credited bool, err error)

	// CreditsAhead returns up to limit transfers credited to bucket (a
	// bucket name) ahead of MySQL's record whose hold's deadline passed more
	// than grace ago by Redis's clock, with no record's credit yet: the
	// sweeper records them (their giving bucket may have lost its hold, and
	// their message may be lost). Each names its giving bucket and token.
	CreditsAhead(ctx context.Context, bucket string, grace time.Duration, limit int) ([]Reservation, error)

	// Landed tells the giving bucket t.Bucket that the units of its HELD
	// transfer hold (of t's token) were credited: they are no longer on
	// their way (moving), once. The hold stays HELD until MySQL's record.
	Landed(ctx context.Context, t Reservation) error
}

// StockFigures is a bucket's figures in Redis: read, warmed from MySQL,
// kept in step with admin changes, healed of drift. Methods that take a SKU
// (or a level's SKU) take the name of one of its buckets (BucketName).
type StockFigures interface {
	// Stock returns the SKU's figures in Redis; ErrUnknownSKU if Redis has
	// no stock for sku.
	Stock(ctx context.Context, sku string) (RedisStock, error)

	// Buckets returns K as the SKU's bucket 0 has it (1 for a SKU warmed
	// without it), and whether a group-buy was created on the SKU (its
	// groups live in bucket 0); ErrUnknownSKU if Redis has no stock for
	// bucket 0.
	Buckets(ctx context.Context, sku string) (k int, groups bool, err error)

	// Sync makes a SKU Redis knows follow MySQL's admin changes: it moves
	// by the difference between level.AdminDelta and the figure it has
	// applied (newer versions only) and takes the per-user limits and the
	// sale window.
	// SyncMissing if Redis has no stock for the SKU (see Warm).
	Sync(ctx context.Context, level StockLevel) (SyncResult, error)

	// HeldIDs returns the ids of the SKU's HELD holds (at most limit).
	HeldIDs(ctx context.Context, sku string, limit int) ([]string, error)

	// UnpaidIDs returns the ids of the bucket's reservations Redis counts
	// as CONFIRMED and unpaid within a pay window (at most limit): units
	// that may return (QueueState.Unpaid).
	UnpaidIDs(ctx context.Context, bucket string, limit int) ([]string, error)

	// Warm loads a SKU Redis has no stock for from one consistent MySQL
	// read taken after held (HeldIDs) was listed: level, and confirmed, the
	// rows among held MySQL has already CONFIRMED (their units are out of
	// level.Available and still in held). available = level.Available −
	// held + those units. SyncStale if any listed hold moved since, or a
	// confirm newer than the level reached Redis: read again. The rows of
	// confirmed in level's bucket still unpaid within a pay window become
	// the bucket's units that may return unpaid (QueueState.Unpaid), but
	// for those Redis heard were paid or cancelled since the read.
	Warm(ctx context.Context, level StockLevel, held []string, confirmed []Reservation) (SyncResult, error)

	// EndWhole ends the time in which the bucket holds every reservation
	// of its SKU (ReserveOutcome.Whole): a warm-up that gave it finds it
	// was not the SKU's first.
	EndWhole(ctx context.Context, bucket string) error

	// Heal moves the SKU's stock by drift if the same drift was measured at
	// least after ago and Redis still shows seen (no reserve or release
	// since the measurement); otherwise it records or forgets the sighting.
	// healed reports whether the stock moved.
	Heal(ctx context.Context, seen RedisStock, drift int64, after time.Duration) (healed bool, err error)
}

// GroupSlots is a group-buy's slots in Redis (in bucket 0 of its SKU), and
// Redis's clock, by which its deadline is judged.
type GroupSlots interface {
	// Now returns Redis's clock (or the injected test clock).
	Now(ctx context.Context) (time.Time, error)

	// CreateGroup records an OPEN group with all its slots free (in bucket
	// 0), and that the SKU has groups.
	CreateGroup(ctx context.Context, g Group) error

	// Group returns the group's slots and status as Redis has them.
	Group(ctx context.Context, sku, id string) (Group, error)

	// GroupHoldersAccepted reports whether every hold that takes a slot of
	// the group is accepted (marked by AcceptJoin) or decided; false while a
	// join's send is in flight (it may still fail and give its slot back).
	// A member whose hold Redis no longer has counts as accepted.
	GroupHoldersAccepted(ctx context.Context, g Group) (bool, error)

	// FormGroup marks the group FORMED (final; no slot left to take) once
	// MySQL has recorded it; false if Redis has no such group or it FAILED.
	FormGroup(ctx context.Context, g Group, formedAt time.Time) (bool, error)

	// CloseGroup ends the group in Redis once its deadline passed by Redis's
	// clock: a FORMED group stays FORMED; one whose slots are all taken is
	// reported Full (unchanged: MySQL decides whether it formed); otherwise
	// it becomes FAILED (no more joins) and the ids holding its slots are
	// returned. NotDue if the deadline has not passed; Unknown if Redis lost
	// the group.
	CloseGroup(ctx context.Context, g Group) (GroupClosing, error)

	// CloseGroups is CloseGroup of many groups in one round trip (per
	// shard): one answer or error per group.
	CloseGroups(ctx context.Context, gs []Group) ([]GroupClosing, []error)
}

// LiveMarks is what the sweeper visits: the SKUs marked live, and the
// cursor of its pass over the catalog.
type LiveMarks interface {
	// Touch marks sku live until ttl after Redis's now (a later mark
	// stands) and returns the mark as it stands: the sweeper visits every
	// live SKU each sweep. Reserve marks
	// a SKU before a hold can be taken on it, so every hold's deadline
	// passes before its mark does.
	Touch(ctx context.Context, sku string, ttl time.Duration) (LiveSKU, error)

	// Live returns up to limit live SKUs, the earliest marks first.
	Live(ctx context.Context, limit int) ([]LiveSKU, error)

	// Unmark ends the mark m if it is still the SKU's mark and has passed by
	// Redis's clock; false if it moved (a reserve marked the SKU again) or
	// has not passed.
	Unmark(ctx context.Context, m LiveSKU) (bool, error)

	// Withdraw ends the mark m at once if it is still the SKU's mark: the
	// reserve that made it found that MySQL has no such SKU, so no hold can
	// exist under it (a flood of made-up SKUs leaves no marks behind).
	Withdraw(ctx context.Context, m LiveSKU) (bool, error)

	// Cursor returns the last SKU the sweeper's catalog pass reached (""
	// at the start of a pass, or when Redis forgot it); SetCursor records it.
	Cursor(ctx context.Context) (string, error)

	SetCursor(ctx context.Context, sku string) error
}

// LiveSKU is a SKU marked live, and until when.
type LiveSKU struct {
	SKU   string
	Until time.Time
}

// Attempt is one attempt of a buyer's on a SKU that Holds.Charge charges.
type Attempt struct {
	SKU    string
	Bucket int // the buyer's home bucket, where their attempt budget lives
	UserID string
	Token  string // names the attempt: a repeat of the same call is free
	// Group, when set, is a group the buyer opens: it counts as one of their
	// open groups until Until; MaxOpen bounds them (0: no cap).
	Group   string
	Until   time.Time
	MaxOpen int
}

// ReserveOutcome says what Reserve did besides holding.
type ReserveOutcome struct {
	Replayed bool // the hold existed: nothing taken
	Full     bool // this join took the group's last slot: once accepted, the group may form
	// Tombstone: the replayed hold is a tombstone Follow wrote of MySQL's
	// row in a bucket that had no hold of the row's own (a stray returned
	// there, a twin, or a hold Redis lost). The row may have moved on since
	// (a refund follows in the row's bucket, not here): only a final hold
	// the bucket took itself is the row's bucket's word.
	Tombstone bool
	// Whole: the bucket holds every reservation of its SKU, each at least
	// until its retention (it was warmed when MySQL had none, with one
	// bucket, and K has not changed since): an id it has no hold of has no
	// row in MySQL either. Set with a new hold and with the refusals a keyed
	// buy would otherwise ask MySQL about (docs/design.md, "A bucket that
	// holds every id").
	Whole bool
}

// RedisStock is a SKU as Redis has it.
type RedisStock struct {
	SKU        string
	Available  int64 // units buyers can still reserve
	Held       int64 // units HELD, not yet decided
	AdminDelta int64 // the admin changes applied (StockLevel.AdminDelta)
	Version    int64 // the MySQL version of the last level applied
	// Moving is the units of transfers out of this bucket taken out and not
	// credited yet (part of Held): on their way to another bucket.
	Moving int64
	// Ahead is the units of transfers into this bucket credited ahead of
	// MySQL's record (part of Available): until the record, MySQL's share
	// lacks them, so the bucket's drift is theirs and is not healed.
	Ahead int64
	// OpensAt and ClosesAt are the sale window the bucket's figures carry
	// (zero: no such bound), the one its reserves are judged by.
	OpensAt, ClosesAt time.Time
	// AdmitPermille is the waiting room bucket 0's figures carry (0: none).
	AdmitPermille int
}

// SyncResult is what Sync did.
type SyncResult int

// Outcomes of StockFigures.Sync.
const (
	SyncNone     SyncResult = iota // nothing to change
	SyncWarmed                     // the SKU was missing and is loaded
	SyncAdjusted                   // admin changes were applied
	SyncStale                      // the level is older than what Redis saw: read it again
	SyncMissing                    // Redis has no stock for the SKU: warm it
)

// GroupClosing is CloseGroup's answer.
type GroupClosing struct {
	Status   GroupStatus // FORMED or FAILED; "" with NotDue or Unknown
	FormedAt time.Time
	Holders  []string // reservation ids holding slots of a FAILED group
	NotDue   bool     // Redis's clock says the deadline has not passed
	Full     bool     // OPEN past the deadline with every slot taken: MySQL decides
	FullAt   time.Time
	Unknown  bool // Redis has no such group
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
	OverLimit                           // the user's confirmed units would pass the per-user limit
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

// BatchResult is the ledger's outcome for one reservation.
type BatchResult struct {
	Result  ApplyResult
	Row     Reservation // the existing row for AlreadyConfirmed and AlreadyCancelled
	Version int64       // the stock row's version after an Applied commit
}

// Ledger is the MySQL side, the arbiter. A reservation's row decides its
// fate, and every unit that moves in either store is the effect of one of its
// transitions: none → CONFIRMED (Apply), none → CANCELLED (Fence),
// CONFIRMED → CANCELLED (Refund); CONFIRMED → PAID (Pay) moves none and
// ends it. A CANCELLED transition leaves the row's
// release owed until Redis has followed it (MarkReleased): Reservation's
// sub-states. Every transition of a reservation's row or a group's writes
// its Event to the event outbox in the same transaction (ConfirmedEvent,
// CancelledEvent, GroupEvent; a transfer has none), unpublished until
// MarkPublished: no event without its decision, no decision without its event.
type Ledger interface {
	// Apply makes one attempt, in one transaction, to insert r's row
	// CONFIRMED and take its stock with a version-checked update (and its
	// per-user units and group slot). ErrVersionConflict: nothing written,
	// try again in a fresh transaction. When the row already exists it is
	// returned with AlreadyConfirmed or AlreadyCancelled.
	Apply(ctx context.Context, r Reservation, lock Locking, now time.Time) (BatchResult, error)
	// ApplyBatch makes one attempt to settle reservations of one SKU without
	// group joins, in one transaction: a row that already exists is returned
	// as it stands (AlreadyConfirmed, AlreadyCancelled); of the others, those
	// that fit the available stock and their users' limits, in the order
	// given, are inserted CONFIRMED in one statement and their summed
	// quantity taken with one version-checked update under the row lock
	// (Applied); the rest are Insufficient or OverLimit and nothing is
	// written for them. ErrVersionConflict (a fence raced the insert, or a
	// deadlock): nothing written, try again.
	ApplyBatch(ctx context.Context, sku string, rs []Reservation, now time.Time) ([]BatchResult, error)
	// Fence inserts r's row CANCELLED with reason (and r.Note with
	// ReasonOrderCancelled) unless a row exists (Fenced, its release owed,
	// its CancelledEvent written unless a transfer's), and returns the row
	// as it stands; inserted reports whether this call wrote it.
	Fence(ctx context.Context, r Reservation, reason Reason, now time.Time) (row Reservation, inserted bool, err error)
	// Refund turns a CONFIRMED unpaid row CANCELLED (Refunded, release
	// owed, note kept with ReasonOrderCancelled, its CancelledEvent
	// written) and returns its stock, per-user units and — unless the group
	// formed — its group slot in one transaction; refunded reports whether
	// this call did it. A PAID row is returned as it stands: final.
	// ErrNotFound: no such row, or a transfer's (no buyer's to refund).
	Refund(ctx context.Context, id string, reason Reason, note string, now time.Time) (row Reservation, refunded bool, err error)
	// Pay records the payment of a CONFIRMED unpaid row at now (PaidAt;
	// its PaidEvent written) in one transaction; paid reports whether this
	// call did it. A PAID or CANCELLED row is returned as it stands.
	// ErrNotFound: no row (the reservation may still be HELD);
	// ErrGroupNotFormed: a join whose group MySQL has not recorded FORMED.
	Pay(ctx context.Context, id string, now time.Time) (row Reservation, paid bool, err error)
	// PaymentsDue returns up to limit CONFIRMED unpaid rows whose PayBy is
	// at or before t, the earliest first (an index range read): the
	// sweeper cancels them ReasonPaymentTimeout.
	PaymentsDue(ctx context.Context, t time.Time, limit int) ([]Reservation, error)
	// Transfer records the transfer t, whose units bucket t.Bucket holds
	// (TakeOut), in one transaction: its row CONFIRMED and unreleased (its
	// release owed: the credit to bucket t.Into), the two buckets' shares moved, the stock
	// row's version moved on (the returned row's TransferVersion); recorded
	// reports that this call wrote it. If a row with t.ID exists (recorded
	// before, or fenced by a release before transfers were completed
	// forward), it is returned as it stands and nothing moves. A transfer
	// between buckets the SKU does not have is ErrNotATransfer, and
	// ErrUnknownSKU if MySQL has no such SKU: nothing is written.
	Transfer(ctx context.Context, t Reservation, now time.Time) (row Reservation, recorded bool, err error)
	// Reservation returns the row for id, or ErrNotFound.
	Reservation(ctx context.Context, id string) (Reservation, error)
	// MarkReleased records that Redis followed the row of id: an owed
	// release becomes ReleaseDone.
	MarkReleased(ctx context.Context, id string) error
	// Outbox returns rows last changed before t whose release is owed
	// (ReleaseOwed: CANCELLED rows Redis has not followed yet, and
	// transfers not credited yet), for the sweeper to drain.
	Outbox(ctx context.Context, t time.Time, limit int) ([]Reservation, error)
	// EventsOf returns the unpublished events of the named aggregates
	// (reservation or group ids), each aggregate's in the order they were
	// written.
	EventsOf(ctx context.Context, aggregates []string) ([]Event, error)
	// Unpublished returns unpublished events that occurred before t, oldest
	// first, each aggregate's in version order: the event outbox the
	// sweeper drains. Up to limit events — or more, when the confirmations
	// one ApplyBatch wrote are kept together (those still unpublished come
	// whole), and when a listed reservation's confirmation, which goes
	// before it, is still owed by a batch not listed (one such each, at most).
	Unpublished(ctx context.Context, t time.Time, limit int) ([]Event, error)
	// MarkPublished records that evs went out at at.
	MarkPublished(ctx context.Context, evs []Event, at time.Time) error
	// OldestUnpublished returns when the oldest unpublished event occurred;
	// ok false when every event is published (the outbox's lag).
	OldestUnpublished(ctx context.Context) (at time.Time, ok bool, err error)
	// Unreleased counts the SKU's rows Redis has not followed yet
	// (cancellations and transfers).
	Unreleased(ctx context.Context, sku string) (int, error)
	// ChangeStock applies an admin's change in one transaction (a pay
	// window included: Apply and FormGroup start each confirmed row's
	// window from it, PayBy) (creating
	// the SKU on an absolute change) and returns the new level.
	// ErrPreconditionRequired, ErrPreconditionFailed, ErrInsufficient,
	// ErrUnknownSKU (Add on a missing SKU).
	ChangeStock(ctx context.Context, c StockChange) (StockLevel, error)
	// Stock returns the SKU's level, or ErrUnknownSKU.
	Stock(ctx context.Context, sku string) (StockLevel, error)
	// CountWarmUp records a warm-up of one of the SKU's Redis buckets and
	// returns how many the SKU has had, this one included, and whether
	// MySQL has any reservation row of the SKU; ErrUnknownSKU.
	CountWarmUp(ctx context.Context, sku string) (n int64, reserved bool, err error)
	// Snapshot reads, consistently, the SKU's level and the CONFIRMED rows
	// among ids, and every CONFIRMED row of the SKU still unpaid within a
	// pay window (units that may return), each row once (the warm-up's read).
	Snapshot(ctx context.Context, sku string, ids []string) (StockLevel, []Reservation, error)
	// StocksAfter returns up to limit SKUs' levels in SKU order, starting
	// after the SKU named after ("": from the first).
	StocksAfter(ctx context.Context, after string, limit int) ([]StockLevel, error)
	// Levels returns the levels of the SKUs named that exist, in any order.
	Levels(ctx context.Context, skus []string) ([]StockLevel, error)
	// Opening returns the levels of up to limit SKUs whose sale window
	// opens after after and at or before until, the earliest first (the
	// sweeper warms them before they open).
	Opening(ctx context.Context, after, until time.Time, limit int) ([]StockLevel, error)
	// CreateGroup inserts an OPEN group; ErrUnknownSKU if the SKU is unknown.
	CreateGroup(ctx context.Context, g Group) error
	// Group returns the group, or ErrUnknownGroup.
	Group(ctx context.Context, id string) (Group, error)
	// DueGroups returns up to limit groups OPEN with their deadline at or
	// before t, in (deadline, id) order, after the group named by after
	// (its Deadline and ID; zero: from the first).
	DueGroups(ctx context.Context, t time.Time, after Group, limit int) ([]Group, error)
	// UnsettledGroups returns groups whose end has not reached both stores:
	// FORMED ones Redis has not been told of, FAILED ones whose members are
	// not all cancelled yet.
	UnsettledGroups(ctx context.Context, limit int) ([]Group, error)
	// FormGroup records that the group formed (its last slot was taken in
	// Redis at formedAt, before its deadline): OPEN → FORMED, final — unless
	// a member's cancellation is still on its way to Redis (an unreleased
	// row: Redis's slot count is behind MySQL). formed reports whether the
	// group is FORMED now. The members it finds confirmed get their pay
	// window from now, the record's time (formedAt may be long past: a
	// record that failed and was retried).
	FormGroup(ctx context.Context, id string, formedAt, now time.Time) (formed bool, err error)
	// FailGroup turns an OPEN group FAILED and returns it as it stands
	// (FORMED if it formed first).
	FailGroup(ctx context.Context, id string, now time.Time) (Group, error)
	// FailEmptyGroups turns the named groups FAILED and settled at once where
	// they are still OPEN, due by now and without a member in MySQL (Redis
	// said no slot of theirs is held); it returns how many it ended.
	FailEmptyGroups(ctx context.Context, ids []string, now time.Time) (int, error)
	// GroupMembers returns the CONFIRMED reservations of a group.
	GroupMembers(ctx context.Context, id string) ([]Reservation, error)
	// GroupLeaving returns the CANCELLED rows of a group's joins that Redis
	// has not been seen to follow yet (released = 0).
	GroupLeaving(ctx context.Context, id string) ([]Reservation, error)
	// GroupSettled records that a group's end reached both stores: every
	// member of a FAILED group is cancelled; Redis knows a FORMED group formed.
	GroupSettled(ctx context.Context, id string) error
	// Books: the ledger audit's tally and its record.
	Books
}

// Enqueuer hands an accepted reservation to persist (SQS in production).
type Enqueuer interface {
	Enqueue(ctx context.Context, r Reservation) error
}

// Notifier publishes the outbox's events to the order service (EventBridge
// in production), in no particular order: Service.send gives one call at
// most one event per aggregate. Delivery is at least once: consumers
// deduplicate by Event.ID. errs[i] is events[i]'s: nil once the bus took it.
type Notifier interface {
	Publish(ctx context.Context, events []Event) (errs []error)
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
