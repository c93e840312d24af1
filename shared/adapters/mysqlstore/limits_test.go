package mysqlstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/adapters/mysqlstore"
	"github.com/holdfast/holdfast/shared/reservation"
)

// sell confirms one unit of sku for each of users (one batch, as persist).
func sell(t *testing.T, s *mysqlstore.Store, sku string, users ...string) []string {
	t.Helper()
	rs := make([]reservation.Reservation, len(users))
	ids := make([]string, len(users))
	for i, u := range users {
		ids[i] = fmt.Sprintf("%s-%s", sku, u)
		rs[i] = reservation.Reservation{ID: ids[i], SKU: sku, Qty: 1, UserID: u, CreatedAt: now, ExpiresAt: now.Add(time.Minute)}
	}
	out, err := s.ApplyBatch(context.Background(), sku, rs, now)
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range out {
		if o.Result != reservation.Applied {
			t.Fatalf("sell %s: result %v, want applied", rs[i].ID, o.Result)
		}
	}
	return ids
}

// wantUnits checks user_units of sku against want (buyer → units; a buyer
// with none may have no row or a zero row).
func wantUnits(t *testing.T, db *sql.DB, sku string, want map[string]int64) {
	t.Helper()
	rows, err := db.Query(`SELECT user_id, units FROM user_units WHERE sku = ? AND units > 0`, sku)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	got := map[string]int64{}
	for rows.Next() {
		var u string
		var n int64
		if err := rows.Scan(&u, &n); err != nil {
			t.Fatal(err)
		}
		got[u] = n
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("user_units of %s = %v, want %v", sku, got, want)
	}
}

// lockWaits counts the row lock waits going on now.
func lockWaits(t *testing.T, root *sql.DB) int64 {
	t.Helper()
	return innodbCounter(t, root, "Innodb_row_lock_current_waits")
}

// TestChangeStockPerUserLimit: turning a per-user limit on rebuilds the
// SKU's user_units from its confirmed rows without a lock on anything of
// another SKU, so admins changing distinct SKUs never wait for each other
// (issue 20: two such changes, on SKUs without user_units rows yet, each
// held the gap of the empty table and deadlocked).
func TestChangeStockPerUserLimit(t *testing.T) {
	t.Run("limit changes of distinct SKUs do not wait for each other", func(t *testing.T) {
		ctx := context.Background()
		s, db, root := private(t)
		for _, sku := range []string{"lim-a", "lim-b"} {
			if _, err := s.ChangeStock(ctx, reservation.SetTo(sku, 10)); err != nil {
				t.Fatal(err)
			}
		}
		ra := sell(t, s, "lim-a", "ua")
		sell(t, s, "lim-b", "ub")
		deadlocks, waits := innodbCounter(t, root, "Innodb_deadlocks"), innodbCounter(t, root, "Innodb_row_lock_waits")

		// a's confirmed row is locked, as a persist or a refund of a would
		// hold it: a's change may wait for its own SKU, never b's for a's.
		hold, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer hold.Rollback() //nolint:errcheck // released below
		var qty int
		if err := hold.QueryRow(`SELECT qty FROM reservations WHERE reservation_id = ? FOR UPDATE`, ra[0]).Scan(&qty); err != nil {
			t.Fatal(err)
		}
		doneA, doneB := make(chan error, 1), make(chan error, 1)
		go func() {
			_, err := s.ChangeStock(ctx, reservation.StockChange{SKU: "lim-a", Add: ptr(int64(1)), Limit: ptr(2)})
			doneA <- err
		}()
		var errA error
		var aDone bool
		testservices.Eventually(t, 10*time.Second, "a's change ends or waits for a lock", func() bool {
			select {
			case errA = <-doneA:
				aDone = true
				return true
			default:
				return lockWaits(t, root) > 0
			}
		})
		go func() {
			_, err := s.ChangeStock(ctx, reservation.StockChange{SKU: "lim-b", Add: ptr(int64(1)), Limit: ptr(2)})
			doneB <- err
		}()
		var errB error
		select {
		case errB = <-doneB:
		case <-time.After(10 * time.Second):
			t.Errorf("the limit change of lim-b waited 10 s (still waiting) for the change of lim-a")
			_ = hold.Rollback()
			errB = <-doneB
		}
		if errB != nil {
			t.Errorf("change of lim-b: %v", errB)
		}
		_ = hold.Rollback()
		if !aDone {
			errA = <-doneA
		}
		if errA != nil {
			t.Errorf("change of lim-a: %v", errA)
		}
		if d := innodbCounter(t, root, "Innodb_deadlocks") - deadlocks; d != 0 {
			t.Errorf("%d deadlocks between limit changes of two SKUs, want none; the latest:%s", d, latestDeadlock(root))
		}
		if w := innodbCounter(t, root, "Innodb_row_lock_waits") - waits; w != 0 {
			t.Errorf("%d row lock waits, want none: a limit change waits for nothing but its own SKU's stock row", w)
		}
		wantUnits(t, db, "lim-a", map[string]int64{"ua": 1})
		wantUnits(t, db, "lim-b", map[string]int64{"ub": 1})
	})

	t.Run("16 admins turning limits on and off for distinct SKUs never wait, and the figures are the confirmed units", func(t *testing.T) {
		ctx := context.Background()
		s, db, root := private(t)
		const writers, rounds = 16, 10
		for w := range writers {
			sku := fmt.Sprintf("lim-%02d", w)
			if _, err := s.ChangeStock(ctx, reservation.SetTo(sku, 1000)); err != nil {
				t.Fatal(err)
			}
		}
		deadlocks, waits := innodbCounter(t, root, "Innodb_deadlocks"), innodbCounter(t, root, "Innodb_row_lock_waits")
		var wg sync.WaitGroup
		for w := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sku := fmt.Sprintf("lim-%02d", w)
				for i := range rounds {
					// A sale while the limit is off (no figures kept), then on.
					rs := []reservation.Reservation{{ID: fmt.Sprintf("%s-%d", sku, i), SKU: sku, Qty: 1 + i%2,
						UserID: fmt.Sprintf("u%d", i%3), CreatedAt: now, ExpiresAt: now.Add(time.Minute)}}
					if _, err := s.ApplyBatch(ctx, sku, rs, now); err != nil {
						t.Errorf("sell %s: %v", sku, err)
					}
					for _, limit := range []int{100, 0} {
						if i == rounds-1 && limit == 0 {
							break // ends on
						}
						if _, err := s.ChangeStock(ctx, reservation.StockChange{SKU: sku, Add: ptr(int64(0)), Limit: ptr(limit)}); err != nil {
							t.Errorf("ChangeStock(%s, limit %d): %v", sku, limit, err)
						}
					}
				}
			}()
		}
		wg.Wait()
		if d := innodbCounter(t, root, "Innodb_deadlocks") - deadlocks; d != 0 {
			t.Errorf("%d deadlocks among limit changes of distinct SKUs, want none; the latest:%s", d, latestDeadlock(root))
		}
		if w := innodbCounter(t, root, "Innodb_row_lock_waits") - waits; w != 0 {
			t.Errorf("%d row lock waits among limit changes and sales of distinct SKUs, want none", w)
		}
		want := map[string]int64{}
		for i := range rounds {
			want[fmt.Sprintf("u%d", i%3)] += int64(1 + i%2)
		}
		for w := range writers {
			wantUnits(t, db, fmt.Sprintf("lim-%02d", w), want)
		}
	})
}

// TestApplyPerUserLimit: persist's figures of a SKU with a per-user limit
// (user_units) are read and written by primary key after the SKU's stock
// row is locked, so persists and refunds of distinct SKUs, each buyer new,
// never wait for each other; the limit still holds.
func TestApplyPerUserLimit(t *testing.T) {
	t.Run("16 persists of distinct limited SKUs with new buyers never wait for each other", func(t *testing.T) {
		ctx := context.Background()
		s, db, root := private(t)
		const writers, rounds = 16, 20
		for w := range writers {
			for _, sku := range []string{fmt.Sprintf("pl-%02d", w), fmt.Sprintf("open-%02d", w)} {
				c := reservation.SetTo(sku, 1000)
				if sku[0] == 'p' {
					c.Limit = ptr(2)
				}
				if _, err := s.ChangeStock(ctx, c); err != nil {
					t.Fatal(err)
				}
			}
		}
		deadlocks, waits := innodbCounter(t, root, "Innodb_deadlocks"), innodbCounter(t, root, "Innodb_row_lock_waits")
		var wg sync.WaitGroup
		for w := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				limited, open := fmt.Sprintf("pl-%02d", w), fmt.Sprintf("open-%02d", w)
				for i := range rounds {
					r := func(sku, user string, n int) reservation.Reservation {
						return reservation.Reservation{ID: fmt.Sprintf("%s-%d-%d", sku, i, n), SKU: sku, Qty: 1, UserID: user,
							CreatedAt: now, ExpiresAt: now.Add(time.Minute)}
					}
					// A batch of two new buyers, the second twice (its third
					// unit over the limit of 2), and one buyer alone.
					batch := []reservation.Reservation{r(limited, fmt.Sprintf("a%d", i), 0),
						r(limited, fmt.Sprintf("b%d", i), 1), r(limited, fmt.Sprintf("b%d", i), 2), r(limited, fmt.Sprintf("b%d", i), 3)}
					out, err := s.ApplyBatch(ctx, limited, batch, now)
					if err != nil {
						t.Errorf("batch %s: %v", limited, err)
						return
					}
					if out[3].Result != reservation.OverLimit {
						t.Errorf("batch %s: a third unit of one buyer is %v, want over the limit", limited, out[3].Result)
					}
					one, err := s.Apply(ctx, r(limited, fmt.Sprintf("c%d", i), 4), reservation.Pessimistic, now)
					if err != nil || one.Result != reservation.Applied {
						t.Errorf("apply %s: %v, %v", limited, one.Result, err)
					}
					// Refunds: of a limited SKU's buyer, and of a SKU without a limit.
					if _, _, err := s.Refund(ctx, batch[0].ID, reservation.ReasonBuyer, "", now); err != nil {
						t.Errorf("refund %s: %v", batch[0].ID, err)
					}
					unl := r(open, fmt.Sprintf("d%d", i), 5)
					if o, err := s.Apply(ctx, unl, reservation.Pessimistic, now); err != nil || o.Result != reservation.Applied {
						t.Errorf("apply %s: %v, %v", open, o.Result, err)
					}
					if _, _, err := s.Refund(ctx, unl.ID, reservation.ReasonBuyer, "", now); err != nil {
						t.Errorf("refund %s: %v", unl.ID, err)
					}
				}
			}()
		}
		wg.Wait()
		if d := innodbCounter(t, root, "Innodb_deadlocks") - deadlocks; d != 0 {
			t.Errorf("%d deadlocks among persists of distinct SKUs, want none; the latest:%s", d, latestDeadlock(root))
		}
		if w := innodbCounter(t, root, "Innodb_row_lock_waits") - waits; w != 0 {
			t.Errorf("%d row lock waits among persists and refunds of distinct SKUs, want none", w)
		}
		want := map[string]int64{}
		for i := range rounds {
			want[fmt.Sprintf("b%d", i)], want[fmt.Sprintf("c%d", i)] = 2, 1
		}
		for w := range writers {
			wantUnits(t, db, fmt.Sprintf("pl-%02d", w), want)
		}
	})
}
