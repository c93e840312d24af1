package eventsource_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/holdfast/holdfast/internal/devsqs"
	"github.com/holdfast/holdfast/internal/eventsource"
	"github.com/holdfast/holdfast/internal/testkit/testservices"
)

// On the real SQS-API server: a batch of up to BatchSize records is
// gathered over many receives (SQS gives at most 10 each), within the
// window; the records the handler reports failed stay on the queue, the
// others are deleted (in chunks of 10).
// Both clients: the SDK's, and the dev stack's lean one (devsqs).
func TestPollerGathersBatchesBeyondTenPerReceive(t *testing.T) {
	env := testservices.Require(t)
	client := env.SQS(t)
	lean, err := devsqs.New(context.Background(), client)
	if err != nil {
		t.Fatal(err)
	}
	for name, api := range map[string]eventsource.API{"sdk": client, "devsqs": lean} {
		t.Run(name, func(t *testing.T) { gathersBatchesBeyondTen(t, env, client, api) })
	}
}

func gathersBatchesBeyondTen(t *testing.T, env testservices.Env, client *sqs.Client, api eventsource.API) {
	ctx := context.Background()
	q := env.CreateQueues(t, client, 5)
	const sent = 35
	for i := 0; i < sent; i += 10 {
		var entries []sqstypes.SendMessageBatchRequestEntry
		for j := i; j < min(sent, i+10); j++ {
			entries = append(entries, sqstypes.SendMessageBatchRequestEntry{Id: aws.String(fmt.Sprint(j)), MessageBody: aws.String(fmt.Sprintf("m%02d", j))})
		}
		if _, err := client.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(q.URL), Entries: entries}); err != nil {
			t.Fatal(err)
		}
	}
	var sizes []int
	var failedBody []string
	p := &eventsource.Poller{Client: api, QueueURL: q.URL, BatchSize: 25, Window: 200 * time.Millisecond, Visibility: 2, WaitTime: 1,
		Handler: func(_ context.Context, ev events.SQSEvent) (events.SQSEventResponse, error) {
			sizes = append(sizes, len(ev.Records))
			var resp events.SQSEventResponse
			for _, r := range ev.Records[:2] { // the first two of each batch fail
				failedBody = append(failedBody, r.Body)
				resp.BatchItemFailures = append(resp.BatchItemFailures, events.SQSBatchItemFailure{ItemIdentifier: r.MessageId})
			}
			return resp, nil
		}}
	first, err := p.PollOnce(ctx)
	if err != nil || first.Received != 25 || first.Failed != 2 {
		t.Fatalf("first poll = %+v %v, want 25 received (batch size, not 10), 2 failed", first, err)
	}
	second, err := p.PollOnce(ctx)
	if err != nil || second.Received != 10 {
		t.Fatalf("second poll = %+v %v, want the remaining 10", second, err)
	}
	// Once their visibility passes, the 4 failed records come back, and
	// nothing else: every other record was deleted.
	var again []string
	p.WaitTime, p.Handler = 5, func(_ context.Context, ev events.SQSEvent) (events.SQSEventResponse, error) {
		for _, r := range ev.Records {
			again = append(again, r.Body)
		}
		return events.SQSEventResponse{}, nil
	}
	for len(again) < 4 {
		res, err := p.PollOnce(ctx)
		if err != nil || res.Received == 0 {
			t.Fatalf("poll for the failed records = %+v %v; have %v", res, err, again)
		}
	}
	sort.Strings(again)
	sort.Strings(failedBody)
	if fmt.Sprint(again) != fmt.Sprint(failedBody) {
		t.Errorf("redelivered %v, want exactly the failed %v", again, failedBody)
	}
}

// fakeSQS serves n messages of the given body size, 10 a receive (or
// perReceive, if set), and counts receives.
type fakeSQS struct {
	mu         sync.Mutex
	left       int
	body       string
	perReceive int
	receives   int
}

func (f *fakeSQS) ReceiveMessage(_ context.Context, in *sqs.ReceiveMessageInput, _ ...func(*sqs.Options)) (*sqs.ReceiveMessageOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.receives++
	out := &sqs.ReceiveMessageOutput{}
	n := int(in.MaxNumberOfMessages)
	if f.perReceive > 0 {
		n = min(n, f.perReceive)
	}
	for range min(n, f.left) {
		f.left--
		out.Messages = append(out.Messages, sqstypes.Message{MessageId: aws.String(fmt.Sprint(f.left)), ReceiptHandle: aws.String("rh"), Body: aws.String(f.body)})
	}
	return out, nil
}

func (f *fakeSQS) DeleteMessageBatch(_ context.Context, in *sqs.DeleteMessageBatchInput, _ ...func(*sqs.Options)) (*sqs.DeleteMessageBatchOutput, error) {
	if len(in.Entries) > 10 {
		return nil, fmt.Errorf("%d entries: SQS takes at most 10", len(in.Entries))
	}
	return &sqs.DeleteMessageBatchOutput{}, nil
}

// A batch never outgrows Lambda's 6 MB invocation payload, whatever
// BatchSize says; with no window, one receive is one batch (as in Lambda).
func TestPollerBatchStaysUnderThePayloadLimit(t *testing.T) {
	f := &fakeSQS{left: 1000, body: strings.Repeat("x", 100_000)}
	var got int
	p := &eventsource.Poller{Client: f, QueueURL: "q", BatchSize: 10_000, Window: time.Minute, Visibility: 60,
		Handler: func(_ context.Context, ev events.SQSEvent) (events.SQSEventResponse, error) {
			got = len(ev.Records)
			return events.SQSEventResponse{}, nil
		}}
	if _, err := p.PollOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got == 0 || got*100_000 > 6<<20 {
		t.Errorf("a batch of %d records of 100 kB, want some, under 6 MB", got)
	}
	if got < 40 {
		t.Errorf("a batch of %d records of 100 kB, want it to fill most of the 6 MB", got)
	}

	f = &fakeSQS{left: 100, body: "m"}
	p.Client, p.Window = f, 0
	if _, err := p.PollOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got != 10 || f.receives != 1 {
		t.Errorf("no window: %d records in %d receives, want 10 in 1", got, f.receives)
	}
}

// A queue that trickles (each receive finds one message, fewer than asked)
// is asked again after a pause, not at once: a batch gathered over a
// 500 ms window takes a handful of receives, not hundreds.
func TestPollerPausesOnADrainedQueue(t *testing.T) {
	f := &fakeSQS{left: 1_000_000, body: "m", perReceive: 1}
	var got int
	p := &eventsource.Poller{Client: f, QueueURL: "q", BatchSize: 10_000, Window: 500 * time.Millisecond, Visibility: 60,
		Handler: func(_ context.Context, ev events.SQSEvent) (events.SQSEventResponse, error) {
			got = len(ev.Records)
			return events.SQSEventResponse{}, nil
		}}
	if _, err := p.PollOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got < 2 || got != f.receives {
		t.Fatalf("%d records in %d receives, want one a receive and more than one: the window keeps gathering", got, f.receives)
	}
	if f.receives > 7 { // the first, then at most one per 100 ms pause, and the one at the deadline
		t.Errorf("%d receives in a 500 ms window on a trickling queue, want at most 7", f.receives)
	}
}
