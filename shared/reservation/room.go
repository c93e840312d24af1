package reservation

// The waiting room: a queue per SKU that admits buyers in order while the
// stock can serve them (docs/design.md, "The waiting room"). A buyer's
// ticket is derived from the SKU and the buyer, so asking again is the same
// ticket and nobody can hold another's; an admission is a token signed for
// buyer, SKU and ticket that fixes the reservation's id, so one ticket takes
// one reservation and a retry is a replay by construction. The queue lives
// in Redis (bucket 0 of the SKU, which then has one bucket); MySQL never
// hears of it.

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"strconv"
	"strings"
	"time"
)

// TicketState is a ticket's place in the waiting room.
type TicketState string

// A ticket WAITs until admitted; ADMITTED, it has an admission token that
// lasts Config.AdmitFor; it is RESERVED once a hold was taken with it, or
// EXPIRED when its admission lapsed unused. A waiting ticket is SOLD_OUT
// while no unit is left and none can return (units that come back admit
// again), CLOSED once the sale window closed. None: not in the queue.
const (
	TicketNone     TicketState = ""
	TicketWaiting  TicketState = "WAITING"
	TicketAdmitted TicketState = "ADMITTED"
	TicketReserved TicketState = "RESERVED"
	TicketExpired  TicketState = "EXPIRED"
	TicketSoldOut  TicketState = "SOLD_OUT"
	TicketClosed   TicketState = "CLOSED"
)

// QueueState is a waiting room as Redis has it, after admitting whom the
// stock can serve: the SKU's part (what a CDN may cache for everyone) and,
// when asked, one ticket's.
type QueueState struct {
	SKU string
	// Now is Redis's clock; OpensAt and ClosesAt the sale window (zero: no
	// such bound). Before OpensAt the queue's order is not drawn yet.
	Now, OpensAt, ClosesAt time.Time
	// Through is how many places are admitted, from the first; Length how
	// many tickets the queue has.
	Through, Length int64
	// Available and Held are the SKU's units free and HELD (which may
	// still return) when the state was read; Unpaid its units CONFIRMED
	// but unpaid within a pay window (which return if it lapses).
	Available, Held, Unpaid int64
	// The ticket's: its place from 1 (0 before the opening), its state,
	// and when it was admitted (ADMITTED only).
	Ticket     string
	Position   int64
	State      TicketState
	AdmittedAt time.Time
}

// Open reports whether the sale opened: places are drawn.
func (q QueueState) Open() bool { return q.OpensAt.IsZero() || !q.Now.Before(q.OpensAt) }

// SoldOut reports whether no unit is left and none can return: every
// waiter's next look says SOLD_OUT.
func (q QueueState) SoldOut() bool { return q.Available <= 0 && q.Held <= 0 && q.Unpaid <= 0 }

// MayReturn reports whether no unit is left but HELD or unpaid ones may
// still come back (a waiter may yet be admitted).
func (q QueueState) MayReturn() bool { return q.Available <= 0 && (q.Held > 0 || q.Unpaid > 0) }

// Admission is a ticket's admission token, for POST /reservations.
type Admission struct {
	Token   string
	Expires time.Time
}

// QueueOp is what a WaitingRoom call does besides admitting.
type QueueOp struct {
	Join bool // take the ticket's place (a no-op for a ticket in the queue)
	// Place is a new ticket's place before the opening: a random fraction
	// in [0, 1), so the ones taken before the opening are shuffled.
	Place float64
	Lead  time.Duration // how long before the opening the queue opens
	// AdmitFor is how long an admission lasts.
	AdmitFor time.Duration
	// Charge is the buyer whose attempt budget on the SKU the call is
	// charged to, before it changes anything ("" = none: the public look);
	// past the rate *RateLimitedError and nothing changed.
	Charge string
}

// Domain errors of the waiting room.
var (
	// ErrNoWaitingRoom: the SKU sells without a waiting room.
	ErrNoWaitingRoom = errors.New("no waiting room for this sku")
	// ErrQueueNotOpen: the queue opens Config.QueueLead before the sale
	// (see QueueNotOpenError).
	ErrQueueNotOpen = errors.New("queue not open yet")
	// ErrUnknownTicket: no such ticket of this buyer on this SKU.
	ErrUnknownTicket = errors.New("unknown ticket")
	// ErrAdmissionRequired: a reserve of a waiting-room SKU without an
	// Admission-Token.
	ErrAdmissionRequired = errors.New("admission required")
	// ErrAdmissionInvalid: an Admission-Token that is not this buyer's for
	// this SKU (forged, another buyer's, another SKU's, or malformed).
	ErrAdmissionInvalid = errors.New("admission token invalid")
	// ErrAdmissionExpired: an Admission-Token past its time, or lapsed in
	// Redis: the ticket had its turn.
	ErrAdmissionExpired = errors.New("admission expired")
)

// QueueNotOpenError is ErrQueueNotOpen with when the queue opens, and how
// long that is from Redis's now.
type QueueNotOpenError struct {
	OpensAt    time.Time
	RetryAfter time.Duration
}

func (e *QueueNotOpenError) Error() string {
	return fmt.Sprintf("%v: opens at %s", ErrQueueNotOpen, e.OpensAt.UTC().Format(time.RFC3339Nano))
}

// Is makes errors.Is(err, ErrQueueNotOpen) hold.
func (e *QueueNotOpenError) Is(target error) bool { return target == ErrQueueNotOpen }

// TicketOf is user's ticket for sku: a MAC of both under the service's
// secret, 26 characters of base32. The same buyer always has the same
// ticket; nobody can make another's.
func (s *Service) TicketOf(sku, user string) string {
	mac := s.mac("ticket", sku, user)
	return idEncoding.EncodeToString(mac[:16]) // as a reservation id's random part
}

// mac is the service secret's HMAC-SHA256 of parts, each prefixed by its
// length, under a purpose (domain separation from the ids' MAC).
func (s *Service) mac(purpose string, parts ...string) []byte {
	h := s.macs.Get().(hash.Hash)
	defer s.macs.Put(h)
	h.Reset()
	h.Write([]byte("holdfast/" + purpose))
	for _, p := range parts {
		var n [4]byte
		binary.BigEndian.PutUint32(n[:], uint32(len(p)))
		h.Write(n[:])
		h.Write([]byte(p))
	}
	return h.Sum(nil)
}

// admission signs ticket's admission for user on sku, lasting until exp:
// "<exp unix ms>.<base64url of a 16-byte MAC>".
func (s *Service) admission(sku, user, ticket string, exp time.Time) Admission {
	ms := strconv.FormatInt(exp.UnixMilli(), 10)
	mac := s.mac("admission", sku, user, ticket, ms)
	return Admission{Token: ms + "." + base64.RawURLEncoding.EncodeToString(mac[:16]), Expires: time.UnixMilli(exp.UnixMilli()).UTC()}
}

// admitted verifies token as user's admission to sku and returns its
// ticket and expiry: ErrAdmissionInvalid if it is not theirs for this SKU;
// ErrAdmissionExpired, with the ticket and expiry all the same, once it is
// past (by this instance's clock; the reserve script checks it again by
// Redis's): a retry of a reserve that was held in time is still a replay.
func (s *Service) admitted(token, sku, user string) (ticket string, exp time.Time, err error) {
	ms, sig, ok := strings.Cut(token, ".")
	n, perr := strconv.ParseInt(ms, 10, 64)
	if !ok || perr != nil || n <= 0 || len(token) > 64 {
		return "", time.Time{}, ErrAdmissionInvalid
	}
	ticket = s.TicketOf(sku, user)
	want := s.mac("admission", sku, user, ticket, ms)
	// The token's MAC is compared as the text admission wrote: decoding
	// it would take other spellings of the same bytes (the last
	// character's spare bits, line breaks), and a token is one string.
	var text [22]byte // base64url of 16 bytes, unpadded
	base64.RawURLEncoding.Encode(text[:], want[:16])
	if subtle.ConstantTimeCompare([]byte(sig), text[:]) != 1 {
		return "", time.Time{}, ErrAdmissionInvalid
	}
	exp = time.UnixMilli(n).UTC()
	if !s.clock.Now().Before(exp) {
		return ticket, exp, ErrAdmissionExpired
	}
	return ticket, exp, nil
}

// randomPlace is a uniform fraction in [0, 1) from the system's random
// source: a pre-opening ticket's place.
func randomPlace() float64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return float64(binary.BigEndian.Uint64(b[:])>>11) / (1 << 53)
}

// JoinQueue gives user a ticket in sku's waiting room, or the one they
// have: its state after admitting whom the stock can serve. It is an
// attempt of the buyer's on the SKU (metered like a reserve: past the rate
// *RateLimitedError). Before the queue opens (Config.QueueLead before the
// sale) *QueueNotOpenError; ErrSaleClosed from the close; ErrNoWaitingRoom,
// ErrUnknownSKU. A ticket taken before the opening has no place yet: the
// places of those are drawn at random, so arriving first is no advantage.
func (s *Service) JoinQueue(ctx context.Context, user, sku string) (QueueState, error) {
	if !ValidID(sku) || !ValidID(user) {
		return QueueState{}, ErrUnknownSKU
	}
	if _, err := s.layoutOf(ctx, sku); err != nil {
		return QueueState{}, err
	}
	ticket := s.TicketOf(sku, user)
	q, err := s.lookQueue(ctx, sku, ticket, QueueOp{Join: true, Place: randomPlace(), Lead: s.cfg.QueueLead, AdmitFor: s.cfg.AdmitFor, Charge: user}, true)
	if err == nil {
		s.touch(ctx, sku)
	}
	return q, err
}

// QueueStatus is sku's waiting room for everyone (no ticket): who is
// admitted, whether it sold out. It costs one Redis call and no MySQL, and
// admits whom the stock can serve; a CDN may cache it for a second, errors
// too (the same for everyone).
func (s *Service) QueueStatus(ctx context.Context, sku string) (QueueState, error) {
	if !ValidID(sku) {
		return QueueState{}, ErrUnknownSKU
	}
	// Anyone may ask, of any name, with no account and no meter: this look
	// never asks MySQL. A SKU this instance served lately is warmed (as a
	// buyer's call would); any other without figures in Redis is unknown
	// until a buyer's call (a join, a reserve) or the sweep warms it.
	_, served := s.layouts.get(sku, s.clock.Now())
	return s.lookQueue(ctx, sku, "", QueueOp{AdmitFor: s.cfg.AdmitFor}, served)
}

// Ticket is user's ticket in sku's waiting room, and its admission token
// when ADMITTED. ErrUnknownTicket unless ticket is user's for sku and in
// the queue. It is an attempt of the buyer's on the SKU, as a join is
// (past the rate *RateLimitedError), charged in the same Redis call: one
// Redis call, no MySQL.
func (s *Service) Ticket(ctx context.Context, user, sku, ticket string) (QueueState, Admission, error) {
	if !ValidID(sku) || !ValidID(user) || subtle.ConstantTimeCompare([]byte(ticket), []byte(s.TicketOf(sku, user))) != 1 {
		return QueueState{}, Admission{}, ErrUnknownTicket
	}
	q, err := s.lookQueue(ctx, sku, ticket, QueueOp{AdmitFor: s.cfg.AdmitFor, Charge: user}, true)
	if err != nil {
		return QueueState{}, Admission{}, err
	}
	if q.State == TicketNone {
		return QueueState{}, Admission{}, ErrUnknownTicket
	}
	var a Admission
	if q.State == TicketAdmitted {
		a = s.admission(sku, user, ticket, q.AdmittedAt.Add(s.cfg.AdmitFor))
	}
	return q, a, nil
}

// lookQueue runs the waiting room's one script, warming bucket 0 first if
// Redis lost the SKU's figures and warm says it may ask MySQL.
func (s *Service) lookQueue(ctx context.Context, sku, ticket string, op QueueOp, warm bool) (QueueState, error) {
	q, err := s.room.Queue(ctx, sku, ticket, op)
	if warm && errors.Is(err, ErrUnknownSKU) {
		if _, err = s.warm(ctx, sku, 0); err != nil {
			return QueueState{}, err
		}
		q, err = s.room.Queue(ctx, sku, ticket, op)
	}
	if errors.Is(err, ErrRateLimited) {
		s.metrics.Count("rate_limited", 1)
	}
	if err != nil {
		return QueueState{}, err
	}
	q.SKU, q.Ticket = sku, ticket
	return q, nil
}
