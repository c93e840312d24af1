package main

// The buckets part: one hot SKU over K = 1 and K = 3 buckets on a three-shard
// Redis Cluster of its own. Two cores cannot show three shards' wall-clock
// speed-up, so it measures what scales: each shard's server time per reserve
// (INFO commandstats) and how evenly the reserves spread, and projects the
// ceiling for K shards from them.

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/holdfast/holdfast/internal/services"
	"github.com/holdfast/holdfast/shared/app"
	"github.com/holdfast/holdfast/shared/reservation"
	"github.com/redis/go-redis/v9"
)

// shardFigure is one shard's share of a run.
type shardFigure struct {
	addr     string
	scripts  int64   // EVALSHA and EVAL calls: reserves and refills
	calls    int64   // every command
	usec     int64   // time in commands (commandstats: wall time, so a preempted command counts the wait)
	scriptUS int64   // of that, in the scripts
	cpu      float64 // CPU seconds of the main thread (INFO cpu): commands, network I/O and all
}

// bucketRun is one run of the part: K buckets, the reserves taken.
type bucketRun struct {
	k       int
	ops     int64
	elapsed time.Duration
	shards  []shardFigure
}

func (b *bench) buckets(ctx context.Context) error {
	dir, err := os.MkdirTemp("", "holdfast-bench-cluster-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cl, err := services.StartCluster(ctx, dir, 3)
	if err != nil {
		return err
	}
	defer cl.Stop()
	cfg := b.cfg
	cfg.RedisAddr, cfg.RedisCluster = strings.Join(cl.Addrs, ","), true
	svc, err := b.service(ctx, cfg, app.Options{Enqueuer: func(reservation.Enqueuer) reservation.Enqueuer { return nopQueue{} }})
	if err != nil {
		return err
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs})
	defer cc.Close()
	for _, k := range []int{1, 3} {
		sku, err := services.SpreadSKU(ctx, cc, fmt.Sprintf("bench-buckets%d-%d", k, time.Now().UnixNano()), k)
		if err != nil {
			return err
		}
		if _, err := svc.ChangeStock(ctx, reservation.StockChange{SKU: sku, Set: ptr(int64(bigStock)), Buckets: &k}); err != nil {
			return err
		}
		if _, err := svc.Available(ctx, sku); err != nil { // warms every bucket
			return err
		}
		if err := cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return n.ConfigResetStat(ctx).Err() }); err != nil {
			return err
		}
		cpu0 := map[string]float64{}
		for _, addr := range cl.Addrs {
			if cpu0[addr], err = mainThreadCPU(ctx, addr); err != nil {
				return err
			}
		}
		b.log("buckets: K = %d …", k)
		ops, el, lat, err := hammer(b.o.concurrency, b.o.duration, func(w, i int) error {
			_, _, err := svc.Reserve(ctx, reservation.ReserveRequest{SKU: sku, Qty: 1, UserID: fmt.Sprintf("b%d-%d-%d", k, w, i)})
			return err
		})
		if err != nil {
			return fmt.Errorf("buckets K=%d: %w", k, err)
		}
		run := bucketRun{k: k, ops: ops, elapsed: el}
		for _, addr := range cl.Addrs {
			f, err := commandStats(ctx, addr)
			if err != nil {
				return err
			}
			cpu, err := mainThreadCPU(ctx, addr)
			if err != nil {
				return err
			}
			f.cpu = cpu - cpu0[addr]
			run.shards = append(run.shards, f)
		}
		avail, err := svc.Available(ctx, sku)
		if err != nil {
			return err
		}
		if avail != bigStock-ops {
			return fmt.Errorf("buckets K=%d: %d available after %d reserves of %d: a unit lost or taken twice", k, avail, ops, bigStock)
		}
		b.checks = append(b.checks, fmt.Sprintf("buckets K=%d: %d taken, the buckets' sum moved by exactly %d", k, ops, ops))
		b.results = append(b.results, result{group: "buckets", name: fmt.Sprintf("reserve, K = %d on 3 shards (2 cores)", k), ops: ops, elapsed: el, lat: lat})
		b.bucketRuns = append(b.bucketRuns, run)
	}
	return b.drySale(ctx, svc, cc)
}

// drySale sells a K = 3 SKU of few units to twice as many buyers, so that
// home buckets run dry, and counts the MySQL statements the buyers' path
// sent (MariaDB's Questions; persist does not run here: the queue is a
// no-op), per reserve.
func (b *bench) drySale(ctx context.Context, svc *reservation.Service, cc *redis.ClusterClient) error {
	const k, units, buyers = 3, 300, 600
	sku, err := services.SpreadSKU(ctx, cc, fmt.Sprintf("bench-dry-%d", time.Now().UnixNano()), k)
	if err != nil {
		return err
	}
	if _, err := svc.ChangeStock(ctx, reservation.StockChange{SKU: sku, Set: ptr(int64(units)), Buckets: ptr(k)}); err != nil {
		return err
	}
	if _, err := svc.Available(ctx, sku); err != nil { // warms every bucket
		return err
	}
	questions := func() (int64, error) {
		var name string
		var n int64
		err := b.app.DB.QueryRowContext(ctx, `SHOW GLOBAL STATUS LIKE 'Questions'`).Scan(&name, &n)
		return n, err
	}
	q0, err := questions()
	if err != nil {
		return err
	}
	var mu sync.Mutex
	accepted := 0
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for i := range buyers {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			_, _, err := svc.Reserve(ctx, reservation.ReserveRequest{SKU: sku, Qty: 1, UserID: fmt.Sprintf("dry-%d", i)})
			if err == nil {
				mu.Lock()
				accepted++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	q1, err := questions()
	if err != nil {
		return err
	}
	if accepted != units {
		return fmt.Errorf("buckets dry sale: %d accepted of %d units", accepted, units)
	}
	b.dry = fmt.Sprintf("a K = 3 sale of %d units to %d buyers (home buckets run dry): %d MySQL statements on the buyers' path, %.2f per reserve",
		units, buyers, q1-q0-1, float64(q1-q0-1)/buyers)
	return nil
}

func ptr[T any](v T) *T { return &v }

// mainThreadCPU reads the CPU seconds a node's main thread has used.
func mainThreadCPU(ctx context.Context, addr string) (float64, error) {
	n := redis.NewClient(&redis.Options{Addr: addr})
	defer n.Close()
	info, err := n.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, err
	}
	var sum float64
	for _, line := range strings.Split(info, "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		if k == "used_cpu_user_main_thread" || k == "used_cpu_sys_main_thread" {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: %s %q: %w", addr, k, v, err)
			}
			sum += f
		}
	}
	return sum, nil
}

// commandStats reads a node's INFO commandstats.
func commandStats(ctx context.Context, addr string) (shardFigure, error) {
	n := redis.NewClient(&redis.Options{Addr: addr})
	defer n.Close()
	return commandStatsOf(ctx, n, addr)
}

// commandStatsOf reads INFO commandstats through n, the node at addr.
func commandStatsOf(ctx context.Context, n *redis.Client, addr string) (shardFigure, error) {
	info, err := n.Info(ctx, "commandstats").Result()
	if err != nil {
		return shardFigure{}, err
	}
	f := shardFigure{addr: addr}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		var calls, usec int64
		for _, kv := range strings.Split(rest, ",") {
			key, v, _ := strings.Cut(kv, "=")
			switch key {
			case "calls":
				calls, _ = strconv.ParseInt(v, 10, 64)
			case "usec":
				usec, _ = strconv.ParseInt(v, 10, 64)
			}
		}
		f.calls += calls
		f.usec += usec
		if name == "cmdstat_evalsha" || name == "cmdstat_eval" {
			f.scripts += calls
			f.scriptUS += usec
		}
	}
	return f, nil
}

// bucketLines reports the runs: the spread over the shards, each shard's
// main-thread CPU and command time per reserve, and the projected ceiling
// for K shards.
func (b *bench) bucketLines() []string {
	if len(b.bucketRuns) == 0 {
		return nil
	}
	out := []string{"one hot SKU over K buckets on a 3-shard Redis Cluster (INFO cpu and commandstats per shard):"}
	if b.dry != "" {
		out = append(out, "  "+b.dry)
	}
	var cpuPer, evenness float64 // at K = 3: main-thread CPU µs per reserve on a shard; mean/max shard load
	for _, r := range b.bucketRuns {
		var cpu, most float64
		var usec, scripts int64
		for _, s := range r.shards {
			cpu += s.cpu
			usec += s.usec
			scripts += s.scripts
			most = max(most, s.cpu)
		}
		shares := make([]string, len(r.shards))
		for i, s := range r.shards {
			shares[i] = fmt.Sprintf("%.0f%%", 100*s.cpu/max(cpu, 1e-9))
		}
		per := 1e6 * cpu / float64(max(r.ops, 1))
		out = append(out, fmt.Sprintf("  K = %d: %d reserves; per reserve %.1f µs of shard main-thread CPU, %.1f µs in commands; %d script calls; shards' shares of the CPU %s",
			r.k, r.ops, per, float64(usec)/float64(max(r.ops, 1)), scripts, strings.Join(shares, " / ")))
		if r.k == 3 {
			cpuPer, evenness = per, cpu/float64(len(r.shards))/max(most, 1e-9)
		}
	}
	if cpuPer == 0 {
		return out
	}
	perShard := 1e6 / cpuPer
	out = append(out, fmt.Sprintf("  at K = 3: mean/max shard load %.2f; one shard's thread, busy with nothing else, does ≈ %.0fk reserves/s (1 s / %.1f µs)",
		evenness, perShard/1000, cpuPer))
	if floor, ok := b.find(modeFloor); ok {
		out = append(out, fmt.Sprintf("  (the raw script floor above, one shard with the client on the same 2 cores: %.0fk/s)", floor.rate()/1000))
	}
	out = append(out, "  projected ceiling of one hot SKU, K = shards, from that and the spread:")
	for _, shards := range []int{1, 3, 6, 12, 24} {
		out = append(out, fmt.Sprintf("    %2d shards: ≈ %6.0fk reserves/s", shards, perShard*float64(shards)*min(1, evenness)/1000))
	}
	return out
}
