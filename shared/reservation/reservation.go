// Package reservation is holdfast's protocol: the life of a stock reservation
// (HELD → CONFIRMED | CANCELLED), the group-buy rules, and the decisions that
// reserve, persist, compensate, the sweeper and a buyer's cancel take.
//
// Redis pre-deducts stock and keeps holds; MySQL is the arbiter: a
// reservation's row decides its fate. Every path that could cancel a
// reservation goes through one fenced decision (Service.fence): write the
// CANCELLED row if no row exists, and only then return the hold's stock. A
// late persist finds the fence and takes nothing, so no reservation is ever
// both confirmed and released. docs/design.md tells the whole story.
//
// The package declares the ports it needs (Holds, Ledger, Enqueuer,
// Notifier, Metrics, Clock); adapters live beside it and depend on it.
package reservation

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Status is the state of a reservation.
type Status string

// A reservation is HELD from the moment Redis pre-deducts its stock until
// MySQL decides it: CONFIRMED (stock taken in MySQL) or CANCELLED (stock
// returned, or never taken). CONFIRMED may still become CANCELLED by a
// buyer's or the order service's cancel, a payment timeout or a failed
// group, which returns the stock to both stores — or PAID, final.
const (
	StatusHeld      Status = "HELD"
	StatusConfirmed Status = "CONFIRMED"
	StatusCancelled Status = "CANCELLED"
	// StatusPaid is shown, never a row's Status: a CONFIRMED row whose
	// payment the order service recorded (PaidAt set; Ledger.Pay). Its stock
	// stays taken for good: no cancel, refund or timeout moves it again.
	// Redis never hears of it (its hold is CONFIRMED, which is all a hold
	// needs to know).
	StatusPaid Status = "PAID"
)

// Cancellation says how a CANCELLED reservation came about; NotCancelled
// (the zero value) on every other. Two transitions write it, both final:
//
//	HELD      → CANCELLED  Fenced    Ledger.Fence: MySQL never took the stock
//	CONFIRMED → CANCELLED  Refunded  Ledger.Refund: the stock went back to MySQL
type Cancellation string

// The ways of cancelling, named for the ledger transition that wrote them.
const (
	NotCancelled Cancellation = ""         // HELD or CONFIRMED
	Fenced       Cancellation = "fenced"   // cancelled while HELD: MySQL never took its stock
	Refunded     Cancellation = "refunded" // cancelled after CONFIRMED: its stock went back to MySQL
)

// ReleaseState is a decided row's give-back to Redis: MySQL's release
// outbox, which the sweeper drains. A CANCELLED row gives its hold's units
// back to its bucket; a transfer's row credits its units to bucket Into (a
// fenced one's go back to the giving bucket). ReleaseNone (the zero value):
// nothing to give back, as on a hold MySQL has not decided or a CONFIRMED
// buy.
//
//	ReleaseNone → ReleaseOwed  Ledger.Fence, Ledger.Refund, Ledger.Transfer
//	ReleaseOwed → ReleaseDone  Ledger.MarkReleased, once Redis followed the row
type ReleaseState string

// The states of the release outbox.
const (
	ReleaseNone ReleaseState = ""     // nothing to give back
	ReleaseOwed ReleaseState = "owed" // MySQL decided; Redis has not acknowledged following it
	ReleaseDone ReleaseState = "done" // Redis followed the row (a transfer's: credited it)
)

// Reason says why a reservation was cancelled.
type Reason string

// Reasons of cancellation, as stored in MySQL and sent in events.
const (
	ReasonExpired       Reason = "expired"            // hold deadline passed without a decision
	ReasonPublishFailed Reason = "publish_failed"     // the SQS send failed at reserve time
	ReasonHoldFailed    Reason = "hold_failed"        // Redis failed mid-reserve: a hold may exist, nothing was sent
	ReasonInsufficient  Reason = "insufficient_stock" // MySQL could not cover it (stores drifted)
	ReasonDeadLetter    Reason = "dead_letter"        // persist gave up; the message reached the DLQ
	ReasonBuyer         Reason = "buyer_cancelled"    // DELETE /reservations/{id}
	ReasonGroupFailed   Reason = "group_failed"       // the group's deadline passed before it formed
	ReasonGroupClosed   Reason = "group_closed"       // joined a group MySQL no longer has open
	ReasonGroupFull     Reason = "group_full"         // MySQL found the group full
	ReasonAlreadyJoined Reason = "already_joined"     // MySQL found the user already in the group
	ReasonUnknownSKU    Reason = "unknown_sku"        // the SKU does not exist in MySQL
	ReasonLimit         Reason = "limit_exceeded"     // MySQL found the user at the SKU's per-user limit
	// ReasonPaymentTimeout: CONFIRMED and not paid by its PayBy (the SKU's
	// pay window); the sweeper refunded it.
	ReasonPaymentTimeout Reason = "payment_timeout"
	// ReasonOrderCancelled: the order service cancelled it (POST
	// /admin/reservations/{id}/cancel); its own words are the row's Note.
	ReasonOrderCancelled Reason = "order_cancelled"
)

// CountsInGroup reports whether a join cancelled for r had counted among
// its group's slots: it was accepted (its message was sent: the buyer
// cancelled it, it reached the dead-letter queue, MySQL was short or over
// the limit), or its hold expired (nobody can tell that from an accepted
// join whose message came too late). A join that did not count — its send
// or Redis call failed at reserve, or MySQL refused it as not joining this
// group — never filled its group: its slot reopens even after the deadline.
func (r Reason) CountsInGroup() bool {
	switch r {
	case ReasonBuyer, ReasonOrderCancelled, ReasonDeadLetter, ReasonExpired, ReasonInsufficient, ReasonLimit:
		return true
	}
	return false
}

// Reservation is one buyer's claim on Qty units of SKU.
type Reservation struct {
	ID      string
	SKU     string
	Qty     int
	UserID  string
	GroupID string // empty unless a group-buy join
	// Token names one Redis incarnation of the hold: random per hold that
	// reserve.lua records. MySQL stores the token of the hold it decided, so
	// a hold Redis took again for the same id after forgetting the first (a
	// stray) is recognised and returned instead of confirmed.
	Token  string
	Status Status
	Reason Reason // set when CANCELLED
	// Note is the order service's own reason for its cancel (with
	// ReasonOrderCancelled; empty otherwise): recorded and published as
	// given, never interpreted.
	Note string
	// PayBy is when a CONFIRMED row's payment is due (zero: no pay window,
	// or a group join whose group has not formed: a join's window opens
	// when its group forms). Not paid by then, the sweeper cancels it
	// ReasonPaymentTimeout. PaidAt is when the order service recorded its
	// payment (zero: unpaid): the row is PAID (Shown), final.
	PayBy, PaidAt time.Time
	// Cancellation and Release are the row's sub-states: how it was
	// cancelled, its give-back to Redis. Only these combinations occur
	// (→: the outbox drained):
	//
	//	row                        Cancellation  Release
	//	HELD (not in MySQL yet)    NotCancelled  None
	//	CONFIRMED buy or join      NotCancelled  None
	//	CANCELLED, fenced          Fenced        Owed → Done
	//	CANCELLED, refunded        Refunded      Owed → Done
	//	transfer, CONFIRMED        NotCancelled  Owed → Done
	//	transfer, fenced           Fenced        Owed → Done
	//
	// and PaidAt is set only on a CONFIRMED buy or join (shown PAID).
	//
	// A hold read from Redis has its Status and Cancellation, no outbox.
	// Its events are not the row's: the decision writes them to the event
	// outbox (Event) in the same transaction.
	Cancellation Cancellation
	Release      ReleaseState
	// RefundVersion is the stock row's version right after a refund (0
	// otherwise): Redis warmed from a level at or past it already has the
	// refunded units, so the release gives nothing back a second time. A
	// transfer's version is TransferVersion.
	RefundVersion int64
	ExpiresAt     time.Time // the hold's deadline
	CreatedAt     time.Time
	// Bucket is the bucket of the SKU the hold is in (0 with one bucket).
	Bucket int
	// Transfer marks a transfer of Qty units from bucket Bucket to bucket
	// Into (Service.refill): a hold in the giving bucket, confirmed by the
	// MySQL transaction that moves the buckets' shares, and credited to Into
	// once (its Release owed until then). It has no user and no event.
	Transfer bool
	Into     int
	// TransferVersion is the stock row's version right after a transfer's
	// transaction (0 until it committed): Redis's receiving bucket warmed
	// from a level at or past it already has the units, so the credit adds
	// nothing. MySQL keeps it in the column a refund's version uses
	// (refund_version): a row is a refund or a transfer, never both.
	TransferVersion int64
	// Sent (Redis, a join's hold) says its message was sent: the join was
	// accepted (Holds.AcceptJoin). A join's hold that expires unsent never
	// counted among its group's slots.
	Sent bool
	// Ticket is the waiting-room ticket a reserve's admission token names
	// ("" without one), and TicketExpires when the admission ends: the
	// reserve script holds for an admitted ticket only, once. Never stored.
	Ticket        string
	TicketExpires time.Time
	// AlreadyCharged marks a reserve call whose attempt is charged to the
	// buyer's attempt rate already (by Holds.Charge, or by the script on an
	// earlier call: the retry after a warm-up or a refill): it is not
	// charged again. Never stored.
	AlreadyCharged bool
}

// GroupStatus is the state of a group-buy.
type GroupStatus string

// A group is OPEN until its last slot is taken (FORMED) or its deadline passes
// first (FAILED, terminal: every member is cancelled and the stock returns).
const (
	GroupOpen   GroupStatus = "OPEN"
	GroupFormed GroupStatus = "FORMED"
	GroupFailed GroupStatus = "FAILED"
	// GroupFull is shown, never stored: every slot is taken and MySQL has
	// not recorded the group FORMED yet (a join in flight, or a member's
	// cancellation on its way to Redis). It becomes FORMED, or OPEN again.
	GroupFull GroupStatus = "FULL"
)

// Group is a group-buy on one SKU with a fixed number of slots.
type Group struct {
	ID        string
	SKU       string
	Capacity  int
	Remaining int // slots anyone can still take (0 once FORMED or FAILED)
	Members   int // members confirmed in MySQL
	Status    GroupStatus
	Deadline  time.Time
	FormedAt  time.Time // when the last slot was taken in Redis (zero unless FORMED)
	FullAt    time.Time // Redis: when its last slot was taken, while OPEN (zero if a slot is free)
	CreatedAt time.Time
}

// StockLevel is a SKU's stock as MySQL records it.
type StockLevel struct {
	SKU          string
	Available    int64
	Version      int64 // moves with every change of the row: sales, refunds, admin changes
	PerUserLimit int   // units per user; 0: no limit
	// UserRate and UserBurst bound each user's reserve attempts on the SKU
	// (per second, and the burst); 0 takes the service's defaults.
	UserRate, UserBurst int
	// AdminDelta is the sum of every admin change ever made (units added
	// minus units removed). Redis records the figure it has applied, so it
	// follows admin changes exactly once each, in any order: it moves by the
	// difference between the newest figure and the one it has.
	AdminDelta int64
	// Buckets is K, the Redis buckets the SKU's stock is split over (0 or
	// 1: one). BucketAvailable[b-1] is bucket b's share of Available for
	// b ≥ 1; bucket 0 has the rest (see Bucket).
	Buckets         int
	BucketAvailable []int64
	// OpensAt and ClosesAt are the SKU's sale window (zero: no such bound;
	// no window by default). By Redis's clock, a buy or join is refused
	// before OpensAt (ErrNotOpen) and from ClosesAt on (ErrSaleClosed); a
	// hold taken before ClosesAt settles as usual.
	OpensAt, ClosesAt time.Time
	// PayWithin is the SKU's pay window (0: none): a reservation confirmed
	// with it is due to be paid PayWithin after its confirmation (a join:
	// after its group formed). A change applies to confirmations after it.
	PayWithin time.Duration
	// AdmitPermille is the SKU's waiting room: buyers admitted per unit
	// left, in thousandths (≥ 1000), or 0: no waiting room (the default).
	// A SKU with a waiting room has one bucket (the room is what spreads
	// its load). See WaitingRoom.
	AdmitPermille int
	// Created: this change inserted the SKU's row (ChangeStock's level),
	// or this is the level its warm-up loads (warmBucket's, for Warm). No
	// hold of the SKU can exist anywhere before its first warm-up, so that
	// warm-up, with one bucket, makes a bucket that holds every reservation
	// of it (ReserveOutcome.Whole) unless checkFirst finds it was not the
	// first, or finds a reservation row of the SKU.
	Created bool
}

// WaitingRoom reports whether the SKU sells through its waiting room.
func (l StockLevel) WaitingRoom() bool { return l.AdmitPermille > 0 }

// StockChange is an admin's change of a SKU's sellable stock: an absolute
// figure (Set, guarded by IfVersion) or a relative one (Add).
type StockChange struct {
	SKU string
	// Set is the new available figure. On an existing SKU it needs
	// IfVersion: the version the admin read (ErrPreconditionRequired
	// without it, ErrPreconditionFailed when the row moved since).
	Set     *int64
	Add     *int64 // units to add (negative: remove); commutes with sales
	Limit   *int   // new per-user limit, when not nil
	Rate    *int   // new per-user attempts per second, when not nil (0: the default)
	Burst   *int   // new per-user burst, when not nil (0: the default)
	Buckets *int   // new K, when not nil: 1..MaxBuckets, never fewer than the SKU has
	// OpensAt and ClosesAt, when not nil, set a bound of the sale window
	// (in milliseconds); a zero time clears it. The window must close after
	// it opens, the bound the change leaves alone included.
	OpensAt, ClosesAt *time.Time
	// PayWithin, when not nil, sets the SKU's pay window, in whole seconds
	// (0: none).
	PayWithin *time.Duration
	// WaitingRoom, when not nil, turns the SKU's waiting room on or off;
	// AdmitFactor, when not nil, sets its admit factor (1 to 100, buyers
	// per unit left; 1 when a room is turned on without one). ApplyRoom.
	WaitingRoom *bool
	AdmitFactor *float64
	IfVersion   *int64
	// IfExists is If-Match: *: Set applies to the SKU as it stands, without
	// a version, and fails (ErrPreconditionFailed) if there is none.
	IfExists bool
	// Key makes a retried change a no-op (an Idempotency-Key); optional.
	Key string
}

// Domain errors. Callers branch on them with errors.Is.
var (
	ErrSoldOut       = errors.New("sold out")
	ErrGroupFull     = errors.New("group full")
	ErrAlreadyJoined = errors.New("user already joined this group")
	ErrGroupClosed   = errors.New("group closed")
	ErrUnknownSKU    = errors.New("unknown sku")
	ErrUnknownGroup  = errors.New("unknown group")
	ErrNotFound      = errors.New("reservation not found")
	ErrLimitExceeded = errors.New("per-user limit exceeded")
	ErrRateLimited   = errors.New("too many attempts")
	// ErrNotOpen: the SKU's sale window has not opened (see NotOpenError).
	ErrNotOpen = errors.New("sale not open yet")
	// ErrSaleClosed: the SKU's sale window has closed.
	ErrSaleClosed = errors.New("sale closed")
	// ErrPaid: the reservation is PAID, final: it cannot be cancelled.
	ErrPaid = errors.New("reservation paid")
	// ErrNotConfirmed: a payment of a reservation MySQL has not confirmed
	// (still HELD): nothing changed; pay once ReservationConfirmed is out.
	ErrNotConfirmed = errors.New("reservation not confirmed yet")
	// ErrCancelled: a payment of a CANCELLED reservation (see
	// CancelledError): nothing changed.
	ErrCancelled = errors.New("reservation cancelled")
	// ErrGroupNotFormed: a payment of a group join whose group has not
	// formed: nothing changed; a join is paid once GroupFormed is out.
	ErrGroupNotFormed = errors.New("group not formed yet")
	// ErrTooManyGroups: the buyer already holds Config.MaxOpenGroups open
	// groups on the SKU (see TooManyGroupsError).
	ErrTooManyGroups       = errors.New("too many open groups")
	ErrIdempotencyMismatch = errors.New("idempotency key reused with a different request")
	// ErrPreconditionRequired: an absolute stock change of an existing SKU
	// without the version it was based on.
	ErrPreconditionRequired = errors.New("precondition required")
	// ErrPreconditionFailed: the stock row moved since the version given.
	ErrPreconditionFailed = errors.New("version mismatch")
	// ErrInsufficient: a stock change would take available below zero.
	ErrInsufficient = errors.New("insufficient stock")
	// ErrNotATransfer: a transfer message or record that names no two
	// buckets the SKU has (only a forged one can): nothing is written.
	ErrNotATransfer = errors.New("not a transfer between two buckets of the sku")
	// ErrUnavailable marks a failure of a store or queue: the request may be
	// retried, and nothing was held.
	ErrUnavailable = errors.New("dependency unavailable")
	// ErrVersionConflict is an optimistic-lock miss in the ledger: retry in
	// a fresh transaction.
	ErrVersionConflict = errors.New("version conflict")
	// ErrContended means persist ran out of optimistic retries; the message
	// is redelivered, never cancelled for it.
	ErrContended = errors.New("stock row contended")
)

// RateLimitedError is ErrRateLimited with how long to wait.
type RateLimitedError struct{ RetryAfter time.Duration }

func (e *RateLimitedError) Error() string {
	return fmt.Sprintf("%v: retry after %v", ErrRateLimited, e.RetryAfter)
}

// Is makes errors.Is(err, ErrRateLimited) hold.
func (e *RateLimitedError) Is(target error) bool { return target == ErrRateLimited }

// NotOpenError is ErrNotOpen with when the sale opens and how long that
// is from Redis's now.
type NotOpenError struct {
	OpensAt    time.Time
	RetryAfter time.Duration
}

func (e *NotOpenError) Error() string {
	return fmt.Sprintf("%v: opens at %s", ErrNotOpen, e.OpensAt.UTC().Format(time.RFC3339Nano))
}

// Is makes errors.Is(err, ErrNotOpen) hold.
func (e *NotOpenError) Is(target error) bool { return target == ErrNotOpen }

// CancelledError is ErrCancelled with the reservation's reason.
type CancelledError struct{ Reason Reason }

func (e *CancelledError) Error() string { return fmt.Sprintf("%v (%s)", ErrCancelled, e.Reason) }

// Is makes errors.Is(err, ErrCancelled) hold.
func (e *CancelledError) Is(target error) bool { return target == ErrCancelled }

// TooManyGroupsError is ErrTooManyGroups with how long until one of the
// buyer's open groups stops counting.
type TooManyGroupsError struct{ RetryAfter time.Duration }

func (e *TooManyGroupsError) Error() string {
	return fmt.Sprintf("%v: retry after %v", ErrTooManyGroups, e.RetryAfter)
}

// Is makes errors.Is(err, ErrTooManyGroups) hold.
func (e *TooManyGroupsError) Is(target error) bool { return target == ErrTooManyGroups }

// InvalidError is bad input: it names the field and the problem.
type InvalidError struct {
	Field string
	Msg   string
}

func (e *InvalidError) Error() string { return e.Field + ": " + e.Msg }

func invalid(field, format string, args ...any) error {
	return &InvalidError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// ValidID reports whether s can be a SKU, user or group id:
// 1–64 characters of letters, digits and ._:- (no braces, so an id can never
// break a Redis hash tag). It runs on every request, so it is a loop, not a
// regular expression.
func ValidID(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == ':', c == '-':
		default:
			return false
		}
	}
	return true
}

// Validate checks a reservation request against the per-request limit.
func (r Reservation) Validate(maxQty int) error {
	switch {
	case !ValidID(r.SKU):
		return invalid("sku", "must be 1-64 characters of letters, digits and ._:-")
	case !ValidID(r.UserID):
		return invalid("user_id", "must be 1-64 characters of letters, digits and ._:-")
	case r.GroupID != "" && !ValidID(r.GroupID):
		return invalid("group_id", "must be 1-64 characters of letters, digits and ._:-")
	case r.ID != "" && !ValidReservationID(r.ID, r.SKU):
		return invalid("reservation_id", "must be the sku, a dot and 26 base32 characters")
	case r.Qty < 1:
		return invalid("qty", "must be at least 1")
	case r.Qty > maxQty:
		return invalid("qty", "must be at most %d", maxQty)
	}
	return nil
}

// ValidReservationID reports whether id is a reservation id of sku (any SKU
// when sku is empty): the SKU, a dot, and 26 characters of lower-case base32.
func ValidReservationID(id, sku string) bool {
	owner, ok := SKUOf(id)
	return ok && (sku == "" || owner == sku)
}

// SKUOf returns the SKU a reservation id names. A reservation id carries its
// SKU so that the hold can be found from the id alone: no index to write on
// the hot path, no second key in another cluster slot.
func SKUOf(id string) (string, bool) {
	i := strings.LastIndexByte(id, '.')
	if i < 1 || len(id)-i-1 != idRandLen || !ValidID(id[:i]) {
		return "", false
	}
	for _, c := range []byte(id[i+1:]) {
		if (c < 'a' || c > 'z') && (c < '2' || c > '7') {
			return "", false
		}
	}
	return id[:i], true
}

// idRandLen is the length of the random (or key-derived) part of an id.
const idRandLen = 26

// Final reports whether the status is a decided one.
func (s Status) Final() bool { return s == StatusConfirmed || s == StatusCancelled || s == StatusPaid }

// Shown is the status a buyer or the order service sees: PAID for a
// CONFIRMED row with its payment recorded, else the Status.
func (r Reservation) Shown() Status {
	if r.Status == StatusConfirmed && !r.PaidAt.IsZero() {
		return StatusPaid
	}
	return r.Status
}

// ValidNote reports whether s can be the order service's reason for its
// cancel: 1–64 characters of letters, digits and ._:- (as an id), so a
// note is a code, never free text that could carry anything.
func ValidNote(s string) bool { return ValidID(s) }
