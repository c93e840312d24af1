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
	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/adapters/mysqlstore"
	"github.com/holdfast/holdfast/shared/reservation"
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
		out, err := s.Apply(ctx, r, reservation.Optimistic, now)
		if errors.Is(err, reservation.ErrVersionConflict) {
			continue
		}
		return out.Result, err
	}
}

func TestMigrateIsRepeatable(t *testing.T) {
	_, db := open(t)
	if applied, err := mysqlstore.Migrate(context.Background(), db); err != nil || len(applied) != 0 {
		t.Fatalf("second Migrate = %v, %v; want nothing applied", applied, err)
	}
}

// MySQL commits DDL statement by statement: a run that died after the first
// statement of a migration resumes after it, instead of failing on a
// column that already exists.
func TestMigrateResumesAfterTheLastStatementThatFinished(t *testing.T) {
	ctx := context.Background()
	_, db := open(t)
	latest := mysqlstore.Latest()
	// As a crash after statement 1 of the newest migration leaves it: that
	// statement applied (its effect is still there) and recorded, the
	// migration not.
	if _, err := db.ExecContext(ctx, `DELETE FROM schema_migrations WHERE version = ?`, latest); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `DELETE FROM schema_migration_steps WHERE version = ? AND step > 0`, latest); err != nil {
		t.Fatal(err)
	}
	applied, err := mysqlstore.Migrate(ctx, db)
	if err != nil || len(applied) != 1 || applied[0] != latest {
		t.Fatalf("Migrate = %v, %v; want %d applied", applied, err, latest)
	}

	// A run that lost its connection while MySQL still applied the
	// statement (a timeout, the function's deadline) recorded nothing: the
	// statement runs again, finds its effect there, and the run goes on.
	if _, err := db.ExecContext(ctx, `DELETE FROM schema_migrations WHERE version = ?`, latest); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `DELETE FROM schema_migration_steps WHERE version = ?`, latest); err != nil {
		t.Fatal(err)
	}
	if applied, err := mysqlstore.Migrate(ctx, db); err != nil || len(applied) != 1 {
		t.Errorf("Migrate of a statement applied but not recorded = %v, %v; want it recorded as applied", applied, err)
	}
}

// Two migrators at once (the deploy's custom resource and an operator) take
// turns: both succeed and each migration is applied once.
func TestConcurrentMigratesTakeTurns(t *testing.T) {
	env := testservices.Require(t)
	dsn := env.EmptyDatabase(t)
	ctx := context.Background()
	errs := make(chan error, 2)
	total := make(chan int, 2)
	for range 2 {
		go func() {
			db, err := sql.Open("mysql", dsn)
			if err != nil {
				errs <- err
				return
			}
			defer db.Close()
			applied, err := mysqlstore.Migrate(ctx, db)
			total <- len(applied)
			errs <- err
		}()
	}
	n := 0
	for range 2 {
		if err := <-errs; err != nil {
			t.Errorf("Migrate: %v", err)
		}
	}
	n = <-total + <-total
	if n != mysqlstore.Latest() {
		t.Errorf("the two runs applied %d migrations together, want %d (each once)", n, mysqlstore.Latest())
	}
}

func TestApplyOutcomes(t *testing.T) {
	ctx := context.Background()
	s, _ := open(t)
	if _, err := s.ChangeStock(ctx, reservation.SetTo("s", 5)); err != nil {
		t.Fatal(err)
	}
	check := func(name string, r reservation.Reservation, want reservation.ApplyResult) {
		t.Helper()
		got, err := s.Apply(ctx, r, reservation.Optimistic, now)
		if err != nil || got.Result != want {
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
	if _, err := s.ChangeStock(ctx, reservation.SetTo("s", 5)); err != nil {
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
	if _, err := s.ChangeStock(ctx, reservation.SetTo("s", n)); err != nil {
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
	if _, err := s.ChangeStock(ctx, reservation.SetTo("hot", 150)); err != nil {
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
	if _, err := s.ChangeStock(ctx, reservation.SetTo("s", 5)); err != nil {
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
	if _, err := s.ChangeStock(ctx, reservation.SetTo("s", 100)); err != nil {
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
	if _, err := s.Apply(context.Background(), res("a", "s", 1), reservation.Optimistic, now); !errors.Is(err, reservation.ErrUnavailable) {
		t.Errorf("Apply on a closed db = %v, want ErrUnavailable", err)
	}
}

// The locking attempt never loses a version race: 32 writers, one attempt each.
func TestPessimisticApplyNeverConflicts(t *testing.T) {
	ctx := context.Background()
	s, _ := open(t)
	if _, err := s.ChangeStock(ctx, reservation.SetTo("hot", 100)); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var conflicts atomic.Int64
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, err := s.Apply(ctx, res(fmt.Sprintf("p%d", i), "hot", 1), reservation.Pessimistic, now)
			if errors.Is(err, reservation.ErrVersionConflict) {
				conflicts.Add(1)
			} else if err != nil || got.Result != reservation.Applied {
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
	if _, err := s.ChangeStock(ctx, reservation.SetTo("hot", 300)); err != nil {
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

func ptr[T any](v T) *T { return &v }

// An absolute stock change needs the version it was based on; a relative
// one commutes with sales; a keyed retry applies once; admin_delta sums them.
func TestChangeStockPreconditions(t *testing.T) {
	ctx := context.Background()
	s, _ := open(t)
	l, err := s.ChangeStock(ctx, reservation.SetTo("s", 100))
	if err != nil || l.Available != 100 || l.Version != 1 || l.AdminDelta != 100 {
		t.Fatalf("create = %+v %v", l, err)
	}
	if _, err := s.ChangeStock(ctx, reservation.SetTo("s", 90)); !errors.Is(err, reservation.ErrPreconditionRequired) {
		t.Errorf("set without a version = %v, want ErrPreconditionRequired", err)
	}
	if _, err := apply(ctx, s, res("a", "s", 5)); err != nil { // a sale moves the version
		t.Fatal(err)
	}
	if _, err := s.ChangeStock(ctx, reservation.StockChange{SKU: "s", Set: ptr[int64](60), IfVersion: ptr[int64](1)}); !errors.Is(err, reservation.ErrPreconditionFailed) {
		t.Errorf("set from a stale version = %v, want ErrPreconditionFailed", err)
	}
	if got := available(t, s, "s"); got != 95 {
		t.Fatalf("a refused change moved stock: %d", got)
	}
	l, err = s.ChangeStock(ctx, reservation.StockChange{SKU: "s", Set: ptr[int64](60), IfVersion: ptr[int64](2), Limit: ptr(1)})
	if err != nil || l.Available != 60 || l.Version != 3 || l.AdminDelta != 65 || l.PerUserLimit != 1 {
		t.Fatalf("set from the fresh version = %+v %v", l, err)
	}
	for range 2 {
		l, err = s.ChangeStock(ctx, reservation.StockChange{SKU: "s", Add: ptr[int64](-10), Key: "k1"})
		if err != nil || l.Available != 50 || l.AdminDelta != 55 {
			t.Fatalf("keyed add = %+v %v, want 50 available once", l, err)
		}
	}
	// A keyed absolute change retried after it committed (the same request:
	// the same If-Match) is a no-op, not a 412.
	based := l.Version
	for range 2 {
		l, err = s.ChangeStock(ctx, reservation.StockChange{SKU: "s", Set: ptr[int64](50), IfVersion: ptr(based), Key: "k2"})
		if err != nil || l.Available != 50 {
			t.Fatalf("keyed set = %+v %v, want 50 once", l, err)
		}
	}
	// The same key with any other field of the change is refused.
	for _, other := range []reservation.StockChange{
		{SKU: "s", Set: ptr[int64](50), IfVersion: ptr(based), Key: "k2", Rate: ptr(3)},
		{SKU: "s", Set: ptr[int64](50), IfVersion: ptr(based), Key: "k2", Burst: ptr(3)},
		{SKU: "s", Set: ptr[int64](50), IfVersion: ptr(based + 1), Key: "k2"},
		{SKU: "s", Set: ptr[int64](50), IfExists: true, Key: "k2"},
	} {
		if _, err := s.ChangeStock(ctx, other); !errors.Is(err, reservation.ErrIdempotencyMismatch) {
			t.Errorf("key k2 with %+v = %v, want ErrIdempotencyMismatch", other, err)
		}
	}
	// If-Match: * sets the figure on the SKU as it stands; on none it fails.
	if l, err = s.ChangeStock(ctx, reservation.StockChange{SKU: "s", Set: ptr[int64](50), IfExists: true}); err != nil || l.Available != 50 {
		t.Fatalf("set with If-Match: * = %+v %v", l, err)
	}
	if _, err := s.ChangeStock(ctx, reservation.StockChange{SKU: "nosuch", Set: ptr[int64](5), IfExists: true}); !errors.Is(err, reservation.ErrPreconditionFailed) {
		t.Errorf("If-Match: * on no sku = %v, want ErrPreconditionFailed", err)
	}
	if _, err := s.ChangeStock(ctx, reservation.StockChange{SKU: "s", Add: ptr[int64](-51)}); !errors.Is(err, reservation.ErrInsufficient) {
		t.Errorf("remove more than available = %v, want ErrInsufficient", err)
	}
	if _, err := s.ChangeStock(ctx, reservation.StockChange{SKU: "nosuch", Add: ptr[int64](1)}); !errors.Is(err, reservation.ErrUnknownSKU) {
		t.Errorf("add to an unknown sku = %v, want ErrUnknownSKU", err)
	}
}

// Persist enforces the per-user limit in MySQL (one message at a time and in
// a batch), counts what was confirmed before the limit was set, and a
// refunded unit no longer counts.
func TestPerUserLimitHoldsInMySQL(t *testing.T) {
	ctx := context.Background()
	s, _ := open(t)
	if _, err := s.ChangeStock(ctx, reservation.SetTo("s", 100)); err != nil {
		t.Fatal(err)
	}
	mine := func(id string, qty int) reservation.Reservation {
		r := res(id, "s", qty)
		r.UserID = "ann"
		return r
	}
	if got, err := apply(ctx, s, mine("a", 1)); err != nil || got != reservation.Applied {
		t.Fatalf("before the limit = %v %v", got, err)
	}
	l, _ := s.Stock(ctx, "s")
	if _, err := s.ChangeStock(ctx, reservation.StockChange{SKU: "s", Add: ptr[int64](0), Limit: ptr(2), IfVersion: ptr(l.Version)}); err != nil {
		t.Fatal(err)
	}
	if got, err := apply(ctx, s, mine("b", 2)); err != nil || got != reservation.OverLimit {
		t.Errorf("past the limit = %v %v, want OverLimit", got, err)
	}
	out, err := s.ApplyBatch(ctx, "s", []reservation.Reservation{mine("c", 1), mine("d", 1), res("e", "s", 2)}, now)
	if err != nil {
		t.Fatal(err)
	}
	if out[0].Result != reservation.Applied || out[1].Result != reservation.OverLimit || out[2].Result != reservation.Applied {
		t.Errorf("batch = %v %v %v, want Applied OverLimit Applied", out[0].Result, out[1].Result, out[2].Result)
	}
	if _, _, err := s.Refund(ctx, "a", reservation.ReasonBuyer, now); err != nil {
		t.Fatal(err)
	}
	if got, err := apply(ctx, s, mine("f", 1)); err != nil || got != reservation.Applied {
		t.Errorf("after a refund = %v %v, want Applied", got, err)
	}
	if got := available(t, s, "s"); got != 96 {
		t.Errorf("available = %d, want 96 (a, c, e, f taken; a refunded)", got)
	}
}

// Every CANCELLED transition is unreleased until Redis followed it; the
// outbox lists it; MarkReleased ends it. A refund keeps a FORMED group FORMED.
func TestReleaseOutboxAndFormedGroups(t *testing.T) {
	ctx := context.Background()
	s, _ := open(t)
	if _, err := s.ChangeStock(ctx, reservation.SetTo("s", 10)); err != nil {
		t.Fatal(err)
	}
	row, _, err := s.Fence(ctx, res("f", "s", 1), reservation.ReasonExpired, now)
	if err != nil || row.Released || row.Notified {
		t.Fatalf("fence = %+v %v, want unreleased and unnotified", row, err)
	}
	if n, err := s.Unreleased(ctx, "s"); err != nil || n != 1 {
		t.Errorf("Unreleased = %d %v, want 1", n, err)
	}
	if got, err := s.Outbox(ctx, now.Add(time.Second), 10); err != nil || len(got) != 1 || got[0].ID != "f" {
		t.Errorf("Outbox = %+v %v", got, err)
	}
	if err := s.MarkReleased(ctx, "f"); err != nil {
		t.Fatal(err)
	}
	if err := s.MarkNotified(ctx, "f"); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Outbox(ctx, now.Add(time.Second), 10); len(got) != 0 {
		t.Errorf("Outbox after both marks = %+v", got)
	}

	g := reservation.Group{ID: "g", SKU: "s", Capacity: 2, Status: reservation.GroupOpen, Deadline: now.Add(time.Hour), CreatedAt: now}
	if err := s.CreateGroup(ctx, g); err != nil {
		t.Fatal(err)
	}
	join := func(id, user string) reservation.ApplyResult {
		r := res(id, "s", 1)
		r.UserID, r.GroupID = user, "g"
		got, err := apply(ctx, s, r)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := join("m1", "u1"); got != reservation.Applied {
		t.Fatalf("join = %v", got)
	}
	// Redis took the last slot before the deadline: FORMED, and a late member still joins.
	if formed, err := s.FormGroup(ctx, "g", now.Add(time.Minute)); err != nil || !formed {
		t.Fatalf("FormGroup = %v %v", formed, err)
	}
	if gr, _ := s.FailGroup(ctx, "g", now.Add(2*time.Hour)); gr.Status != reservation.GroupFormed {
		t.Errorf("FailGroup of a formed group = %v", gr.Status)
	}
	if got := join("m2", "u2"); got != reservation.Applied {
		t.Fatalf("late member of a formed group = %v, want Applied", got)
	}
	row, refunded, err := s.Refund(ctx, "m1", reservation.ReasonBuyer, now)
	if err != nil || !refunded || row.Released {
		t.Fatalf("refund = %+v %v %v, want refunded and unreleased", row, refunded, err)
	}
	gr, _ := s.Group(ctx, "g")
	if gr.Status != reservation.GroupFormed || gr.Members != 1 {
		t.Errorf("group after a member's refund = %+v, want FORMED with 1 member", gr)
	}
	if got := join("m3", "u3"); got != reservation.Applied {
		t.Errorf("no slot is given twice, but a late holder of a formed group still joins: %v", got)
	}
}

// A group is not recorded FORMED while a member's cancellation is still on
// its way to Redis: Redis's slot count is behind MySQL's then.
func TestFormGroupWaitsForUnreleasedMembers(t *testing.T) {
	ctx := context.Background()
	s, _ := open(t)
	if _, err := s.ChangeStock(ctx, reservation.SetTo("s", 10)); err != nil {
		t.Fatal(err)
	}
	g := reservation.Group{ID: "g", SKU: "s", Capacity: 2, Status: reservation.GroupOpen, Deadline: now.Add(time.Hour), CreatedAt: now}
	if err := s.CreateGroup(ctx, g); err != nil {
		t.Fatal(err)
	}
	r := res("m1", "s", 1)
	r.GroupID = "g"
	if _, _, err := s.Fence(ctx, r, reservation.ReasonBuyer, now); err != nil {
		t.Fatal(err)
	}
	if formed, err := s.FormGroup(ctx, "g", now); err != nil || formed {
		t.Fatalf("FormGroup with an unreleased member = %v %v, want not formed", formed, err)
	}
	if err := s.MarkReleased(ctx, "m1"); err != nil {
		t.Fatal(err)
	}
	if formed, err := s.FormGroup(ctx, "g", now); err != nil || !formed {
		t.Fatalf("FormGroup once released = %v %v, want formed", formed, err)
	}
}

// Every statement of every migration can run a second time: a run that lost
// its connection after MySQL applied a statement (and before its step was
// recorded) must be able to resume. A new migration that is not resumable
// (a RENAME, an INSERT without ON DUPLICATE KEY) fails here.
func TestEveryMigrationStatementCanRunAgain(t *testing.T) {
	ctx := context.Background()
	_, db := open(t)
	for _, q := range []string{
		"INSERT INTO product_stock (sku, available, per_user_limit) VALUES ('s1', 10, 2)",
		"INSERT INTO reservations (reservation_id, sku, qty, user_id, status, created_at, updated_at) VALUES ('s1.r1', 's1', 1, 'u1', 'CONFIRMED', NOW(3), NOW(3))",
		"INSERT INTO user_units (sku, user_id, units) VALUES ('s1', 'u1', 1)",
		"DELETE FROM schema_migration_steps",
		"DELETE FROM schema_migrations",
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	applied, err := mysqlstore.Migrate(ctx, db)
	if err != nil || len(applied) != mysqlstore.Latest() {
		t.Fatalf("every migration run again = %v, %v; want all %d applied", applied, err, mysqlstore.Latest())
	}
	var units int
	if err := db.QueryRowContext(ctx, `SELECT units FROM user_units WHERE sku = 's1' AND user_id = 'u1'`).Scan(&units); err != nil || units != 1 {
		t.Errorf("user_units after the re-run = %d, %v; want 1 (the same figure)", units, err)
	}
}
