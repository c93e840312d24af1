package mysqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/holdfast/holdfast/internal/testkit/eventschema"
	"github.com/holdfast/holdfast/internal/testkit/reservationtest"
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
	if n != mysqlstore.MigrationCount() {
		t.Errorf("the two runs applied %d migrations together, want %d (each once)", n, mysqlstore.MigrationCount())
	}
}

// Persist and a fence racing on the same id: exactly one wins, and the
// stock is taken if and only if the row ends CONFIRMED.
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

func TestClosedDatabaseIsUnavailable(t *testing.T) {
	s, db := open(t)
	_ = db.Close()
	if _, err := s.Apply(context.Background(), res("a", "s", 1), reservation.Optimistic, now); !errors.Is(err, reservation.ErrUnavailable) {
		t.Errorf("Apply on a closed db = %v, want ErrUnavailable", err)
	}
}

// The locking attempt never loses a version race: 32 writers, one attempt each.
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
// Persist enforces the per-user limit in MySQL (one message at a time and in
// a batch), counts what was confirmed before the limit was set, and a
// refunded unit no longer counts.
// Every CANCELLED transition is unreleased until Redis followed it; the
// outbox lists it; MarkReleased ends it. A refund keeps a FORMED group FORMED.
// A group is not recorded FORMED while a member's cancellation is still on
// its way to Redis: Redis's slot count is behind MySQL's then.
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
	if err != nil || len(applied) != mysqlstore.MigrationCount() {
		t.Fatalf("every migration run again = %v, %v; want all %d applied", applied, err, mysqlstore.MigrationCount())
	}
	var units int
	if err := db.QueryRowContext(ctx, `SELECT units FROM user_units WHERE sku = 's1' AND user_id = 'u1'`).Scan(&units); err != nil || units != 1 {
		t.Errorf("user_units after the re-run = %d, %v; want 1 (the same figure)", units, err)
	}
}

// The Ledger contract, on MariaDB.
func TestLedgerContract(t *testing.T) {
	reservationtest.Ledger(t, func(t *testing.T) reservation.Ledger {
		s, _ := open(t)
		return s
	})
}

// Migration 0010 moves the cancellations the notified flag still owed to the
// event outbox, in the shape the code writes and its schema accepts; a
// second run inserts nothing more.
func TestMigrationMovesOwedCancellationsToTheOutbox(t *testing.T) {
	ctx := context.Background()
	_, db := open(t)
	for _, q := range []string{
		"INSERT INTO product_stock (sku, available) VALUES ('s1', 10)",
		"INSERT INTO reservations (reservation_id, sku, qty, user_id, status, reason, notified, created_at, updated_at) VALUES ('s1.f', 's1', 1, 'u1', 'CANCELLED', 'expired', 0, NOW(3), NOW(3))",
		"INSERT INTO reservations (reservation_id, sku, qty, user_id, group_id, status, reason, refunded, notified, created_at, updated_at) VALUES ('s1.r', 's1', 2, 'u2', 'g-1', 'CANCELLED', 'group_failed', 1, 0, NOW(3), NOW(3))",
		"INSERT INTO reservations (reservation_id, sku, qty, user_id, status, reason, created_at, updated_at) VALUES ('s1.sent', 's1', 1, 'u3', 'CANCELLED', 'expired', NOW(3), NOW(3))",
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	for range 2 {
		for _, q := range []string{"DELETE FROM schema_migration_steps", "DELETE FROM schema_migrations"} {
			if _, err := db.ExecContext(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := mysqlstore.Migrate(ctx, db); err != nil {
			t.Fatal(err)
		}
	}
	rows, err := db.QueryContext(ctx, `SELECT event_id, type, payload FROM events ORDER BY event_id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id, typ string
		var payload []byte
		if err := rows.Scan(&id, &typ, &payload); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
		if err := eventschema.Validate(typ, payload); err != nil {
			t.Errorf("%s: %v", id, err)
		}
	}
	if strings.Join(ids, " ") != "reservation/s1.f/1 reservation/s1.r/2" {
		t.Errorf("events = %v, want the two owed cancellations", ids)
	}
	var owed int
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM reservations WHERE notified = 0`).Scan(&owed); err != nil || owed != 0 {
		t.Errorf("rows still owing by the old flag = %d %v", owed, err)
	}
}
