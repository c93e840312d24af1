package mysqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/adapters/mysqlstore"
	"github.com/holdfast/holdfast/shared/reservation"
)

// private is a Store on a MariaDB of the test's own, with root on it, so
// InnoDB's server-wide counters (deadlocks, row lock waits) count this
// test's statements alone.
func private(t *testing.T) (*mysqlstore.Store, *sql.DB, *sql.DB) {
	t.Helper()
	m := testservices.StartMariaDB(t)
	root, err := sql.Open("mysql", m.RootDSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = root.Close() })
	if _, err := root.Exec("CREATE DATABASE holdfast_priv"); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("mysql", m.RootDSN+"holdfast_priv?parseTime=true&interpolateParams=true")
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(64)
	t.Cleanup(func() { _ = db.Close() })
	if _, err := mysqlstore.Migrate(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	return mysqlstore.New(db), db, root
}

// innodbCounter reads one of InnoDB's server-wide status counters.
func innodbCounter(t *testing.T, root *sql.DB, name string) int64 {
	t.Helper()
	var n int64
	if err := root.QueryRow(`SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = ?`, strings.ToUpper(name)).Scan(&n); err != nil {
		t.Fatalf("status %s: %v", name, err)
	}
	return n
}

// latestDeadlock is InnoDB's report of its latest deadlock, for a failure
// message ("" if it has seen none).
func latestDeadlock(root *sql.DB) string {
	var typ, name, status string
	if err := root.QueryRow(`SHOW ENGINE INNODB STATUS`).Scan(&typ, &name, &status); err != nil {
		return "SHOW ENGINE INNODB STATUS: " + err.Error()
	}
	_, after, ok := strings.Cut(status, "LATEST DETECTED DEADLOCK")
	if !ok {
		return ""
	}
	report, _, _ := strings.Cut(after, "\nTRANSACTIONS\n")
	return report
}

// ChangeStock on distinct SKUs never contends (no gap or next-key lock of
// one SKU's write covers another's), and changes of one SKU serialise.
// (Found by the catalog-import attack of issue 20: 16 importers got 1213
// Deadlock on about 10 % of their creations.)
func TestChangeStock(t *testing.T) {
	t.Run("16 writers creating distinct SKUs side by side all succeed", func(t *testing.T) {
		ctx := context.Background()
		s, db, root := private(t)
		// A SKU to either side of the new ones, so their inserts go into
		// gaps between existing rows as well as at the end of the index.
		for _, sku := range []string{"imp-", "imp-9999"} {
			if _, err := s.ChangeStock(ctx, reservation.SetTo(sku, 1)); err != nil {
				t.Fatal(err)
			}
		}
		const writers, each = 16, 100
		deadlocks, waits := innodbCounter(t, root, "Innodb_deadlocks"), innodbCounter(t, root, "Innodb_row_lock_waits")
		errs := make(chan error, writers*each)
		var wg sync.WaitGroup
		for w := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range each {
					// Neighbouring keys at the same moment: writer w's
					// i-th SKU sits next to every other writer's i-th.
					c := reservation.SetTo(fmt.Sprintf("imp-%04d-%02d", i, w), int64(i))
					switch i % 4 {
					case 1: // an import that retries safely
						c.Key = fmt.Sprintf("import-%d-%d", w, i)
					case 2: // If-Match: 0 (create only), with settings
						c.IfVersion, c.Limit, c.Buckets = ptr[int64](0), ptr(2), ptr(3)
					case 3:
						c.Key, c.IfVersion, c.Rate = fmt.Sprintf("import-%d-%d", w, i), ptr[int64](0), ptr(5)
					}
					if _, err := s.ChangeStock(ctx, c); err != nil {
						errs <- fmt.Errorf("ChangeStock(%q): %w", c.SKU, err)
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		var failed []error
		for err := range errs {
			failed = append(failed, err)
		}
		if len(failed) > 0 {
			t.Errorf("%d of %d creations failed, want none; first: %v", len(failed), writers*each, failed[0])
		}
		// Retried deadlocks would hide in the figures above: InnoDB's own
		// counters show whether any two creations waited for each other.
		if d := innodbCounter(t, root, "Innodb_deadlocks") - deadlocks; d != 0 {
			t.Errorf("%d deadlocks among the creations, want none; the latest:%s", d, latestDeadlock(root))
		}
		if w := innodbCounter(t, root, "Innodb_row_lock_waits") - waits; w != 0 {
			t.Errorf("%d row lock waits among the creations of distinct SKUs, want none", w)
		}
		var n int
		if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM product_stock WHERE sku LIKE 'imp-%-%'`).Scan(&n); err != nil || n != writers*each {
			t.Errorf("SKUs created = %d, %v; want %d", n, err, writers*each)
		}
		for w := range writers {
			for i := range each {
				sku := fmt.Sprintf("imp-%04d-%02d", i, w)
				if i%20 == 2 {
					l, err := s.Stock(ctx, sku)
					if err != nil || l.Available != int64(i) || l.Version != 1 || l.PerUserLimit != 2 || l.Buckets != 3 || l.AdminDelta != int64(i) {
						t.Errorf("Stock(%q) = %+v, %v; want %d available at version 1, limit 2, 3 buckets", sku, l, err, i)
					}
				}
			}
		}
	})

	t.Run("a retried keyed creation is answered as applied, another change under its key is refused", func(t *testing.T) {
		ctx := context.Background()
		s, _ := open(t)
		c := reservation.StockChange{SKU: "new", Set: ptr[int64](7), Key: "k"}
		for range 2 {
			if l, err := s.ChangeStock(ctx, c); err != nil || l.Available != 7 || l.Version != 1 {
				t.Fatalf("ChangeStock(%+v) = %+v, %v; want 7 at version 1", c, l, err)
			}
		}
		c.Set = ptr[int64](8)
		if _, err := s.ChangeStock(ctx, c); !errors.Is(err, reservation.ErrIdempotencyMismatch) {
			t.Errorf("ChangeStock under the key with another figure = %v, want ErrIdempotencyMismatch", err)
		}
		if _, err := s.ChangeStock(ctx, reservation.SetTo("new", 9)); !errors.Is(err, reservation.ErrPreconditionRequired) {
			t.Errorf("an unconditional Set of an existing SKU = %v, want ErrPreconditionRequired", err)
		}
		if _, err := s.ChangeStock(ctx, reservation.StockChange{SKU: "new", Set: ptr[int64](9), IfVersion: ptr[int64](0)}); !errors.Is(err, reservation.ErrPreconditionFailed) {
			t.Errorf("If-Match: 0 on an existing SKU = %v, want ErrPreconditionFailed", err)
		}
	})

	t.Run("16 creators of one new SKU: one creates it, the others are refused", func(t *testing.T) {
		ctx := context.Background()
		s, _ := open(t)
		for round := range 20 {
			sku := fmt.Sprintf("race-%02d", round)
			results := make(chan error, 16)
			var wg sync.WaitGroup
			for w := range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					c := reservation.SetTo(sku, int64(w))
					if w%2 == 1 {
						c.IfVersion = ptr[int64](0)
					}
					_, err := s.ChangeStock(ctx, c)
					results <- err
				}()
			}
			wg.Wait()
			close(results)
			won := 0
			for err := range results {
				switch {
				case err == nil:
					won++
				case errors.Is(err, reservation.ErrPreconditionFailed), errors.Is(err, reservation.ErrPreconditionRequired):
				default:
					t.Errorf("ChangeStock(%q) = %v, want success or a refused precondition", sku, err)
				}
			}
			if l, err := s.Stock(ctx, sku); won != 1 || err != nil || l.Version != 1 {
				t.Errorf("%d creators of %q won, level %+v, %v; want one, at version 1", won, sku, l, err)
			}
		}
	})

	t.Run("If-Match writers on one SKU: exactly one wins per version", func(t *testing.T) {
		ctx := context.Background()
		s, _ := open(t)
		l, err := s.ChangeStock(ctx, reservation.SetTo("one", 100))
		if err != nil {
			t.Fatal(err)
		}
		for round := range 20 {
			based := l.Version
			won := make(chan reservation.StockLevel, 16)
			var wg sync.WaitGroup
			for w := range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					got, err := s.ChangeStock(ctx, reservation.StockChange{SKU: "one", Set: ptr(int64(round*100 + w)), IfVersion: ptr(based)})
					switch {
					case err == nil:
						won <- got
					case !errors.Is(err, reservation.ErrPreconditionFailed):
						t.Errorf("ChangeStock If-Match %d = %v, want success or ErrPreconditionFailed", based, err)
					}
				}()
			}
			wg.Wait()
			close(won)
			var wins []reservation.StockLevel
			for w := range won {
				wins = append(wins, w)
			}
			if len(wins) != 1 {
				t.Fatalf("round %d: %d writers won version %d, want exactly one", round, len(wins), based)
			}
			if l, err = s.Stock(ctx, "one"); err != nil || l.Available != wins[0].Available || l.Version != wins[0].Version || l.Version != based+1 {
				t.Fatalf("round %d: level %+v, %v; want the winner's %+v at version %d", round, l, err, wins[0], based+1)
			}
		}
	})

	t.Run("concurrent adds on one SKU sum exactly", func(t *testing.T) {
		ctx := context.Background()
		s, _ := open(t)
		if _, err := s.ChangeStock(ctx, reservation.SetTo("sum", 1000)); err != nil {
			t.Fatal(err)
		}
		const writers, each = 16, 50
		var wg sync.WaitGroup
		for w := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range each {
					c := reservation.StockChange{SKU: "sum", Add: ptr(int64(w + 1))}
					if i%2 == 1 {
						c.Add, c.Key = ptr(-int64(w)), fmt.Sprintf("add-%d-%d", w, i)
					}
					if _, err := s.ChangeStock(ctx, c); err != nil {
						t.Errorf("ChangeStock(%+v) = %v", c, err)
					}
				}
			}()
		}
		wg.Wait()
		// Each writer adds (w+1) 25 times and removes w 25 times: 25 net.
		want := int64(1000 + writers*each/2)
		if l, err := s.Stock(ctx, "sum"); err != nil || l.Available != want || l.AdminDelta != want || l.Version != 1+writers*each {
			t.Errorf("Stock after the adds = %+v, %v; want %d available and admin_delta, version %d", l, err, want, 1+writers*each)
		}
	})
}
