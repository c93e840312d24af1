// Package consumer holds the SQS handlers of persist (the reservation queue)
// and compensate (its dead-letter queue). They decode each record, call the
// reservation service once per record, and report failed records through
// events.SQSEventResponse so that only those return to the queue.
package consumer

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/holdfast/holdfast/shared/message"
	"github.com/holdfast/holdfast/shared/reservation"
)

// Decider is one protocol decision applied to a reservation message:
// Service.Compensate for compensate.
type Decider func(ctx context.Context, r reservation.Reservation) (reservation.Reservation, error)

// BatchDecider decides a whole batch at once (Service.PersistBatch) and
// returns one error per message: nil once decided.
type BatchDecider func(ctx context.Context, rs []reservation.Reservation) []error

// Counter counts poison messages.
type Counter interface {
	Count(name string, n int)
}

// Handler is an SQS batch handler with partial batch responses.
type Handler struct {
	name    string
	decide  BatchDecider
	metrics Counter
	log     *slog.Logger
	// reserve is how much of the invocation's remaining time to keep
	// unused: records not started by then are reported failed (redelivered)
	// rather than lost to a timeout that would fail the whole batch.
	reserve time.Duration
}

// New returns a Handler named name (for logs) that applies decide to each
// message in turn.
func New(name string, decide Decider, metrics Counter, log *slog.Logger) *Handler {
	return NewBatch(name, func(ctx context.Context, rs []reservation.Reservation) []error {
		errs := make([]error, len(rs))
		for i, r := range rs {
			_, errs[i] = decide(ctx, r)
		}
		return errs
	}, metrics, log)
}

// NewBatch returns a Handler that hands every valid message of a batch to
// decide at once.
func NewBatch(name string, decide BatchDecider, metrics Counter, log *slog.Logger) *Handler {
	return &Handler{name: name, decide: decide, metrics: metrics, log: log, reserve: 2 * time.Second}
}

// Handle processes a batch. It never fails the whole batch: each record
// either succeeds or is listed in BatchItemFailures. A poison record is
// listed too, so SQS moves it to the dead-letter queue after maxReceiveCount
// receives; it never touches stock. With too little time left for the batch
// every record is listed, to be redelivered rather than lost to a timeout.
func (h *Handler) Handle(ctx context.Context, ev events.SQSEvent) (events.SQSEventResponse, error) {
	var resp events.SQSEventResponse
	fail := func(id string) {
		resp.BatchItemFailures = append(resp.BatchItemFailures, events.SQSBatchItemFailure{ItemIdentifier: id})
	}
	if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < h.reserve {
		for _, rec := range ev.Records {
			fail(rec.MessageId)
		}
		return resp, nil
	}
	var valid []reservation.Reservation
	var ids []string
	for _, rec := range ev.Records {
		r, err := message.Decode([]byte(rec.Body))
		if err != nil {
			h.metrics.Count("poison_messages", 1)
			h.log.ErrorContext(ctx, h.name+": poison message", "message_id", rec.MessageId, "error", err)
			fail(rec.MessageId)
			continue
		}
		valid = append(valid, r)
		ids = append(ids, rec.MessageId)
	}
	if len(valid) > 0 {
		for i, err := range h.decide(ctx, valid) {
			if err == nil {
				continue
			}
			level := slog.LevelWarn
			if !errors.Is(err, reservation.ErrContended) && !errors.Is(err, reservation.ErrUnavailable) {
				level = slog.LevelError
			}
			h.log.Log(ctx, level, h.name+": will retry", "message_id", ids[i], "reservation_id", valid[i].ID, "error", err)
			fail(ids[i])
		}
	}
	// Records and batches: their ratio is the batch size the dashboard shows.
	h.metrics.Count("records", len(ev.Records))
	h.metrics.Count("batches", 1)
	if n := len(resp.BatchItemFailures); n > 0 {
		// Item failures are not invocation errors: without this metric an
		// alarm could not see "MySQL down" (every record retried, no error).
		h.metrics.Count("item_failures", n)
	}
	h.log.InfoContext(ctx, h.name+": batch", "size", len(ev.Records), "failures", len(resp.BatchItemFailures))
	return resp, nil
}
