package eventbus_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	ebtypes "github.com/aws/aws-sdk-go-v2/service/eventbridge/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/holdfast/holdfast/internal/testkit/awstest"
	"github.com/holdfast/holdfast/internal/testkit/reservationtest"
	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/adapters/eventbus"
	"github.com/holdfast/holdfast/shared/reservation"
)

// The Notifier contract on the local stand-in (an SQS queue, the envelope
// EventBridge delivers to an SQS target).
func TestQueueNotifierContract(t *testing.T) {
	env := testservices.Require(t)
	reservationtest.Notifier(t, func(t *testing.T) (reservation.Notifier, reservationtest.Published) {
		client := env.SQS(t)
		q := env.CreateQueues(t, client, 5)
		return eventbus.NewQueue(client, q.EventsURL), func(t *testing.T, n int) []reservationtest.PublishedEvent {
			var out []reservationtest.PublishedEvent
			for _, body := range testservices.Receive(t, client, q.EventsURL, n) {
				var e eventbus.Envelope
				if err := json.Unmarshal(body, &e); err != nil || e.Source != eventbus.Source || !e.Time.Equal(e.Detail.OccurredAt) {
					t.Fatalf("event %s: %v", body, err)
				}
				out = append(out, reservationtest.PublishedEvent{DetailType: e.DetailType, Event: e.Detail})
			}
			return out
		}
	})
}

// The Notifier contract on EventBridge (moto): a bus, a rule for holdfast's
// events, an SQS target, as the order service would subscribe.
func TestEventBridgeNotifierContract(t *testing.T) {
	testservices.Require(t)
	moto := testservices.StartMoto(t)
	ctx := context.Background()
	awsCfg, err := awstest.Config(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Per client: an AWS_ENDPOINT_URL_SQS in the environment (the local
	// SQS server's) would win over a global endpoint.
	eb := eventbridge.NewFromConfig(awsCfg, func(o *eventbridge.Options) { o.BaseEndpoint = aws.String(moto) })
	sq := sqs.NewFromConfig(awsCfg, func(o *sqs.Options) { o.BaseEndpoint = aws.String(moto) })
	reservationtest.Notifier(t, func(t *testing.T) (reservation.Notifier, reservationtest.Published) {
		bus, name := testservices.Name("bus"), testservices.Name("orders")
		if _, err := eb.CreateEventBus(ctx, &eventbridge.CreateEventBusInput{Name: aws.String(bus)}); err != nil {
			t.Fatal(err)
		}
		qo, err := sq.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name)})
		if err != nil {
			t.Fatal(err)
		}
		attrs, err := sq.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: qo.QueueUrl,
			AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn}})
		if err != nil {
			t.Fatal(err)
		}
		pattern := `{"source":["` + eventbus.Source + `"]}`
		if _, err := eb.PutRule(ctx, &eventbridge.PutRuleInput{Name: aws.String(name), EventBusName: aws.String(bus), EventPattern: aws.String(pattern)}); err != nil {
			t.Fatal(err)
		}
		if _, err := eb.PutTargets(ctx, &eventbridge.PutTargetsInput{Rule: aws.String(name), EventBusName: aws.String(bus),
			Targets: []ebtypes.Target{{Id: aws.String("orders"), Arn: aws.String(attrs.Attributes["QueueArn"])}}}); err != nil {
			t.Fatal(err)
		}
		return eventbus.NewEventBridge(eb, bus), func(t *testing.T, n int) []reservationtest.PublishedEvent {
			var out []reservationtest.PublishedEvent
			for _, body := range testservices.Receive(t, sq, aws.ToString(qo.QueueUrl), n) {
				var e eventbus.Envelope // the shape EventBridge delivers to an SQS target
				if err := json.Unmarshal(body, &e); err != nil || e.Source != eventbus.Source {
					t.Fatalf("event %s: %v", body, err)
				}
				out = append(out, reservationtest.PublishedEvent{DetailType: e.DetailType, Event: e.Detail})
			}
			return out
		}
	})
}
