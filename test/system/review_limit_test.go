package system_test

// Adversarial review of the rewritten reserve.lua: the per-user count is
// raised with one HINCRBY and given back on a refusal, and the ticket is
// taken with one ZREM. These hold (they pass); they are the evidence of the
// review's "attacks that held".

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"

	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/reservation"
)

// One buyer fires many concurrent buys of 1, 2 and 3 units under a limit of
// 2, on a SKU that has 3 units (so some are SOLD_OUT, some LIMIT, some
// over both): the buyer's count in Redis is exactly the units held, never
// over the limit, and returns to nothing when the holds are cancelled.
func TestReviewLimitRefusalsGiveBackExactlyUnderConcurrency(t *testing.T) {
	ctx := context.Background()
	p := newPromise(t)
	sku := testservices.Name("revlim")
	p.createSKU(sku, 3, 2)
	var mu sync.Mutex
	var ids []string
	var wg sync.WaitGroup
	for i := range 30 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, _, err := p.app.Service.Reserve(ctx, reservation.ReserveRequest{SKU: sku, Qty: 1 + i%3, UserID: "scalper",
				IdempotencyKey: fmt.Sprintf("k%d", i)})
			if err == nil {
				mu.Lock()
				ids = append(ids, r.ID)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	tag := "hf:{" + sku + "}"
	held := 0
	for _, id := range ids {
		q, _ := strconv.Atoi(p.rdb.HGet(ctx, tag+":r:"+id, "qty").Val())
		held += q
	}
	n, _ := strconv.Atoi(p.rdb.HGet(ctx, tag+":users", "scalper").Val())
	if users := p.rdb.HGetAll(ctx, tag+":users").Val(); len(users) > 1 {
		t.Errorf("users hash %v", users)
	}
	if held == 0 {
		t.Fatalf("no buy was held (%d ids)", len(ids))
	}
	if held > 2 || n != held {
		t.Errorf("after 30 concurrent buys: units held %d, the buyer's count %d; want held ≤ 2 and the count = held", held, n)
	}
	for _, id := range ids {
		if _, err := p.app.Service.Cancel(ctx, id, "scalper"); err != nil {
			t.Fatal(err)
		}
	}
	if users := p.rdb.HGetAll(ctx, tag+":users").Val(); len(users) != 0 {
		t.Errorf("after cancelling every hold the users hash = %v, want empty", users)
	}
}
