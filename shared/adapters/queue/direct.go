package queue

import (
	"context"
	"crypto/md5" //nolint:gosec // SQS's own body checksum, not a security measure
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/holdfast/holdfast/shared/awsjson"
	"github.com/holdfast/holdfast/shared/message"
	"github.com/holdfast/holdfast/shared/reservation"
)

// DirectConfig configures a DirectPublisher. Its Endpoint may be empty:
// then the queue URL's scheme and host, which is the regional endpoint, or
// its VPC endpoint's private DNS name.
type DirectConfig struct {
	QueueURL string
	awsjson.Config
}

// DirectPublisher sends each reservation message with one signed request in
// SQS's JSON protocol (awsjson): the request the SDK's SendMessage sends,
// without its per-call middleware stack, which cost this path about 2.5
// times the CPU of the request itself (docs/benchmarks.md). Reserve sends
// with it; HOLDFAST_SQS_SEND=sdk switches back to the SDK's Publisher.
type DirectPublisher struct {
	url    string
	client *awsjson.Client
}

var _ reservation.Enqueuer = (*DirectPublisher)(nil)

// NewDirectPublisher returns a DirectPublisher, or an error if the
// configuration cannot work.
func NewDirectPublisher(c DirectConfig) (*DirectPublisher, error) {
	u, err := url.Parse(c.QueueURL)
	if err != nil || u.Scheme == "" || u.Host == "" {
		return nil, fmt.Errorf("sqs direct publisher: queue url %q is not an absolute URL", c.QueueURL)
	}
	if strings.TrimSuffix(c.Endpoint, "/") == "" {
		c.Endpoint = u.Scheme + "://" + u.Host
	}
	client, err := awsjson.NewClient(awsjson.SQS, c.Config)
	if err != nil {
		return nil, err
	}
	return &DirectPublisher{url: c.QueueURL, client: client}, nil
}

// sendMessage is SendMessage's input in the JSON protocol.
type sendMessage struct {
	QueueURL          string            `json:"QueueUrl"`
	MessageBody       string            `json:"MessageBody"`
	MessageAttributes messageAttributes `json:"MessageAttributes"`
}

// messageAttributes are a message's attributes (a map in the protocol, a
// struct here: the same JSON, in the same order, without a map to build
// on every send).
type messageAttributes struct {
	Type    attributeValue `json:"type"`
	Version attributeValue `json:"version"`
}

type attributeValue struct {
	DataType    string `json:"DataType"`
	StringValue string `json:"StringValue"`
}

// attributes are the message attributes of r's message: its type and version.
func attributes(r reservation.Reservation) messageAttributes {
	return messageAttributes{
		Type:    attributeValue{DataType: "String", StringValue: message.TypeOf(r)},
		Version: attributeValue{DataType: "Number", StringValue: strconv.Itoa(message.Version)},
	}
}

// Enqueue implements reservation.Enqueuer. An error means the message may or
// may not have been enqueued (a lost answer); the caller settles that
// through the fence, and a duplicate is harmless (persist takes each id
// once). A transport error, a retryable refusal (*awsjson.Error) or a body
// checksum that does not match is tried again (awsjson.Client.Call).
func (p *DirectPublisher) Enqueue(ctx context.Context, r reservation.Reservation) error {
	body, err := message.Encode(r)
	if err != nil {
		return fmt.Errorf("encode %s: %w", r.ID, err)
	}
	payload, err := json.Marshal(sendMessage{QueueURL: p.url, MessageBody: string(body), MessageAttributes: attributes(r)})
	if err != nil {
		return fmt.Errorf("encode %s: %w", r.ID, err)
	}
	sum := md5.Sum(body) //nolint:gosec // SQS's checksum of the body
	wantMD5 := hex.EncodeToString(sum[:])
	err = p.client.Call(ctx, "SendMessage", payload, func(data []byte) error {
		var out struct {
			MD5OfMessageBody string `json:"MD5OfMessageBody"`
			MessageID        string `json:"MessageId"`
		}
		if err := json.Unmarshal(data, &out); err != nil || out.MessageID == "" {
			return fmt.Errorf("no message id (%v)", err)
		}
		if !strings.EqualFold(out.MD5OfMessageBody, wantMD5) {
			return fmt.Errorf("body checksum %s, want %s", out.MD5OfMessageBody, wantMD5)
		}
		return nil
	})
	if err != nil {
		return reservation.Unavailable("sqs send", err)
	}
	return nil
}

// Endpoint is where the sends go.
func (p *DirectPublisher) Endpoint() string { return p.client.Endpoint() }
