package redisstore_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/adapters/redisstore"
	"github.com/holdfast/holdfast/shared/reservation"
)

// confirm.lua gives each hold of its batch its TTL (EXPIRE, from the time
// of that command) in its loop, and reads the clock for meta.decided only
// after the loop: with a batch of confirmChunk (200) holds, on Redis's own
// clock as in production, decided is later than the first holds' TTL base.
// reserve.lua says whole while now < decided + retention, so there is a
// stretch of milliseconds in which Redis has deleted the first holds
// (their PEXPIRETIME passed) and the bucket still says it holds every id.
// (follow.lua's retain has the same order, over a few commands.) Expected:
// every confirmed hold's PEXPIRETIME >= decided + wholefor - 1 (no ms in
// which the key is gone and whole is said).
func TestReview3ConfirmMarksDecidedAfterItsHoldsTTLs(t *testing.T) {
	env := testservices.Require(t)
	rdb := env.Redis(t)
	ctx := context.Background()
	const retention = time.Hour
	s := redisstore.New(rdb, retention) // production: the scripts read Redis's clock
	worst := int64(0)
	for trial := range 20 {
		sku := testservices.Name("rv3dec")
		if res, err := s.Warm(ctx, reservation.StockLevel{SKU: sku, Available: 1000, Version: 1, Created: true}, nil, nil); err != nil || res != reservation.SyncWarmed {
			t.Fatalf("warm: %v %v", res, err)
		}
		rows := make([]reservation.Reservation, 0, 200)
		for i := range 200 {
			user := fmt.Sprintf("u%d", i)
			r := reservation.Reservation{ID: reservation.ReservationID(reservation.ReserveRequest{SKU: sku}, nil), SKU: sku, Qty: 1,
				UserID: user, Token: "t" + user, Status: reservation.StatusHeld}
			h, _, err := s.Reserve(ctx, r, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			h.Status = reservation.StatusConfirmed
			h.PayBy = time.Now().Add(time.Hour) // a pay window: the unpaid hash too, as a sale with one has
			rows = append(rows, h)
		}
		if _, errs := s.FollowAll(ctx, rows, 2); errs[0] != nil {
			t.Fatal(errs[0])
		}
		meta := rdb.HMGet(ctx, "hf:{"+sku+"}:meta", "decided", "wholefor").Val()
		decided, _ := strconv.ParseInt(fmt.Sprint(meta[0]), 10, 64)
		wholefor, _ := strconv.ParseInt(fmt.Sprint(meta[1]), 10, 64)
		first := rdb.PExpireTime(ctx, "hf:{"+sku+"}:r:"+rows[0].ID).Val().Milliseconds()
		last := rdb.PExpireTime(ctx, "hf:{"+sku+"}:r:"+rows[len(rows)-1].ID).Val().Milliseconds()
		t.Logf("trial %d: decided %d wholefor %d; first hold's TTL base %d, last's %d", trial, decided, wholefor, first-wholefor, last-wholefor)
		for _, r := range rows {
			e := rdb.PExpireTime(ctx, "hf:{"+sku+"}:r:"+r.ID).Val().Milliseconds()
			if gap := decided + wholefor - 1 - e; gap > worst {
				worst = gap
				t.Logf("trial %d: hold %s expires at %d, whole said until %d: %d ms gone while whole", trial, r.ID, e, decided+wholefor-1, gap)
			}
		}
	}
	if worst > 0 {
		t.Errorf("a confirmed hold is gone up to %d ms before the bucket stops saying whole (meta.decided is read after the batch's EXPIREs)", worst)
	}
}
