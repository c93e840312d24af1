package loadgen

// The events check: after the sale settled, the run reads the events its
// decisions published (an SQS queue: make dev's events queue, or a queue
// of its own behind EventBridge), deduplicates them by event_id and holds
// them against what it saw decided.

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/holdfast/holdfast/shared/adapters/eventbus"
	"github.com/holdfast/holdfast/shared/reservation"
)

// EventQueue is the queue a run reads its events from. Each message is an
// eventbus.Envelope (what the local stand-in sends, and what EventBridge
// delivers to an SQS target).
type EventQueue interface {
	// Receive returns the next messages (up to 10), waiting up to about a
	// second for one; each stays hidden from other receivers for hide.
	Receive(ctx context.Context, hide time.Duration) ([]QueueMessage, error)
	// Delete removes messages for good: the run's own events.
	Delete(ctx context.Context, ms []QueueMessage) error
	// Release makes messages visible again at once: everyone else's.
	Release(ctx context.Context, ms []QueueMessage) error
	// Name names the queue in the report.
	Name() string
}

// QueueMessage is one received message.
type QueueMessage struct {
	ID     string // the message id, the same on every receive
	Body   []byte
	Handle string // the receipt handle of this receive
}

// SQSAPI is the part of the SQS client SQSQueue uses.
type SQSAPI interface {
	ReceiveMessage(ctx context.Context, in *sqs.ReceiveMessageInput, opts ...func(*sqs.Options)) (*sqs.ReceiveMessageOutput, error)
	DeleteMessageBatch(ctx context.Context, in *sqs.DeleteMessageBatchInput, opts ...func(*sqs.Options)) (*sqs.DeleteMessageBatchOutput, error)
	ChangeMessageVisibility(ctx context.Context, in *sqs.ChangeMessageVisibilityInput, opts ...func(*sqs.Options)) (*sqs.ChangeMessageVisibilityOutput, error)
}

// SQSQueue is an EventQueue on SQS (or the SQS-API server of make dev).
type SQSQueue struct {
	client SQSAPI
	url    string
}

var _ EventQueue = (*SQSQueue)(nil)

// NewSQSQueue returns the queue at url.
func NewSQSQueue(client SQSAPI, url string) *SQSQueue { return &SQSQueue{client: client, url: url} }

// Name implements EventQueue: the queue's name.
func (q *SQSQueue) Name() string { return q.url[strings.LastIndexByte(q.url, '/')+1:] }

// maxHide is SQS's longest visibility timeout (12 h).
const maxHide = 12 * time.Hour

// Receive implements EventQueue: a one-second long poll.
func (q *SQSQueue) Receive(ctx context.Context, hide time.Duration) ([]QueueMessage, error) {
	secs := int32(min(maxHide, max(time.Second, hide)) / time.Second)
	out, err := q.client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
		QueueUrl: aws.String(q.url), MaxNumberOfMessages: 10, WaitTimeSeconds: 1, VisibilityTimeout: secs,
	})
	if err != nil {
		return nil, fmt.Errorf("receive from %s: %w", q.Name(), err)
	}
	ms := make([]QueueMessage, len(out.Messages))
	for i, m := range out.Messages {
		ms[i] = QueueMessage{ID: aws.ToString(m.MessageId), Body: []byte(aws.ToString(m.Body)), Handle: aws.ToString(m.ReceiptHandle)}
	}
	return ms, nil
}

// Delete implements EventQueue: DeleteMessageBatch, ten a call.
func (q *SQSQueue) Delete(ctx context.Context, ms []QueueMessage) error {
	for lo := 0; lo < len(ms); lo += 10 {
		chunk := ms[lo:min(len(ms), lo+10)]
		entries := make([]sqstypes.DeleteMessageBatchRequestEntry, len(chunk))
		for i, m := range chunk {
			entries[i] = sqstypes.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: aws.String(m.Handle)}
		}
		out, err := q.client.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(q.url), Entries: entries})
		if err != nil {
			return fmt.Errorf("delete from %s: %w", q.Name(), err)
		}
		if len(out.Failed) > 0 {
			return fmt.Errorf("delete from %s: %d of %d entries failed", q.Name(), len(out.Failed), len(chunk))
		}
	}
	return nil
}

// Release implements EventQueue: a zero visibility timeout per message
// (goaws has no batch of it).
func (q *SQSQueue) Release(ctx context.Context, ms []QueueMessage) error {
	var errs []error
	for _, m := range ms {
		if _, err := q.client.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{
			QueueUrl: aws.String(q.url), ReceiptHandle: aws.String(m.Handle), VisibilityTimeout: 0,
		}); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("release %d of %d messages on %s: %w", len(errs), len(ms), q.Name(), errs[0])
	}
	return nil
}

// decision is what the run saw become of one aggregate: a reservation it
// was told 202 for (polled final, or still HELD when the wait ended), or a
// group it opened (read once every join was final).
type decision struct {
	group  bool   // a group, not a reservation
	id     string // the reservation's id, or the group's
	status string // CONFIRMED, CANCELLED, HELD (undecided); FORMED, FAILED, OPEN
	reason string // a cancellation's
	sku    string
	user   string // a reservation's buyer
	qty    int
	gid    string // a reservation's group
}

// expected reports the events d's final state must have, by event_id. A
// cancellation has one of two shapes, which the API does not tell apart
// (a fenced reservation: ReservationCancelled version 1; a refunded one:
// ReservationConfirmed 1, then ReservationCancelled 2): refunded says
// which the events showed.
func (d decision) expected(refunded bool) map[string]reservation.Event {
	kind := "reservation"
	if d.group {
		kind = "group"
	}
	ev := func(t reservation.EventType, v int) reservation.Event {
		e := reservation.Event{ID: reservation.EventID(kind, d.id, v), Type: t, AggregateID: d.id, Version: v, SKU: d.sku}
		if d.group {
			e.GroupID = d.id
		} else {
			e.ReservationID, e.UserID, e.Qty, e.GroupID = d.id, d.user, d.qty, d.gid
		}
		return e
	}
	out := map[string]reservation.Event{}
	add := func(e reservation.Event) { out[e.ID] = e }
	switch d.status {
	case "CONFIRMED":
		add(ev(reservation.EventConfirmed, 1))
	case "CANCELLED":
		if refunded {
			add(ev(reservation.EventConfirmed, 1))
			c := ev(reservation.EventCancelled, 2)
			c.Reason, c.Refunded = reservation.Reason(d.reason), true
			add(c)
		} else {
			c := ev(reservation.EventCancelled, 1)
			c.Reason = reservation.Reason(d.reason)
			add(c)
		}
	case "FORMED":
		add(ev(reservation.EventGroupFormed, 1))
	case "FAILED":
		add(ev(reservation.EventGroupFailed, 1))
	}
	return out
}

// undecided reports whether d saw no final state: events of it may come
// either way, and none is owed.
func (d decision) undecided() bool { return d.status == "HELD" || d.status == "OPEN" }

// matches reports whether got says what want does: the fields of a
// decision the run can know (not occurred_at, nor a group's capacity).
func matches(got, want reservation.Event) bool {
	return got.ID == want.ID && got.Type == want.Type && got.AggregateID == want.AggregateID && got.Version == want.Version &&
		got.SKU == want.SKU && got.ReservationID == want.ReservationID && got.UserID == want.UserID && got.Qty == want.Qty &&
		got.GroupID == want.GroupID && got.Reason == want.Reason && got.Refunded == want.Refunded
}

// delivery is one message the run read, in the order it read them.
type delivery struct {
	event reservation.Event
	ok    bool // an envelope of holdfast's, decoded
}

func decode(body []byte) delivery {
	var env eventbus.Envelope
	if err := json.Unmarshal(body, &env); err != nil || env.Source != eventbus.Source || env.Detail.ID == "" {
		return delivery{}
	}
	return delivery{event: env.Detail, ok: true}
}

// eventScope says which events are the run's: those of the aggregates it
// saw, and any other of its SKUs or groups decided since it began (another
// run's on a reused SKU came before). unanswered names the buyers a
// request of whom was answered 5xx or not at all: a reservation of theirs
// the run does not know may exist.
type eventScope struct {
	known      map[string]bool // aggregate ids
	skus       map[string]bool
	groups     map[string]bool
	since      time.Time
	unanswered map[string]bool
}

func newScope(ds []decision, skus []string, since time.Time, unanswered map[string]bool) eventScope {
	s := eventScope{known: map[string]bool{}, skus: map[string]bool{}, groups: map[string]bool{}, since: since, unanswered: unanswered}
	for _, d := range ds {
		s.known[d.id] = true
		if d.group {
			s.groups[d.id] = true
		}
	}
	for _, k := range skus {
		if k != "" {
			s.skus[k] = true
		}
	}
	return s
}

// ours reports whether e is one of the run's events.
func (s eventScope) ours(e reservation.Event) bool {
	if s.known[e.AggregateID] {
		return true
	}
	return (s.skus[e.SKU] || s.groups[e.GroupID]) && !e.OccurredAt.Before(s.since)
}

// EventsReport is what the events check found.
type EventsReport struct {
	Skipped string // why the check did not run ("" when it ran)
	Queue   string
	Err     error // reading the queue failed
	// ReleaseErr is a failure to make the others visible again at once
	// (they come back when their receive's hiding ends).
	ReleaseErr error

	Counts      map[reservation.EventType]int // distinct events of the run, by type
	Events      int                           // distinct events of the run
	Deliveries  int                           // messages carrying them
	Redelivered int                           // repeats with the same content, dropped
	Others      int                           // messages not the run's, left on the queue
	Decisions   int                           // decisions that owe events (final reservations, ended groups)
	Late        int                           // events of reservations still HELD when the settle wait ended, or of groups still OPEN
	Unanswered  int                           // events of reservations unknown to the run, of buyers whose request got no answer or a 5xx
	Missing     []string                      // decisions without their event
	Extra       []string                      // events without a decision the run saw, or contradicting one, or a repeat with other content
	OutOfOrder  []string                      // aggregates whose later version arrived first (allowed: consumers order by version)
	Waited      time.Duration
}

// compareEvents holds the deliveries (in the order read) of the run's
// events against its decisions.
func compareEvents(ds []decision, dels []delivery, scope eventScope) *EventsReport {
	rep := &EventsReport{Counts: map[reservation.EventType]int{}}
	byID := map[string]reservation.Event{}
	firstAt := map[string]int{} // event id → index of its first delivery
	var order []string
	conflicted := map[string]bool{}
	for i, d := range dels {
		if !d.ok || !scope.ours(d.event) {
			continue
		}
		rep.Deliveries++
		e := d.event
		if prev, seen := byID[e.ID]; seen {
			if same(prev, e) {
				rep.Redelivered++
			} else if !conflicted[e.ID] {
				conflicted[e.ID] = true
				rep.Extra = append(rep.Extra, fmt.Sprintf("%s delivered twice with different content (%s, then %s)", e.ID, describe(prev), describe(e)))
			}
			continue
		}
		byID[e.ID] = e
		firstAt[e.ID] = i
		order = append(order, e.ID)
		rep.Counts[e.Type]++
		rep.Events++
	}

	claimed := map[string]bool{}
	for _, d := range ds {
		kind := "reservation"
		if d.group {
			kind = "group"
		}
		if d.undecided() {
			for v := 1; v <= 2; v++ {
				if id := reservation.EventID(kind, d.id, v); byID[id].ID != "" {
					claimed[id] = true
					rep.Late++
				}
			}
			continue
		}
		rep.Decisions++
		// A cancellation whose events show a confirmation first (or a
		// refund) is held to the refund's shape.
		v1, v2 := byID[reservation.EventID(kind, d.id, 1)], byID[reservation.EventID(kind, d.id, 2)]
		refunded := d.status == "CANCELLED" && (v1.Type == reservation.EventConfirmed || (v2.Type == reservation.EventCancelled && v2.Refunded))
		want := d.expected(refunded)
		ids := make([]string, 0, len(want))
		for id := range want {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		for _, id := range ids {
			w := want[id]
			got, ok := byID[id]
			switch {
			case !ok:
				rep.Missing = append(rep.Missing, fmt.Sprintf("%s %s (%s %s)", id, w.Type, kind, statusOf(d)))
			case !matches(got, w):
				claimed[id] = true
				rep.Missing = append(rep.Missing, fmt.Sprintf("%s %s (%s %s)", id, w.Type, kind, statusOf(d)))
				rep.Extra = append(rep.Extra, fmt.Sprintf("%s is %s, but the run saw %s %s", id, describe(got), kind, statusOf(d)))
			default:
				claimed[id] = true
			}
		}
	}
	for _, id := range order {
		e := byID[id]
		if claimed[id] {
			continue
		}
		if !scope.known[e.AggregateID] && e.ReservationID != "" && scope.unanswered[e.UserID] {
			rep.Unanswered++
			continue
		}
		what := "a decision the run did not see"
		if !scope.known[e.AggregateID] {
			what = "an aggregate the run never heard of"
		}
		rep.Extra = append(rep.Extra, fmt.Sprintf("%s (%s) of %s", id, describe(e), what))
	}

	// Out of order: a later version of an aggregate read before an earlier one.
	versions := map[string][]reservation.Event{}
	for _, id := range order {
		e := byID[id]
		versions[e.AggregateID] = append(versions[e.AggregateID], e)
	}
	aggs := make([]string, 0, len(versions))
	for a := range versions {
		aggs = append(aggs, a)
	}
	sort.Strings(aggs)
	for _, a := range aggs {
		evs := versions[a] // in the order first read
		for i := 1; i < len(evs); i++ {
			if evs[i].Version < evs[i-1].Version {
				rep.OutOfOrder = append(rep.OutOfOrder, fmt.Sprintf("%s: version %d read before version %d", a, evs[i-1].Version, evs[i].Version))
				break
			}
		}
	}
	return rep
}

// same reports whether two deliveries of one event_id say the same.
func same(a, b reservation.Event) bool {
	at, bt := a.OccurredAt, b.OccurredAt
	a.OccurredAt, b.OccurredAt = time.Time{}, time.Time{}
	return a == b && at.Equal(bt)
}

func statusOf(d decision) string {
	if d.reason != "" {
		return d.status + " " + d.reason
	}
	return d.status
}

func describe(e reservation.Event) string {
	s := string(e.Type)
	if e.Reason != "" {
		s += " " + string(e.Reason)
	}
	if e.Refunded {
		s += " refunded"
	}
	return fmt.Sprintf("%s v%d sku %s user %q qty %d group %q", s, e.Version, e.SKU, e.UserID, e.Qty, e.GroupID)
}

// complete reports whether no decision misses its event yet.
func (r *EventsReport) complete() bool { return len(r.Missing) == 0 }

// hideFor is how long a receive hides what it read: every other message
// is read again after it (and released at the end), and a message a
// receive took whose answer was lost (goaws hides it all the same) comes
// back within it — a wait as long as the deadline would lose it.
const hideFor = 10 * time.Second

// readEvents reads q until every decision has its events and a receive
// brings nothing more of the run's (repeats and strays already there
// count), or until deadline. It deletes the run's messages as it reads them
// and leaves every other message on the queue, made visible again at the end.
func readEvents(ctx context.Context, q EventQueue, ds []decision, scope eventScope, deadline time.Time) *EventsReport {
	start := time.Now()
	var dels []delivery
	type held struct {
		m  QueueMessage
		at time.Time
	}
	others := map[string]held{} // by message id: its latest receive
	var rep *EventsReport
	var err error
	for ctx.Err() == nil {
		var ms []QueueMessage
		ms, err = q.Receive(ctx, hideFor)
		if err != nil {
			break
		}
		var mine []QueueMessage
		at := time.Now()
		for _, m := range ms {
			d := decode(m.Body)
			if d.ok && scope.ours(d.event) {
				dels = append(dels, d)
				mine = append(mine, m)
			} else {
				others[m.ID] = held{m, at}
			}
		}
		if err = q.Delete(ctx, mine); err != nil {
			break
		}
		if len(mine) == 0 { // nothing more of the run's just now: done if nothing is owed
			if rep = compareEvents(ds, dels, scope); rep.complete() {
				break
			}
		}
		if !time.Now().Before(deadline) {
			break
		}
	}
	if err == nil {
		err = ctx.Err()
	}
	rep = compareEvents(ds, dels, scope)
	rep.Queue, rep.Others, rep.Waited = q.Name(), len(others), time.Since(start)
	rep.Err = err
	// The others still hidden are made visible again, with a context of
	// their own: an interrupted run still gives them back. A failure only
	// leaves them hidden until their time is up.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	var release []QueueMessage
	for _, h := range others {
		if time.Since(h.at) < hideFor-time.Second {
			release = append(release, h.m)
		}
	}
	rep.ReleaseErr = q.Release(rctx, release)
	return rep
}
