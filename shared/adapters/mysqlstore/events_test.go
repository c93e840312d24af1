package mysqlstore_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/testkit/eventschema"
	"github.com/holdfast/holdfast/internal/testkit/outbox"
	"github.com/holdfast/holdfast/shared/reservation"
)

// settleBatch settles rs of sku in one ApplyBatch at when and returns the
// fails unless each was Applied.
func settleBatch(t *testing.T, s interface {
	ApplyBatch(context.Context, string, []reservation.Reservation, time.Time) ([]reservation.BatchResult, error)
}, sku string, when time.Time, rs ...reservation.Reservation) {
	t.Helper()
	out, err := s.ApplyBatch(context.Background(), sku, rs, when)
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range out {
		if o.Result != reservation.Applied {
			t.Fatalf("%s: %v, want Applied", rs[i].ID, o.Result)
		}
	}
}

func mustJSON(t *testing.T, e reservation.Event) []byte {
	t.Helper()
	b, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func ids(evs []reservation.Event) string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.ID
	}
	return strings.Join(out, " ")
}

func count(t *testing.T, db *sql.DB, q string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRow(q, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// A persist batch's confirmations are one outbox row (migration 0015):
// one insert for the batch, no events row each, every row naming it; its
// events validate against their schema; a limit smaller than the batch
// still lists it whole (its events are marked together).
func TestBatchConfirmationsAreOneOutboxRow(t *testing.T) {
	ctx := context.Background()
	s, db := open(t)
	if _, err := s.ChangeStock(ctx, reservation.SetTo("t", 10)); err != nil {
		t.Fatal(err)
	}
	settleBatch(t, s, "t", now, res("c1", "t", 1), res("c2", "t", 2), res("c3", "t", 1))
	if n := count(t, db, `SELECT COUNT(*) FROM event_batches`); n != 1 {
		t.Errorf("event_batches rows = %d, want 1", n)
	}
	if n := count(t, db, `SELECT COUNT(*) FROM events`); n != 0 {
		t.Errorf("events rows = %d, want none: the batch holds them", n)
	}
	if n := count(t, db, `SELECT COUNT(*) FROM reservations r JOIN event_batches b ON b.batch_id = r.event_batch WHERE b.events = 3`); n != 3 {
		t.Errorf("rows naming the batch of 3 = %d, want 3", n)
	}
	evs, err := s.Unpublished(ctx, now.Add(time.Second), 1)
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(evs); got != "reservation/c1/1 reservation/c2/1 reservation/c3/1" {
		t.Errorf("Unpublished, limit 1 = %s, want the batch whole", got)
	}
	for _, e := range evs {
		if err := eventschema.Validate(string(e.Type), mustJSON(t, e)); err != nil {
			t.Errorf("%s: %v", e.ID, err)
		}
	}
	if err := s.MarkPublished(ctx, evs, now); err != nil {
		t.Fatal(err)
	}
	if n := count(t, db, `SELECT COUNT(*) FROM event_batches WHERE published_at IS NULL`); n != 0 {
		t.Errorf("unpublished batches after every event went out = %d", n)
	}
	if _, ok, err := s.OldestUnpublished(ctx); err != nil || ok {
		t.Errorf("OldestUnpublished = %v %v, want none", ok, err)
	}
}

// A batch partly out keeps exactly the rest, whichever path marks what:
// the refund's publish of one member, then the sweeper's drain of a batch
// it read whole before that (a stale full list) publishes it.
func TestBatchPartlyPublishedKeepsTheRest(t *testing.T) {
	ctx := context.Background()
	s, db := open(t)
	if _, err := s.ChangeStock(ctx, reservation.SetTo("t", 10)); err != nil {
		t.Fatal(err)
	}
	settleBatch(t, s, "t", now, res("c1", "t", 1), res("c2", "t", 1), res("c3", "t", 1))
	whole, err := s.Unpublished(ctx, now.Add(time.Second), 100)
	if err != nil {
		t.Fatal(err)
	}
	mine, err := s.EventsOf(ctx, []string{"c2"})
	if err != nil || ids(mine) != "reservation/c2/1" {
		t.Fatalf("EventsOf(c2) = %s %v, want its confirmation", ids(mine), err)
	}
	if err := s.MarkPublished(ctx, mine, now); err != nil {
		t.Fatal(err)
	}
	left, err := s.Unpublished(ctx, now.Add(time.Second), 100)
	if err != nil || ids(left) != "reservation/c1/1 reservation/c3/1" {
		t.Fatalf("Unpublished after c2 went out = %s %v, want c1 and c3", ids(left), err)
	}
	if got, err := s.EventsOf(ctx, []string{"c2"}); err != nil || len(got) != 0 {
		t.Errorf("EventsOf(c2) after it went out = %s %v", ids(got), err)
	}
	// c3 alone, then c1 with a stale c2: each takes exactly its own.
	if err := s.MarkPublished(ctx, left[1:], now); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Unpublished(ctx, now.Add(time.Second), 100); err != nil || ids(got) != "reservation/c1/1" {
		t.Fatalf("Unpublished after c3 went out = %s %v, want c1", ids(got), err)
	}
	if err := s.MarkPublished(ctx, whole[:2], now); err != nil {
		t.Fatal(err)
	}
	if n := count(t, db, `SELECT COUNT(*) FROM event_batches WHERE published_at IS NULL`); n != 0 {
		t.Errorf("unpublished batches = %d, want 0", n)
	}
}

// A batch's clock may run ahead of a later decision's (two Lambdas): the
// drain before the batch's time still sends the confirmation the batch owes
// before the refund it finds.
func TestDrainSendsAConfirmationOwedBeforeItsRefundWhateverTheClocks(t *testing.T) {
	ctx := context.Background()
	s, _ := open(t)
	if _, err := s.ChangeStock(ctx, reservation.SetTo("t", 10)); err != nil {
		t.Fatal(err)
	}
	settleBatch(t, s, "t", now.Add(time.Minute), res("c1", "t", 1), res("c2", "t", 1))
	if _, _, err := s.Refund(ctx, "c2", reservation.ReasonBuyer, "", now); err != nil {
		t.Fatal(err)
	}
	evs, err := s.Unpublished(ctx, now.Add(time.Second), 100)
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(evs); got != "reservation/c2/1 reservation/c2/2" {
		t.Errorf("Unpublished before the batch's time = %s, want c2's confirmation, then its refund", got)
	}
}

// The tests' view of the outbox (outbox.Table) lists each event once,
// from either table, published as MarkPublished left it.
func TestOutboxTableListsEveryEventOnce(t *testing.T) {
	ctx := context.Background()
	s, db := open(t)
	if _, err := s.ChangeStock(ctx, reservation.SetTo("t", 10)); err != nil {
		t.Fatal(err)
	}
	settleBatch(t, s, "t", now, res("c1", "t", 1), res("c2", "t", 1))
	if _, _, err := s.Refund(ctx, "c2", reservation.ReasonBuyer, "", now); err != nil {
		t.Fatal(err)
	}
	mine, err := s.EventsOf(ctx, []string{"c2"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.MarkPublished(ctx, mine, now); err != nil {
		t.Fatal(err)
	}
	rows, err := db.Query(`SELECT event_id, sku, published, JSON_UNQUOTE(JSON_EXTRACT(payload, '$.event_id')) FROM ` + outbox.Table + ` ORDER BY event_id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []string
	for rows.Next() {
		var id, sku, inPayload string
		var published bool
		if err := rows.Scan(&id, &sku, &published, &inPayload); err != nil {
			t.Fatal(err)
		}
		if inPayload != id || sku != "t" {
			t.Errorf("%s: payload's id %s, sku %s", id, inPayload, sku)
		}
		got = append(got, fmt.Sprintf("%s:%v", id, published))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, " ") != "reservation/c1/1:false reservation/c2/1:true reservation/c2/2:true" {
		t.Errorf("outbox = %v", got)
	}
}

// A SKU may be 64 characters (reservation.ValidID), so a reservation id is
// up to 64 + 1 + 26 = 91 (migration 0002 widened reservations to 100). The
// events table (migration 0010) keeps aggregate_id VARCHAR(64) and event_id
// VARCHAR(96): "reservation/<91>/1" is 105. Every decision that writes an
// events row for such a reservation (Apply, Fence, Refund) fails under the
// strict SQL mode MySQL 8 runs by default ("Data too long"), so persist
// cannot decide it, the sweeper cannot fence it, and a refund cannot be
// made. Since 0015 a hot batch's confirmation goes into event_batches' JSON
// and succeeds, which makes it worse: the row is CONFIRMED, and then no
// refund of it ever commits.
func TestLongSKUDecisionsWriteTheirEvents(t *testing.T) {
	ctx := context.Background()
	s, _ := open(t)
	sku := strings.Repeat("s", 64)
	if !reservation.ValidID(sku) {
		t.Fatal("a 64-character SKU is valid")
	}
	if _, err := s.ChangeStock(ctx, reservation.SetTo(sku, 10)); err != nil {
		t.Fatal(err)
	}
	id := func(n int) string {
		return reservation.ReservationID(reservation.ReserveRequest{SKU: sku, UserID: "u", IdempotencyKey: fmt.Sprint(n)}, []byte("k"))
	}
	mk := func(n int) reservation.Reservation { r := res(id(n), sku, 1); r.UserID = "u"; return r }
	one := mk(1)
	if err := one.Validate(10); err != nil {
		t.Fatalf("the reservation is valid: %v", err)
	}
	t.Logf("reservation id: %d characters", len(one.ID))
	if r, err := apply(ctx, s, one); err != nil || r != reservation.Applied {
		t.Errorf("Apply (persist, one by one) = %v, %v; want Applied", r, err)
	}
	if _, _, err := s.Fence(ctx, mk(2), reservation.ReasonExpired, now); err != nil {
		t.Errorf("Fence (the sweeper's expiry, reserve's failed send) = %v", err)
	}
	settleBatch(t, s, sku, now, mk(3)) // the hot path: event_batches has no such limit
	if _, _, err := s.Refund(ctx, id(3), reservation.ReasonBuyer, "", now.Add(time.Second)); err != nil {
		t.Errorf("Refund of a row the batch confirmed = %v", err)
	}
}

// The drain (Unpublished) counts a batch by the events it was written with
// (event_batches.events), not by those still owed. A batch the bus partly
// refused (throttling: PutEvents answers per entry) keeps its whole count,
// so once its count reaches the sweep's limit every drain reads that batch
// alone and no batch behind it: a single event the bus keeps refusing
// starves every later batch, and a backlog of partly sent batches drains
// one batch a sweep. With one events row per confirmation (before 0015) the
// drain took limit events whatever one of them did.
func TestDrainIsNotStuckBehindAPartlySentBatch(t *testing.T) {
	ctx := context.Background()
	s, _ := open(t)
	if _, err := s.ChangeStock(ctx, reservation.SetTo("t", 10)); err != nil {
		t.Fatal(err)
	}
	settleBatch(t, s, "t", now, res("p1", "t", 1), res("p2", "t", 1), res("p3", "t", 1), res("p4", "t", 1))
	settleBatch(t, s, "t", now.Add(time.Millisecond), res("q1", "t", 1), res("q2", "t", 1))
	const limit = 4 // SweepBatch (500 in production, a persist batch's size)
	evs, err := s.Unpublished(ctx, now.Add(time.Second), limit)
	if err != nil {
		t.Fatal(err)
	}
	// The bus took every event of the first batch but p1 (which it keeps refusing).
	var out []reservation.Event
	for _, e := range evs {
		if e.AggregateID != "p1" {
			out = append(out, e)
		}
	}
	if err := s.MarkPublished(ctx, out, now); err != nil {
		t.Fatal(err)
	}
	for sweep := 1; sweep <= 3; sweep++ {
		evs, err := s.Unpublished(ctx, now.Add(time.Second), limit)
		if err != nil {
			t.Fatal(err)
		}
		if got := ids(evs); !strings.Contains(got, "reservation/q1/1") {
			t.Fatalf("drain %d with room for %d events = %q: the second batch (q1, q2) waits behind p1's one owed event", sweep, limit, got)
		}
	}
}

// Ledger.Unpublished promises the oldest first (ports.go). The drain lists
// unpublished batches before any events row, and stops once they fill the
// limit: an older cancellation (or payment, or a group's end) is not in
// the drain at all while batches of limit events wait behind it. After a
// bus outage in a sale (thousands of batches), every other outcome waits
// until every batch went out. Before 0015 the one table drained by seq.
func TestDrainTakesTheOldestEventFirst(t *testing.T) {
	ctx := context.Background()
	s, _ := open(t)
	if _, err := s.ChangeStock(ctx, reservation.SetTo("t", 10)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Fence(ctx, res("f1", "t", 1), reservation.ReasonExpired, now); err != nil {
		t.Fatal(err)
	}
	settleBatch(t, s, "t", now.Add(time.Second), res("b1", "t", 1), res("b2", "t", 1))
	evs, err := s.Unpublished(ctx, now.Add(time.Minute), 2)
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(evs); !strings.HasPrefix(got, "reservation/f1/1") {
		t.Errorf("Unpublished, limit 2 = %q; want the oldest, f1's cancellation (a second before the batch), first", got)
	}
}

// EventsOf reads the batches its reservations name in chunks of ids; a
// batch two chunks both name is listed once.
func TestEventsOfListsABatchOnceAcrossChunks(t *testing.T) {
	ctx := context.Background()
	s, _ := open(t)
	if _, err := s.ChangeStock(ctx, reservation.SetTo("t", 10)); err != nil {
		t.Fatal(err)
	}
	settleBatch(t, s, "t", now, res("c1", "t", 1), res("c2", "t", 1))
	var names []string
	for i := range 999 { // c1 last of the first chunk of 1000, c2 first of the second
		names = append(names, fmt.Sprintf("x%d", i))
	}
	evs, err := s.EventsOf(ctx, append(names, "c1", "c2"))
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(evs); got != "reservation/c1/1 reservation/c2/1" {
		t.Errorf("EventsOf = %q, want each confirmation once", got)
	}
}
