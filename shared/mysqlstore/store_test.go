package mysqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/holdfast/holdfast/shared/mysqlstore"
	"github.com/holdfast/holdfast/shared/reservation"
	"github.com/holdfast/holdfast/shared/testservices"
)

var now = time.Date(2026, 11, 11, 12, 0, 0, 0, time.UTC)

func open(t *testing.T) (*mysqlstore.Store, *sql.DB) {
	t.Helper()
	env := testservices.Require(t)
	db, err := sql.Open("mysql", env.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(64)
	t.Cleanup(func() { _ = db.Close() })
	return mysqlstore.New(db), db
}

func res(id, sku string, qty int) reservation.Reservation {
	return reservation.Reservation{ID: id, SKU: sku, Qty: qty, UserID: "u-" + id, CreatedAt: now, ExpiresAt: now.Add(time.Minute)}
}

func available(t *testing.T, s *mysqlstore.Store, sku string) int64 {
	t.Helper()
	l, err := s.Stock(context.Background(), sku)
	if err != nil {
		t.Fatal(err)
	}
	return l.Available
}

// apply retries version conflicts (optimistically, in fresh transactions).
func apply(ctx context.Context, s *mysqlstore.Store, r reservation.Reservation) (reservation.ApplyResult, error) {
	for {
		out, _, err := s.Apply(ctx, r, reservation.Optimistic, now)
		if errors.Is(err, reservation.ErrVersionConflict) {
			continue
		}
		return out, err
	}
}

func TestMigrateIsRepeatable(t *testing.T) {
	_, db := open(t)
	if err := mysqlstore.Migrate(context.Background(), db); err != nil {
		t.Fatalf("second Migrate = %v", err)
	}
}

func TestApplyOutcomes(t *testing.T) {
	ctx := context.Background()
	s, _ := open(t)
	if _, _, err := s.SetStock(ctx, "s", 5, nil); err != nil {
		t.Fatal(err)
	}
	check := func(name string, r reservation.Reservation, want reservation.ApplyResult) {
		t.Helper()
		got, _, err := s.Apply(ctx, r, reservation.Optimistic, now)
		if err != nil || got != want {
			t.Errorf("%s: Apply = %v %v, want %v", name, got, err, want)
		}
	}
	check("first", res("a", "s", 2), reservation.Applied)
	check("redelivery", res("a", "s", 2), reservation.AlreadyConfirmed)
	if _, inserted, err := s.Fence(ctx, res("b", "s", 1), reservation.ReasonExpired, now); err != nil || !inserted {
		t.Fatalf("Fence = %v %v", inserted, err)
	}
	check("fenced", res("b", "s", 1), reservation.AlreadyCancelled)
	check("too much", res("c", "s", 4), reservation.Insufficient)
	check("unknown sku", res("d", "nosuch", 1), reservation.NoSuchSKU)
	if got := available(t, s, "s"); got != 3 {
		t.Errorf("available = %d, want 3", got)
	}
	if _, err := s.Reservation(ctx, "c"); !errors.Is(err, reservation.ErrNotFound) {
		t.Errorf("a refused apply left a row: %v", err)
	}
}

func TestFenceNeverOverwritesAConfirmedRow(t *testing.T) {
	ctx := context.Background()
	s, _ := open(t)
	if _, _, err := s.SetStock(ctx, "s", 5, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := apply(ctx, s, res("a", "s", 2)); err != nil {
		t.Fatal(err)
	}
	row, inserted, err := s.Fence(ctx, res("a", "s", 2), reservation.ReasonDeadLetter, now)
	if err != nil || inserted || row.Status != reservation.StatusConfirmed {
		t.Errorf("Fence of confirmed = %v %v %v, want the CONFIRMED row untouched", row.Status, inserted, err)
	}
}

// Persist and a fence racing on the same id: exactly one wins, and the
// stock is taken if and only if the row ends CONFIRMED.
func TestApplyAndFenceRaceDecideOneOutcome(t *testing.T) {
	ctx := context.Background()
	s, _ := open(t)
	const n = 60
	if _, _, err := s.SetStock(ctx, "s", n, nil); err != nil {
		t.Fatal(err)
	}
	var confirmed int64
	for i := range n {
		r := res(fmt.Sprintf("r%d", i), "s", 1)
		var wg sync.WaitGroup
		wg.Add(2)
		go func() {
			defer wg.Done()
			if _, err := apply(ctx, s, r); err != nil {
				t.Errorf("apply: %v", err)
			}
		}()
		go func() {
			defer wg.Done()
			if _, _, err := s.Fence(ctx, r, reservation.ReasonExpired, now); err != nil {
				t.Errorf("fence: %v", err)
			}
		}()
		wg.Wait()
		row, err := s.Reservation(ctx, r.ID)
		if err != nil {
			t.Fatal(err)
		}
		if row.Status == reservation.StatusConfirmed {
			confirmed++
		}
	}
	if got := available(t, s, "s"); got != n-confirmed {
		t.Errorf("available = %d with %d confirmed, want %d", got, confirmed, n-confirmed)
	}
}

// 32 consumers, one hot row, 200 orders for 150 units: no lost update, no
// oversell, and every refusal is a real shortage.
func TestOptimisticStormNeverOversells(t *testing.T) {
	ctx := context.Background()
	s, db := open(t)
	if _, _, err := s.SetStock(ctx, "hot", 150, nil); err != nil {
		t.Fatal(err)
	}
	var applied, short atomic.Int64
	work := make(chan int)
	var wg sync.WaitGroup
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				got, err := apply(ctx, s, res(fmt.Sprintf("o%d", i), "hot", 1))
				switch {
				case err != nil:
					t.Errorf("apply: %v", err)
				case got == reservation.Applied:
					applied.Add(1)
				case got == reservation.Insufficient:
					short.Add(1)
				}
			}
		}()
	}
	for i := range 200 {
		work <- i
	}
	close(work)
	wg.Wait()
	if applied.Load() != 150 || short.Load() != 50 {
		t.Errorf("applied %d short %d, want 150 and 50", applied.Load(), short.Load())
	}
	l, _ := s.Stock(ctx, "hot")
	if l.Available != 0 || l.Version != 151 {
		t.Errorf("stock = %+v, want available 0 version 151", l)
	}
	var rows int
	_ = db.QueryRow(`SELECT COUNT(*) FROM reservations WHERE status = 'CONFIRMED'`).Scan(&rows)
	if rows != 150 {
		t.Errorf("confirmed rows = %d, want 150", rows)
	}
}

func TestRefundReturnsStockOnceUnderConcurrency(t *testing.T) {
	ctx := context.Background()
	s, _ := open(t)
	if _, _, err := s.SetStock(ctx, "s", 5, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := apply(ctx, s, res("a", "s", 3)); err != nil {
		t.Fatal(err)
	}
	var refunded atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				_, ok, err := s.Refund(ctx, "a", reservation.ReasonBuyer, now)
				if errors.Is(err, reservation.ErrVersionConflict) {
					continue
				}
				if err != nil {
					t.Errorf("refund: %v", err)
				}
				if ok {
					refunded.Add(1)
				}
				return
			}
		}()
	}
	wg.Wait()
	if refunded.Load() != 1 || available(t, s, "s") != 5 {
		t.Errorf("refunded %d times, available %d; want once and 5", refunded.Load(), available(t, s, "s"))
	}
	row, _ := s.Reservation(ctx, "a")
	if row.Status != reservation.StatusCancelled || !row.Refunded || row.Notified {
		t.Errorf("row = %+v, want CANCELLED, refunded, event pending", row)
	}
}

func TestGroupCapacityAndOneJoinPerUser(t *testing.T) {
	ctx := context.Background()
	s, _ := open(t)
	if _, _, err := s.SetStock(ctx, "s", 100, nil); err != nil {
		t.Fatal(err)
	}
	g := reservation.Group{ID: "g", SKU: "s", Capacity: 3, Status: reservation.GroupOpen, Deadline: now.Add(time.Hour), CreatedAt: now}
	if err := s.CreateGroup(ctx, g); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateGroup(ctx, reservation.Group{ID: "g2", SKU: "nosuch", Capacity: 3, Deadline: now, CreatedAt: now}); !errors.Is(err, reservation.ErrUnknownSKU) {
		t.Errorf("group on unknown sku = %v", err)
	}
	users := []string{"a", "b", "a", "c", "d", "e"}
	results := make([]reservation.ApplyResult, len(users))
	var wg sync.WaitGroup
	for i, u := range users {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := res(fmt.Sprintf("j%d", i), "s", 1)
			r.UserID, r.GroupID = u, "g"
			got, err := apply(ctx, s, r)
			if err != nil {
				t.Errorf("apply: %v", err)
			}
			results[i] = got
		}()
	}
	wg.Wait()
	applied := 0
	for _, r := range results {
		if r == reservation.Applied {
			applied++
		}
	}
	got, _ := s.Group(ctx, "g")
	if applied != 3 || got.Members != 3 || got.Status != reservation.GroupFormed {
		t.Errorf("applied %d, group %+v; want 3 members FORMED", applied, got)
	}
	if av := available(t, s, "s"); av != 97 {
		t.Errorf("available = %d, want 97 (refused joins take nothing)", av)
	}
}

func TestClosedDatabaseIsUnavailable(t *testing.T) {
	s, db := open(t)
	_ = db.Close()
	if _, _, err := s.Apply(context.Background(), res("a", "s", 1), reservation.Optimistic, now); !errors.Is(err, reservation.ErrUnavailable) {
		t.Errorf("Apply on a closed db = %v, want ErrUnavailable", err)
	}
}

// The locking attempt never loses a version race: 32 writers, one attempt each.
func TestPessimisticApplyNeverConflicts(t *testing.T) {
	ctx := context.Background()
	s, _ := open(t)
	if _, _, err := s.SetStock(ctx, "hot", 100, nil); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var conflicts atomic.Int64
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, _, err := s.Apply(ctx, res(fmt.Sprintf("p%d", i), "hot", 1), reservation.Pessimistic, now)
			if errors.Is(err, reservation.ErrVersionConflict) {
				conflicts.Add(1)
			} else if err != nil || got != reservation.Applied {
				t.Errorf("locking apply = %v %v", got, err)
			}
		}()
	}
	wg.Wait()
	if conflicts.Load() != 0 || available(t, s, "hot") != 36 {
		t.Errorf("conflicts %d, available %d; want 0 and 36", conflicts.Load(), available(t, s, "hot"))
	}
}

// The hot-SKU path: 16 consumers settle 400 orders for 300 units in batches
// of 10 — no oversell, every refusal a real shortage, and a fence racing a
// batch never lets a fenced id be confirmed.
func TestApplyBatchStormAndFenceRace(t *testing.T) {
	ctx := context.Background()
	s, db := open(t)
	if _, _, err := s.SetStock(ctx, "hot", 300, nil); err != nil {
		t.Fatal(err)
	}
	work := make(chan []reservation.Reservation)
	var applied, short, fenced atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for batch := range work {
				for {
					out, err := s.ApplyBatch(ctx, "hot", batch, now)
					if errors.Is(err, reservation.ErrVersionConflict) {
						continue
					}
					if err != nil {
						t.Errorf("batch: %v", err)
						break
					}
					for _, o := range out {
						switch o.Result {
						case reservation.Applied:
							applied.Add(1)
						case reservation.Insufficient:
							short.Add(1)
						case reservation.AlreadyCancelled:
							fenced.Add(1)
						}
					}
					break
				}
			}
		}()
	}
	for b := range 40 {
		batch := make([]reservation.Reservation, 10)
		for i := range batch {
			batch[i] = res(fmt.Sprintf("b%d-%d", b, i), "hot", 1)
		}
		// A fence races every tenth batch's first id.
		if b%10 == 0 {
			go func() { _, _, _ = s.Fence(ctx, batch[0], reservation.ReasonExpired, now) }()
		}
		work <- batch
	}
	close(work)
	wg.Wait()
	var confirmedRows int64
	_ = db.QueryRow(`SELECT COUNT(*) FROM reservations WHERE status = 'CONFIRMED'`).Scan(&confirmedRows)
	if av := available(t, s, "hot"); av != 300-confirmedRows || av < 0 {
		t.Errorf("available %d with %d confirmed rows: the ledger does not balance", av, confirmedRows)
	}
	if applied.Load() != confirmedRows || applied.Load() > 300 {
		t.Errorf("applied %d, confirmed rows %d", applied.Load(), confirmedRows)
	}
	if applied.Load()+short.Load()+fenced.Load() < 396 {
		t.Errorf("applied %d short %d fenced %d: results missing", applied.Load(), short.Load(), fenced.Load())
	}
}
