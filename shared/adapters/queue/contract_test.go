package queue_test

import (
	"testing"

	"github.com/holdfast/holdfast/internal/testkit/reservationtest"
	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/adapters/queue"
	"github.com/holdfast/holdfast/shared/reservation"
)

// The Enqueuer contract, on the SQS-API server: what arrives, decoded as
// persist decodes it, is what was sent.
func TestEnqueuerContract(t *testing.T) {
	env := testservices.Require(t)
	reservationtest.Enqueuer(t, func(t *testing.T) (reservation.Enqueuer, reservationtest.Delivered) {
		client := env.SQS(t)
		q := env.CreateQueues(t, client, 5)
		return queue.NewPublisher(client, q.URL), func(t *testing.T, n int) []reservation.Reservation {
			var out []reservation.Reservation
			for _, body := range testservices.Receive(t, client, q.URL, n) {
				r, err := queue.Decode(body)
				if err != nil {
					t.Fatalf("decode %s: %v", body, err)
				}
				out = append(out, r)
			}
			return out
		}
	})
}
