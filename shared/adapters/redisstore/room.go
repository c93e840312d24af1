package redisstore

// The waiting room's queue (queue.lua): join it, look at it.

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/holdfast/holdfast/shared/reservation"
)

// queueLife is how long a waiting room's keys live after its last write (a join,
// an admission, a lapse): longer than any sale's queue.
const queueLife = 7 * 24 * time.Hour

// Queue implements reservation.WaitingRoom.
func (s *Store) Queue(ctx context.Context, sku, ticket string, op reservation.QueueOp) (reservation.QueueState, error) {
	k := keysOf(reservation.BucketName(sku, 0))
	verb := "look"
	if op.Join {
		verb = "join"
	}
	charge := ""
	if op.Charge != "" {
		charge = "1"
	}
	out, err := queueScript.Run(ctx, s.rdb, append(k.queueKeys(), k.attempts(op.Charge)), verb, ticket, strconv.FormatFloat(op.Place, 'f', -1, 64),
		op.Lead.Milliseconds(), op.AdmitFor.Milliseconds(), s.now(), int64(queueLife/time.Second), charge, s.rate, s.burst).StringSlice()
	if err != nil {
		return reservation.QueueState{}, reservation.Unavailable("redis queue", err)
	}
	if len(out) == 0 {
		return reservation.QueueState{}, fmt.Errorf("redis queue: empty reply")
	}
	num := func(i int) int64 {
		if i >= len(out) {
			return 0
		}
		n, _ := strconv.ParseInt(out[i], 10, 64)
		return n
	}
	q := reservation.QueueState{SKU: sku, Ticket: ticket, Now: time.UnixMilli(num(1)).UTC(), OpensAt: fromMS(num(2)), ClosesAt: fromMS(num(3))}
	switch out[0] {
	case "OK":
	case "UNKNOWN_SKU":
		return q, reservation.ErrUnknownSKU
	case "NO_ROOM":
		return q, reservation.ErrNoWaitingRoom
	case "QUEUE_NOT_OPEN":
		opens := q.OpensAt.Add(-op.Lead)
		return q, &reservation.QueueNotOpenError{OpensAt: opens, RetryAfter: opens.Sub(q.Now)}
	case "SALE_CLOSED":
		return q, reservation.ErrSaleClosed
	case "RATE_LIMITED":
		return q, &reservation.RateLimitedError{RetryAfter: time.Duration(num(4)) * time.Millisecond}
	default:
		return q, fmt.Errorf("redis queue: unknown code %q", out[0])
	}
	if len(out) != 12 {
		return q, fmt.Errorf("redis queue: unexpected reply %v", out)
	}
	q.Through, q.Length, q.Available, q.Held, q.Position, q.Unpaid = num(4), num(5), num(6), num(7), num(8), num(11)
	q.State = reservation.TicketState(out[9])
	if at := num(10); at > 0 {
		q.AdmittedAt = time.UnixMilli(at).UTC()
	}
	return q, nil
}
