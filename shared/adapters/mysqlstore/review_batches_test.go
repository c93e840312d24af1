package mysqlstore_test

// Review of migration 0015 (a persist batch's confirmations as one
// event_batches row): tests that reproduce what the review found, and
// tests of what it tried that held.

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast/shared/reservation"
)

// A refused row of a batch is deleted again, so its id is fresh in a later
// batch (its fence never ran: the Lambda died, MySQL blinked). batchOf
// names the later batch by that id again: "unique since a row is inserted
// once" does not hold, and the later batch cannot commit.
func TestReviewBatchIDOfARefusedFirstRowIsReused(t *testing.T) {
	ctx := context.Background()
	s, db := open(t)
	if _, err := s.ChangeStock(ctx, reservation.SetTo("t", 1)); err != nil {
		t.Fatal(err)
	}
	r1 := res("r1", "t", 2) // first in the batch, more than MySQL has
	out, err := s.ApplyBatch(ctx, "t", []reservation.Reservation{r1, res("r2", "t", 1)}, now)
	if err != nil {
		t.Fatal(err)
	}
	if out[0].Result != reservation.Insufficient || out[1].Result != reservation.Applied {
		t.Fatalf("first batch = %v %v, want r1 Insufficient, r2 Applied", out[0].Result, out[1].Result)
	}
	var id string
	if err := db.QueryRow(`SELECT batch_id FROM event_batches`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	t.Logf("first batch's row: %s (named after r1, which it refused and deleted)", id)
	// r1's fence did not run; a refund returns a unit meanwhile.
	if _, _, err := s.Refund(ctx, "r2", reservation.ReasonBuyer, "", now.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	// r1's redelivery, first again, beside a message that fits.
	out, err = s.ApplyBatch(ctx, "t", []reservation.Reservation{r1, res("r3", "t", 1)}, now.Add(2*time.Second))
	switch {
	case err != nil:
		t.Errorf("redelivered batch: %v (its event_batches row collides with the first batch's)", err)
	case out[1].Result != reservation.Applied:
		t.Errorf("r3 = %v, want Applied", out[1].Result)
	default: // give r3's unit back
		if _, _, err := s.Refund(ctx, "r3", reservation.ReasonBuyer, "", now.Add(3*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	// And r1 alone, once it fits: the message a redelivery of r1 alone is.
	if _, err := s.ChangeStock(ctx, reservation.StockChange{SKU: "t", Set: ptr(int64(2)), IfVersion: stockVersion(t, db, "t")}); err != nil {
		t.Fatal(err)
	}
	out, err = s.ApplyBatch(ctx, "t", []reservation.Reservation{r1}, now.Add(4*time.Second))
	if err != nil {
		t.Fatalf("r1 alone, now that it fits: %v (every redelivery fails alike, until the dead-letter queue)", err)
	}
	if out[0].Result != reservation.Applied {
		t.Errorf("r1 = %v, want Applied", out[0].Result)
	}
}

func stockVersion(t *testing.T, db *sql.DB, sku string) *int64 {
	t.Helper()
	var v int64
	if err := db.QueryRow(`SELECT version FROM product_stock WHERE sku = ?`, sku).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return &v
}

// manyBatches commits n unpublished batches of size confirmations each.
func manyBatches(t *testing.T, s interface {
	ApplyBatch(context.Context, string, []reservation.Reservation, time.Time) ([]reservation.BatchResult, error)
	ChangeStock(context.Context, reservation.StockChange) (reservation.StockLevel, error)
}, n, size int) {
	t.Helper()
	if _, err := s.ChangeStock(context.Background(), reservation.SetTo("t", int64(n*size))); err != nil {
		t.Fatal(err)
	}
	for b := range n {
		rs := make([]reservation.Reservation, size)
		for i := range rs {
			rs[i] = res(fmt.Sprintf("b%03d-%04d", b, i), "t", 1)
		}
		settleBatch(t, s, "t", now.Add(time.Duration(b)*time.Millisecond), rs...)
	}
}

func globalStatus(t *testing.T, db *sql.DB, name string) int64 {
	t.Helper()
	var k, v string
	if err := db.QueryRow(`SHOW GLOBAL STATUS LIKE '`+name+`'`).Scan(&k, &v); err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// The drain's batch query asks for limit batches (LIMIT limit) but uses
// them only until limit events are read: with persist's 500-message
// batches and SweepBatch 500 that is one batch, yet the server sends (and
// the driver reads, at rows.Close) the payload of up to 500.
func TestReviewDrainReadsEveryBatchPayloadItDoesNotUse(t *testing.T) {
	ctx := context.Background()
	s, db := open(t)
	const batches, size = 30, 100
	manyBatches(t, s, batches, size)
	var one int64
	if err := db.QueryRow(`SELECT MAX(LENGTH(payload)) FROM event_batches`).Scan(&one); err != nil {
		t.Fatal(err)
	}
	before := globalStatus(t, db, "Bytes_sent")
	evs, err := s.Unpublished(ctx, now.Add(time.Hour), size) // SweepBatch = the batch size, as deployed
	if err != nil {
		t.Fatal(err)
	}
	sent := globalStatus(t, db, "Bytes_sent") - before
	if len(evs) != size {
		t.Fatalf("Unpublished = %d events, want one batch's %d", len(evs), size)
	}
	t.Logf("one batch's payload %d bytes; the drain's read sent %d bytes (%.1f batches' worth)", one, sent, float64(sent)/float64(one))
	if sent > 3*one {
		t.Errorf("the drain that used one batch read %d bytes, %.1f batches' payloads", sent, float64(sent)/float64(one))
	}
}

// Held: marks of one batch racing each other — one member each (a refund's
// publish), the whole list (persist's own send), a stale drain — leave the
// batch published, each event counted once, and none owed.
func TestReviewConcurrentMarksOfOneBatchPublishIt(t *testing.T) {
	ctx := context.Background()
	s, db := open(t)
	const size = 12
	for round := range 5 {
		if _, err := db.Exec(`DELETE FROM event_batches`); err != nil {
			t.Fatal(err)
		}
		if _, err := s.ChangeStock(ctx, reservation.SetTo(fmt.Sprintf("t%d", round), size)); err != nil {
			t.Fatal(err)
		}
		rs := make([]reservation.Reservation, size)
		for i := range rs {
			rs[i] = res(fmt.Sprintf("c%d-%02d", round, i), fmt.Sprintf("t%d", round), 1)
		}
		settleBatch(t, s, fmt.Sprintf("t%d", round), now, rs...)
		whole, err := s.Unpublished(ctx, now.Add(time.Second), 100)
		if err != nil || len(whole) != size {
			t.Fatalf("Unpublished = %d %v", len(whole), err)
		}
		var wg sync.WaitGroup
		errs := make(chan error, 2*size+2)
		for i := range size {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs <- s.MarkPublished(ctx, whole[i:i+1], now)
			}()
		}
		// Rounds 0 and 1: one member each only (markPartly alone). Then
		// two halves, and (rounds 3, 4) the whole list (the fast path).
		for _, part := range [][]reservation.Event{whole[:size/2], whole[size/2:]} {
			if round < 2 {
				break
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs <- s.MarkPublished(ctx, part, now)
			}()
		}
		if round >= 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs <- s.MarkPublished(ctx, whole, now)
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Errorf("round %d: MarkPublished: %v", round, err)
				logDeadlock(t, db)
			}
		}
		if n := count(t, db, `SELECT COUNT(*) FROM event_batches WHERE published_at IS NULL`); n != 0 {
			t.Errorf("round %d: unpublished batches = %d", round, n)
		}
		if left, err := s.Unpublished(ctx, now.Add(time.Hour), 100); err != nil || len(left) != 0 {
			t.Errorf("round %d: left = %s %v", round, ids(left), err)
		}
	}
}

// Held (and measured): a partial mark (fewer than the batch) then the rest,
// one at a time, never publishes the batch before its last event, and the
// lag sees the batch until then.
func TestReviewPartialMarksNeverPublishEarly(t *testing.T) {
	ctx := context.Background()
	s, db := open(t)
	if _, err := s.ChangeStock(ctx, reservation.SetTo("t", 10)); err != nil {
		t.Fatal(err)
	}
	settleBatch(t, s, "t", now, res("c1", "t", 1), res("c2", "t", 1), res("c3", "t", 1))
	whole, err := s.Unpublished(ctx, now.Add(time.Second), 100)
	if err != nil || len(whole) != 3 {
		t.Fatal(len(whole), err)
	}
	// The same event three times, and twice in separate calls: one event.
	for _, evs := range [][]reservation.Event{{whole[0], whole[0], whole[0]}, {whole[0]}, {whole[0], whole[1]}} {
		if err := s.MarkPublished(ctx, evs, now); err != nil {
			t.Fatal(err)
		}
		if n := count(t, db, `SELECT COUNT(*) FROM event_batches WHERE published_at IS NULL`); n != 1 {
			t.Fatalf("after marking %s: unpublished batches = %d, want 1 (c3 is not out)", ids(evs), n)
		}
		if _, ok, err := s.OldestUnpublished(ctx); err != nil || !ok {
			t.Fatalf("OldestUnpublished after %s = %v %v, want the batch", ids(evs), ok, err)
		}
	}
	if left, err := s.EventsOf(ctx, []string{"c1", "c2", "c3"}); err != nil || ids(left) != "reservation/c3/1" {
		t.Fatalf("EventsOf = %s %v, want c3's alone", ids(left), err)
	}
}

// Held: a single Apply's confirmation (an events row) and a batch's, in
// one MarkPublished, each land in its own table.
func TestReviewMarkPublishedMixesTables(t *testing.T) {
	ctx := context.Background()
	s, db := open(t)
	if _, err := s.ChangeStock(ctx, reservation.SetTo("t", 10)); err != nil {
		t.Fatal(err)
	}
	if r, err := apply(ctx, s, res("a1", "t", 1)); err != nil || r != reservation.Applied {
		t.Fatal(r, err)
	}
	settleBatch(t, s, "t", now, res("c1", "t", 1), res("c2", "t", 1))
	evs, err := s.Unpublished(ctx, now.Add(time.Second), 100)
	if err != nil || len(evs) != 3 {
		t.Fatal(ids(evs), err)
	}
	if err := s.MarkPublished(ctx, evs, now); err != nil {
		t.Fatal(err)
	}
	if n := count(t, db, `SELECT COUNT(*) FROM events WHERE published_at IS NULL`) + count(t, db, `SELECT COUNT(*) FROM event_batches WHERE published_at IS NULL`); n != 0 {
		t.Errorf("unpublished rows = %d", n)
	}
}

// Measured: the plan of EventsOf's extra query (owed) with a backlog of
// unpublished batches: which index of event_batches it reads.
func TestReviewOwedQueryPlan(t *testing.T) {
	st, db := open(t)
	manyBatches(t, st, 60, 5)
	explain(t, db, `EXPLAIN SELECT seq, payload, sent FROM event_batches
			WHERE published_at IS NULL AND batch_id IN (SELECT event_batch FROM reservations
				WHERE reservation_id IN (?) AND event_batch IS NOT NULL) ORDER BY seq`, "b030-0001")
	// MarkPublished's fast path and markPartly's locking read.
	explain(t, db, `EXPLAIN UPDATE event_batches SET published_at = NOW(3)
			WHERE batch_id = ? AND events <= ? AND published_at IS NULL`, "confirmations/b030-0000", 1)
	explain(t, db, `EXPLAIN SELECT seq, payload, sent FROM event_batches
		WHERE batch_id = ? AND published_at IS NULL FOR UPDATE`, "confirmations/b030-0000")
}

func explain(t *testing.T, db *sql.DB, q string, args ...any) {
	t.Helper()
	rows, err := db.Query(q, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	for rows.Next() {
		vals := make([]sql.NullString, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		line := ""
		for i, c := range cols {
			line += c + "=" + vals[i].String + " "
		}
		t.Log(line)
	}
}

// logDeadlock logs InnoDB's latest detected deadlock (once a test).
func logDeadlock(t *testing.T, db *sql.DB) {
	t.Helper()
	var typ, name, status string
	if err := db.QueryRow(`SHOW ENGINE INNODB STATUS`).Scan(&typ, &name, &status); err != nil {
		t.Logf("innodb status: %v", err)
		return
	}
	if i := strings.Index(status, "LATEST DETECTED DEADLOCK"); i >= 0 {
		end := strings.Index(status[i:], "TRANSACTIONS\n")
		if end < 0 {
			end = min(len(status)-i, 6000)
		}
		t.Log(status[i : i+end])
	}
}
