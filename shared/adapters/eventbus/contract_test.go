package eventbus_test

import (
	"context"
	"encoding/json"
	"net/http"
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
	"github.com/holdfast/holdfast/shared/awsjson"
	"github.com/holdfast/holdfast/shared/reservation"
)

// envelopes reads n events from the queue at url in the envelope
// EventBridge delivers to an SQS target (and the stand-in sends).
func envelopes(t *testing.T, client *sqs.Client, url string, n int) []reservationtest.PublishedEvent {
	t.Helper()
	var out []reservationtest.PublishedEvent
	for _, body := range testservices.Receive(t, client, url, n) {
		var e eventbus.Envelope
		if err := json.Unmarshal(body, &e); err != nil || e.Source != eventbus.Source || !e.Time.Equal(e.Detail.OccurredAt) {
			t.Fatalf("event %s: %v", body, err)
		}
		out = append(out, reservationtest.PublishedEvent{DetailType: e.DetailType, Event: e.Detail})
	}
	return out
}

// The Notifier contract on the local stand-in (an SQS queue, the envelope
// EventBridge delivers to an SQS target): on the test SQS server (goaws
// under make test), and on moto, whose SendMessageBatch answers list the
// sent entries with their checksums.
func TestQueueNotifierContract(t *testing.T) {
	env := testservices.Require(t)
	t.Run("test server", func(t *testing.T) {
		reservationtest.Notifier(t, func(t *testing.T) (reservation.Notifier, reservationtest.Published) {
			client := env.SQS(t)
			q := env.CreateQueues(t, client, 5)
			return env.EventsQueue(t, q.EventsURL), func(t *testing.T, n int) []reservationtest.PublishedEvent {
				return envelopes(t, client, q.EventsURL, n)
			}
		})
	})
	t.Run("moto", func(t *testing.T) {
		m := newMoto(t)
		reservationtest.Notifier(t, func(t *testing.T) (reservation.Notifier, reservationtest.Published) {
			url := m.queue(t)
			p, err := eventbus.NewQueue(m.direct, url)
			if err != nil {
				t.Fatal(err)
			}
			return p, func(t *testing.T, n int) []reservationtest.PublishedEvent { return envelopes(t, m.sqs, url, n) }
		})
	})
}

// moto is a moto_server with SDK clients for the test's setup and the
// direct senders' configuration.
type moto struct {
	eb     *eventbridge.Client
	sqs    *sqs.Client
	direct awsjson.Config
}

func newMoto(t *testing.T) moto {
	endpoint := testservices.StartMoto(t)
	awsCfg, err := awstest.Config(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// Per client: an AWS_ENDPOINT_URL_SQS in the environment (the local
	// SQS server's) would win over a global endpoint.
	return moto{
		eb:     eventbridge.NewFromConfig(awsCfg, func(o *eventbridge.Options) { o.BaseEndpoint = aws.String(endpoint) }),
		sqs:    sqs.NewFromConfig(awsCfg, func(o *sqs.Options) { o.BaseEndpoint = aws.String(endpoint) }),
		direct: awsjson.Config{Endpoint: endpoint, Region: awsCfg.Region, Credentials: awsCfg.Credentials, HTTPClient: http.DefaultClient},
	}
}

func (m moto) queue(t *testing.T) string {
	qo, err := m.sqs.CreateQueue(context.Background(), &sqs.CreateQueueInput{QueueName: aws.String(testservices.Name("orders"))})
	if err != nil {
		t.Fatal(err)
	}
	return aws.ToString(qo.QueueUrl)
}

// The Notifier contract on EventBridge (moto): a bus, a rule for holdfast's
// events, an SQS target, as the order service would subscribe; the
// publisher is the direct PutEvents the functions send.
func TestEventBridgeNotifierContract(t *testing.T) {
	testservices.Require(t)
	m := newMoto(t)
	ctx := context.Background()
	reservationtest.Notifier(t, func(t *testing.T) (reservation.Notifier, reservationtest.Published) {
		bus, name := testservices.Name("bus"), testservices.Name("orders")
		if _, err := m.eb.CreateEventBus(ctx, &eventbridge.CreateEventBusInput{Name: aws.String(bus)}); err != nil {
			t.Fatal(err)
		}
		url := m.queue(t)
		attrs, err := m.sqs.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(url),
			AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn}})
		if err != nil {
			t.Fatal(err)
		}
		pattern := `{"source":["` + eventbus.Source + `"]}`
		if _, err := m.eb.PutRule(ctx, &eventbridge.PutRuleInput{Name: aws.String(name), EventBusName: aws.String(bus), EventPattern: aws.String(pattern)}); err != nil {
			t.Fatal(err)
		}
		if _, err := m.eb.PutTargets(ctx, &eventbridge.PutTargetsInput{Rule: aws.String(name), EventBusName: aws.String(bus),
			Targets: []ebtypes.Target{{Id: aws.String("orders"), Arn: aws.String(attrs.Attributes["QueueArn"])}}}); err != nil {
			t.Fatal(err)
		}
		p, err := eventbus.NewEventBridge(m.direct, bus)
		if err != nil {
			t.Fatal(err)
		}
		return p, func(t *testing.T, n int) []reservationtest.PublishedEvent { return envelopes(t, m.sqs, url, n) }
	})
}
