package mysqlstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/shared/reservation"
)

// rounds is what Service.send publishes, in order: each round the first
// unsent event of each aggregate (publish.go), every event taken.
func rounds(evs []reservation.Event) []string {
	var out []string
	for len(evs) > 0 {
		var rest []reservation.Event
		in := map[string]bool{}
		for _, e := range evs {
			if in[e.AggregateID] {
				rest = append(rest, e)
				continue
			}
			in[e.AggregateID] = true
			out = append(out, e.ID)
		}
		evs = rest
	}
	return out
}

func indexOf(list []string, id string) int {
	for i, s := range list {
		if s == id {
			return i
		}
	}
	return -1
}

// The batch's clock runs ahead of the refund's (two Lambdas), and one drain
// takes both (TestDrainSendsAConfirmationOwedBeforeItsRefundWhateverTheClocks
// covers a drain whose cutoff is before the batch's time). The merge puts
// the refund, by its time, before the batch; the batch, which holds c2's
// first event, goes whole ahead of it, so c2/1 is published before c2/2.
func TestDrainKeepsConfirmationBeforeRefundWhenBothAreTaken(t *testing.T) {
	ctx := context.Background()
	s, _ := open(t)
	if _, err := s.ChangeStock(ctx, reservation.SetTo("t", 10)); err != nil {
		t.Fatal(err)
	}
	settleBatch(t, s, "t", now.Add(time.Minute), res("c1", "t", 1), res("c2", "t", 1))
	if _, _, err := s.Refund(ctx, "c2", reservation.ReasonBuyer, "", now); err != nil {
		t.Fatal(err)
	}
	evs, err := s.Unpublished(ctx, now.Add(2*time.Minute), 100)
	if err != nil {
		t.Fatal(err)
	}
	sent := rounds(evs)
	t.Logf("Unpublished = %s; published in order %v", ids(evs), sent)
	c, r := indexOf(sent, "reservation/c2/1"), indexOf(sent, "reservation/c2/2")
	if c < 0 || r < 0 || c > r {
		t.Errorf("drain publishes c2's refund (at %d) before its confirmation (at %d): version order broken", r, c)
	}
}

// The same with a payment: the confirmation (version 1) its batch holds
// goes out before the paid event (version 2), in one drain.
func TestDrainKeepsConfirmationBeforePaymentWhenBothAreTaken(t *testing.T) {
	ctx := context.Background()
	s, _ := open(t)
	if _, err := s.ChangeStock(ctx, reservation.SetTo("t", 10)); err != nil {
		t.Fatal(err)
	}
	settleBatch(t, s, "t", now.Add(50*time.Millisecond), res("c1", "t", 1), res("c2", "t", 1))
	if _, _, err := s.Pay(ctx, "c1", now.Add(10*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	evs, err := s.Unpublished(ctx, now.Add(time.Second), 100)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Unpublished = %s", ids(evs))
	got := strings.Fields(ids(evs))
	c, p := indexOf(got, "reservation/c1/1"), indexOf(got, "reservation/c1/2")
	if c < 0 || p < 0 || c > p {
		t.Errorf("Unpublished lists c1's payment (at %d) before its confirmation (at %d)", p, c)
	}
}

// Migration 0016 claims an in-place change with no table copy in MariaDB.
// Replays it on a copy of the 0010 events table (with rows) under MariaDB's
// own guards: ALGORITHM=NOCOPY fails if the table would be copied, LOCK=NONE
// if writes would wait. Reports what INSTANT does too.
func TestMigration0016WidensInPlace(t *testing.T) {
	ctx := context.Background()
	_, db := open(t)
	var version string
	if err := db.QueryRowContext(ctx, `SELECT VERSION()`).Scan(&version); err != nil {
		t.Fatal(err)
	}
	t.Logf("server %s", version)
	mk := func(name string) {
		t.Helper()
		stmts := []string{
			`DROP TABLE IF EXISTS ` + name,
			`CREATE TABLE ` + name + ` (
  seq          BIGINT       NOT NULL AUTO_INCREMENT,
  event_id     VARCHAR(96)  NOT NULL,
  aggregate_id VARCHAR(64)  NOT NULL,
  version      INT          NOT NULL,
  type         VARCHAR(32)  NOT NULL,
  payload      JSON         NOT NULL,
  occurred_at  DATETIME(3)  NOT NULL,
  published_at DATETIME(3)  NULL,
  PRIMARY KEY (seq),
  UNIQUE KEY events_id (event_id),
  KEY events_aggregate (aggregate_id, version),
  KEY events_unpublished (published_at, seq)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci`,
		}
		for _, q := range stmts {
			if _, err := db.ExecContext(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
		for i := range 50 {
			if _, err := db.ExecContext(ctx, `INSERT INTO `+name+` (event_id, aggregate_id, version, type, payload, occurred_at) VALUES (?, ?, 1, 'x', '{}', ?)`,
				fmt.Sprintf("reservation/r%d/1", i), fmt.Sprintf("r%d", i), now); err != nil {
				t.Fatal(err)
			}
		}
	}
	alter := `MODIFY event_id VARCHAR(128) NOT NULL, MODIFY aggregate_id VARCHAR(100) NOT NULL`
	try := func(name, algo string) error {
		mk(name)
		_, err := db.ExecContext(ctx, `ALTER TABLE `+name+` `+alter+`, `+algo)
		return err
	}
	for _, algo := range []string{"ALGORITHM=INSTANT", "ALGORITHM=NOCOPY, LOCK=NONE", "ALGORITHM=INPLACE, LOCK=NONE"} {
		t.Logf("%s: %v", algo, try("events_0016", algo))
	}
	if err := try("events_0016", "ALGORITHM=NOCOPY, LOCK=NONE"); err != nil {
		t.Errorf("0016 on MariaDB copies the table or blocks writes: %v", err)
	}
	var coll sql.NullString
	if err := db.QueryRowContext(ctx, `SELECT COLLATION_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'events' AND COLUMN_NAME = 'event_id'`).Scan(&coll); err != nil {
		t.Fatal(err)
	}
	t.Logf("events.event_id collation after 0016: %v", coll.String)
}

// One persist Lambda whose clock runs ahead writes a batch (seq first, time
// late); every later batch, written on a right clock, waits behind it in the
// merge (each table keeps its seq order). A refund of a later batch's row,
// taken in the same drain, still goes out after that row's confirmation.
func TestDrainKeepsConfirmationsFirstBehindAFastClockBatch(t *testing.T) {
	ctx := context.Background()
	s, _ := open(t)
	if _, err := s.ChangeStock(ctx, reservation.SetTo("t", 10)); err != nil {
		t.Fatal(err)
	}
	settleBatch(t, s, "t", now.Add(time.Minute), res("x1", "t", 1)) // the fast clock
	settleBatch(t, s, "t", now, res("c1", "t", 1), res("c2", "t", 1))
	if _, _, err := s.Refund(ctx, "c2", reservation.ReasonBuyer, "", now.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	evs, err := s.Unpublished(ctx, now.Add(2*time.Minute), 500)
	if err != nil {
		t.Fatal(err)
	}
	sent := rounds(evs)
	t.Logf("Unpublished = %s", ids(evs))
	c, r := indexOf(sent, "reservation/c2/1"), indexOf(sent, "reservation/c2/2")
	if c < 0 || r < 0 || c > r {
		t.Errorf("drain publishes c2's refund (at %d) before its confirmation (at %d)", r, c)
	}
}
