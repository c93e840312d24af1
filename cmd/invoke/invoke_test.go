package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	_ "github.com/go-sql-driver/mysql"
	"github.com/holdfast/holdfast/internal/testkit/testservices"
)

const (
	fixtureID = "demo-phone.o5huxqhfb5dp3mwp34lmcopv7e" // events/reserve-post.json (user-42, order-7f3a9c)
	lostID    = "demo-phone.eozym3bwhhburugtdf5sriopfe" // events/compensate-batch.json
)

// Every function runs as its real bootstrap under the Runtime Interface
// Emulator, with the template's variables only, against the real services,
// fed the events sam local invoke would be given, logged in to MySQL as
// the user the migrate function creates (rows only).
func TestEveryFunctionUnderTheEmulator(t *testing.T) {
	env := testservices.Require(t)
	ctx := context.Background()
	rdb := env.Redis(t)
	client := env.SQS(t)
	q := env.CreateQueues(t, client, 5)
	// The database as a deploy leaves it: made by the migrate function, and
	// every function logs in as its least-privilege user.
	st := newStage(t, env)
	bin := t.TempDir()
	if out := migrateUnderTheEmulator(t, st, bin, map[string]any{}, nil); out["app_user"] != st.user {
		t.Fatalf("migrate = %v", out)
	}
	dsn := st.appDSN
	// The events name a fixed SKU: start from a clean slate in Redis.
	keys, _ := rdb.Keys(ctx, "hf:{demo-phone}*").Result()
	if len(keys) > 0 {
		rdb.Del(ctx, keys...)
	}

	vars := map[string]string{
		"HOLDFAST_REDIS_ADDR": env.RedisAddr, "HOLDFAST_DB_DSN": dsn, "HOLDFAST_QUEUE_URL": q.URL,
		"HOLDFAST_EVENTS_QUEUE_URL": q.EventsURL, "HOLDFAST_AWS_ENDPOINT": env.SQSEndpoint,
		// make dev's id key (scripts/services.sh), which events/ derive their ids with.
		"HOLDFAST_ID_SECRET_FILE": os.Getenv("HOLDFAST_ID_SECRET_FILE"),
	}
	call := func(fn, event string) map[string]any {
		t.Helper()
		out, err := invoke(ctx, options{
			Root: "../..", Function: fn, Event: "../../events/" + event, EnvFile: "events/env.json",
			Inherit: true, Getenv: func(k string) string { return vars[k] }, Logs: io.Discard, BinDir: bin,
		})
		if err != nil {
			t.Fatalf("invoke %s %s: %v", fn, event, err)
		}
		var m map[string]any
		if err := json.Unmarshal(out, &m); err != nil {
			t.Fatalf("%s %s: response %s: %v", fn, event, out, err)
		}
		if m["errorMessage"] != nil {
			t.Fatalf("%s %s: function error %v", fn, event, m)
		}
		return m
	}
	api := func(event string, wantStatus int) map[string]any {
		t.Helper()
		resp := call("reserve", event)
		var body map[string]any
		_ = json.Unmarshal([]byte(resp["body"].(string)), &body)
		if int(resp["statusCode"].(float64)) != wantStatus {
			t.Fatalf("%s = %v %v, want %d", event, resp["statusCode"], body, wantStatus)
		}
		return body
	}
	db := openDB(t, dsn)
	count := func(q string, args ...any) int {
		var n int
		if err := db.QueryRow(q, args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	api("admin-stock-put.json", 200)
	if body := api("reserve-post-invalid.json", 400); body["error"] != "invalid_request" {
		t.Errorf("invalid reserve = %v", body)
	}
	if body := api("reserve-post.json", 202); body["reservation_id"] != fixtureID || body["status"] != "HELD" {
		t.Fatalf("reserve = %v, want HELD %s", body, fixtureID)
	}
	if state, _ := rdb.HGet(ctx, "hf:{demo-phone}:r:"+fixtureID, "state").Result(); state != "HELD" {
		t.Errorf("redis hold state = %q, want HELD", state)
	}
	if got := depth(t, client, q.URL); got != 1 {
		t.Errorf("queue depth = %d, want 1", got)
	}

	if resp := call("persist", "persist-batch.json"); resp["batchItemFailures"] != nil {
		t.Errorf("persist = %v, want no failures", resp)
	}
	if n := count(`SELECT COUNT(*) FROM reservations WHERE reservation_id = ? AND status = 'CONFIRMED'`, fixtureID); n != 1 {
		t.Errorf("confirmed rows = %d, want 1", n)
	}
	if n := count(`SELECT available FROM product_stock WHERE sku = 'demo-phone'`); n != 99 {
		t.Errorf("mysql available = %d, want 99 (the batch's duplicate took nothing)", n)
	}
	if body := api("reserve-get.json", 200); body["status"] != "CONFIRMED" {
		t.Errorf("status = %v, want CONFIRMED", body)
	}
	if body := api("skus-get.json", 200); body["available"] != float64(99) {
		t.Errorf("sku = %v, want 99 available", body)
	}
	// The waiting room's public status needs no token (no authorizer);
	// demo-phone sells without a room.
	if body := api("skus-queue-get.json", 404); body["error"] != "no_waiting_room" {
		t.Errorf("queue status without a token = %v, want 404 no_waiting_room", body)
	}
	if body := api("groups-post.json", 201); body["status"] != "OPEN" || !strings.HasPrefix(body["group_id"].(string), "g-") {
		t.Errorf("group = %v", body)
	}
	if body := api("groups-get.json", 404); body["error"] != "unknown_group" {
		t.Errorf("unknown group = %v", body)
	}

	if resp := call("compensate", "compensate-batch.json"); resp["batchItemFailures"] != nil {
		t.Errorf("compensate = %v, want no failures", resp)
	}
	if n := count(`SELECT COUNT(*) FROM reservations WHERE reservation_id = ? AND status = 'CANCELLED' AND reason = 'dead_letter'`, lostID); n != 1 {
		t.Errorf("dead letter not fenced: %d rows", n)
	}
	if got := depth(t, client, q.EventsURL); got != 2 {
		t.Errorf("events = %d, want 2 (the persisted one's ReservationConfirmed, the dead letter's ReservationCancelled)", got)
	}

	// The order service releases the confirmed reservation for its code; it
	// can no longer be paid; the buyer's cancel finds it cancelled.
	if body := api("admin-reservation-cancel.json", 200); body["status"] != "CANCELLED" || body["reason"] != "order_cancelled" || body["note"] != "checkout:abandoned" {
		t.Errorf("order cancel = %v, want CANCELLED order_cancelled with note checkout:abandoned", body)
	}
	if body := api("admin-reservation-paid.json", 409); body["error"] != "cancelled" || body["reason"] != "order_cancelled" {
		t.Errorf("paid after the order cancel = %v, want 409 cancelled (order_cancelled)", body)
	}
	if body := api("reserve-delete.json", 200); body["status"] != "CANCELLED" {
		t.Errorf("cancel = %v", body)
	}
	if n := count(`SELECT available FROM product_stock WHERE sku = 'demo-phone'`); n != 100 {
		t.Errorf("mysql available after cancel = %d, want 100", n)
	}
	if rep := call("sweeper", "sweeper-schedule.json"); rep["errors"] != float64(0) || rep["skus"] != float64(1) {
		t.Errorf("sweep = %v", rep)
	}

	// An existing SKU: an absolute figure needs its version; a keyed add is applied once.
	if body := api("admin-stock-put.json", 428); body["error"] != "precondition_required" {
		t.Errorf("absolute PUT on an existing sku = %v, want 428 precondition_required", body)
	}
	for range 2 {
		if body := api("admin-stock-add.json", 200); body["stock"] != float64(110) {
			t.Errorf("keyed add = %v, want stock 110 (once)", body)
		}
	}
}

func depth(t *testing.T, c *sqs.Client, url string) int {
	t.Helper()
	out, err := c.GetQueueAttributes(context.Background(), &sqs.GetQueueAttributesInput{
		QueueUrl: aws.String(url), AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameApproximateNumberOfMessages},
	})
	if err != nil {
		t.Fatal(err)
	}
	var n int
	_ = json.Unmarshal([]byte(out.Attributes["ApproximateNumberOfMessages"]), &n)
	return n
}

func openDB(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}
