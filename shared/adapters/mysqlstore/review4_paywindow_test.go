package mysqlstore_test

// Review 4 of ae3ab65 (a batch's rows inserted due by a per-process guess
// of the SKU's pay window, corrected only when the read under the lock
// differs).

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast/shared/adapters/mysqlstore"
	"github.com/holdfast/holdfast/shared/reservation"
)

// Two processes (two Stores, each with its own guess) apply batches of one
// SKU while an admin flips its pay window: every confirmed row is due by
// the window the stock row held at the version its batch took (mapped from
// the ChangeStock versions), its row says the same as the batch's answer,
// and no refused row is left.
func TestReview4PayWindowGuessUnderConcurrentWindowChanges(t *testing.T) {
	ctx := context.Background()
	a, db := open(t)
	b := mysqlstore.New(db)
	if _, err := a.ChangeStock(ctx, reservation.StockChange{SKU: "pw", Set: ptr(int64(1_000_000)), PayWithin: ptr(time.Minute), Key: "pw-init"}); err != nil {
		t.Fatal(err)
	}
	type change struct {
		version int64
		window  time.Duration
	}
	var mu sync.Mutex
	changes := []change{}
	l, err := a.Stock(ctx, "pw")
	if err != nil {
		t.Fatal(err)
	}
	changes = append(changes, change{l.Version, l.PayWithin})
	type applied struct {
		id      string
		version int64
		payBy   time.Time
		at      time.Time
	}
	var got []applied
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the admin
		defer wg.Done()
		windows := []time.Duration{0, 30 * time.Second, time.Minute, 2 * time.Minute}
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			w := windows[i%len(windows)]
			l, err := a.ChangeStock(ctx, reservation.StockChange{SKU: "pw", Add: ptr(int64(0)), PayWithin: ptr(w), Key: fmt.Sprintf("pw-%d", i)})
			if err != nil {
				t.Errorf("ChangeStock: %v", err)
				return
			}
			mu.Lock()
			changes = append(changes, change{l.Version, l.PayWithin})
			mu.Unlock()
			time.Sleep(time.Millisecond)
		}
	}()
	var workers sync.WaitGroup
	for w := 0; w < 6; w++ {
		workers.Add(1)
		go func(w int) {
			defer workers.Done()
			for i := 0; i < 40; i++ {
				s := a
				if (w+i)%2 == 1 {
					s = b
				}
				at := now.Add(time.Duration(w*1000+i) * time.Millisecond)
				id := func(k string) string { return fmt.Sprintf("pw-%d-%d-%s", w, i, k) }
				big := res(id("big"), "pw", 1)
				big.Qty = 10_000_000 // refused: Insufficient
				batch := []reservation.Reservation{res(id("a"), "pw", 1), big, res(id("b"), "pw", 1), res(id("a"), "pw", 1)}
				if i > 0 { // a redelivery of the last batch's first row
					batch = append(batch, res(fmt.Sprintf("pw-%d-%d-a", w, i-1), "pw", 1))
				}
				var out []reservation.BatchResult
				var err error
				for {
					out, err = s.ApplyBatch(ctx, "pw", batch, at)
					if !errors.Is(err, reservation.ErrVersionConflict) {
						break
					}
				}
				if err != nil {
					t.Errorf("ApplyBatch: %v", err)
					return
				}
				if out[1].Result != reservation.Insufficient {
					t.Errorf("big = %v", out[1].Result)
				}
				mu.Lock()
				for _, j := range []int{0, 2} {
					if out[j].Result != reservation.Applied {
						t.Errorf("%s = %v", batch[j].ID, out[j].Result)
						continue
					}
					got = append(got, applied{batch[j].ID, out[j].Version, out[j].Row.PayBy, at})
				}
				mu.Unlock()
				if out[3].Row.PayBy != out[0].Row.PayBy {
					t.Errorf("twin's pay_by %v, its first copy's %v", out[3].Row.PayBy, out[0].Row.PayBy)
				}
			}
		}(w)
	}
	workers.Wait() // then the admin
	close(stop)
	wg.Wait()
	sort.Slice(changes, func(i, j int) bool { return changes[i].version < changes[j].version })
	windowAt := func(v int64) time.Duration { // the window of the last change before version v
		w := time.Duration(-1)
		for _, c := range changes {
			if c.version < v {
				w = c.window
			}
		}
		return w
	}
	wrong := 0
	for _, g := range got {
		row, err := a.Reservation(ctx, g.id)
		if err != nil {
			t.Fatal(err)
		}
		if !row.PayBy.Equal(g.payBy) {
			wrong++
			t.Errorf("%s: row due %v, its batch said %v", g.id, row.PayBy, g.payBy)
		}
		want := time.Time{}
		if w := windowAt(g.version); w > 0 {
			want = g.at.Add(w)
		}
		if !row.PayBy.Equal(want) {
			wrong++
			if wrong < 10 {
				t.Errorf("%s (version %d): due %v, want %v (window %v)", g.id, g.version, row.PayBy, want, windowAt(g.version))
			}
		}
	}
	var left int
	if err := db.QueryRow(`SELECT COUNT(*) FROM reservations WHERE reservation_id LIKE 'pw-%-big'`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("%d refused rows left", left)
	}
	t.Logf("%d confirmations, %d window changes, %d wrong", len(got), len(changes), wrong)
}
