package consumer_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/holdfast/holdfast/shared/handlers/consumer"
	"github.com/holdfast/holdfast/shared/message"
	"github.com/holdfast/holdfast/shared/reservation"
)

// down is the id suffix whose decision fails as if MySQL were down.
const down = "dddddddddddddddddddddddddd"

type counter map[string]int

func (c counter) Count(name string, n int) { c[name] += n }

func body(t *testing.T, id string) string {
	t.Helper()
	b, err := message.Encode(reservation.Reservation{ID: "s." + id, SKU: "s", Qty: 1, UserID: "u"})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestPartialBatchFailuresListOnlyTheFailedRecords(t *testing.T) {
	var decided []string
	decide := func(_ context.Context, r reservation.Reservation) (reservation.Reservation, error) {
		decided = append(decided, r.ID)
		if r.ID == "s."+down {
			return r, reservation.Unavailable("mysql", errors.New("connection refused"))
		}
		r.Status = reservation.StatusConfirmed
		return r, nil
	}
	metrics := counter{}
	h := consumer.New("persist", decide, metrics, slog.New(slog.NewTextHandler(io.Discard, nil)))
	resp, err := h.Handle(context.Background(), events.SQSEvent{Records: []events.SQSMessage{
		{MessageId: "m1", Body: body(t, "okokokokokokokokokokokokok")},
		{MessageId: "m2", Body: `{"poison":true}`},
		{MessageId: "m3", Body: body(t, down)},
		{MessageId: "m4", Body: body(t, "zzzzzzzzzzzzzzzzzzzzzzzzzz")},
	}})
	if err != nil {
		t.Fatalf("Handle = %v; a batch must never fail whole", err)
	}
	var failed []string
	for _, f := range resp.BatchItemFailures {
		failed = append(failed, f.ItemIdentifier)
	}
	if len(failed) != 2 || failed[0] != "m2" || failed[1] != "m3" {
		t.Errorf("failures = %v, want [m2 m3]", failed)
	}
	if len(decided) != 3 {
		t.Errorf("decided %v: the poison record must not reach the protocol, the rest must", decided)
	}
	if metrics["poison_messages"] != 1 {
		t.Errorf("poison_messages = %d, want 1", metrics["poison_messages"])
	}
	if metrics["item_failures"] != 2 {
		t.Errorf("item_failures = %d, want 2 (the alarm that sees MySQL down reads it)", metrics["item_failures"])
	}
}

func TestRecordsLeftWhenTimeRunsOutAreRedelivered(t *testing.T) {
	calls := 0
	decide := func(_ context.Context, r reservation.Reservation) (reservation.Reservation, error) {
		calls++
		return r, nil
	}
	h := consumer.New("persist", decide, counter{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithTimeout(context.Background(), time.Second) // less than the 2 s reserve
	defer cancel()
	resp, _ := h.Handle(ctx, events.SQSEvent{Records: []events.SQSMessage{{MessageId: "m1", Body: body(t, "aaaaaaaaaaaaaaaaaaaaaaaaaa")}}})
	if calls != 0 || len(resp.BatchItemFailures) != 1 {
		t.Errorf("calls %d failures %d, want 0 and 1", calls, len(resp.BatchItemFailures))
	}
}
