package services

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/holdfast/holdfast/shared/reservation"
	"github.com/redis/go-redis/v9"
)

// Cluster is a Redis Cluster of masters on loopback, started by StartCluster.
type Cluster struct {
	Addrs []string // the masters, host:port
	cmds  []*exec.Cmd
}

// StartCluster starts n redis-server --cluster-enabled masters on free
// loopback ports, data under dir, joins them with redis-cli --cluster create
// (slots split evenly, no replicas) and waits until every node reports the
// cluster ok. Stop ends them.
func StartCluster(ctx context.Context, dir string, n int) (*Cluster, error) {
	c := &Cluster{}
	for i := range n {
		port, err := FreePort()
		if err != nil {
			c.Stop()
			return nil, err
		}
		node := filepath.Join(dir, "node"+strconv.Itoa(i))
		args := append(RedisArgs(port, dir), "--cluster-enabled", "yes",
			"--cluster-config-file", node+".conf", "--cluster-node-timeout", "2000", "--dbfilename", filepath.Base(node)+".rdb")
		cmd, err := spawn(node+".log", "redis-server", args...)
		if err != nil {
			c.Stop()
			return nil, err
		}
		c.cmds = append(c.cmds, cmd)
		c.Addrs = append(c.Addrs, "127.0.0.1:"+strconv.Itoa(port))
		if err := waitFor(ctx, "redis-server on "+strconv.Itoa(port), func() error { return redisPing(port) }); err != nil {
			c.Stop()
			return nil, err
		}
	}
	args := append([]string{"--cluster", "create"}, c.Addrs...)
	if out, err := exec.CommandContext(ctx, "redis-cli", append(args, "--cluster-replicas", "0", "--cluster-yes")...).CombinedOutput(); err != nil {
		c.Stop()
		return nil, fmt.Errorf("redis-cli --cluster create: %v\n%s", err, out)
	}
	err := waitFor(ctx, "the cluster's state ok", func() error {
		for _, addr := range c.Addrs {
			node := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second})
			info, err := node.ClusterInfo(ctx).Result()
			_ = node.Close()
			if err != nil {
				return err
			}
			if !strings.Contains(info, "cluster_state:ok") {
				return fmt.Errorf("%s: cluster state not ok yet", addr)
			}
		}
		return nil
	})
	if err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// Stop ends the cluster's servers (only the processes StartCluster started).
func (c *Cluster) Stop() {
	for _, cmd := range c.cmds {
		_ = cmd.Process.Kill()
		_, _ = cmd.Process.Wait()
	}
	c.cmds = nil
}

// SpreadSKU returns the first SKU named prefix-<n> whose k buckets' hash
// tags (reservation.BucketName) sit on k different masters of c: the
// precondition of a test or benchmark of one SKU over k shards.
func SpreadSKU(ctx context.Context, c *redis.ClusterClient, prefix string, k int) (string, error) {
	for i := range 1000 {
		sku := fmt.Sprintf("%s-%d", prefix, i)
		masters := map[string]bool{}
		for b := range k {
			m, err := c.MasterForKey(ctx, "{"+reservation.BucketName(sku, b)+"}") // a key's slot is its hash tag's
			if err != nil {
				return "", err
			}
			masters[m.Options().Addr] = true
		}
		if len(masters) == k {
			return sku, nil
		}
	}
	return "", fmt.Errorf("no SKU named %s-<n> spreads %d buckets over %d masters", prefix, k, k)
}
