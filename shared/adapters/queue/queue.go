// Package queue is the contract of the reservation message that reserve sends
// and persist and compensate consume, and its SQS publisher. Messages are
// versioned JSON with a type attribute; decoding is strict, so a message that
// does not fit the contract is poison and never reaches the protocol.
package queue

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/holdfast/holdfast/shared/reservation"
)

// MessageType names the reservation message in its "type" field and in the
// SQS message attribute "type".
const MessageType = "ReservationHeld"

// Version is the message schema version this code writes and reads.
const Version = 1

// Message is the body of a reservation message.
type Message struct {
	Version       int    `json:"version"`
	Type          string `json:"type"`
	ReservationID string `json:"reservation_id"`
	SKU           string `json:"sku"`
	Qty           int    `json:"qty"`
	UserID        string `json:"user_id"`
	GroupID       string `json:"group_id,omitempty"`
	// HoldToken names the Redis incarnation of the hold (optional: messages
	// written before it existed have none).
	HoldToken string    `json:"hold_token,omitempty"`
	ExpiresAt time.Time `json:"expires_at"`
	CreatedAt time.Time `json:"created_at"`
	// Bucket is the bucket of the SKU the hold is in (absent: 0, the only
	// one of a SKU without buckets).
	Bucket int `json:"bucket,omitempty"`
}

// ErrPoison marks a message that can never be processed: it is reported as
// failed until SQS moves it to the dead-letter queue, and touches no stock.
var ErrPoison = errors.New("poison message")

// maxQty bounds a message's quantity independently of the API's limit, so a
// forged message cannot ask for absurd amounts.
const maxQty = 1_000_000

// Encode returns the message body for r.
func Encode(r reservation.Reservation) ([]byte, error) {
	return json.Marshal(Message{
		Version: Version, Type: MessageType, ReservationID: r.ID, SKU: r.SKU, Qty: r.Qty,
		UserID: r.UserID, GroupID: r.GroupID, HoldToken: r.Token, ExpiresAt: r.ExpiresAt.UTC(), CreatedAt: r.CreatedAt.UTC(),
		Bucket: r.Bucket,
	})
}

// Decode parses and validates a message body. Any error wraps ErrPoison.
func Decode(body []byte) (reservation.Reservation, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	var m Message
	if err := dec.Decode(&m); err != nil {
		return reservation.Reservation{}, fmt.Errorf("%w: %v", ErrPoison, err)
	}
	if dec.More() {
		return reservation.Reservation{}, fmt.Errorf("%w: trailing data", ErrPoison)
	}
	if m.Version != Version || m.Type != MessageType {
		return reservation.Reservation{}, fmt.Errorf("%w: version %d type %q not understood", ErrPoison, m.Version, m.Type)
	}
	r := reservation.Reservation{
		ID: m.ReservationID, SKU: m.SKU, Qty: m.Qty, UserID: m.UserID, GroupID: m.GroupID, Token: m.HoldToken,
		Status: reservation.StatusHeld, ExpiresAt: m.ExpiresAt, CreatedAt: m.CreatedAt, Bucket: m.Bucket,
	}
	if m.Bucket < 0 || m.Bucket >= reservation.MaxBuckets || (m.Bucket != 0 && m.GroupID != "") {
		return reservation.Reservation{}, fmt.Errorf("%w: bucket %d out of range", ErrPoison, m.Bucket)
	}
	if r.ID == "" {
		return reservation.Reservation{}, fmt.Errorf("%w: reservation_id missing", ErrPoison)
	}
	if err := r.Validate(maxQty); err != nil {
		return reservation.Reservation{}, fmt.Errorf("%w: %v", ErrPoison, err)
	}
	return r, nil
}

// SendAPI is the part of the SQS client the publisher uses.
type SendAPI interface {
	SendMessage(ctx context.Context, in *sqs.SendMessageInput, opts ...func(*sqs.Options)) (*sqs.SendMessageOutput, error)
}

// Publisher sends reservation messages to one SQS queue.
type Publisher struct {
	client SendAPI
	url    string
}

var _ reservation.Enqueuer = (*Publisher)(nil)

// NewPublisher returns a Publisher for the queue at url.
func NewPublisher(client SendAPI, url string) *Publisher {
	return &Publisher{client: client, url: url}
}

// Enqueue implements reservation.Enqueuer. An error means the message may or
// may not have been enqueued; the caller settles that through the fence.
func (p *Publisher) Enqueue(ctx context.Context, r reservation.Reservation) error {
	body, err := Encode(r)
	if err != nil {
		return fmt.Errorf("encode %s: %w", r.ID, err)
	}
	_, err = p.client.SendMessage(ctx, &sqs.SendMessageInput{
		QueueUrl:    aws.String(p.url),
		MessageBody: aws.String(string(body)),
		MessageAttributes: map[string]sqstypes.MessageAttributeValue{
			"type":    {DataType: aws.String("String"), StringValue: aws.String(MessageType)},
			"version": {DataType: aws.String("Number"), StringValue: aws.String(fmt.Sprint(Version))},
		},
	})
	if err != nil {
		return reservation.Unavailable("sqs send", err)
	}
	return nil
}

// RedrivePolicy is the RedrivePolicy attribute of a queue that moves a
// message to dlqARN after maxReceive receives (template.yaml declares it for
// AWS; make dev and the tests create their queues with it).
func RedrivePolicy(maxReceive int, dlqARN string) string {
	return fmt.Sprintf(`{"maxReceiveCount":"%d","deadLetterTargetArn":"%s"}`, maxReceive, dlqARN)
}
