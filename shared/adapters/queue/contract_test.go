package queue_test

import (
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/holdfast/holdfast/internal/testkit/reservationtest"
	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/adapters/queue"
	"github.com/holdfast/holdfast/shared/message"
	"github.com/holdfast/holdfast/shared/reservation"
)

// The Enqueuer contract, on the SQS-API server: what arrives, decoded as
// persist decodes it, is what was sent.
// Both publishers keep it: the SDK's and the direct one reserve uses.
func TestEnqueuerContract(t *testing.T) {
	env := testservices.Require(t)
	t.Run("sdk", func(t *testing.T) {
		reservationtest.Enqueuer(t, contractFactory(env, func(t *testing.T, client *sqs.Client, url string) reservation.Enqueuer {
			return queue.NewPublisher(client, url)
		}))
	})
	t.Run("direct", func(t *testing.T) {
		reservationtest.Enqueuer(t, contractFactory(env, func(t *testing.T, client *sqs.Client, url string) reservation.Enqueuer {
			p, err := queue.NewDirectPublisher(queue.DirectConfig{QueueURL: url, Config: env.SQSDirect(t)})
			if err != nil {
				t.Fatal(err)
			}
			return p
		}))
	})
}

func contractFactory(env testservices.Env, publisher func(t *testing.T, client *sqs.Client, url string) reservation.Enqueuer) reservationtest.EnqueuerFactory {
	return func(t *testing.T) (reservation.Enqueuer, reservationtest.Delivered) {
		client := env.SQS(t)
		q := env.CreateQueues(t, client, 5)
		return publisher(t, client, q.URL), func(t *testing.T, n int) []reservation.Reservation {
			var out []reservation.Reservation
			for _, body := range testservices.Receive(t, client, q.URL, n) {
				r, err := message.Decode(body)
				if err != nil {
					t.Fatalf("decode %s: %v", body, err)
				}
				out = append(out, r)
			}
			return out
		}
	}
}
