package main

// The script part: reserve.lua's Redis time per call (INFO commandstats,
// usec per EVALSHA) against a bare hold's and a textbook check-and-DECRBY's,
// in the same run, with every feature of reserve on: the sale window, the
// attempt budget, the per-user limit, the deadline index and a waiting-room
// admission. On a standalone redis-server of its own (idle but for this),
// and at K = 3 on a 3-shard Redis Cluster of its own. One SKU's ceiling on
// one shard is 1 s divided by its script's Redis time.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/holdfast/holdfast/internal/services"
	"github.com/holdfast/holdfast/shared/adapters/redisstore"
	"github.com/holdfast/holdfast/shared/reservation"
	"github.com/redis/go-redis/v9"
)

// The baselines: a bare hold (the least a hold with a deadline index can
// be: GET, DECRBY, HSET of 5 fields, ZADD) and the textbook
// check-and-DECRBY. KEYS: stock, hold, exp (reserve's KEYS[1], KEYS[5],
// KEYS[3]); ARGV: sku, id, qty, user, deadline (unix ms).
const (
	bareHoldLua = `local stock = redis.call('GET', KEYS[1])
if not stock or tonumber(stock) < tonumber(ARGV[3]) then return 0 end
redis.call('DECRBY', KEYS[1], ARGV[3])
redis.call('HSET', KEYS[2], 'sku', ARGV[1], 'qty', ARGV[3], 'user', ARGV[4], 'state', 'HELD', 'deadline', ARGV[5])
redis.call('ZADD', KEYS[3], ARGV[5], ARGV[2])
return 1`
	textbookLua = `local stock = redis.call('GET', KEYS[1])
if not stock or tonumber(stock) < tonumber(ARGV[3]) then return 0 end
redis.call('DECRBY', KEYS[1], ARGV[3])
return 1`
)

// scriptRounds is how many times each script runs in turn: their figures
// are the sums, so a neighbour's burst of CPU weighs on all three alike.
const scriptRounds = 6

// scriptSale is the sale of the part's SKUs: every feature of reserve on.
var scriptSale = func(now time.Time) reservation.StockLevel {
	return reservation.StockLevel{Available: bigStock, Version: 1, PerUserLimit: 5, UserRate: 5, UserBurst: 10,
		OpensAt: now.Add(-time.Hour), ClosesAt: now.Add(time.Hour), AdmitPermille: 1000}
}

// reserveSource is the reserve script the part measures.
var reserveSource = redisstore.ReserveLua

// scriptFigure is one place's measurement: µs of Redis time per call.
type scriptFigure struct {
	where, label            string // label: what the summary line names after "bare hold"
	reserve, bare, textbook float64
	calls                   int64 // reserve calls measured
}

// scriptCost measures on a standalone redis-server started here, then at
// K = 3 on a 3-shard cluster started here (one bucket a shard).
func (b *bench) scriptCost(ctx context.Context) error {
	dir, err := os.MkdirTemp("", "holdfast-bench-script-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	addr, stop, err := startRedis(ctx, dir)
	if err != nil {
		return err
	}
	defer stop()
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: b.o.concurrency})
	defer c.Close()
	b.log("script: one standalone redis-server …")
	f, err := measureScripts(ctx, c, []string{addr}, b.o.concurrency, b.o.duration, 1, func(prefix string) (string, error) { return prefix, nil })
	if err != nil {
		return err
	}
	f.where = "one standalone redis-server"
	b.scriptRuns = append(b.scriptRuns, f)

	if err := os.Mkdir(filepath.Join(dir, "cluster"), 0o755); err != nil {
		return err
	}
	cl, err := services.StartCluster(ctx, filepath.Join(dir, "cluster"), 3)
	if err != nil {
		return err
	}
	defer cl.Stop()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs, PoolSize: b.o.concurrency})
	defer cc.Close()
	b.log("script: K = 3 on a 3-shard cluster …")
	f, err = measureScripts(ctx, cc, cl.Addrs, b.o.concurrency, b.o.duration, 3, func(prefix string) (string, error) {
		return services.SpreadSKU(ctx, cc, prefix, 3)
	})
	if err != nil {
		return err
	}
	f.where, f.label = "a 3-shard Redis Cluster, one bucket a shard", ", K = 3 on a 3-shard Redis Cluster"
	b.scriptRuns = append(b.scriptRuns, f)
	return nil
}

// startRedis starts a redis-server on a free loopback port, data in dir;
// stop ends it (that process only).
func startRedis(ctx context.Context, dir string) (string, func(), error) {
	port, err := services.FreePort()
	if err != nil {
		return "", nil, err
	}
	log, err := os.Create(filepath.Join(dir, "redis.log"))
	if err != nil {
		return "", nil, err
	}
	defer log.Close()
	cmd := exec.Command("redis-server", services.RedisArgs(port, dir)...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return "", nil, fmt.Errorf("start redis-server: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	stop := func() { _ = cmd.Process.Kill(); <-exited }
	addr := "127.0.0.1:" + strconv.Itoa(port)
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	for deadline := time.Now().Add(30 * time.Second); ; {
		if c.Ping(ctx).Err() == nil {
			return addr, stop, nil
		}
		select {
		case <-exited:
			tail, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
			return "", nil, fmt.Errorf("redis-server on %d exited:\n%s", port, tail)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			stop()
			return "", nil, fmt.Errorf("redis-server on %d did not answer", port)
		}
	}
}

// scriptRun is one run of the script part: a script on a fresh SKU of k
// buckets, every feature on.
type scriptRun struct {
	c       redis.UniversalClient
	script  *redis.Script
	reserve bool // the script is reserve.lua (else a baseline: KEYS stock, hold, exp)
	sku     string
	k       int
	now     time.Time
}

// call makes call i of worker w: a unique id, buyer and admitted ticket, in
// bucket (w + i) mod k. reserve.lua must hold; a baseline must answer 1.
func (r scriptRun) call(ctx context.Context, w, i int) error {
	res := reservation.Reservation{ID: fmt.Sprintf("s%d-%d", w, i), SKU: r.sku, Bucket: (w + i) % r.k, Qty: 1, UserID: fmt.Sprintf("u%d-%d", w, i), Token: "t",
		Ticket: fmt.Sprintf("k%d-%d", w, i), TicketExpires: r.now.Add(time.Hour)}
	keys := redisstore.ReserveKeys(res)
	args := redisstore.ReserveArgs(res, time.Minute, 0, 0)
	if !r.reserve {
		keys = []string{keys[0], keys[4], keys[2]}
		args = []any{res.SKU, res.ID, res.Qty, res.UserID, r.now.Add(time.Minute).UnixMilli()}
	}
	var cmd *redis.Cmd
	if _, err := r.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		if r.reserve { // the admission, outside the measured command
			p.ZAdd(ctx, keys[8], redis.Z{Score: float64(r.now.UnixMilli()), Member: res.Ticket})
		}
		cmd = r.script.EvalSha(ctx, p, keys, args...)
		return nil
	}); err != nil {
		return err
	}
	if r.reserve {
		if out, _ := cmd.StringSlice(); len(out) != 5 || out[0] != "OK" {
			return fmt.Errorf("reserve script: %v", out)
		}
	} else if n, _ := cmd.Int(); n != 1 {
		return fmt.Errorf("a baseline script answered %v", cmd.Val())
	}
	return nil
}

// warm sets up the run's SKU, every feature on. Its admitted sets hold a
// ticket nobody uses and live 7 days, as queue.lua leaves them (a set the
// script empties would lose its TTL, which no sale does).
func (r scriptRun) warm(ctx context.Context) error {
	for bk := range r.k {
		lvl := scriptSale(r.now)
		lvl.SKU = reservation.BucketName(r.sku, bk)
		if _, err := redisstore.New(r.c, 0).Warm(ctx, lvl, nil, nil); err != nil {
			return err
		}
		admitted := redisstore.ReserveKeys(reservation.Reservation{SKU: r.sku, Bucket: bk})[8]
		if err := r.c.ZAdd(ctx, admitted, redis.Z{Score: float64(r.now.UnixMilli()), Member: "bench-idle"}).Err(); err != nil {
			return err
		}
		if err := r.c.Expire(ctx, admitted, 7*24*time.Hour).Err(); err != nil {
			return err
		}
	}
	return nil
}

// measureScripts runs reserve.lua, the bare hold and the textbook script in
// turn, scriptRounds times, conc clients each for d/scriptRounds, each run
// on a fresh SKU of k buckets (newSKU names it from a prefix, its buckets
// spread over the shards). It reads the EVALSHA time of every node in addrs
// after each run, the stats reset before it.
func measureScripts(ctx context.Context, c redis.UniversalClient, addrs []string, conc int, d time.Duration, k int, newSKU func(prefix string) (string, error)) (scriptFigure, error) {
	var f scriptFigure
	scripts := []*redis.Script{redis.NewScript(reserveSource), redis.NewScript(bareHoldLua), redis.NewScript(textbookLua)}
	for _, s := range scripts {
		if err := loadEverywhere(ctx, s, addrs); err != nil {
			return f, err
		}
	}
	nodes := make([]*redis.Client, len(addrs))
	for i, a := range addrs {
		nodes[i] = redis.NewClient(&redis.Options{Addr: a})
		defer nodes[i].Close()
	}
	now := time.Now()
	var calls [3]int64
	var usec [3]float64
	for round := range scriptRounds {
		for i, s := range scripts {
			sku, err := newSKU(fmt.Sprintf("bench-script-%d-%d-%d", now.UnixNano(), i, round))
			if err != nil {
				return f, err
			}
			r := scriptRun{c: c, script: s, reserve: i == 0, sku: sku, k: k, now: now}
			if err := r.warm(ctx); err != nil {
				return f, err
			}
			for _, n := range nodes {
				if err := n.ConfigResetStat(ctx).Err(); err != nil {
					return f, err
				}
			}
			if _, _, _, err := hammer(conc, d/scriptRounds, func(w, j int) error { return r.call(ctx, w, j) }); err != nil {
				return f, err
			}
			for _, n := range nodes {
				st, err := commandStatsOf(ctx, n, "")
				if err != nil {
					return f, err
				}
				calls[i] += st.scripts
				usec[i] += float64(st.scriptUS)
			}
		}
	}
	if calls[0] == 0 || calls[1] == 0 || calls[2] == 0 {
		return f, errors.New("script part: no calls measured")
	}
	f.reserve, f.bare, f.textbook, f.calls = usec[0]/float64(calls[0]), usec[1]/float64(calls[1]), usec[2]/float64(calls[2]), calls[0]
	return f, nil
}

// loadEverywhere loads s on every node.
func loadEverywhere(ctx context.Context, s *redis.Script, addrs []string) error {
	for _, a := range addrs {
		n := redis.NewClient(&redis.Options{Addr: a})
		err := s.Load(ctx, n).Err()
		n.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// scriptLines are the part's summary lines, one a place.
func (b *bench) scriptLines() []string {
	var out []string
	for _, f := range b.scriptRuns {
		out = append(out, fmt.Sprintf("reserve script / bare hold%s = %.2f× (goal ≤ 1.5×): reserve.lua %.1f µs of Redis time per call, bare hold %.1f µs (textbook check-and-DECRBY %.1f µs); on %s, every feature on (window, attempt budget, per-user limit, deadline index, admission), %d clients, %d reserve calls, INFO commandstats",
			f.label, f.reserve/f.bare, f.reserve, f.bare, f.textbook, f.where, b.o.concurrency, f.calls))
	}
	return out
}
