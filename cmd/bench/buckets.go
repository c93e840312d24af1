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
	"time"

	"github.com/holdfast/holdfast/internal/services"
	"github.com/holdfast/holdfast/shared/app"
	"github.com/holdfast/holdfast/shared/reservation"
	"github.com/redis/go-redis/v9"
)

// shardFigure is one shard's share of a run.
type shardFigure struct {
	addr     string
	scripts  int64 // EVALSHA and EVAL calls: reserves and refills
	calls    int64 // every command
	usec     int64 // server time of every command
	scriptUS int64 // server time of the scripts
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
		sku, err := spreadSKU(ctx, cc, fmt.Sprintf("bench-buckets%d-%d", k, time.Now().UnixNano()), k)
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
	return nil
}

func ptr[T any](v T) *T { return &v }

// spreadSKU returns a SKU named after prefix whose k buckets sit on k
// different masters.
func spreadSKU(ctx context.Context, c *redis.ClusterClient, prefix string, k int) (string, error) {
	for i := range 1000 {
		sku := fmt.Sprintf("%s-%d", prefix, i)
		masters := map[string]bool{}
		for bk := range k {
			m, err := c.MasterForKey(ctx, "hf:{"+reservation.BucketName(sku, bk)+"}:stock")
			if err != nil {
				return "", err
			}
			masters[m.Options().Addr] = true
		}
		if len(masters) == k {
			return sku, nil
		}
	}
	return "", fmt.Errorf("no SKU named %s-<n> spreads over %d masters", prefix, k)
}

// commandStats reads a node's INFO commandstats.
func commandStats(ctx context.Context, addr string) (shardFigure, error) {
	n := redis.NewClient(&redis.Options{Addr: addr})
	defer n.Close()
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

// bucketLines reports the runs: the spread over the shards, the server time
// per reserve, and the projected ceiling for K shards.
func (b *bench) bucketLines() []string {
	if len(b.bucketRuns) == 0 {
		return nil
	}
	out := []string{"one hot SKU over K buckets on a 3-shard Redis Cluster (INFO commandstats per shard):"}
	var perReserve float64 // server µs per reserve, summed over the shards, at K = 3
	var evenness float64
	for _, r := range b.bucketRuns {
		var usec, scripts int64
		var most int64
		for _, s := range r.shards {
			usec += s.usec
			scripts += s.scripts
			most = max(most, s.usec)
		}
		shares := make([]string, len(r.shards))
		for i, s := range r.shards {
			shares[i] = fmt.Sprintf("%.0f%%", 100*float64(s.usec)/float64(max(usec, 1)))
		}
		per := float64(usec) / float64(max(r.ops, 1))
		mean := float64(usec) / float64(len(r.shards))
		out = append(out, fmt.Sprintf("  K = %d: %d reserves, %.1f µs of server time each (all shards), %d script calls; shards' shares of the time %s",
			r.k, r.ops, per, scripts, strings.Join(shares, " / ")))
		if r.k == 3 {
			perReserve, evenness = per, mean/float64(max(most, 1))
		}
	}
	if perReserve == 0 {
		return out
	}
	floor, ok := b.find(modeFloor)
	perShard := 1e6 / perReserve // command time alone: an upper bound
	basis := "command time alone (an upper bound: network I/O is not in commandstats)"
	if ok {
		perShard, basis = floor.rate(), "the raw script floor measured above on one shard"
	}
	out = append(out, fmt.Sprintf("  spread at K = 3: mean/max shard time = %.2f; projected ceiling of one hot SKU, from %s:", evenness, basis))
	for _, shards := range []int{1, 3, 6, 12, 24} {
		out = append(out, fmt.Sprintf("    %2d shards (K = %2d): ≈ %6.0fk reserves/s", shards, shards, perShard*float64(shards)*min(1, evenness)/1000))
	}
	return out
}
