package loadgen

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/reservation"
)

// firstEmpty is an EventQueue that closes empty after the first receive
// that found nothing.
type firstEmpty struct {
	EventQueue
	empty chan struct{}
	once  atomic.Bool
}

func (q *firstEmpty) Receive(ctx context.Context, hide time.Duration) ([]QueueMessage, error) {
	ms, err := q.EventQueue.Receive(ctx, hide)
	if err == nil && len(ms) == 0 && q.once.CompareAndSwap(false, true) {
		close(q.empty)
	}
	return ms, err
}

// TestEventsReadFromTheQueue: on the real SQS server, the events check
// reads the run's events as the local stand-in of the bus sends them,
// waits for a late one (the sweeper's drain) by condition, gives up on a
// missing one at its deadline, deletes the run's messages and leaves every
// other message on the queue.
func TestEventsReadFromTheQueue(t *testing.T) {
	env := testservices.Require(t)
	ctx := context.Background()
	client := env.SQS(t)
	setup := func(t *testing.T) (string, func(...reservation.Event)) {
		q := env.CreateQueues(t, client, 5)
		pub := env.EventsQueue(t, q.EventsURL)
		publish := func(evs ...reservation.Event) {
			for _, e := range evs { // one at a time: in the order given
				if errs := pub.Publish(ctx, []reservation.Event{e}); errs[0] != nil {
					t.Fatalf("publish %s: %v", e.ID, errs[0])
				}
			}
		}
		return q.EventsURL, publish
	}
	left := func(t *testing.T, url string) int {
		t.Helper()
		n := 0
		for {
			out, err := client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(url), MaxNumberOfMessages: 10})
			if err != nil {
				t.Fatal(err)
			}
			if len(out.Messages) == 0 {
				return n
			}
			n += len(out.Messages)
		}
	}
	ds, evs, scope := eventsFixture()

	t.Run("the run's events are counted and deleted, every other message left", func(t *testing.T) {
		url, publish := setup(t)
		publish(reservation.ConfirmedEvent(reservation.Reservation{ID: "demo.a", SKU: "demo", UserID: "ann", Qty: 1}, time.Now()))
		if _, err := client.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(url), MessageBody: aws.String(`{"not":"an event"}`)}); err != nil {
			t.Fatal(err)
		}
		publish(evs...)
		publish(evs[0]) // a redelivery
		rep := readEvents(ctx, NewSQSQueue(client, url), ds, scope, time.Now().Add(time.Minute))
		if rep.Err != nil || len(rep.Missing)+len(rep.Extra) > 0 || rep.Events != 6 || rep.Deliveries != 7 || rep.Redelivered != 1 || rep.Others != 2 {
			t.Errorf("readEvents = %d events in %d deliveries (%d redelivered), %d others, missing %q, extra %q, error %v;\n"+
				"want 6 in 7 (1 redelivered), 2 others, none missing or extra", rep.Events, rep.Deliveries, rep.Redelivered, rep.Others, rep.Missing, rep.Extra, rep.Err)
		}
		if rep.Waited > 30*time.Second {
			t.Errorf("readEvents waited %v with every event there", rep.Waited)
		}
		if n := left(t, url); n != 2 {
			t.Errorf("%d messages left on the queue, want the 2 not the run's (visible again at once)", n)
		}
	})

	t.Run("a late event is waited for", func(t *testing.T) {
		url, publish := setup(t)
		publish(evs[:5]...)
		q := &firstEmpty{EventQueue: NewSQSQueue(client, url), empty: make(chan struct{})}
		done := make(chan *EventsReport)
		go func() { done <- readEvents(ctx, q, ds, scope, time.Now().Add(time.Minute)) }()
		<-q.empty // it read everything there and still waits: the group's end comes late
		publish(evs[5])
		rep := <-done
		if rep.Err != nil || len(rep.Missing)+len(rep.Extra) > 0 || rep.Events != 6 {
			t.Errorf("readEvents = %d events, missing %q, extra %q, error %v; want all 6", rep.Events, rep.Missing, rep.Extra, rep.Err)
		}
		if n := left(t, url); n != 0 {
			t.Errorf("%d messages left on the queue, want none", n)
		}
	})

	t.Run("an event of the run's SKU without a decision fails the check", func(t *testing.T) {
		url, publish := setup(t)
		stray := reservation.ConfirmedEvent(reservation.Reservation{ID: "flash.stray", SKU: "flash", UserID: "buyer-7", Qty: 1}, scope.since.Add(time.Second))
		publish(append(append([]reservation.Event{}, evs...), stray)...)
		rep := readEvents(ctx, NewSQSQueue(client, url), ds, scope, time.Now().Add(time.Minute))
		if len(rep.Missing) != 0 || len(rep.Extra) != 1 || !strings.Contains(rep.Extra[0], stray.ID) {
			t.Errorf("readEvents = missing %q, extra %q; want %s extra", rep.Missing, rep.Extra, stray.ID)
		}
		r := &Report{Events: rep}
		if r.Checks = checks(r); r.Passed() {
			t.Error("a run with an extra event passed")
		}
		if n := left(t, url); n != 0 {
			t.Errorf("%d messages left on the queue, want none (the stray is the run's SKU's: read and deleted)", n)
		}
	})

	t.Run("a missing event fails the check at the deadline", func(t *testing.T) {
		url, publish := setup(t)
		publish(evs[1:]...)
		start := time.Now()
		rep := readEvents(ctx, NewSQSQueue(client, url), ds, scope, start.Add(2*time.Second))
		if len(rep.Missing) != 1 || len(rep.Extra) != 0 || rep.Events != 5 {
			t.Errorf("readEvents = %d events, missing %q, extra %q; want 5, reservation/flash.r1/1 missing", rep.Events, rep.Missing, rep.Extra)
		}
		if took := time.Since(start); took < 2*time.Second || took > 10*time.Second {
			t.Errorf("readEvents took %v for a 2 s deadline", took)
		}
		r := &Report{Events: rep}
		if r.Checks = checks(r); r.Passed() {
			t.Error("a run with a missing event passed")
		}
	})
}
