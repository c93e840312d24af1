// Package eventbus publishes the protocol's events for the order service
// (reservation.Event: ReservationConfirmed, ReservationCancelled,
// ReservationPaid, GroupFormed, GroupFailed), on EventBridge in AWS and on
// an SQS queue locally. Delivery is at least once; consumers deduplicate by
// the detail's event_id and order an aggregate's events by its version.
package eventbus

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	ebtypes "github.com/aws/aws-sdk-go-v2/service/eventbridge/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/holdfast/holdfast/shared/reservation"
)

// Source is the EventBridge source of every holdfast event.
const Source = "holdfast.reservations"

// DetailTypeCancelled is the detail-type of a cancellation; every event's
// detail-type is its reservation.EventType.
const DetailTypeCancelled = string(reservation.EventCancelled)

// perCall is the most entries one PutEvents or SendMessageBatch call takes.
const perCall = 10

// callsAtOnce bounds the calls one Publish makes at the same time: a
// persist batch's 500 confirmations are 50 calls, not 50 round trips in a row.
const callsAtOnce = 8

// publishInChunks calls put on runs of at most perCall events, callsAtOnce
// at a time, and collects one error per event. The service never gives one
// Publish two events of one aggregate, so the runs need no order.
func publishInChunks(evs []reservation.Event, put func([]reservation.Event) []error) []error {
	errs := make([]error, len(evs))
	sem := make(chan struct{}, callsAtOnce)
	var wg sync.WaitGroup
	for lo := 0; lo < len(evs); lo += perCall {
		hi := min(len(evs), lo+perCall)
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			copy(errs[lo:hi], put(evs[lo:hi]))
			<-sem
		}()
	}
	wg.Wait()
	return errs
}

func fill(errs []error, err error) []error {
	for i := range errs {
		errs[i] = err
	}
	return errs
}

// PutEventsAPI is the part of the EventBridge client the publisher uses.
type PutEventsAPI interface {
	PutEvents(ctx context.Context, in *eventbridge.PutEventsInput, opts ...func(*eventbridge.Options)) (*eventbridge.PutEventsOutput, error)
}

// EventBridge publishes to an event bus.
type EventBridge struct {
	client PutEventsAPI
	bus    string
}

var _ reservation.Notifier = (*EventBridge)(nil)

// NewEventBridge returns a publisher to the named bus.
func NewEventBridge(client PutEventsAPI, bus string) *EventBridge {
	return &EventBridge{client: client, bus: bus}
}

// Publish implements reservation.Notifier: PutEvents, ten entries a call,
// each event's time its occurred_at.
func (p *EventBridge) Publish(ctx context.Context, evs []reservation.Event) []error {
	return publishInChunks(evs, func(chunk []reservation.Event) []error {
		errs := make([]error, len(chunk))
		entries := make([]ebtypes.PutEventsRequestEntry, len(chunk))
		for i, e := range chunk {
			body, err := json.Marshal(e)
			if err != nil {
				return fill(errs, fmt.Errorf("encode event %s: %w", e.ID, err))
			}
			entries[i] = ebtypes.PutEventsRequestEntry{
				EventBusName: aws.String(p.bus), Source: aws.String(Source), Time: aws.Time(e.OccurredAt),
				DetailType: aws.String(string(e.Type)), Detail: aws.String(string(body)),
			}
		}
		out, err := p.client.PutEvents(ctx, &eventbridge.PutEventsInput{Entries: entries})
		if err != nil {
			return fill(errs, reservation.Unavailable("eventbridge put", err))
		}
		if out.FailedEntryCount == 0 {
			return errs
		}
		for i := range errs { // Entries answers the request's entries in order
			if i >= len(out.Entries) {
				errs[i] = reservation.Unavailable("eventbridge put", fmt.Errorf("entry %d not answered", i))
			} else if c := out.Entries[i].ErrorCode; c != nil {
				errs[i] = reservation.Unavailable("eventbridge put", fmt.Errorf("entry failed: %s", *c))
			}
		}
		return errs
	})
}

// Envelope is what the SQS stand-in sends: the shape EventBridge delivers to
// an SQS target.
type Envelope struct {
	Source     string            `json:"source"`
	DetailType string            `json:"detail-type"`
	Time       time.Time         `json:"time"`
	Detail     reservation.Event `json:"detail"`
}

// SendAPI is the part of the SQS client the stand-in uses.
type SendAPI interface {
	SendMessageBatch(ctx context.Context, in *sqs.SendMessageBatchInput, opts ...func(*sqs.Options)) (*sqs.SendMessageBatchOutput, error)
}

// Queue publishes events to an SQS queue, standing in for EventBridge where
// there is none (the local stack and tests).
type Queue struct {
	client SendAPI
	url    string
}

var _ reservation.Notifier = (*Queue)(nil)

// NewQueue returns a publisher to the queue at url.
func NewQueue(client SendAPI, url string) *Queue {
	return &Queue{client: client, url: url}
}

// Publish implements reservation.Notifier: SendMessageBatch, ten a call.
func (p *Queue) Publish(ctx context.Context, evs []reservation.Event) []error {
	return publishInChunks(evs, func(chunk []reservation.Event) []error {
		errs := make([]error, len(chunk))
		entries := make([]sqstypes.SendMessageBatchRequestEntry, len(chunk))
		for i, e := range chunk {
			body, err := json.Marshal(Envelope{Source: Source, DetailType: string(e.Type), Time: e.OccurredAt, Detail: e})
			if err != nil {
				return fill(errs, fmt.Errorf("encode event %s: %w", e.ID, err))
			}
			entries[i] = sqstypes.SendMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), MessageBody: aws.String(string(body))}
		}
		out, err := p.client.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(p.url), Entries: entries})
		if err != nil {
			return fill(errs, reservation.Unavailable("events queue send", err))
		}
		for _, f := range out.Failed { // some servers leave Successful empty: Failed is what counts
			if i, err := strconv.Atoi(aws.ToString(f.Id)); err == nil && i >= 0 && i < len(errs) {
				errs[i] = reservation.Unavailable("events queue send", fmt.Errorf("entry failed: %s", aws.ToString(f.Code)))
			}
		}
		return errs
	})
}
