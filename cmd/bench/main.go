// Command bench measures holdfast against the baselines a user would
// otherwise pick, in one run, on the real local servers (scripts/bench.sh
// starts them): reserve on one hot SKU (the raw Lua floor, holdfast's path
// with and without the SQS send, the pure-database design), persist of a
// backlog on one hot SKU (the textbook optimistic consumer vs holdfast's
// batch path), the sold-out storm with and without the per-instance flag, the
// whole pipeline through the dev stack, one sale without and with its
// waiting room (the load tool's -room mode), a catalog import by concurrent
// admins, and each function's cold start under
// the Lambda Runtime Interface Emulator. It prints a table and
// benchstat-compatible lines, and rewrites docs/benchmarks.md.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs"
	_ "github.com/go-sql-driver/mysql"
	"github.com/holdfast/holdfast/internal/devauth"
	"github.com/holdfast/holdfast/internal/devstack"
	"github.com/holdfast/holdfast/internal/loadgen"
	"github.com/holdfast/holdfast/shared/adapters/mysqlstore"
	"github.com/holdfast/holdfast/shared/adapters/redisstore"
	"github.com/holdfast/holdfast/shared/app"
	"github.com/holdfast/holdfast/shared/config"
	"github.com/holdfast/holdfast/shared/reservation"
	"github.com/redis/go-redis/v9"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

type options struct {
	concurrency int
	duration    time.Duration
	backlog     int
	consumers   int
	out         string
	chart       string
	devProfile  string
	profile     string
	// The waiting-room part's sale: buyers and units.
	roomN, roomStock int
}

// result is one measured mode.
type result struct {
	group, name string
	ops         int64
	elapsed     time.Duration
	lat         []time.Duration
	extra       map[string]string
	cpu         map[string]time.Duration // CPU each process spent over the timed part (persist parts only)
}

func (r result) rate() float64 { return float64(r.ops) / r.elapsed.Seconds() }

func (r result) pct(q float64) time.Duration {
	if len(r.lat) == 0 {
		return 0
	}
	return r.lat[min(len(r.lat)-1, int(q*float64(len(r.lat))))]
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	var o options
	fs.IntVar(&o.concurrency, "c", 32, "concurrent clients for the reserve modes")
	fs.DurationVar(&o.duration, "d", 3*time.Second, "time per reserve mode")
	fs.IntVar(&o.backlog, "m", 20000, "persist backlog (messages)")
	fs.IntVar(&o.consumers, "consumers", 20, "concurrent persist consumers (the template's MaximumConcurrency)")
	fs.StringVar(&o.out, "out", "docs/benchmarks.md", "report to rewrite (empty: none)")
	fs.StringVar(&o.chart, "chart", "docs/benchmarks.png", "chart of the load run")
	fs.StringVar(&o.devProfile, "dev-profile", "", "write a CPU profile of make dev's process in the http and stack parts to this file; implies -out ''")
	fs.StringVar(&o.profile, "profile", "", "write a CPU profile of this process (the bench itself: the handler, script and persist parts run in it) to this file, and its allocations to FILE.allocs; implies -out '' (profiling slows what it measures)")
	fs.IntVar(&o.roomN, "room-n", 3000, "waiting room part: buyers")
	fs.IntVar(&o.roomStock, "room-stock", 300, "waiting room part: units")
	only := fs.String("only", "", "run only these parts (comma-separated: http,stack,cpu,decode,script,reserve,persist,hot,lag,buckets,soldout,e2e,room,sweep,groups,catalog,cold); implies -out ''")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.profile != "" || o.devProfile != "" {
		o.out, o.chart = "", "" // a profiled run's figures carry the profiler's cost
	}
	cfg, err := config.Load(getenv)
	if err != nil {
		return err
	}
	cfg.Protocol.SoldOutTTL = 0 // measured separately
	b := &bench{o: o, cfg: cfg, getenv: getenv, stdout: stdout}
	a, err := app.Build(ctx, cfg, app.Options{Function: "bench", Out: io.Discard})
	if err != nil {
		return err
	}
	defer a.Close()
	defer func() {
		for _, c := range b.closers {
			_ = c()
		}
	}()
	if _, err := mysqlstore.Migrate(ctx, a.DB); err != nil {
		return err
	}
	b.app = a
	if err := checkClocks(); err != nil {
		return fmt.Errorf("the CPU clocks the figures are read by: %w", err)
	}
	if b.refStart, err = hostReference(); err != nil {
		return err
	}
	if o.profile != "" {
		f, err := os.Create(o.profile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
		defer func() {
			if f, err := os.Create(o.profile + ".allocs"); err == nil {
				_ = pprof.Lookup("allocs").WriteTo(f, 0)
				_ = f.Close()
			}
		}()
	}
	if err := devstack.EnsureQueues(ctx, a.SQS, cfg, getenv("HOLDFAST_DLQ_URL"), "template.yaml"); err != nil {
		return err
	}
	steps := []struct {
		name string
		run  func(context.Context) error
	}{
		// The cold starts first, on stores no other part has filled: the
		// sweeper's one invocation is a sweep, whose length is the stores'
		// (the parts leave live SKUs, benchHoldTTL's for hours). Then the
		// sweep part, on stores still nearly empty.
		{"cold", b.coldStart}, {"sweep", b.sweep}, {"groups", b.groups}, {"http", b.httpFigures}, {"stack", b.stack}, {"decode", b.decodeCost}, {"script", b.scriptCost}, {"reserve", b.reserve}, {"persist", b.persist}, {"hot", b.persistHot},
		{"lag", b.confirmLag}, {"buckets", b.buckets}, {"soldout", b.soldOut}, {"e2e", b.endToEnd}, {"room", b.room}, {"cpu", b.handlerCPU}, {"catalog", b.catalog},
	}
	for _, step := range steps {
		if *only != "" && !strings.Contains(","+*only+",", ","+step.name+",") {
			continue
		}
		if err := step.run(ctx); err != nil {
			return err
		}
	}
	if *only != "" {
		b.printResults()
		for _, l := range append(b.ratios(), b.partLines()...) {
			fmt.Fprintln(b.stdout, l)
		}
		return nil
	}
	b.print()
	if o.out != "" {
		return b.writeDoc()
	}
	return nil
}

// benchHoldTTL is the hold TTL of the parts that leave holds no persist
// takes (their queue is purged or there is none): the http part and the
// reserve part. With the default five minutes these expired during later
// parts, whose stacks' sweepers decided them (a fence, its event, its
// release: MariaDB's work) inside those parts' figures, and the cold part
// swept the rest for minutes before its own. The script's work is the
// same for any TTL; their SKUs stay live (the sweeper visits them) as
// long, some twenty SKUs. The cpu part keeps the template's TTL (it is
// the figure a Lambda bills, and the room mode cost more with this one)
// and runs after every part with a sweeper; every other part keeps the
// template's too.
const benchHoldTTL = 3 * time.Hour

type bench struct {
	o       options
	cfg     config.Config
	getenv  func(string) string
	stdout  io.Writer
	app     *app.App
	results []result
	checks  []string
	load    *loadgen.Report
	roomRun *loadgen.Comparison // the waiting-room part's two sales
	cold    map[string]time.Duration
	sweeps  []sweepFigure
	// groupRuns is the groups part's run.
	groupRuns []groupsFigure
	// stackRun is the stack part's run with a waiting room (the figure),
	// stackNoRoom its run without.
	stackRun, stackNoRoom *stackFigure
	// serverPids are the servers the persist parts read the CPU of, by
	// name (persistCPU finds them once).
	serverPids map[string]int
	// handlerPer is the handler CPU part's CPU per accepted reservation,
	// by mode.
	handlerPer map[string]time.Duration
	// refStart is the host's speed idle when the bench started
	// (hostReference); handlerRefs are the handler part's runs, each at the
	// host's speed under its own load, by mode.
	refStart    hostSpeed
	handlerRefs []string
	// scriptRuns are the script part's figures (standalone, K = 3).
	scriptRuns []scriptFigure
	// bucketRuns are the buckets part's runs (K = 1, K = 3).
	bucketRuns []bucketRun
	dry        string         // the buckets part's dry sale: MySQL statements on the buyers' path
	closers    []func() error // services built for a part, closed at the end
}

func (b *bench) log(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }

// hammer runs op from c goroutines for d and records each latency.
func hammer(c int, d time.Duration, op func(worker, i int) error) (int64, time.Duration, []time.Duration, error) {
	var ops atomic.Int64
	var mu sync.Mutex
	var lat []time.Duration
	var firstErr error
	start := time.Now()
	deadline := start.Add(d)
	var wg sync.WaitGroup
	for w := range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := make([]time.Duration, 0, 4096)
			for i := 0; time.Now().Before(deadline); i++ {
				t := time.Now()
				if err := op(w, i); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					return
				}
				local = append(local, time.Since(t))
				ops.Add(1)
			}
			mu.Lock()
			lat = append(lat, local...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	return ops.Load(), elapsed, lat, firstErr
}

const bigStock = 1_000_000_000

// reserve: the floor, holdfast without and with the send, the pure-DB design.
func (b *bench) reserve(ctx context.Context) error {
	rdb, db := b.app.Redis, b.app.DB
	// Each mode runs reserveRounds times, the modes in turn, and its figure
	// is its runs together: the ratios compare modes that met the same
	// moments of this host (see handlerRounds).
	sums := map[string]*result{}
	var order []string
	run := func(name string, setup func(sku string) error, op func(sku string, w, i int) error, check func(sku string, ops int64) error) error {
		sku := fmt.Sprintf("bench-reserve%d-%d", len(order), time.Now().UnixNano())
		if err := setup(sku); err != nil {
			return err
		}
		b.log("reserve: %s …", name)
		ops, el, lat, err := hammer(b.o.concurrency, roundOf(b.o.duration, reserveRounds), func(w, i int) error { return op(sku, w, i) })
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		sum := sums[name]
		if sum == nil {
			sum = &result{group: "reserve", name: name, extra: map[string]string{"runs": strconv.Itoa(reserveRounds)}}
			sums[name] = sum
			order = append(order, name)
		}
		sum.ops, sum.elapsed, sum.lat = sum.ops+ops, sum.elapsed+el, append(sum.lat, lat...)
		if err := check(sku, ops); err != nil {
			return err
		}
		b.checks = append(b.checks, fmt.Sprintf("reserve %s: %d taken, stock moved by exactly %d (no oversell)", name, ops, ops))
		return nil
	}
	defer func() {
		for _, name := range order {
			r := *sums[name]
			sort.Slice(r.lat, func(i, j int) bool { return r.lat[i] < r.lat[j] })
			b.results = append(b.results, r)
		}
	}()
	modes, err := b.reserveModes(ctx, rdb, db)
	if err != nil {
		return err
	}
	// Each round starts one mode later, so no mode always follows the
	// same one (the pure-DB mode's MariaDB work, the send's goaws work).
	for round := range reserveRounds {
		for j := range modes {
			m := modes[(j+round)%len(modes)]
			if err := b.awaitQuiet(ctx, "reserve"); err != nil {
				return err
			}
			if err := run(m.name, m.setup, m.op, m.check); err != nil {
				return err
			}
		}
	}
	return nil
}

// reserveRounds is how many times the reserve part runs each mode, each
// run a share of -d (the holds it leaves are swept before the cold part).
const reserveRounds = 3

// roundOf is one of n runs' share of d: at least a second.
func roundOf(d time.Duration, n int) time.Duration { return max(time.Second, d/time.Duration(n)) }

// reserveMode is one of the reserve part's modes: a SKU's setup, one
// operation, and the check of the stock after ops of them.
type reserveMode struct {
	name  string
	setup func(sku string) error
	op    func(sku string, w, i int) error
	check func(sku string, ops int64) error
}

// reserveModes are the reserve part's modes: the floor, holdfast without
// and with the send, the pure-DB design.
func (b *bench) reserveModes(ctx context.Context, rdb redis.UniversalClient, db *sql.DB) ([]reserveMode, error) {
	setStock := func(sku string) error {
		_, err := b.app.Service.ChangeStock(ctx, reservation.SetTo(sku, bigStock))
		return err
	}
	redisCheck := func(sku string, ops int64) error {
		rs, err := redisstore.New(rdb, 0).Stock(ctx, sku)
		if err != nil {
			return err
		}
		if avail := rs.Available; avail != bigStock-ops {
			return fmt.Errorf("redis stock %d after %d reservations: oversold", avail, ops)
		}
		return nil
	}
	script := redis.NewScript(redisstore.ReserveLua)
	left := b.cfg // no persist takes these holds: benchHoldTTL
	left.Protocol.HoldTTL = benchHoldTTL
	noSend, err := b.service(ctx, left, app.Options{Enqueuer: func(reservation.Enqueuer) reservation.Enqueuer { return nopQueue{} }})
	if err != nil {
		return nil, err
	}
	send, err := b.service(ctx, left, app.Options{})
	if err != nil {
		return nil, err
	}
	return []reserveMode{
		{modeFloor, setStock, func(sku string, w, i int) error {
			r := reservation.Reservation{ID: fmt.Sprintf("f%d-%d", w, i), SKU: sku, Qty: 1, UserID: fmt.Sprintf("u%d-%d", w, i), Token: "floor"}
			out, err := script.Run(ctx, rdb, redisstore.ReserveKeys(r), redisstore.ReserveArgs(r, benchHoldTTL, b.cfg.UserRate, b.cfg.UserBurst)...).StringSlice()
			if err != nil || !heldNow(out, r.Token) {
				return fmt.Errorf("floor: %v %v", out, err)
			}
			return nil
		}, redisCheck},
		{modeNoSend, setStock, func(sku string, w, i int) error {
			_, _, err := noSend.Reserve(ctx, reservation.ReserveRequest{SKU: sku, Qty: 1, UserID: fmt.Sprintf("u%d-%d", w, i)})
			return err
		}, redisCheck},
		{modeSend, setStock, func(sku string, w, i int) error {
			_, _, err := send.Reserve(ctx, reservation.ReserveRequest{SKU: sku, Qty: 1, UserID: fmt.Sprintf("u%d-%d", w, i)})
			return err
		}, func(sku string, ops int64) error {
			if _, err := b.app.SQS.PurgeQueue(ctx, &sqs.PurgeQueueInput{QueueUrl: &b.cfg.QueueURL}); err != nil {
				b.log("purge: %v", err)
			}
			return redisCheck(sku, ops)
		}},
		{modePureDB, setStock, func(sku string, w, i int) error {
			res, err := db.ExecContext(context.Background(), `UPDATE product_stock SET available = available - 1 WHERE sku = ? AND available >= 1`, sku)
			if err != nil {
				return err
			}
			if n, _ := res.RowsAffected(); n != 1 {
				return errors.New("pure DB: sold out")
			}
			return nil
		}, func(sku string, ops int64) error {
			var avail int64
			if err := db.QueryRowContext(ctx, `SELECT available FROM product_stock WHERE sku = ?`, sku).Scan(&avail); err != nil {
				return err
			}
			if avail != bigStock-ops {
				return fmt.Errorf("mysql stock %d after %d updates", avail, ops)
			}
			return nil
		}},
	}, nil
}

type nopQueue struct{}

func (nopQueue) Enqueue(context.Context, reservation.Reservation) error { return nil }

// service is another service on the same stores, wired by app.Build as the
// functions are, with o's overrides; closed when the bench ends.
func (b *bench) service(ctx context.Context, cfg config.Config, o app.Options) (*reservation.Service, error) {
	o.Function = "bench"
	if o.Out == nil {
		o.Out = io.Discard
	}
	a, err := app.Build(ctx, cfg, o)
	if err != nil {
		return nil, err
	}
	b.closers = append(b.closers, a.Close)
	return a.Service, nil
}

// persist: a backlog of messages on one hot SKU, textbook consumer vs holdfast.
func (b *bench) persist(ctx context.Context) error {
	db := b.app.DB
	backlog := func(prefix, sku string) []reservation.Reservation {
		now := time.Now()
		out := make([]reservation.Reservation, b.o.backlog)
		for i := range out {
			out[i] = reservation.Reservation{ID: fmt.Sprintf("%s-%d", prefix, i), SKU: sku, Qty: 1, UserID: fmt.Sprintf("u%d", i), CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
		}
		return out
	}

	// The textbook consumer: read, compare, version-checked update, sleep
	// 50 ms × attempt on a miss, give up (compensate) after 3 attempts.
	sku := fmt.Sprintf("bench-textbook-%d", time.Now().UnixNano())
	if _, err := b.app.Service.ChangeStock(ctx, reservation.SetTo(sku, int64(b.o.backlog))); err != nil {
		return err
	}
	msgs := backlog("t", sku)
	b.log("persist: textbook consumer, %d messages, %d consumers …", len(msgs), b.o.consumers)
	var next, retries, falseCancel atomic.Int64
	start := time.Now()
	limit := start.Add(60 * time.Second)
	var wg sync.WaitGroup
	for range b.o.consumers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= len(msgs) || time.Now().After(limit) {
					return
				}
				m := msgs[i]
				done := false
				for attempt := 1; attempt <= 3 && !done; attempt++ {
					var avail, ver int64
					if err := db.QueryRowContext(ctx, `SELECT available, version FROM product_stock WHERE sku = ?`, sku).Scan(&avail, &ver); err != nil {
						return
					}
					if avail < int64(m.Qty) {
						break
					}
					res, err := db.ExecContext(ctx, `UPDATE product_stock SET available = available - ?, version = version + 1
						WHERE sku = ? AND version = ? AND available >= ?`, m.Qty, sku, ver, m.Qty)
					if err != nil {
						return
					}
					if n, _ := res.RowsAffected(); n == 1 {
						done = true
						break
					}
					retries.Add(1)
					time.Sleep(time.Duration(attempt) * 50 * time.Millisecond) // the baseline's own backoff
				}
				if !done {
					falseCancel.Add(1) // stock was there: the backlog never exceeds it
				}
			}
		}()
	}
	wg.Wait()
	settled := min(next.Load(), int64(len(msgs)))
	tb := result{group: "persist", name: modeTextbook, ops: settled, elapsed: time.Since(start),
		extra: map[string]string{"retries": fmt.Sprint(retries.Load()), "false cancellations": fmt.Sprint(falseCancel.Load())}}
	b.results = append(b.results, tb)

	// holdfast's persist: the same backlog and consumers, batches of 10
	// (the textbook's batch, and holdfast's before issue 14).
	hf, confirmed, cancelled, err := b.holdfastPersist(ctx, b.o.backlog, b.o.consumers, 10, "h", nil)
	if err != nil {
		return err
	}
	b.results = append(b.results, hf)
	b.checks = append(b.checks, fmt.Sprintf("persist holdfast: %d confirmed, MySQL available 0, %d false cancellations", confirmed, cancelled))
	// The BatchSize sweep: the event source's batch, with the template's
	// consumers, on a backlog big enough for 20 batches of the largest.
	for _, consumers := range []int{4, b.o.consumers} {
		for _, size := range persistBatchSizes {
			n := max(b.o.backlog, min(200_000, 4*consumers*size))
			r, confirmed, cancelled, err := b.holdfastPersist(ctx, n, consumers, size, fmt.Sprintf("b%dc%d", size, consumers), nil)
			if err != nil {
				return err
			}
			r.name = fmt.Sprintf("%s %d × %d", modeBatchOf, size, consumers)
			b.results = append(b.results, r)
			b.checks = append(b.checks, fmt.Sprintf("persist batch %d × %d consumers: %d confirmed, MySQL available 0, %d false cancellations",
				size, consumers, confirmed, cancelled))
		}
	}
	return nil
}

// persistBatchSizes are the BatchSize values the persist sweep measures.
var persistBatchSizes = []int{10, 100, 500, 1000, 5000}

// holdfastPersist settles a backlog of n messages on a fresh hot SKU with
// the given number of consumers, each taking batches of batch messages; the
// latencies are those of one batch. bus, when set, replaces the event bus
// (nil: the configured one).
func (b *bench) holdfastPersist(ctx context.Context, n, consumers, batch int, prefix string, bus reservation.Notifier) (result, int64, int64, error) {
	db := b.app.DB
	sku := fmt.Sprintf("bench-%s-%d", prefix, time.Now().UnixNano())
	if _, err := b.app.Service.ChangeStock(ctx, reservation.SetTo(sku, int64(n))); err != nil {
		return result{}, 0, 0, err
	}
	now := time.Now()
	msgs := make([]reservation.Reservation, n)
	for i := range msgs {
		// Ids as reserve mints them: random, so a batch's rows land all over
		// the primary key, as a sale's do.
		msgs[i] = reservation.Reservation{ID: reservation.ReservationID(reservation.ReserveRequest{SKU: sku}, nil), SKU: sku, Qty: 1,
			UserID: fmt.Sprintf("u%d", i), Token: fmt.Sprintf("t%d", i), CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
	}
	// Each message's hold, as reserve left it (untimed): persist confirms them.
	if err := b.holdAll(ctx, msgs); err != nil {
		return result{}, 0, 0, err
	}
	rec := &counter{}
	opts := app.Options{Metrics: rec}
	if bus != nil {
		opts.Notifier = func(reservation.Notifier) reservation.Notifier { return bus }
	}
	svc, err := b.service(ctx, b.cfg, opts)
	if err != nil {
		return result{}, 0, 0, err
	}
	b.log("persist: holdfast, %d messages, %d consumers, batches of %d …", n, consumers, batch)
	var next, failed atomic.Int64
	var wg sync.WaitGroup
	var mu sync.Mutex
	var lat []time.Duration
	runtime.GC() // the setup's garbage is not persist's
	cpu0, cpuErr := b.persistCPU()
	start := time.Now()
	for range consumers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(int64(batch))) - batch
				if i >= len(msgs) {
					return
				}
				t := time.Now()
				for _, err := range svc.PersistBatch(ctx, msgs[i:min(i+batch, len(msgs))]) {
					if err != nil {
						failed.Add(1)
					}
				}
				d := time.Since(t)
				mu.Lock()
				lat = append(lat, d)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	r := result{group: "persist", name: modeBatch, ops: int64(n), elapsed: elapsed, lat: lat}
	if cpu1, err := b.persistCPU(); cpuErr == nil && err == nil {
		r.cpu = map[string]time.Duration{}
		for name, d := range cpu1 {
			r.cpu[name] = d - cpu0[name]
		}
	}
	var confirmed, cancelled, avail int64
	_ = db.QueryRowContext(ctx, `SELECT COUNT(*) FROM reservations WHERE sku = ? AND status = 'CONFIRMED' AND into_bucket IS NULL`, sku).Scan(&confirmed)
	_ = db.QueryRowContext(ctx, `SELECT COUNT(*) FROM reservations WHERE sku = ? AND status = 'CANCELLED'`, sku).Scan(&cancelled)
	_ = db.QueryRowContext(ctx, `SELECT available FROM product_stock WHERE sku = ?`, sku).Scan(&avail)
	r.extra = map[string]string{"retries": fmt.Sprint(rec.get("persist_retries")), "false cancellations": fmt.Sprint(cancelled), "redelivered": fmt.Sprint(failed.Load())}
	if confirmed != int64(n) || avail != 0 {
		return r, confirmed, cancelled, fmt.Errorf("holdfast persist: %d confirmed, %d available; want %d and 0", confirmed, avail, n)
	}
	return r, confirmed, cancelled, nil
}

// holdAll records the holds of msgs in Redis as reserve does, the reserve
// script pipelined 500 a round trip (bench setup, not measured).
func (b *bench) holdAll(ctx context.Context, msgs []reservation.Reservation) error {
	script := redis.NewScript(redisstore.ReserveLua)
	if err := script.Load(ctx, b.app.Redis).Err(); err != nil {
		return err
	}
	for lo := 0; lo < len(msgs); lo += 500 {
		cmds, err := b.app.Redis.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, r := range msgs[lo:min(len(msgs), lo+500)] {
				script.EvalSha(ctx, p, redisstore.ReserveKeys(r), redisstore.ReserveArgs(r, time.Hour, 0, 0)...)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("persist setup: hold: %w", err)
		}
		for i, c := range cmds {
			if out, _ := c.(*redis.Cmd).StringSlice(); !heldNow(out, msgs[lo+i].Token) {
				return fmt.Errorf("persist setup: hold: %v", out)
			}
		}
	}
	return nil
}

type counter struct {
	mu sync.Mutex
	m  map[string]int
}

func (c *counter) Count(name string, n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]int{}
	}
	c.m[name] += n
}

func (c *counter) get(name string) int { c.mu.Lock(); defer c.mu.Unlock(); return c.m[name] }

// soldOut: a storm on a sold-out SKU, with and without the per-instance flag.
func (b *bench) soldOut(ctx context.Context) error {
	for _, ttl := range []time.Duration{0, reservation.DefaultConfig().SoldOutTTL} {
		cfg := b.cfg
		cfg.Protocol.SoldOutTTL = ttl
		svc, err := b.service(ctx, cfg, app.Options{Enqueuer: func(reservation.Enqueuer) reservation.Enqueuer { return nopQueue{} }})
		if err != nil {
			return err
		}
		sku := fmt.Sprintf("bench-soldout-%d", time.Now().UnixNano())
		if _, err := svc.ChangeStock(ctx, reservation.SetTo(sku, 0)); err != nil {
			return err
		}
		name := modeNoFlag
		if ttl > 0 {
			name = fmt.Sprintf("sold-out storm, %v flag", ttl)
		}
		b.log("%s …", name)
		ops, el, lat, err := hammer(b.o.concurrency, b.o.duration, func(w, i int) error {
			_, _, err := svc.Reserve(ctx, reservation.ReserveRequest{SKU: sku, Qty: 1, UserID: fmt.Sprintf("u%d-%d", w, i)})
			if !errors.Is(err, reservation.ErrSoldOut) {
				return fmt.Errorf("want sold out, got %v", err)
			}
			return nil
		})
		if err != nil {
			return err
		}
		b.results = append(b.results, result{group: "sold out", name: name, ops: ops, elapsed: el, lat: lat})
	}
	return nil
}

// endToEnd: the dev stack (template settings) under the load tool.
func (b *bench) endToEnd(ctx context.Context) error {
	cfg := b.cfg
	cfg.Protocol.SoldOutTTL = reservation.DefaultConfig().SoldOutTTL
	dlq := b.getenv("HOLDFAST_DLQ_URL")
	// Buyers carry their own dev JWTs, minted before the timed phase, as make load does.
	jwtDir, err := os.MkdirTemp("", "holdfast-bench-jwt-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(jwtDir)
	issuer, err := devauth.Open(jwtDir)
	if err != nil {
		return err
	}
	stack, err := devstack.Start(ctx, cfg, devstack.Options{Addr: "127.0.0.1:0", Template: "template.yaml", DLQURL: dlq,
		Log: slog.New(slog.DiscardHandler), Verifier: issuer.Verifier()})
	if err != nil {
		return err
	}
	defer stack.Stop()
	b.log("end to end: 20,000 buyers for 5,000 units through the dev stack …")
	rep, err := loadgen.Run(ctx, loadgen.Config{BaseURL: stack.URL, N: 20000, Concurrency: 64,
		SKU: fmt.Sprintf("bench-e2e-%d", time.Now().UnixNano()), Stock: 5000, Settle: 5 * time.Minute,
		TokenFor: func(user string) (string, error) { return issuer.Mint(user, time.Hour) }})
	if err != nil {
		return err
	}
	if !rep.Passed() {
		rep.Print(os.Stderr)
		return errors.New("end to end: the invariant report failed")
	}
	b.load = rep
	if b.o.chart != "" {
		return loadgen.WriteChart(rep, b.o.chart)
	}
	return nil
}

var coldRe = regexp.MustCompile(`cold invocation answered ([0-9.]+[µm]?s) after`)

// coldStart: each bootstrap's init duration under the emulator.
func (b *bench) coldStart(ctx context.Context) error {
	b.cold = map[string]time.Duration{}
	for _, fn := range []string{"reserve", "persist", "compensate", "sweeper"} {
		event := map[string]string{"reserve": "events/skus-get.json", "persist": "events/persist-batch.json",
			"compensate": "events/compensate-batch.json", "sweeper": "events/sweeper-schedule.json"}[fn]
		b.log("cold start: %s …", fn)
		cmd := exec.CommandContext(ctx, "go", "run", "./cmd/invoke", "-fn", fn, "-event", event)
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("cold start %s: %v\n%s", fn, err, out)
		}
		m := coldRe.FindSubmatch(out)
		if m == nil {
			return fmt.Errorf("cold start %s: no timing in the invoker's output", fn)
		}
		d, err := time.ParseDuration(string(m[1]))
		if err != nil {
			return err
		}
		b.cold[fn] = d
	}
	return nil
}

// find returns the result of the named mode; ok is false when that part
// did not run (-only), and a name that matches nothing at all is a bug.
func (b *bench) find(name string) (result, bool) {
	for _, r := range b.results {
		if r.name == name {
			return r, true
		}
	}
	return result{}, false
}

// Mode names the ratios compare.
const (
	modeFloor    = "raw EVALSHA floor"
	modeNoSend   = "holdfast, no send"
	modeSend     = "holdfast with SQS send"
	modePureDB   = "pure DB: UPDATE ... WHERE available >= 1"
	modeTextbook = "textbook optimistic consumer"
	modeBatch    = "holdfast batch persist"
	modeBatchOf  = "holdfast persist, BatchSize × consumers:"
	modeNoFlag   = "sold-out storm, no flag"
)

func (b *bench) ratios() []string {
	var out []string
	ratio := func(format string, f func(rs []result) []any, names ...string) {
		rs := make([]result, len(names))
		for i, n := range names {
			r, ok := b.find(n)
			if !ok {
				return // that part did not run
			}
			rs[i] = r
		}
		out = append(out, fmt.Sprintf(format, f(rs)...))
	}
	withFlag := fmt.Sprintf("sold-out storm, %v flag", reservation.DefaultConfig().SoldOutTTL)
	ratio("holdfast reserve / raw script floor = %.2f (goal ≥ 0.90): holdfast's reserve without its SQS send, the same script by EVALSHA, each 3 runs taken in turn with the other reserve modes", func(r []result) []any { return []any{r[0].rate() / r[1].rate()} }, modeNoSend, modeFloor)
	ratio("holdfast reserve / pure-DB design = %.1f× (goal ≥ 16×): holdfast's reserve without its SQS send, on a SKU without per-SKU checks, Redis without persistence; the pure-DB update durable", func(r []result) []any { return []any{r[0].rate() / r[1].rate()} }, modeNoSend, modePureDB)
	ratio("holdfast reserve with the SQS send / pure-DB design = %.1f× (the local SQS server is the bottleneck)", func(r []result) []any { return []any{r[0].rate() / r[1].rate()} }, modeSend, modePureDB)
	ratio("holdfast persist / textbook consumer = %.0f× (goal ≥ 50×); false cancellations %s vs %s", func(r []result) []any {
		return []any{r[0].rate() / r[1].rate(), r[0].extra["false cancellations"], r[1].extra["false cancellations"]}
	}, modeBatch, modeTextbook)
	ratio("reserve handler CPU per accepted reservation: %s before (SDK send) → %s after (direct send)", func(r []result) []any {
		return []any{r[0].extra["handler CPU"], r[1].extra["handler CPU"]}
	}, modeHandlerSDK, modeHandlerDirect)
	ratio("sold-out flag / no flag = %.1f×", func(r []result) []any { return []any{r[0].rate() / r[1].rate()} }, withFlag, modeNoFlag)
	return out
}

// print writes the whole report: the table, the ratios and checks, the
// end-to-end and cold-start figures, and benchstat-compatible lines.
func (b *bench) print() {
	b.printResults()
	b.printSummary()
}

// printResults prints the table of measured modes.
func (b *bench) printResults() {
	w := b.stdout
	fmt.Fprintf(w, "\n%-10s %-42s %12s %11s %11s  %s\n", "group", "mode", "ops/s", "p50", "p99", "notes")
	for _, r := range b.results {
		var notes []string
		for _, k := range []string{"server CPU", "stack CPU", "handler CPU", "decode", "batching", "retries", "false cancellations", "redelivered", "errors", "deadlocks", "runs"} {
			if v, ok := r.extra[k]; ok {
				notes = append(notes, k+" "+v)
			}
		}
		p50, p99 := "-", "-" // the textbook persist is timed as a whole backlog; holdfast's per batch
		if len(r.lat) > 0 {
			p50, p99 = r.pct(0.5).Round(time.Microsecond).String(), r.pct(0.99).Round(time.Microsecond).String()
		}
		fmt.Fprintf(w, "%-10s %-42s %12.0f %11s %11s  %s\n", r.group, r.name, r.rate(), p50, p99, strings.Join(notes, ", "))
	}
}

// partLines are the summary lines of the parts that report their own.
func (b *bench) partLines() []string {
	return append(append(append(append(append(append(append(append(b.hotLines(), b.stackLines()...), b.handlerLines()...), b.sweepLines()...), b.groupLines()...),
		b.bucketLines()...), b.decodeLine()...), b.roomLines()...), b.scriptLines()...)
}

func (b *bench) printSummary() {
	w := b.stdout
	fmt.Fprintln(w)
	for _, l := range b.ratios() {
		fmt.Fprintln(w, "  "+l)
	}
	for _, c := range b.checks {
		fmt.Fprintln(w, "  check: "+c)
	}
	if b.load != nil {
		fmt.Fprintf(w, "  load tool run (a mixed figure: every answer counts, sold out and group joins too): %.0f answers/s, accepted %d, accept → CONFIRMED p50 %v p99 %v\n",
			b.load.Throughput, b.load.Accepted, b.load.Lag.P50.Round(time.Millisecond), b.load.Lag.P99.Round(time.Millisecond))
	}
	for _, l := range b.partLines() {
		fmt.Fprintln(w, "  "+l)
	}
	for _, fn := range []string{"reserve", "persist", "compensate", "sweeper"} {
		fmt.Fprintf(w, "  cold start %s: first response %v after the emulator started (process start, init, one invocation)\n", fn, b.cold[fn])
	}
	fmt.Fprintln(w)
	for _, r := range b.results { // benchstat-compatible
		name := strings.NewReplacer(" ", "_", ",", "", ".", "", ">=", "ge", ":", "").Replace(r.name)
		group := strings.ReplaceAll(strings.ToUpper(r.group[:1])+r.group[1:], " ", "")
		fmt.Fprintf(w, "Benchmark%s/%s %d %.0f ns/op %.0f ops/s\n", group, name, r.ops, float64(r.elapsed.Nanoseconds())/float64(max(r.ops, 1)), r.rate())
	}
}

func version(cmd string, args ...string) string {
	out, err := exec.Command(cmd, args...).Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
}

// The report's markers and its first line, which says which parts
// writeDoc writes.
const (
	docBegin, docEnd   = "<!-- bench:begin -->", "<!-- bench:end -->"
	headBegin, headEnd = "<!-- headline:begin -->", "<!-- headline:end -->"
	docHeader          = "<!-- Generated in part by `make bench` (cmd/bench): it rewrites what lies between the headline:begin and headline:end markers (the run's goal lines) and between the bench:begin and bench:end markers (the run's figures, docs/benchmarks.png beside it); everything else here is written by hand. -->\n"
)

// goalLines are the summary's lines that set a figure against its goal
// (`<figure> = <value> (goal …)`), in the order the summary prints them.
func goalLines(summary string) []string {
	var out []string
	for _, l := range strings.Split(summary, "\n") {
		if l = strings.TrimSpace(l); strings.Contains(l, " = ") && strings.Contains(l, "(goal ") {
			out = append(out, l)
		}
	}
	return out
}

// spliceBetween replaces what lies between begin and end in doc with gen.
func spliceBetween(doc, begin, end, gen string) (string, error) {
	i, j := strings.Index(doc, begin), strings.Index(doc, end)
	if i < 0 || j < i {
		return "", fmt.Errorf("no %s … %s markers", begin, end)
	}
	return doc[:i] + begin + "\n\n" + gen + "\n" + doc[j:], nil
}

func (b *bench) writeDoc() error {
	var sb strings.Builder
	saved := b.stdout
	b.stdout = &sb
	b.print()
	b.stdout = saved
	table := sb.String()
	doc, err := os.ReadFile(b.o.out)
	if err != nil {
		return err
	}
	var gen strings.Builder
	fmt.Fprintf(&gen, "Measured %s by `make bench` on this machine: %d cores (%s), %s, %s, %s, goaws v0.5.4.\n",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), runtime.NumCPU(), runtime.GOARCH, runtime.Version(),
		version("redis-server", "--version"), version("mariadbd", "--version"))
	fmt.Fprintf(&gen, "Reserve modes: %d clients, %d runs of %v each, the modes in turn, one hot SKU. Persist: a backlog of %d messages, %d consumers (the textbook consumer is cut off after 60 s).\n\n```\n%s```\n\n![load run](benchmarks.png)\n",
		b.o.concurrency, reserveRounds, roundOf(b.o.duration, reserveRounds), b.o.backlog, b.o.consumers, table)
	out, err := spliceDoc(string(doc), gen.String())
	if err != nil {
		return fmt.Errorf("%s: %w", b.o.out, err)
	}
	head := "Every figure with a goal, from the run below:\n\n```\n" + strings.Join(goalLines(table), "\n") + "\n```\n"
	if out, err = spliceBetween(out, headBegin, headEnd, head); err != nil {
		return fmt.Errorf("%s: %w", b.o.out, err)
	}
	return os.WriteFile(b.o.out, []byte(out), 0o644)
}

// spliceDoc puts gen between the report's markers, keeps everything else as
// written, and heads the report with docHeader (once).
func spliceDoc(doc, gen string) (string, error) {
	out, err := spliceBetween(doc, docBegin, docEnd, gen)
	if err != nil {
		return "", err
	}
	return docHeader + strings.TrimPrefix(out, docHeader), nil
}
