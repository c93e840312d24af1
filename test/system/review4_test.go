package system_test

// Found by the adversarial review of issue 14's first increments.

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/message"
	"github.com/holdfast/holdfast/shared/reservation"
)

func (p *promise) msgsOf(id string) []reservation.Reservation {
	p.rec.mu.Lock()
	defer p.rec.mu.Unlock()
	var out []reservation.Reservation
	for _, m := range p.rec.msgs {
		if m.ID == id {
			out = append(out, m)
		}
	}
	return out
}

// deliverBatch hands ms to persist as one SQS batch; every record must succeed.
func (p *promise) deliverBatch(ms ...reservation.Reservation) {
	p.t.Helper()
	var ev events.SQSEvent
	for i, m := range ms {
		body, err := message.Encode(m)
		if err != nil {
			p.t.Fatal(err)
		}
		ev.Records = append(ev.Records, events.SQSMessage{
			MessageId: fmt.Sprintf("msg-%d-%d", time.Now().UnixNano(), i), Body: string(body),
			EventSource: "aws:sqs", EventSourceARN: p.queues.ARN,
		})
	}
	resp, err := p.persist.Handle(context.Background(), ev)
	if err != nil || len(resp.BatchItemFailures) > 0 {
		p.t.Fatalf("persist: %v, %d failures", err, len(resp.BatchItemFailures))
	}
}

// Redis loses the SKU mid-sale and ann repeats her keyed request: MySQL has
// no row yet, so the retry takes a hold again for the same id under a new
// token. Both messages, in one persist batch or in two, take her 2 units
// once in each store, and Redis counts them once for her per-user limit.
func TestReview4OneIDUnderTwoTokensInOneBatchCountsOnce(t *testing.T) {
	for _, oneBatch := range []bool{false, true} {
		t.Run(fmt.Sprintf("one batch %v", oneBatch), func(t *testing.T) {
			p := newPromise(t)
			sku := testservices.Name("twin")
			p.createSKU(sku, 10, 4)
			id := p.reserved(sku, "ann", 2, "k1")
			p.loseSKU(sku)
			code, b := p.reserve(sku, "ann", 2, "k1")
			if code != http.StatusAccepted || b["reservation_id"] != id {
				t.Fatalf("same-key retry: %d %v", code, b)
			}
			ms := p.msgsOf(id)
			if len(ms) != 2 || ms[0].Token == ms[1].Token {
				t.Fatalf("messages of %s: %+v, want two with different tokens", id, ms)
			}
			if oneBatch {
				p.deliverBatch(ms[0], ms[1])
			} else {
				p.deliverBatch(ms[0])
				p.deliverBatch(ms[1])
			}
			a, h := p.redisStock(sku)
			if m := p.mysqlAvailable(sku); a+h != m || m != 8 {
				t.Errorf("Redis available %d + held %d, MySQL %d: want both 8 (one reservation of 2)", a, h, m)
			}
			users, _ := p.rdb.HGet(context.Background(), "hf:{"+sku+"}:users", "ann").Int64()
			if users != p.confirmedUnits(sku, "ann") || users != 2 {
				t.Errorf("Redis counts %d units for ann, MySQL confirmed %d: want 2", users, p.confirmedUnits(sku, "ann"))
			}
			if code, b := p.reserve(sku, "ann", 2, ""); code != http.StatusAccepted {
				t.Errorf("ann's next reserve of 2 (limit 4, 2 confirmed) = %d %v", code, b)
			}
		})
	}
}

// A flood of reserves of made-up SKUs (each a 404) leaves no live marks,
// so a SKU on sale stays in the sweep and its expired hold is decided by
// the first sweep past its deadline.
func TestReview4MadeUpSKUsDoNotCrowdTheSweep(t *testing.T) {
	s := newStack(t, withVars(map[string]string{"HOLDFAST_SWEEP_CATALOG": "10", "HOLDFAST_SWEEP_LIVE": "20"}))
	s.seedCatalog("shop", 300, 5)
	hot := "shop-00290"
	s.setStock(hot, 100)
	for i := range 200 {
		if code, body := s.reserve(fmt.Sprintf("zz-%05d", i), "mallory", 1, ""); code != http.StatusNotFound {
			t.Fatalf("reserve of a made-up sku: %d %v", code, body)
		}
	}
	code, body := s.reserve(hot, "ann", 1, "") // its message is lost: persist never runs
	if code != http.StatusAccepted {
		t.Fatalf("reserve %s: %d %v", hot, code, body)
	}
	id := body["reservation_id"].(string)
	s.clock.Advance(s.cfg.Protocol.HoldTTL + s.cfg.Protocol.SweepGrace + time.Second)
	rep := s.sweep()
	if rep.LiveSKUs != 1 {
		t.Errorf("the sweep visited %d live SKUs, want 1 (%s)", rep.LiveSKUs, hot)
	}
	if n := s.count(`SELECT COUNT(*) FROM reservations WHERE reservation_id = ?`, id); n != 1 {
		t.Errorf("the hold on %s is undecided after the first sweep past its deadline", hot)
	}
}
