package reservationtest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/holdfast/holdfast/shared/reservation"
)

// LedgerFactory returns a fresh, empty Ledger.
type LedgerFactory func(t *testing.T) reservation.Ledger

var now = time.Date(2026, 11, 11, 12, 0, 0, 0, time.UTC)

func res(id, sku string, qty int) reservation.Reservation {
	return reservation.Reservation{ID: id, SKU: sku, Qty: qty, UserID: "u-" + id, CreatedAt: now, ExpiresAt: now.Add(time.Minute)}
}

func available(t *testing.T, s reservation.Ledger, sku string) int64 {
	t.Helper()
	l, err := s.Stock(context.Background(), sku)
	if err != nil {
		t.Fatal(err)
	}
	return l.Available
}

// apply retries version conflicts (optimistically, in fresh transactions).
func apply(ctx context.Context, s reservation.Ledger, r reservation.Reservation) (reservation.ApplyResult, error) {
	for {
		out, err := s.Apply(ctx, r, reservation.Optimistic, now)
		if errors.Is(err, reservation.ErrVersionConflict) {
			continue
		}
		return out.Result, err
	}
}

func ptr[T any](v T) *T { return &v }

// Ledger is the contract of reservation.Ledger (MySQL's), run against the
// MySQL adapter on MariaDB and against the in-memory fake.
func Ledger(t *testing.T, newLedger LedgerFactory) {
	Audit(t, newLedger)
	ledgerEvents(t, newLedger)
	ledgerPayment(t, newLedger)
	t.Run("the catalog pages in SKU order; levels are read by name", func(t *testing.T) {
		ctx := context.Background()
		s := newLedger(t)
		for i, sku := range []string{"c", "a", "e", "b", "d"} {
			if _, err := s.ChangeStock(ctx, reservation.SetTo(sku, int64(i))); err != nil {
				t.Fatal(err)
			}
		}
		var got []string
		after := ""
		for pages := 0; pages < 10; pages++ {
			levels, err := s.StocksAfter(ctx, after, 2)
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range levels {
				got = append(got, l.SKU)
			}
			if len(levels) < 2 {
				break
			}
			after = levels[len(levels)-1].SKU
		}
		if fmt.Sprint(got) != "[a b c d e]" {
			t.Errorf("pages of 2 = %v, want [a b c d e]", got)
		}
		levels, err := s.Levels(ctx, []string{"e", "nosuch", "a"})
		if err != nil || len(levels) != 2 {
			t.Fatalf("Levels = %+v %v, want e and a", levels, err)
		}
		for _, l := range levels {
			if want := map[string]int64{"a": 1, "e": 2}[l.SKU]; l.Available != want {
				t.Errorf("Levels: %s available %d, want %d", l.SKU, l.Available, want)
			}
		}
		if levels, err := s.Levels(ctx, nil); err != nil || len(levels) != 0 {
			t.Errorf("Levels(nil) = %+v %v, want none", levels, err)
		}
	})

	t.Run("apply outcomes", func(t *testing.T) {
		ctx := context.Background()
		s := newLedger(t)
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
	})

	t.Run("fence never overwrites a confirmed row", func(t *testing.T) {
		ctx := context.Background()
		s := newLedger(t)
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
	})

	t.Run("apply and fence race decide one outcome", func(t *testing.T) {
		ctx := context.Background()
		s := newLedger(t)
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
	})

	t.Run("refund returns stock once under concurrency", func(t *testing.T) {
		ctx := context.Background()
		s := newLedger(t)
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
					_, ok, err := s.Refund(ctx, "a", reservation.ReasonBuyer, "", now)
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
		if row.Status != reservation.StatusCancelled || row.Cancellation != reservation.Refunded {
			t.Errorf("row = %+v, want CANCELLED, refunded", row)
		}
		if got := unpublished(t, s, "a"); strings.Join(got, " ") != "ReservationConfirmed/1 ReservationCancelled/2" {
			t.Errorf("events of a = %v, want its confirmation and one refund", got)
		}
	})

	t.Run("group capacity and one join per user", func(t *testing.T) {
		ctx := context.Background()
		s := newLedger(t)
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
	})

	t.Run("pessimistic apply never conflicts", func(t *testing.T) {
		ctx := context.Background()
		s := newLedger(t)
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
	})

	t.Run("change stock preconditions", func(t *testing.T) {
		ctx := context.Background()
		s := newLedger(t)
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
	})

	t.Run("the sale window is kept with the level, covered by a change's key, listed before it opens", func(t *testing.T) {
		ctx := context.Background()
		s := newLedger(t)
		opens, closes := now.Add(time.Hour), now.Add(2*time.Hour)
		l, err := s.ChangeStock(ctx, reservation.StockChange{SKU: "w", Set: ptr[int64](10), OpensAt: &opens, ClosesAt: &closes})
		if err != nil || !l.OpensAt.Equal(opens) || !l.ClosesAt.Equal(closes) || l.Version != 1 {
			t.Fatalf("create with a window = %+v %v", l, err)
		}
		read := func(what string) reservation.StockLevel {
			t.Helper()
			l, err := s.Stock(ctx, "w")
			if err != nil {
				t.Fatal(err)
			}
			ls, err := s.Levels(ctx, []string{"w"})
			if err != nil || len(ls) != 1 || !ls[0].OpensAt.Equal(l.OpensAt) || !ls[0].ClosesAt.Equal(l.ClosesAt) {
				t.Fatalf("%s: Levels = %+v %v, want the window Stock reads (%v, %v)", what, ls, err, l.OpensAt, l.ClosesAt)
			}
			return l
		}
		if l := read("created"); !l.OpensAt.Equal(opens) || !l.ClosesAt.Equal(closes) {
			t.Fatalf("read back = %v .. %v, want %v .. %v", l.OpensAt, l.ClosesAt, opens, closes)
		}
		// A bound that would close the window before it opens is refused,
		// naming the bound the change sets, and changes nothing.
		early := now.Add(30 * time.Minute)
		var inv *reservation.InvalidError
		if _, err := s.ChangeStock(ctx, reservation.StockChange{SKU: "w", Add: ptr[int64](1), ClosesAt: &early}); !errors.As(err, &inv) || inv.Field != "closes_at" {
			t.Errorf("closes_at before the kept opens_at = %v, want an InvalidError naming closes_at", err)
		}
		late := now.Add(3 * time.Hour)
		if _, err := s.ChangeStock(ctx, reservation.StockChange{SKU: "w", Add: ptr[int64](1), OpensAt: &late}); !errors.As(err, &inv) || inv.Field != "opens_at" {
			t.Errorf("opens_at after the kept closes_at = %v, want an InvalidError naming opens_at", err)
		}
		if l := read("after the refused changes"); l.Version != 1 || l.Available != 10 || !l.ClosesAt.Equal(closes) {
			t.Errorf("a refused window change moved the level: %+v", l)
		}
		// A window change is versioned like a stock change; a keyed one is
		// applied once, and the same key with another window is refused.
		for range 2 {
			if l, err = s.ChangeStock(ctx, reservation.StockChange{SKU: "w", Add: ptr[int64](0), OpensAt: &early, Key: "win"}); err != nil || l.Version != 2 || !l.OpensAt.Equal(early) {
				t.Fatalf("keyed window change = %+v %v, want version 2 opening at %v", l, err, early)
			}
		}
		if _, err := s.ChangeStock(ctx, reservation.StockChange{SKU: "w", Add: ptr[int64](0), OpensAt: &opens, Key: "win"}); !errors.Is(err, reservation.ErrIdempotencyMismatch) {
			t.Errorf("key win with another opens_at = %v, want ErrIdempotencyMismatch", err)
		}
		var none time.Time
		if _, err := s.ChangeStock(ctx, reservation.StockChange{SKU: "w", Add: ptr[int64](0), OpensAt: &none, Key: "win"}); !errors.Is(err, reservation.ErrIdempotencyMismatch) {
			t.Errorf("key win clearing opens_at = %v, want ErrIdempotencyMismatch", err)
		}
		// Listed while it opens within the range, earliest first.
		for i, sku := range []string{"x", "y"} {
			at := now.Add(time.Duration(50-i*10) * time.Minute) // y opens first
			if _, err := s.ChangeStock(ctx, reservation.StockChange{SKU: sku, Set: ptr[int64](1), OpensAt: &at}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := s.ChangeStock(ctx, reservation.SetTo("z", 1)); err != nil { // no window
			t.Fatal(err)
		}
		names := func(ls []reservation.StockLevel, err error) string {
			t.Helper()
			if err != nil {
				t.Fatal(err)
			}
			var out []string
			for _, l := range ls {
				out = append(out, l.SKU)
			}
			return fmt.Sprint(out)
		}
		if got := names(s.Opening(ctx, now, now.Add(time.Hour), 10)); got != "[w y x]" {
			t.Errorf("Opening within the hour = %s, want [w y x] (the earliest first; z has no window)", got)
		}
		if got := names(s.Opening(ctx, early, now.Add(time.Hour), 1)); got != "[y]" {
			t.Errorf("Opening after w opened, limit 1 = %s, want [y]", got)
		}
		// Cleared: no window, and not listed.
		if l, err = s.ChangeStock(ctx, reservation.StockChange{SKU: "w", Add: ptr[int64](0), OpensAt: &none, ClosesAt: &none}); err != nil || !l.OpensAt.IsZero() || !l.ClosesAt.IsZero() {
			t.Fatalf("clear the window = %+v %v", l, err)
		}
		if l := read("cleared"); !l.OpensAt.IsZero() || !l.ClosesAt.IsZero() || l.Version != 3 {
			t.Errorf("cleared window read back as %v .. %v version %d", l.OpensAt, l.ClosesAt, l.Version)
		}
		if got := names(s.Opening(ctx, now, now.Add(time.Hour), 10)); got != "[y x]" {
			t.Errorf("Opening once w's window is cleared = %s, want [y x]", got)
		}
	})

	t.Run("a batch larger than one statement settles each id once: new, redelivered, fenced, twins", func(t *testing.T) {
		ctx := context.Background()
		s := newLedger(t)
		const n = 2500 // three insert statements
		if _, err := s.ChangeStock(ctx, reservation.SetTo("s", n-10)); err != nil {
			t.Fatal(err)
		}
		batch := make([]reservation.Reservation, 0, n+1)
		for i := range n {
			batch = append(batch, res(fmt.Sprintf("r%04d", i), "s", 1))
		}
		if got, err := apply(ctx, s, batch[1200]); err != nil || got != reservation.Applied { // a redelivery
			t.Fatalf("apply r1200 = %v %v", got, err)
		}
		if _, inserted, err := s.Fence(ctx, batch[2100], reservation.ReasonExpired, now); err != nil || !inserted {
			t.Fatalf("fence r2100 = %v %v", inserted, err)
		}
		batch = append(batch, batch[5]) // a twin
		out, err := s.ApplyBatch(ctx, "s", batch, now)
		if err != nil {
			t.Fatal(err)
		}
		count := map[reservation.ApplyResult]int{}
		for _, o := range out[:n] {
			count[o.Result]++
		}
		// n−10 units: r1200 took one before; 2,498 new ids want one each.
		if count[reservation.Applied] != n-11 || count[reservation.Insufficient] != 2498-(n-11) ||
			count[reservation.AlreadyConfirmed] != 1 || count[reservation.AlreadyCancelled] != 1 {
			t.Errorf("outcomes = %v, want %d applied, %d insufficient, 1 already confirmed, 1 already cancelled",
				count, n-11, 2498-(n-11))
		}
		if out[1200].Result != reservation.AlreadyConfirmed || out[2100].Result != reservation.AlreadyCancelled || out[n].Result != out[5].Result {
			t.Errorf("r1200 %v, r2100 %v, the twin %v (its first %v)", out[1200].Result, out[2100].Result, out[n].Result, out[5].Result)
		}
		if got := available(t, s, "s"); got != 0 {
			t.Errorf("available = %d, want 0", got)
		}
		for _, i := range []int{0, 999, 1000, 2001} {
			if row, err := s.Reservation(ctx, batch[i].ID); err != nil || row.Status != reservation.StatusConfirmed {
				t.Errorf("%s = %+v %v, want CONFIRMED", batch[i].ID, row, err)
			}
		}
		if _, err := s.Reservation(ctx, batch[n-1].ID); !errors.Is(err, reservation.ErrNotFound) {
			t.Errorf("an insufficient id left a row: %v", err)
		}
	})

	t.Run("per-user limit holds", func(t *testing.T) {
		ctx := context.Background()
		s := newLedger(t)
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
		if _, _, err := s.Refund(ctx, "a", reservation.ReasonBuyer, "", now); err != nil {
			t.Fatal(err)
		}
		if got, err := apply(ctx, s, mine("f", 1)); err != nil || got != reservation.Applied {
			t.Errorf("after a refund = %v %v, want Applied", got, err)
		}
		if got := available(t, s, "s"); got != 96 {
			t.Errorf("available = %d, want 96 (a, c, e, f taken; a refunded)", got)
		}
	})

	t.Run("release outbox and formed groups", func(t *testing.T) {
		ctx := context.Background()
		s := newLedger(t)
		if _, err := s.ChangeStock(ctx, reservation.SetTo("s", 10)); err != nil {
			t.Fatal(err)
		}
		row, _, err := s.Fence(ctx, res("f", "s", 1), reservation.ReasonExpired, now)
		if err != nil || row.Release != reservation.ReleaseOwed {
			t.Fatalf("fence = %+v %v, want its release owed", row, err)
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
		if got, _ := s.Outbox(ctx, now.Add(time.Second), 10); len(got) != 0 {
			t.Errorf("Outbox after the mark = %+v", got)
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
		if formed, err := s.FormGroup(ctx, "g", now.Add(time.Minute), now.Add(time.Minute)); err != nil || !formed {
			t.Fatalf("FormGroup = %v %v", formed, err)
		}
		if gr, _ := s.FailGroup(ctx, "g", now.Add(2*time.Hour)); gr.Status != reservation.GroupFormed {
			t.Errorf("FailGroup of a formed group = %v", gr.Status)
		}
		if got := join("m2", "u2"); got != reservation.Applied {
			t.Fatalf("late member of a formed group = %v, want Applied", got)
		}
		row, refunded, err := s.Refund(ctx, "m1", reservation.ReasonBuyer, "", now)
		if err != nil || !refunded || row.Release != reservation.ReleaseOwed {
			t.Fatalf("refund = %+v %v %v, want refunded, its release owed", row, refunded, err)
		}
		gr, _ := s.Group(ctx, "g")
		if gr.Status != reservation.GroupFormed || gr.Members != 1 {
			t.Errorf("group after a member's refund = %+v, want FORMED with 1 member", gr)
		}
		if got := join("m3", "u3"); got != reservation.Applied {
			t.Errorf("no slot is given twice, but a late holder of a formed group still joins: %v", got)
		}
	})

	t.Run("each transition moves the row's sub-states and writes its event, and the marks move them once", func(t *testing.T) {
		ctx := context.Background()
		s := newLedger(t)
		if _, err := s.ChangeStock(ctx, reservation.StockChange{SKU: "s", Set: ptr(int64(10)), Buckets: ptr(2)}); err != nil {
			t.Fatal(err)
		}
		type states struct {
			c reservation.Cancellation
			r reservation.ReleaseState
			e string // the unpublished events of the row
		}
		check := func(what, id string, want states) {
			t.Helper()
			row, err := s.Reservation(ctx, id)
			if got := (states{row.Cancellation, row.Release, strings.Join(unpublished(t, s, id), " ")}); err != nil || got != want {
				t.Errorf("%s: %s's sub-states = %+v %v, want %+v", what, id, got, err, want)
			}
		}
		mark := func(id string) {
			t.Helper()
			for range 2 { // a repeat moves nothing
				if err := s.MarkReleased(ctx, id); err != nil {
					t.Fatal(err)
				}
				markPublished(t, s, id)
			}
		}
		if _, err := apply(ctx, s, res("c", "s", 1)); err != nil {
			t.Fatal(err)
		}
		check("confirmed", "c", states{e: "ReservationConfirmed/1"})
		mark("c")
		check("confirmed, marked", "c", states{})

		if _, _, err := s.Fence(ctx, res("f", "s", 1), reservation.ReasonExpired, now); err != nil {
			t.Fatal(err)
		}
		check("fenced", "f", states{reservation.Fenced, reservation.ReleaseOwed, "ReservationCancelled/1"})
		mark("f")
		check("fenced, marked", "f", states{reservation.Fenced, reservation.ReleaseDone, ""})
		if _, inserted, err := s.Fence(ctx, res("f", "s", 1), reservation.ReasonBuyer, now); err != nil || inserted {
			t.Fatalf("fence again = %v %v", inserted, err)
		}
		check("fenced again", "f", states{reservation.Fenced, reservation.ReleaseDone, ""})

		if row, _, err := s.Refund(ctx, "c", reservation.ReasonBuyer, "", now); err != nil ||
			row.Cancellation != reservation.Refunded || row.Release != reservation.ReleaseOwed {
			t.Fatalf("Refund = %+v %v, want Refunded, release owed", row, err)
		}
		check("refunded", "c", states{reservation.Refunded, reservation.ReleaseOwed, "ReservationCancelled/2"})
		mark("c")
		check("refunded, marked", "c", states{reservation.Refunded, reservation.ReleaseDone, ""})

		move := reservation.Reservation{ID: "t", SKU: "s", Qty: 1, Bucket: 0, Into: 1, Transfer: true, Token: "t-t",
			Status: reservation.StatusHeld, CreatedAt: now, ExpiresAt: now.Add(time.Minute)}
		moved, recorded, err := s.Transfer(ctx, move, now)
		if err != nil || !recorded || moved.Release != reservation.ReleaseOwed || moved.TransferVersion == 0 || moved.RefundVersion != 0 {
			t.Fatalf("Transfer = %+v %v, want its credit owed, its version a transfer's", moved, err)
		}
		if again, err := s.Reservation(ctx, "t"); err != nil || again.TransferVersion != moved.TransferVersion || again.RefundVersion != 0 {
			t.Errorf("transfer read back = %+v %v, want TransferVersion %d", again, err, moved.TransferVersion)
		}
		if again, recorded, err := s.Transfer(ctx, move, now); err != nil || recorded || again.TransferVersion != moved.TransferVersion {
			t.Errorf("Transfer again = %+v recorded %v %v, want the row as it stands, not recorded again", again, recorded, err)
		}
		forged := move
		forged.ID, forged.Into = "v", 5
		if _, _, err := s.Transfer(ctx, forged, now); !errors.Is(err, reservation.ErrNotATransfer) {
			t.Errorf("Transfer into bucket 5 of 2 = %v, want ErrNotATransfer", err)
		}
		if _, err := s.Reservation(ctx, "v"); !errors.Is(err, reservation.ErrNotFound) {
			t.Errorf("a refused transfer left a row: %v", err)
		}
		check("transfer", "t", states{reservation.NotCancelled, reservation.ReleaseOwed, ""})
		mark("t")
		check("transfer, credited", "t", states{reservation.NotCancelled, reservation.ReleaseDone, ""})

		fenced := move
		fenced.ID, fenced.Token = "u", "t-u"
		if _, _, err := s.Fence(ctx, fenced, reservation.ReasonExpired, now); err != nil {
			t.Fatal(err)
		}
		check("fenced transfer", "u", states{reservation.Fenced, reservation.ReleaseOwed, ""})
		mark("u")
		check("fenced transfer, returned", "u", states{reservation.Fenced, reservation.ReleaseDone, ""})
	})

	t.Run("form group waits for unreleased members", func(t *testing.T) {
		ctx := context.Background()
		s := newLedger(t)
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
		if formed, err := s.FormGroup(ctx, "g", now, now); err != nil || formed {
			t.Fatalf("FormGroup with an unreleased member = %v %v, want not formed", formed, err)
		}
		if err := s.MarkReleased(ctx, "m1"); err != nil {
			t.Fatal(err)
		}
		if formed, err := s.FormGroup(ctx, "g", now, now); err != nil || !formed {
			t.Fatalf("FormGroup once released = %v %v, want formed", formed, err)
		}
	})
	t.Run("forming a group MySQL does not know is unknown_group, not an outage", func(t *testing.T) {
		s := newLedger(t)
		if _, err := s.FormGroup(context.Background(), "g-nosuch", now, now); !errors.Is(err, reservation.ErrUnknownGroup) {
			t.Errorf("FormGroup(unknown) = %v, want ErrUnknownGroup", err)
		}
	})

}
