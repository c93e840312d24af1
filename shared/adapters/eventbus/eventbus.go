// Package eventbus publishes the protocol's events for the order service
// (reservation.Event: ReservationConfirmed, ReservationCancelled,
// ReservationPaid, GroupFormed, GroupFailed), on EventBridge in AWS and on
// an SQS queue locally. Delivery is at least once; consumers deduplicate by
// the detail's event_id and order an aggregate's events by its version.
//
// Both publishers send one signed request per call in the service's JSON
// protocol (awsjson): the request the SDK's PutEvents or SendMessageBatch
// sends, without the SDK's per-call middleware stack, which was two thirds
// of persist's own CPU per order (docs/benchmarks.md).
package eventbus

import (
	"context"
	"crypto/md5" //nolint:gosec // SQS's own body checksum, not a security measure
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/holdfast/holdfast/shared/awsjson"
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

// EventBridge publishes to an event bus.
type EventBridge struct {
	client *awsjson.Client
	bus    string
}

var _ reservation.Notifier = (*EventBridge)(nil)

// NewEventBridge returns a publisher to the named bus at c's endpoint (the
// one the SDK's EventBridge client resolves), or an error if c cannot work.
func NewEventBridge(c awsjson.Config, bus string) (*EventBridge, error) {
	client, err := awsjson.NewClient(awsjson.EventBridge, c)
	if err != nil {
		return nil, err
	}
	return &EventBridge{client: client, bus: bus}, nil
}

// putEvents is PutEvents' input in the JSON protocol.
type putEvents struct {
	Entries []putEventsEntry `json:"Entries"`
}

type putEventsEntry struct {
	Detail       string  `json:"Detail"`
	DetailType   string  `json:"DetailType"`
	EventBusName string  `json:"EventBusName"`
	Source       string  `json:"Source"`
	Time         float64 `json:"Time"` // epoch seconds, to the millisecond, as the SDK sends a timestamp
}

// putEventsAnswer is PutEvents' output in the JSON protocol.
type putEventsAnswer struct {
	FailedEntryCount int `json:"FailedEntryCount"`
	Entries          []struct {
		EventID   string `json:"EventId"`
		ErrorCode string `json:"ErrorCode"`
	} `json:"Entries"`
}

// epochSeconds is t as the JSON protocols carry a timestamp.
func epochSeconds(t time.Time) float64 {
	return float64(t.UnixMilli()) / 1e3
}

// Publish implements reservation.Notifier: PutEvents, ten entries a call,
// each event's time its occurred_at. An entry EventBridge refuses
// (Entries[i].ErrorCode) fails only its event.
func (p *EventBridge) Publish(ctx context.Context, evs []reservation.Event) []error {
	return publishInChunks(evs, func(chunk []reservation.Event) []error {
		errs := make([]error, len(chunk))
		in := putEvents{Entries: make([]putEventsEntry, len(chunk))}
		for i, e := range chunk {
			body, err := json.Marshal(e)
			if err != nil {
				return fill(errs, fmt.Errorf("encode event %s: %w", e.ID, err))
			}
			in.Entries[i] = putEventsEntry{EventBusName: p.bus, Source: Source, Time: epochSeconds(e.OccurredAt),
				DetailType: string(e.Type), Detail: string(body)}
		}
		payload, err := json.Marshal(in)
		if err != nil {
			return fill(errs, fmt.Errorf("encode events: %w", err))
		}
		var out putEventsAnswer
		if err := p.client.Call(ctx, "PutEvents", payload, func(data []byte) error {
			out = putEventsAnswer{}
			return json.Unmarshal(data, &out)
		}); err != nil {
			return fill(errs, reservation.Unavailable("eventbridge put", err))
		}
		for i := range errs { // Entries answers the request's entries in order; an ErrorCode fails its event whatever the count says
			if i >= len(out.Entries) {
				if out.FailedEntryCount == 0 {
					break
				}
				errs[i] = reservation.Unavailable("eventbridge put", fmt.Errorf("entry %d not answered", i))
			} else if c := out.Entries[i].ErrorCode; c != "" {
				errs[i] = reservation.Unavailable("eventbridge put", fmt.Errorf("entry failed: %s", c))
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

// Queue publishes events to an SQS queue, standing in for EventBridge where
// there is none (the local stack and tests).
type Queue struct {
	client *awsjson.Client
	url    string
}

var _ reservation.Notifier = (*Queue)(nil)

// NewQueue returns a publisher to the queue at url through c's endpoint
// (the one the SDK's SQS client resolves), or an error if c cannot work.
func NewQueue(c awsjson.Config, url string) (*Queue, error) {
	client, err := awsjson.NewClient(awsjson.SQS, c)
	if err != nil {
		return nil, err
	}
	return &Queue{client: client, url: url}, nil
}

// sendMessageBatch is SendMessageBatch's input in the JSON protocol.
type sendMessageBatch struct {
	QueueURL string       `json:"QueueUrl"`
	Entries  []batchEntry `json:"Entries"`
}

type batchEntry struct {
	ID          string `json:"Id"`
	MessageBody string `json:"MessageBody"`
}

// batchAnswer is SendMessageBatch's output in the JSON protocol.
type batchAnswer struct {
	Successful []struct {
		ID               string `json:"Id"`
		MD5OfMessageBody string `json:"MD5OfMessageBody"`
	} `json:"Successful"`
	Failed []struct {
		ID   string `json:"Id"`
		Code string `json:"Code"`
	} `json:"Failed"`
}

// verify checks the body checksum of every entry listed as sent, as the
// SDK's SQS client does (some servers list none).
func (a batchAnswer) verify(entries []batchEntry) error {
	for _, s := range a.Successful {
		i, err := strconv.Atoi(s.ID)
		if err != nil || i < 0 || i >= len(entries) {
			return fmt.Errorf("entry %q was not sent", s.ID)
		}
		sum := md5.Sum([]byte(entries[i].MessageBody)) //nolint:gosec // SQS's checksum of the body
		if want := hex.EncodeToString(sum[:]); !strings.EqualFold(s.MD5OfMessageBody, want) {
			return fmt.Errorf("entry %s: body checksum %s, want %s", s.ID, s.MD5OfMessageBody, want)
		}
	}
	return nil
}

// Publish implements reservation.Notifier: SendMessageBatch, ten a call. An
// entry SQS lists as Failed fails only its event; a body checksum that
// does not match sends the call again (a duplicate is harmless).
func (p *Queue) Publish(ctx context.Context, evs []reservation.Event) []error {
	return publishInChunks(evs, func(chunk []reservation.Event) []error {
		errs := make([]error, len(chunk))
		in := sendMessageBatch{QueueURL: p.url, Entries: make([]batchEntry, len(chunk))}
		for i, e := range chunk {
			body, err := json.Marshal(Envelope{Source: Source, DetailType: string(e.Type), Time: e.OccurredAt, Detail: e})
			if err != nil {
				return fill(errs, fmt.Errorf("encode event %s: %w", e.ID, err))
			}
			in.Entries[i] = batchEntry{ID: strconv.Itoa(i), MessageBody: string(body)}
		}
		payload, err := json.Marshal(in)
		if err != nil {
			return fill(errs, fmt.Errorf("encode events: %w", err))
		}
		var out batchAnswer
		if err := p.client.Call(ctx, "SendMessageBatch", payload, func(data []byte) error {
			out = batchAnswer{}
			if err := json.Unmarshal(data, &out); err != nil {
				return err
			}
			return out.verify(in.Entries)
		}); err != nil {
			return fill(errs, reservation.Unavailable("events queue send", err))
		}
		for _, f := range out.Failed { // some servers leave Successful empty: Failed is what counts
			if i, err := strconv.Atoi(f.ID); err == nil && i >= 0 && i < len(errs) {
				errs[i] = reservation.Unavailable("events queue send", fmt.Errorf("entry failed: %s", f.Code))
			}
		}
		return errs
	})
}
