// Package eventsource emulates Lambda's SQS event source mapping for the
// local stack and the tests: it receives batches from a queue, invokes a
// handler with an events.SQSEvent, deletes the records the handler did not
// report as failed, and leaves the failed ones to reappear after the
// visibility timeout (and reach the dead-letter queue after maxReceiveCount).
package eventsource

import (
	"context"
	"fmt"
	"strconv"
	"sync"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

// Handler is an SQS-triggered Lambda handler with partial batch responses.
type Handler func(ctx context.Context, ev events.SQSEvent) (events.SQSEventResponse, error)

// API is the part of the SQS client a Poller uses.
type API interface {
	ReceiveMessage(ctx context.Context, in *sqs.ReceiveMessageInput, opts ...func(*sqs.Options)) (*sqs.ReceiveMessageOutput, error)
	DeleteMessageBatch(ctx context.Context, in *sqs.DeleteMessageBatchInput, opts ...func(*sqs.Options)) (*sqs.DeleteMessageBatchOutput, error)
}

// Poller is one event source mapping.
type Poller struct {
	Client     API
	QueueURL   string
	QueueARN   string
	BatchSize  int32 // 1–10 per receive
	Visibility int32 // seconds a received batch stays invisible
	WaitTime   int32 // long-poll seconds (the batching window, roughly)
	Handler    Handler
}

// Result is what one poll did.
type Result struct {
	Received int
	Failed   int
}

// PollOnce receives one batch, invokes the handler and deletes the
// successes. A handler error fails the whole batch, as in Lambda.
func (p *Poller) PollOnce(ctx context.Context) (Result, error) {
	out, err := p.Client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
		QueueUrl:                    aws.String(p.QueueURL),
		MaxNumberOfMessages:         max(1, min(p.BatchSize, 10)),
		VisibilityTimeout:           p.Visibility,
		WaitTimeSeconds:             p.WaitTime,
		MessageAttributeNames:       []string{"All"},
		MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameAll},
	})
	if err != nil {
		return Result{}, fmt.Errorf("receive %s: %w", p.QueueURL, err)
	}
	if len(out.Messages) == 0 {
		return Result{}, nil
	}
	ev := events.SQSEvent{Records: make([]events.SQSMessage, len(out.Messages))}
	for i, m := range out.Messages {
		attrs := map[string]events.SQSMessageAttribute{}
		for k, v := range m.MessageAttributes {
			attrs[k] = events.SQSMessageAttribute{DataType: aws.ToString(v.DataType), StringValue: v.StringValue}
		}
		ev.Records[i] = events.SQSMessage{
			MessageId: aws.ToString(m.MessageId), ReceiptHandle: aws.ToString(m.ReceiptHandle),
			Body: aws.ToString(m.Body), Md5OfBody: aws.ToString(m.MD5OfBody), Attributes: m.Attributes,
			MessageAttributes: attrs, EventSource: "aws:sqs", EventSourceARN: p.QueueARN, AWSRegion: "us-east-1",
		}
	}
	resp, herr := p.Handler(ctx, ev)
	failed := map[string]bool{}
	if herr != nil {
		for _, r := range ev.Records {
			failed[r.MessageId] = true
		}
	}
	for _, f := range resp.BatchItemFailures {
		failed[f.ItemIdentifier] = true
	}
	var del []sqstypes.DeleteMessageBatchRequestEntry
	for i, r := range ev.Records {
		if !failed[r.MessageId] {
			del = append(del, sqstypes.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: aws.String(r.ReceiptHandle)})
		}
	}
	if len(del) > 0 {
		dout, err := p.Client.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(p.QueueURL), Entries: del})
		if err != nil {
			return Result{Received: len(ev.Records), Failed: len(failed)}, fmt.Errorf("delete %s: %w", p.QueueURL, err)
		}
		if len(dout.Failed) > 0 {
			return Result{Received: len(ev.Records), Failed: len(failed)}, fmt.Errorf("delete %s: %d entries failed", p.QueueURL, len(dout.Failed))
		}
	}
	return Result{Received: len(ev.Records), Failed: len(failed)}, nil
}

// Run polls with concurrency batches in flight until ctx ends. Poll errors
// are passed to onErr (which may be nil) and polling goes on.
func (p *Poller) Run(ctx context.Context, concurrency int, onResult func(Result, error)) {
	q := *p
	q.WaitTime = max(q.WaitTime, 1) // long-poll: never spin on an empty queue
	var wg sync.WaitGroup
	for range max(1, concurrency) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				res, err := q.PollOnce(ctx)
				if onResult != nil && (err != nil || res.Received > 0) && ctx.Err() == nil {
					onResult(res, err)
				}
			}
		}()
	}
	wg.Wait()
}
