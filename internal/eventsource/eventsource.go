// Package eventsource emulates Lambda's SQS event source mapping for the
// local stack and the tests: it gathers batches from a queue as Lambda does
// (up to BatchSize records within the batching window, SQS giving at most 10
// per receive, bounded by the 6 MB payload), invokes a handler with an
// events.SQSEvent, deletes the records the handler did not
// report as failed, and leaves the failed ones to reappear after the
// visibility timeout (and reach the dead-letter queue after maxReceiveCount).
package eventsource

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"time"

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
	Client    API
	QueueURL  string
	QueueARN  string
	BatchSize int32 // records per invocation, 1–10,000 (SQS gives at most 10 per receive)
	// Window is MaximumBatchingWindowInSeconds: once a first message came,
	// receives go on until BatchSize records, the window passing, or the
	// invocation payload nearing Lambda's 6 MB, whichever comes first.
	Window     time.Duration
	Visibility int32 // seconds a received batch stays invisible
	WaitTime   int32 // long-poll seconds of the first receive
	Handler    Handler
}

// Result is what one poll did.
type Result struct {
	Received int
	Failed   int
}

// payloadLimit is Lambda's synchronous invocation payload limit, which
// bounds an SQS batch as much as BatchSize does.
const payloadLimit = 6 << 20

// drainedPause is how long a batch being gathered waits, within its
// window, after a receive that found fewer messages than it asked for
// before asking again. Asking at once mostly comes back empty: at 20 ms,
// make dev's pollers sent one receive for every three messages, half of
// them empty, and each costs the SQS server a request (docs/benchmarks.md).
const drainedPause = 100 * time.Millisecond

// PollOnce gathers one batch, invokes the handler and deletes the
// successes. A handler error fails the whole batch, as in Lambda.
func (p *Poller) PollOnce(ctx context.Context) (Result, error) {
	ev, err := p.gather(ctx)
	if err != nil || len(ev.Records) == 0 {
		return Result{}, err
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
	res := Result{Received: len(ev.Records), Failed: len(failed)}
	var del []sqstypes.DeleteMessageBatchRequestEntry
	for i, r := range ev.Records {
		if !failed[r.MessageId] {
			del = append(del, sqstypes.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: aws.String(r.ReceiptHandle)})
		}
	}
	for len(del) > 0 { // DeleteMessageBatch takes 10 entries at most
		chunk := del[:min(10, len(del))]
		del = del[len(chunk):]
		dout, err := p.Client.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(p.QueueURL), Entries: chunk})
		if err != nil {
			return res, fmt.Errorf("delete %s: %w", p.QueueURL, err)
		}
		if len(dout.Failed) > 0 {
			return res, fmt.Errorf("delete %s: %d entries failed", p.QueueURL, len(dout.Failed))
		}
	}
	return res, nil
}

// gather receives until the batch is complete (see Poller.Window). A
// receive that fails after the first message ends the batch with what it
// has, as the messages it holds would otherwise wait out their visibility.
func (p *Poller) gather(ctx context.Context) (events.SQSEvent, error) {
	want := int(max(1, p.BatchSize))
	var ev events.SQSEvent
	var size, largest int
	var deadline time.Time
	for len(ev.Records) < want && size+10*largest < payloadLimit {
		wait := p.WaitTime
		if len(ev.Records) > 0 {
			wait = 0
		}
		asked := int32(min(10, want-len(ev.Records)))
		out, err := p.Client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
			QueueUrl:                    aws.String(p.QueueURL),
			MaxNumberOfMessages:         asked,
			VisibilityTimeout:           p.Visibility,
			WaitTimeSeconds:             wait,
			MessageAttributeNames:       []string{"All"},
			MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameAll},
		})
		if err != nil {
			if len(ev.Records) == 0 {
				return ev, fmt.Errorf("receive %s: %w", p.QueueURL, err)
			}
			break
		}
		if len(out.Messages) == 0 && len(ev.Records) == 0 {
			break
		}
		if len(ev.Records) == 0 {
			deadline = time.Now().Add(p.Window)
		}
		for _, m := range out.Messages {
			rec := p.record(m)
			n := recordSize(rec)
			size, largest = size+n, max(largest, n)
			ev.Records = append(ev.Records, rec)
		}
		if !time.Now().Before(deadline) {
			break
		}
		if len(out.Messages) < int(asked) {
			// The queue is drained for now: ask again after a pause
			// rather than at once, which would mostly come back empty.
			t := time.NewTimer(min(drainedPause, time.Until(deadline)))
			select {
			case <-ctx.Done():
				t.Stop()
				return ev, nil // what was received is handled, as Lambda would
			case <-t.C:
			}
		}
	}
	return ev, nil
}

func (p *Poller) record(m sqstypes.Message) events.SQSMessage {
	attrs := map[string]events.SQSMessageAttribute{}
	for k, v := range m.MessageAttributes {
		attrs[k] = events.SQSMessageAttribute{DataType: aws.ToString(v.DataType), StringValue: v.StringValue}
	}
	return events.SQSMessage{
		MessageId: aws.ToString(m.MessageId), ReceiptHandle: aws.ToString(m.ReceiptHandle),
		Body: aws.ToString(m.Body), Md5OfBody: aws.ToString(m.MD5OfBody), Attributes: m.Attributes,
		MessageAttributes: attrs, EventSource: "aws:sqs", EventSourceARN: p.QueueARN, AWSRegion: "us-east-1",
	}
}

// recordSize is the record's size in the invocation payload.
func recordSize(r events.SQSMessage) int {
	b, err := json.Marshal(r)
	if err != nil {
		return len(r.Body) + 1024
	}
	return len(b) + 1
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
