package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	_ "github.com/go-sql-driver/mysql"
	"github.com/holdfast/holdfast/internal/devauth"
	"github.com/holdfast/holdfast/internal/devstack"
	"github.com/holdfast/holdfast/internal/loadgen"
	"github.com/holdfast/holdfast/internal/testkit/invariant"
	"github.com/holdfast/holdfast/internal/testkit/outbox"
	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/adapters/eventbus"
	"github.com/holdfast/holdfast/shared/adapters/redisstore"
	"github.com/holdfast/holdfast/shared/config"
	"github.com/holdfast/holdfast/shared/reservation"
)

// The whole pipeline on one machine (the dev stack, wired from
// template.yaml, on the real services): 2,000 buyers for 150 units plus two
// group-buy rounds with duplicate joiners. The report must PASS, and the
// database itself must agree with it — its event outbox too: the events the
// run read from the events queue are, type by type, the outbox's rows of
// its SKUs, and another SKU's event on the queue is left there.
func TestFlashSaleThroughTheDevStack(t *testing.T) {
	env := testservices.Require(t)
	ctx := context.Background()
	client := env.SQS(t)
	q := env.CreateQueues(t, client, 5)
	dsn := env.Database(t)
	vars := map[string]string{
		"HOLDFAST_REDIS_ADDR": env.RedisAddr, "HOLDFAST_DB_DSN": dsn, "HOLDFAST_DB_MAX_OPEN": "40",
		"HOLDFAST_QUEUE_URL": q.URL, "HOLDFAST_EVENTS_QUEUE_URL": q.EventsURL, "HOLDFAST_LOG_LEVEL": "warn",
		"HOLDFAST_ID_SECRET_FILE": os.Getenv("HOLDFAST_ID_SECRET_FILE"),
	}
	cfg, err := config.Load(func(k string) string { return vars[k] })
	if err != nil {
		t.Fatal(err)
	}
	// The stack verifies tokens with the dev issuer's key, as make dev does;
	// buyers get theirs the way the tool gets them by default (minted from
	// the same key directory).
	jwtDir := t.TempDir()
	issuer, err := devauth.Open(jwtDir)
	if err != nil {
		t.Fatal(err)
	}
	verifier := issuer.Verifier()
	tokenFor, _, err := tokenSource(ctx, jwtDir, "", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	stack, err := devstack.Start(ctx, cfg, devstack.Options{
		Addr: "127.0.0.1:0", Template: "../../template.yaml", DLQURL: q.DLQURL,
		Visibility: 2 * time.Second, SweepEvery: time.Second, Verifier: verifier,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer stack.Stop()

	// Another sale's event, on the queue before the run: not the run's.
	other := reservation.ConfirmedEvent(reservation.Reservation{ID: "demo-phone.x", SKU: "demo-phone", UserID: "ann", Qty: 1}, time.Now())
	if errs := env.EventsQueue(t, q.EventsURL).Publish(ctx, []reservation.Event{other}); errs[0] != nil {
		t.Fatal(errs[0])
	}

	sku := testservices.Name("flash")
	rep, err := loadgen.Run(ctx, loadgen.Config{
		BaseURL: stack.URL, N: 2000, Concurrency: 64, SKU: sku, Stock: 150,
		Groups: 2, GroupCapacity: 3, Settle: 2 * time.Minute, TokenFor: tokenFor, OpenAfter: 2 * time.Second,
		Events: loadgen.NewSQSQueue(client, q.EventsURL), EventsWait: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	rep.Print(&out)
	t.Log(out.String())
	for _, want := range []string{"PASS  no oversell", "PASS  conservation", "PASS  every accepted reservation final", "PASS  group capacity respected",
		"PASS  nothing sold before the sale opened", "accepted/s in its first second", "PASS  every outcome's event"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if rep.Accepted != 150 || rep.SoldOut != 1850 {
		t.Errorf("accepted %d sold out %d, want 150 and 1850", rep.Accepted, rep.SoldOut)
	}
	// The sale opened 2 s in: the first buyers heard not_open, and the
	// first second after it sold (150 units go in far less).
	if rep.NotOpen == 0 || rep.FirstSecond == 0 || rep.Opened < time.Second {
		t.Errorf("not_open %d, accepted in the first second %d, opened after %v; want some, some, about 2 s", rep.NotOpen, rep.FirstSecond, rep.Opened)
	}

	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	one := func(q string, args ...any) int {
		var n sql.NullInt64
		if err := db.QueryRow(q, args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return int(n.Int64)
	}
	if got := one(`SELECT available FROM product_stock WHERE sku = ?`, sku); got != 0 {
		t.Errorf("MySQL available = %d, want 0", got)
	}
	if got := one(`SELECT SUM(qty) FROM reservations WHERE sku = ? AND status = 'CONFIRMED'`, sku); got != 150 {
		t.Errorf("MySQL confirmed units = %d, want 150", got)
	}
	if got := one(`SELECT COUNT(*) FROM reservations WHERE sku = ? AND status = 'CANCELLED'`, sku); got != 0 {
		t.Errorf("cancelled = %d, want 0 (no false cancellation)", got)
	}
	for _, g := range rep.Groups {
		if m := one(`SELECT members FROM group_buys WHERE group_id = ?`, g.ID); m > 3 {
			t.Errorf("group %s has %d members", g.ID, m)
		}
		if dup := one(`SELECT COUNT(*) - COUNT(DISTINCT user_id) FROM reservations WHERE group_id = ? AND status = 'CONFIRMED'`, g.ID); dup != 0 {
			t.Errorf("group %s has a user twice", g.ID)
		}
	}
	// The events the run counted are the outbox's rows of its SKUs, type
	// by type; and the ones of its decisions it saw (every final join, the
	// units it saw confirmed, both groups formed).
	ev := rep.Events
	written := map[reservation.EventType]int{}
	rows, err := db.QueryContext(ctx, `SELECT type, COUNT(*) FROM `+outbox.Table+`
		WHERE sku IN (?, ?) GROUP BY type`, sku, rep.GroupSKU)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var typ string
		var n int
		if err := rows.Scan(&typ, &n); err != nil {
			t.Fatal(err)
		}
		written[reservation.EventType(typ)] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	cancelled := 0
	for _, n := range rep.Cancelled {
		cancelled += n
	}
	for _, typ := range reservation.EventTypes {
		if ev.Counts[typ] != written[typ] {
			t.Errorf("the run counted %d %s events, the outbox has %d", ev.Counts[typ], typ, written[typ])
		}
	}
	if ev.Counts[reservation.EventConfirmed] != 150+rep.GroupUnits || ev.Counts[reservation.EventCancelled] != cancelled ||
		ev.Counts[reservation.EventGroupFormed] != 2 || ev.Decisions != 150+rep.GroupUnits+cancelled+2 {
		t.Errorf("events %v for %d decisions; want %d confirmed, %d cancelled, 2 groups formed", ev.Counts, ev.Decisions, 150+rep.GroupUnits, cancelled)
	}
	if ev.Others != 1 {
		t.Errorf("the run read %d messages not its own, want 1 (the other sale's)", ev.Others)
	}
	left := testservices.Receive(t, client, q.EventsURL, 1)
	var got eventbus.Envelope
	if err := json.Unmarshal(left[0], &got); err != nil || got.Detail.ID != other.ID {
		t.Errorf("left on the events queue: %s, want the other sale's event", left[0])
	}
	if out, err := client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(q.EventsURL), MaxNumberOfMessages: 10}); err != nil || len(out.Messages) > 0 {
		t.Errorf("the run left %d of its events on the queue (%v), want none", len(out.Messages), err)
	}

	// And the invariants (I1–I5) the fault and chaos tests check, on both stores.
	vs, err := invariant.Check(ctx, db, redisstore.New(env.Redis(t), 0), invariant.Expect{
		Sellable: map[string]int64{sku: 150}, Quiescent: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(vs) > 0 {
		t.Errorf("invariants broken after the sale:\n%s", invariant.Violations(vs))
	}
	chart := filepath.Join(t.TempDir(), "load.svg")
	if err := loadgen.WriteChart(rep, chart); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(chart); err != nil || st.Size() < 1000 {
		t.Errorf("chart not written: %v", err)
	}
}

func TestFlagsAreValidated(t *testing.T) {
	// -jwt-dir: the default, .holdfast/dev/jwt, would be made in cmd/load.
	if _, err := run(context.Background(), []string{"-n", "0", "-url", "http://127.0.0.1:1", "-jwt-dir", t.TempDir()}, io.Discard, io.Discard); err == nil {
		t.Error("load -n 0 ran")
	}
}
