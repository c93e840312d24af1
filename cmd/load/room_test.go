package main

import (
	"bytes"
	"context"
	"database/sql"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/devauth"
	"github.com/holdfast/holdfast/internal/devstack"
	"github.com/holdfast/holdfast/internal/loadgen"
	"github.com/holdfast/holdfast/internal/testkit/invariant"
	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/adapters/redisstore"
	"github.com/holdfast/holdfast/shared/config"
)

// The waiting-room comparison through the dev stack on the real services:
// 200 buyers for 20 units, sold once without the room and once through it.
// Both runs keep every check of the flash sale (the invariants, the
// events); the room run's own: it sells every unit while buyers wait,
// admits in queue order, and every admitted buyer reserves once. The room
// admits while the admitted who have not reserved ≤ ⌈(available + held) ×
// factor⌉ - held: at factor 1 no more than the units available, so (with
// no admission lapsing) exactly one buyer a unit, each reserving once.
// make bench measures the attempts a unit against the goal (≤ 1.5), and
// how fast SOLD_OUT travels; a test does not.
func TestWaitingRoomThroughTheDevStack(t *testing.T) {
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
	jwtDir := t.TempDir()
	issuer, err := devauth.Open(jwtDir)
	if err != nil {
		t.Fatal(err)
	}
	tokenFor, _, err := tokenSource(ctx, jwtDir, "", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	stack, err := devstack.Start(ctx, cfg, devstack.Options{
		Addr: "127.0.0.1:0", Template: "../../template.yaml", DLQURL: q.DLQURL,
		Visibility: 2 * time.Second, SweepEvery: time.Second, Verifier: issuer.Verifier(),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer stack.Stop()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	counters, err := loadgen.CountersOf(ctx, env.Redis(t), db)
	if err != nil {
		t.Fatal(err)
	}
	defer counters.Close()

	sku := testservices.Name("roomload")
	const buyers, units = 200, 20
	c, err := loadgen.Compare(ctx, loadgen.Config{
		BaseURL: stack.URL, N: buyers, Concurrency: 32, SKU: sku, Stock: units, Settle: 2 * time.Minute,
		TokenFor: tokenFor, OpenAfter: 2 * time.Second, AdmitFactor: 1,
		Events: loadgen.NewSQSQueue(client, q.EventsURL), EventsWait: time.Minute,
		Counters: counters, PollBurst: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	c.Print(&out)
	t.Log(out.String())
	if !c.Passed() {
		t.Error("a run's checks failed")
	}
	for _, want := range []string{"PASS  no oversell", "PASS  conservation", "PASS  every accepted reservation final",
		"PASS  nothing sold before the sale opened", "PASS  every outcome's event", "PASS  admitted in queue order",
		"PASS  no unit unsold while buyers waited", "PASS  every waiter's sale ended", "reserve attempts per unit sold = "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q", want)
		}
	}
	direct, room := c.Direct, c.Room
	for _, r := range []*loadgen.Report{direct, room} {
		if r.Sale.Sold != units || r.Sale.Buyers != buyers {
			t.Errorf("%s: %d buyers, %d units sold; want %d and %d", r.SKU, r.Sale.Buyers, r.Sale.Sold, buyers, units)
		}
	}
	// Without the room every buyer reserves; with it, only the admitted.
	if direct.Sale.Attempts < buyers {
		t.Errorf("without the room %d reserve attempts from %d buyers", direct.Sale.Attempts, buyers)
	}
	f := room.Room
	if room.Sale.Attempts != units || f.Admitted != units {
		t.Errorf("with the room %d reserve attempts for %d units from %d admitted buyers; want one admitted buyer a unit, reserving once", room.Sale.Attempts, units, f.Admitted)
	}
	if room.Sale.Unsold != 0 || f.Inversions != 0 || f.Gaps != 0 || f.Admitted < units {
		t.Errorf("with the room: %d unsold, %d admitted, %d out of order, %d places skipped", room.Sale.Unsold, f.Admitted, f.Inversions, f.Gaps)
	}
	if f.Ends["RESERVED"] != units || f.Ends["SOLD_OUT"] != buyers-units {
		t.Errorf("ends %v, want %d RESERVED and %d SOLD_OUT", f.Ends, units, buyers-units)
	}
	// The burst's polls were counted by the servers (what they cost is make bench's figure).
	if f.Cost == nil || f.Cost.Polls == 0 || f.Cost.Counted.RedisScripts == 0 {
		t.Errorf("the burst of polls: %+v", f.Cost)
	}
	vs, err := invariant.Check(ctx, db, redisstore.New(env.Redis(t), 0), invariant.Expect{
		Sellable: map[string]int64{direct.SKU: units, room.SKU: units}, Quiescent: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(vs) > 0 {
		t.Errorf("invariants broken after the sales:\n%s", invariant.Violations(vs))
	}
}
