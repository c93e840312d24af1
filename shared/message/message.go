// Package message is the contract of the reservation message that reserve
// sends and persist and compensate consume: its body, versioned JSON with a
// type field (the SQS message attributes "type" and "version" repeat them),
// and its encoding. Decoding is strict, so a message that does not fit the
// contract is poison and never reaches the protocol. The queue adapter
// sends it; the consumer handlers read it.
package message

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/holdfast/holdfast/shared/reservation"
)

// Type names the reservation message in its "type" field and in the SQS
// message attribute "type".
const Type = "ReservationHeld"

// TransferType names the message of a transfer between two buckets of one
// SKU (units a refill took out of bucket "bucket" and credited to
// "into_bucket"), which persist records like a reservation. It has no user
// and no group.
const TransferType = "TransferHeld"

// TypeOf returns the type of r's message.
func TypeOf(r reservation.Reservation) string {
	if r.Transfer {
		return TransferType
	}
	return Type
}

// Version is the message schema version this code writes and reads.
const Version = 1

// Body is the body of a reservation message.
type Body struct {
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
	// IntoBucket is a transfer's receiving bucket (TransferHeld only).
	IntoBucket *int `json:"into_bucket,omitempty"`
}

// ErrPoison marks a message that can never be processed: it is reported as
// failed until SQS moves it to the dead-letter queue, and touches no stock.
var ErrPoison = errors.New("poison message")

// maxQty bounds a message's quantity independently of the API's limit, so a
// forged message cannot ask for absurd amounts.
const maxQty = 1_000_000

// Encode returns the message body for r.
func Encode(r reservation.Reservation) ([]byte, error) {
	b := Body{
		Version: Version, Type: TypeOf(r), ReservationID: r.ID, SKU: r.SKU, Qty: r.Qty,
		UserID: r.UserID, GroupID: r.GroupID, HoldToken: r.Token, ExpiresAt: r.ExpiresAt.UTC(), CreatedAt: r.CreatedAt.UTC(),
		Bucket: r.Bucket,
	}
	if r.Transfer {
		b.IntoBucket = &r.Into
	}
	return json.Marshal(b)
}

// Decode parses and validates a message body. Any error wraps ErrPoison.
func Decode(body []byte) (reservation.Reservation, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	var m Body
	if err := dec.Decode(&m); err != nil {
		return reservation.Reservation{}, fmt.Errorf("%w: %v", ErrPoison, err)
	}
	if dec.More() {
		return reservation.Reservation{}, fmt.Errorf("%w: trailing data", ErrPoison)
	}
	if m.Version != Version || (m.Type != Type && m.Type != TransferType) {
		return reservation.Reservation{}, fmt.Errorf("%w: version %d type %q not understood", ErrPoison, m.Version, m.Type)
	}
	if m.Type == TransferType {
		return decodeTransfer(m)
	}
	if m.IntoBucket != nil {
		return reservation.Reservation{}, fmt.Errorf("%w: into_bucket in a %s message", ErrPoison, m.Type)
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

// decodeTransfer validates a TransferHeld body: a hold token, two distinct
// buckets in range, no user and no group. Whether the SKU has the buckets
// is MySQL's to say (reservation.ErrNotATransfer).
func decodeTransfer(m Body) (reservation.Reservation, error) {
	switch {
	case m.UserID != "" || m.GroupID != "":
		return reservation.Reservation{}, fmt.Errorf("%w: a transfer has no user and no group", ErrPoison)
	case m.IntoBucket == nil || *m.IntoBucket == m.Bucket || *m.IntoBucket < 0 || *m.IntoBucket >= reservation.MaxBuckets ||
		m.Bucket < 0 || m.Bucket >= reservation.MaxBuckets:
		return reservation.Reservation{}, fmt.Errorf("%w: a transfer names two distinct buckets in range", ErrPoison)
	case m.HoldToken == "":
		return reservation.Reservation{}, fmt.Errorf("%w: a transfer has a hold token", ErrPoison)
	case !reservation.ValidReservationID(m.ReservationID, m.SKU):
		return reservation.Reservation{}, fmt.Errorf("%w: reservation_id must be the sku, a dot and 26 base32 characters", ErrPoison)
	case m.Qty < 1 || m.Qty > maxQty:
		return reservation.Reservation{}, fmt.Errorf("%w: qty must be 1 to %d", ErrPoison, maxQty)
	}
	return reservation.Reservation{
		ID: m.ReservationID, SKU: m.SKU, Qty: m.Qty, Token: m.HoldToken, Status: reservation.StatusHeld,
		ExpiresAt: m.ExpiresAt, CreatedAt: m.CreatedAt, Bucket: m.Bucket, Transfer: true, Into: *m.IntoBucket,
	}, nil
}
