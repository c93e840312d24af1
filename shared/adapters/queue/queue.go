// Package queue is the SQS publisher of the reservation message (its
// contract is package message): the SDK's SendMessage, and the direct send
// reserve uses.
package queue

import (
	"context"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/holdfast/holdfast/shared/message"
	"github.com/holdfast/holdfast/shared/reservation"
)

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
	body, err := message.Encode(r)
	if err != nil {
		return fmt.Errorf("encode %s: %w", r.ID, err)
	}
	_, err = p.client.SendMessage(ctx, &sqs.SendMessageInput{
		QueueUrl:    aws.String(p.url),
		MessageBody: aws.String(string(body)),
		MessageAttributes: map[string]sqstypes.MessageAttributeValue{
			"type":    {DataType: aws.String("String"), StringValue: aws.String(message.TypeOf(r))},
			"version": {DataType: aws.String("Number"), StringValue: aws.String(fmt.Sprint(message.Version))},
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
