// Package eventbus publishes the protocol's events for the order service:
// ReservationCancelled, on EventBridge in AWS and on an SQS queue locally.
// Delivery is at least once; consumers deduplicate by reservation_id.
package eventbus

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	ebtypes "github.com/aws/aws-sdk-go-v2/service/eventbridge/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/holdfast/holdfast/shared/reservation"
)

// Source is the EventBridge source of every holdfast event.
const Source = "holdfast.reservations"

// DetailTypeCancelled is the detail-type of a cancellation.
const DetailTypeCancelled = "ReservationCancelled"

// Cancelled is the detail of a ReservationCancelled event.
type Cancelled struct {
	ReservationID string    `json:"reservation_id"`
	SKU           string    `json:"sku"`
	Qty           int       `json:"qty"`
	UserID        string    `json:"user_id"`
	GroupID       string    `json:"group_id,omitempty"`
	Reason        string    `json:"reason"`
	Refunded      bool      `json:"refunded"`
	At            time.Time `json:"at"`
}

func detail(r reservation.Reservation, at time.Time) Cancelled {
	return Cancelled{
		ReservationID: r.ID, SKU: r.SKU, Qty: r.Qty, UserID: r.UserID, GroupID: r.GroupID,
		Reason: string(r.Reason), Refunded: r.Cancellation == reservation.Refunded, At: at.UTC(),
	}
}

// PutEventsAPI is the part of the EventBridge client the publisher uses.
type PutEventsAPI interface {
	PutEvents(ctx context.Context, in *eventbridge.PutEventsInput, opts ...func(*eventbridge.Options)) (*eventbridge.PutEventsOutput, error)
}

// EventBridge publishes to an event bus.
type EventBridge struct {
	client PutEventsAPI
	bus    string
	now    func() time.Time
}

var _ reservation.Notifier = (*EventBridge)(nil)

// NewEventBridge returns a publisher to the named bus.
func NewEventBridge(client PutEventsAPI, bus string, now func() time.Time) *EventBridge {
	return &EventBridge{client: client, bus: bus, now: now}
}

// Cancelled implements reservation.Notifier.
func (p *EventBridge) Cancelled(ctx context.Context, r reservation.Reservation) error {
	body, err := json.Marshal(detail(r, p.now()))
	if err != nil {
		return fmt.Errorf("encode event %s: %w", r.ID, err)
	}
	out, err := p.client.PutEvents(ctx, &eventbridge.PutEventsInput{Entries: []ebtypes.PutEventsRequestEntry{{
		EventBusName: aws.String(p.bus), Source: aws.String(Source),
		DetailType: aws.String(DetailTypeCancelled), Detail: aws.String(string(body)),
	}}})
	if err != nil {
		return reservation.Unavailable("eventbridge put", err)
	}
	if out.FailedEntryCount > 0 {
		code := ""
		if len(out.Entries) > 0 && out.Entries[0].ErrorCode != nil {
			code = *out.Entries[0].ErrorCode
		}
		return reservation.Unavailable("eventbridge put", fmt.Errorf("entry failed: %s", code))
	}
	return nil
}

// Envelope is what the SQS stand-in sends: the shape EventBridge delivers to
// an SQS target.
type Envelope struct {
	Source     string    `json:"source"`
	DetailType string    `json:"detail-type"`
	Time       time.Time `json:"time"`
	Detail     Cancelled `json:"detail"`
}

// SendAPI is the part of the SQS client the stand-in uses.
type SendAPI interface {
	SendMessage(ctx context.Context, in *sqs.SendMessageInput, opts ...func(*sqs.Options)) (*sqs.SendMessageOutput, error)
}

// Queue publishes events to an SQS queue, standing in for EventBridge where
// there is none (the local stack and tests).
type Queue struct {
	client SendAPI
	url    string
	now    func() time.Time
}

var _ reservation.Notifier = (*Queue)(nil)

// NewQueue returns a publisher to the queue at url.
func NewQueue(client SendAPI, url string, now func() time.Time) *Queue {
	return &Queue{client: client, url: url, now: now}
}

// Cancelled implements reservation.Notifier.
func (p *Queue) Cancelled(ctx context.Context, r reservation.Reservation) error {
	at := p.now()
	body, err := json.Marshal(Envelope{Source: Source, DetailType: DetailTypeCancelled, Time: at.UTC(), Detail: detail(r, at)})
	if err != nil {
		return fmt.Errorf("encode event %s: %w", r.ID, err)
	}
	if _, err := p.client.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(p.url), MessageBody: aws.String(string(body))}); err != nil {
		return reservation.Unavailable("events queue send", err)
	}
	return nil
}
