package services

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
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
	nodes []clusterNode
}

// clusterNode is one redis-server StartCluster started; exited is closed
// when it has exited.
type clusterNode struct {
	cmd    *exec.Cmd
	exited chan struct{}
}

// StartCluster starts n redis-server --cluster-enabled masters on free
// loopback ports, data under dir, joins them with redis-cli --cluster create
// (slots split evenly, no replicas) and waits until every node reports the
// cluster ok. Stop ends them.
func StartCluster(ctx context.Context, dir string, n int) (*Cluster, error) {
	return startCluster(ctx, dir, n, nil, nil)
}

// TLSFiles are a server's certificate and key and the CA that signed them,
// as PEM files.
type TLSFiles struct {
	CAFile, CertFile, KeyFile string
}

// StartTLSCluster is StartCluster with TLS on every connection, as
// ElastiCache's in-transit encryption has it: each master serves TLS only
// (--port 0), the cluster bus and replication use TLS, every server
// presents files' certificate and asks clients for none. extra goes to every
// redis-server (--cluster-announce-hostname, say). Addrs are the TLS ports.
func StartTLSCluster(ctx context.Context, dir string, n int, files TLSFiles, extra ...string) (*Cluster, error) {
	return startCluster(ctx, dir, n, &files, extra)
}

func startCluster(ctx context.Context, dir string, n int, files *TLSFiles, extra []string) (*Cluster, error) {
	var tlsCfg *tls.Config
	var cliTLS []string
	if files != nil {
		var err error
		if tlsCfg, err = chainOnly(files.CAFile); err != nil {
			return nil, err
		}
		cliTLS = []string{"--tls", "--cacert", files.CAFile}
	}
	c := &Cluster{}
	for i := range n {
		node := filepath.Join(dir, "node"+strconv.Itoa(i))
		// A free port may be taken by someone else before redis-server binds
		// it (the cluster bus's port too): a node that exits before it
		// answers is started again on other ports.
		var err error
		for attempt := 0; attempt < 5; attempt++ {
			if err = c.startNode(ctx, node, files, tlsCfg, extra); !errors.Is(err, errExited) {
				break
			}
		}
		if err != nil {
			c.Stop()
			return nil, err
		}
	}
	// redis-cli waits for the nodes to meet for as long as it takes: a
	// cluster bus that cannot connect would hang here.
	create, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	args := append(append(cliTLS, "--cluster", "create"), c.Addrs...)
	if out, err := exec.CommandContext(create, "redis-cli", append(args, "--cluster-replicas", "0", "--cluster-yes")...).CombinedOutput(); err != nil {
		c.Stop()
		return nil, fmt.Errorf("redis-cli --cluster create: %v\n%s", err, out)
	}
	err := waitFor(ctx, "the cluster's state ok", func() error {
		for _, addr := range c.Addrs {
			node := nodeClient(addr, tlsCfg)
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

// nodeClient is a client of one node, for StartCluster's own checks.
func nodeClient(addr string, tlsCfg *tls.Config) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second, TLSConfig: tlsCfg})
}

// chainOnly is the TLS configuration of StartCluster's readiness checks:
// the server's certificate must chain to caFile, whatever names it holds
// (the names are what the tests of a TLS cluster check, with clients of
// their own).
func chainOnly(caFile string) (*tls.Config, error) {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s: no certificate", caFile)
	}
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		InsecureSkipVerify: true, // the chain is verified below; the name is not this check's business
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			certs := make([]*x509.Certificate, len(raw))
			for i, der := range raw {
				c, err := x509.ParseCertificate(der)
				if err != nil {
					return err
				}
				certs[i] = c
			}
			inter := x509.NewCertPool()
			for _, c := range certs[1:] {
				inter.AddCert(c)
			}
			_, err := certs[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter})
			return err
		},
	}, nil
}

// Stop ends the cluster's servers (only the processes StartCluster started).
func (c *Cluster) Stop() {
	for _, n := range c.nodes {
		_ = n.cmd.Process.Kill()
		<-n.exited
	}
	c.nodes = nil
}

// errExited is a server that exited before it answered.
var errExited = errors.New("exited before it answered")

// startNode starts one cluster-enabled redis-server on free ports (its
// clients' and its cluster bus's), data and log beside node, and waits until
// it answers; errExited when it exits first (a port taken meanwhile).
func (c *Cluster) startNode(ctx context.Context, node string, files *TLSFiles, tlsCfg *tls.Config, extra []string) error {
	port, bus, err := pickPorts()
	if err != nil {
		return err
	}
	args := append(RedisArgs(port, filepath.Dir(node)), "--cluster-enabled", "yes", "--cluster-port", strconv.Itoa(bus),
		"--cluster-config-file", node+".conf", "--cluster-node-timeout", "2000", "--dbfilename", filepath.Base(node)+".rdb")
	if files != nil {
		args = append(args, "--port", "0", "--tls-port", strconv.Itoa(port),
			"--tls-cert-file", files.CertFile, "--tls-key-file", files.KeyFile, "--tls-ca-cert-file", files.CAFile,
			"--tls-auth-clients", "no", "--tls-cluster", "yes", "--tls-replication", "yes")
	}
	_ = os.Remove(node + ".conf") // a failed attempt's, naming its ports
	cmd, err := spawn(node+".log", "redis-server", append(args, extra...)...)
	if err != nil {
		return err
	}
	n := clusterNode{cmd: cmd, exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(n.exited) }()
	addr := "127.0.0.1:" + strconv.Itoa(port)
	ping := func() error { return redisPing(port) }
	if files != nil {
		ping = func() error {
			node := nodeClient(addr, tlsCfg)
			defer node.Close()
			return node.Ping(ctx).Err()
		}
	}
	err = waitFor(ctx, "redis-server on "+strconv.Itoa(port), func() error {
		select {
		case <-n.exited:
			tail, _ := os.ReadFile(node + ".log")
			return fmt.Errorf("redis-server on %d: %w\n%s", port, errExited, lastLines(string(tail), 5))
		default:
			return ping()
		}
	})
	if errors.Is(err, errExited) {
		return err
	}
	c.nodes = append(c.nodes, n) // Stop ends it, answering or not
	if err != nil {
		return err
	}
	c.Addrs = append(c.Addrs, addr)
	return nil
}

// pickPorts chooses a node's ports (a test's hook).
var pickPorts = freePorts

// freePorts are two different free loopback ports.
func freePorts() (int, int, error) {
	a, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, 0, err
	}
	defer a.Close()
	b, err := FreePort()
	if err != nil {
		return 0, 0, err
	}
	return a.Addr().(*net.TCPAddr).Port, b, nil
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
