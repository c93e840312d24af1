package reservation

import (
	"errors"
	"testing"
	"time"
)

// The sale window (issue 23, part 1): refused before it opens and after it
// closes by Redis's clock, with every refusal charged and counted; a
// change applies at once in every bucket; the sweeper warms a SKU before it
// opens, so its first buyer reads nothing from MySQL.

// window sets sku's window through the admin's path ({"add": 0, ...}).
func (f *fixture) window(t *testing.T, sku string, opens, closes time.Time) StockLevel {
	t.Helper()
	l, err := f.svc.ChangeStock(bg, StockChange{SKU: sku, Add: ptr[int64](0), OpensAt: &opens, ClosesAt: &closes})
	if err != nil {
		t.Fatalf("window of %s = %v", sku, err)
	}
	return l
}

// ledgerCalls is the number of Ledger calls so far.
func (f *fixture) ledgerCalls() int {
	f.ledger.mu.Lock()
	defer f.ledger.mu.Unlock()
	n := 0
	for _, c := range f.ledger.calls {
		n += c
	}
	return n
}

func TestSaleWindow(t *testing.T) {
	t.Run("before it opens and after it closes a buy or join is refused, counted, and takes nothing", func(t *testing.T) {
		f := newFixture(t)
		f.stock(t, "s", 5)
		now := f.clock.Now()
		opens, closes := now.Add(10*time.Second), now.Add(time.Minute)
		f.window(t, "s", opens, closes)
		g, err := f.svc.CreateGroup(bg, "host", "s", 2, time.Hour)
		if err != nil {
			t.Fatalf("a group before opening = %v, want created (the window is for buys and joins)", err)
		}
		_, _, err = f.svc.Reserve(bg, ReserveRequest{SKU: "s", Qty: 1, UserID: "u"})
		var no *NotOpenError
		if !errors.As(err, &no) || !no.OpensAt.Equal(opens) || no.RetryAfter != 10*time.Second {
			t.Fatalf("a buy before opening = %v, want not open at %v, 10s away", err, opens)
		}
		if _, _, err := f.svc.Reserve(bg, ReserveRequest{SKU: "s", Qty: 1, UserID: "v", GroupID: g.ID}); !errors.Is(err, ErrNotOpen) {
			t.Errorf("a join before opening = %v, want ErrNotOpen", err)
		}
		f.clock.advance(10 * time.Second)
		held := f.reserve(t, "s", "u", 1)
		f.clock.advance(50 * time.Second)
		if _, _, err := f.svc.Reserve(bg, ReserveRequest{SKU: "s", Qty: 1, UserID: "w"}); !errors.Is(err, ErrSaleClosed) {
			t.Fatalf("a buy at closes_at = %v, want ErrSaleClosed", err)
		}
		if f.metrics.get("not_open") != 2 || f.metrics.get("sale_closed") != 1 {
			t.Errorf("metrics not_open %d, sale_closed %d; want 2 and 1", f.metrics.get("not_open"), f.metrics.get("sale_closed"))
		}
		// The hold taken while it was open settles as usual.
		if row := f.persist(t, held); row.Status != StatusConfirmed {
			t.Errorf("persist after the close = %+v, want CONFIRMED", row)
		}
		if f.redis("s") != 4 || f.mysql("s") != 4 || len(f.queue.sent) != 1 {
			t.Errorf("redis %d, mysql %d, sent %d; want 4, 4, 1 (only the hold taken while open)", f.redis("s"), f.mysql("s"), len(f.queue.sent))
		}
	})

	t.Run("a keyed attempt before opening reads nothing from MySQL; after the close a keyed replay answers its row", func(t *testing.T) {
		f := newFixture(t)
		f.stock(t, "s", 5)
		req := ReserveRequest{SKU: "s", Qty: 1, UserID: "u", IdempotencyKey: "k"}
		first, _, err := f.svc.Reserve(bg, req)
		if err != nil {
			t.Fatal(err)
		}
		f.persist(t, first)
		f.holds.forget(first.ID) // retention passed
		now := f.clock.Now()
		f.window(t, "s", now.Add(time.Hour), now.Add(2*time.Hour)) // moved back after selling
		before := f.ledger.calls["Reservation"]
		for _, key := range []string{"k", "k2", "k3"} {
			r := req
			r.IdempotencyKey = key
			if _, _, err := f.svc.Reserve(bg, r); !errors.Is(err, ErrNotOpen) {
				t.Fatalf("keyed %s before opening = %v, want ErrNotOpen", key, err)
			}
		}
		if n := f.ledger.calls["Reservation"] - before; n != 0 {
			t.Errorf("keyed attempts before opening read MySQL %d times, want 0", n)
		}
		f.clock.advance(2 * time.Hour)
		if got, replayed, err := f.svc.Reserve(bg, req); err != nil || !replayed || got.Status != StatusConfirmed || got.ID != first.ID {
			t.Errorf("keyed replay after the close = %+v %v %v, want MySQL's CONFIRMED row", got, replayed, err)
		}
		r := req
		r.IdempotencyKey = "new"
		if _, _, err := f.svc.Reserve(bg, r); !errors.Is(err, ErrSaleClosed) {
			t.Errorf("a new keyed request after the close = %v, want ErrSaleClosed", err)
		}
	})

	t.Run("a change mid-sale applies at the next reserve in every bucket; a cleared window admits every buy", func(t *testing.T) {
		f := newFixture(t)
		if _, err := f.svc.ChangeStock(bg, StockChange{SKU: "s", Set: ptr[int64](30), Buckets: ptr(3)}); err != nil {
			t.Fatal(err)
		}
		users := map[int]string{} // a buyer at home in each bucket
		for i := 0; len(users) < 3; i++ {
			u := "u" + string(rune('a'+i))
			users[HomeBucket(u, "", 3)] = u
		}
		for b := range 3 {
			if _, _, err := f.svc.Reserve(bg, ReserveRequest{SKU: "s", Qty: 1, UserID: users[b]}); err != nil {
				t.Fatalf("bucket %d's buyer before any window = %v", b, err)
			}
		}
		f.window(t, "s", f.clock.Now().Add(time.Minute), time.Time{})
		for b := range 3 {
			if _, _, err := f.svc.Reserve(bg, ReserveRequest{SKU: "s", Qty: 1, UserID: users[b]}); !errors.Is(err, ErrNotOpen) {
				t.Errorf("bucket %d's buyer once the window moved ahead = %v, want ErrNotOpen", b, err)
			}
		}
		f.window(t, "s", time.Time{}, time.Time{})
		for b := range 3 {
			if _, _, err := f.svc.Reserve(bg, ReserveRequest{SKU: "s", Qty: 1, UserID: users[b]}); err != nil {
				t.Errorf("bucket %d's buyer once the window was cleared = %v, want a hold", b, err)
			}
		}
	})

	t.Run("a bad window is refused naming the bound and changes nothing", func(t *testing.T) {
		f := newFixture(t)
		l := f.stock(t, "s", 5)
		now := f.clock.Now()
		before, after := now.Add(time.Hour), now.Add(2*time.Hour)
		epoch := time.Unix(0, 0)
		for _, c := range []struct {
			name          string
			opens, closes *time.Time
			field         string
		}{
			{"closes before opens", &after, &before, "closes_at"},
			{"closes at opens", &before, &before, "closes_at"},
			{"opens at the epoch", &epoch, nil, "opens_at"},
		} {
			_, err := f.svc.ChangeStock(bg, StockChange{SKU: "s", Add: ptr[int64](1), OpensAt: c.opens, ClosesAt: c.closes})
			var inv *InvalidError
			if !errors.As(err, &inv) || inv.Field != c.field {
				t.Errorf("%s = %v, want an InvalidError naming %s", c.name, err, c.field)
			}
		}
		f.window(t, "s", before, after)
		if _, err := f.svc.ChangeStock(bg, StockChange{SKU: "s", Add: ptr[int64](1), OpensAt: ptr(after.Add(time.Second))}); err == nil {
			t.Errorf("opens_at past the kept closes_at = nil, want refused")
		}
		if got, _ := f.ledger.Stock(bg, "s"); got.Available != 5 || got.Version != l.Version+1 || !got.OpensAt.Equal(before) {
			t.Errorf("after the refused changes = %+v, want 5 units at version %d opening at %v", got, l.Version+1, before)
		}
	})

	t.Run("GET /skus/{sku}'s state is the window Redis judges by and Redis's clock", func(t *testing.T) {
		f := newFixture(t)
		f.stock(t, "s", 5)
		opens := f.clock.Now().Add(90 * time.Second)
		f.window(t, "s", opens, time.Time{})
		st, err := f.svc.SKU(bg, "s")
		if err != nil || st.Available != 5 || !st.OpensAt.Equal(opens) || !st.ClosesAt.IsZero() || !st.Now.Equal(f.clock.Now()) {
			t.Errorf("SKU = %+v %v, want 5 available, opening at %v, no close, now %v", st, err, opens, f.clock.Now())
		}
	})

	t.Run("the sweeper warms every bucket of a SKU about to open, so its first buyer reads nothing from MySQL", func(t *testing.T) {
		f := newFixture(t)
		if _, err := f.svc.ChangeStock(bg, StockChange{SKU: "s", Set: ptr[int64](30), Buckets: ptr(3)}); err != nil {
			t.Fatal(err)
		}
		f.stock(t, "t", 1)
		opens := f.clock.Now().Add(f.svc.liveFor() + f.svc.cfg.WarmLead + time.Minute)
		f.window(t, "s", opens, time.Time{})
		f.clock.advance(f.svc.liveFor() + time.Second) // the changes' live marks pass
		if rep := f.sweep(t); rep.OpeningSKUs != 0 || rep.Unmarked != 2 {
			t.Fatalf("a sweep more than the lead before opening = %+v, want no opening SKU and both marks ended", rep)
		}
		for b := range 3 {
			f.holds.forgetStock(BucketName("s", b)) // a failover lost the SKU
		}
		// The catalog pass is elsewhere: only the opening pass can warm s.
		f.svc.cfg.SweepCatalog = 1
		if err := f.holds.SetCursor(bg, "s"); err != nil {
			t.Fatal(err)
		}
		f.clock.t = opens.Add(-f.svc.cfg.WarmLead / 2)
		if rep := f.sweep(t); rep.OpeningSKUs != 1 || rep.Warmed != 3 || rep.LiveSKUs != 0 {
			t.Fatalf("a sweep within the lead = %+v, want 1 opening SKU and its 3 buckets warmed", rep)
		}
		f.clock.t = opens
		// Bucket 0 has the units (a change lands there): a buyer at home in
		// another bucket would be served by a transfer, which MySQL records.
		user := "first"
		for i := 0; HomeBucket(user, "", 3) != 0; i++ {
			user = "first" + string(rune('a'+i))
		}
		before := f.ledgerCalls()
		if _, _, err := f.svc.Reserve(bg, ReserveRequest{SKU: "s", Qty: 1, UserID: user}); err != nil {
			t.Fatal(err)
		}
		if n := f.ledgerCalls() - before; n != 0 {
			t.Errorf("the first reserve after opening made %d MySQL calls, want 0", n)
		}
		for b := range 3 {
			if _, err := f.holds.Stock(bg, BucketName("s", b)); err != nil {
				t.Errorf("bucket %d after the warm-up: %v, want its figures", b, err)
			}
		}
	})
}
