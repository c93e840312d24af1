package app

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/config"
	"github.com/redis/go-redis/v9"
)

// tlsCluster is one local TLS cluster of TestRedisClusterTLS and what the
// production client must make of it.
type tlsCluster struct {
	Name    string
	Seed    string // HOLDFAST_REDIS_ADDR, as the configuration endpoint
	Refused bool   // a node's certificate does not name the address CLUSTER SLOTS gives for it
}

// The Redis client of the functions, in cluster mode with TLS, verifies
// each node's certificate against the address CLUSTER SLOTS announces for
// that node, not against the configuration endpoint it was given: it
// reaches every master of a cluster that announces 127.0.0.1 with a
// certificate for 127.0.0.1, and of one that announces hostnames (as
// ElastiCache does with in-transit encryption) with a certificate for the
// hostname only; and it refuses a cluster whose certificates name the
// seed's host (localhost) but not the announced 127.0.0.1, instead of
// skipping the check.
func TestRedisClusterTLS(t *testing.T) {
	loopback := []net.IP{net.IPv4(127, 0, 0, 1)}
	both := testservices.NewCerts(t, loopback, []string{"localhost"})
	nameOnly := testservices.NewCerts(t, nil, []string{"localhost"})
	nameOnly2 := testservices.NewCerts(t, nil, []string{"localhost"})
	byHostname := []string{"--cluster-announce-hostname", "localhost", "--cluster-preferred-endpoint-type", "hostname"}

	ips := testservices.StartTLSCluster(t, both)
	hosts := testservices.StartTLSCluster(t, nameOnly, byHostname...)
	wrong := testservices.StartTLSCluster(t, nameOnly2)
	asLocalhost := func(addr string) string {
		_, port, _ := net.SplitHostPort(addr)
		return "localhost:" + port
	}
	clusters := []tlsCluster{
		{Name: "nodes announced by IP, certificates for the IP", Seed: ips[0]},
		{Name: "nodes announced by hostname, certificates for the hostname only", Seed: asLocalhost(hosts[0])},
		{Name: "nodes announced by IP, certificates for the seed's hostname only", Seed: asLocalhost(wrong[0]), Refused: true},
	}

	// The client trusts the runtime's roots only; a child process trusts
	// the test CAs through SSL_CERT_FILE, as Lambda trusts ElastiCache's.
	var bundle []byte
	for _, c := range []testservices.Certs{both, nameOnly, nameOnly2} {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			t.Fatal(err)
		}
		bundle = append(bundle, pem...)
	}
	cas := filepath.Join(t.TempDir(), "cas.pem")
	if err := os.WriteFile(cas, bundle, 0o600); err != nil {
		t.Fatal(err)
	}
	runTrusting(t, cas, "TestRedisClusterTLSWithTheCATrusted", "HOLDFAST_CLUSTER_TLS_CHECK", clusters)
}

// TestRedisClusterTLSWithTheCATrusted runs in the child process that
// TestRedisClusterTLS starts with SSL_CERT_FILE naming the test CAs.
func TestRedisClusterTLSWithTheCATrusted(t *testing.T) {
	raw := os.Getenv("HOLDFAST_CLUSTER_TLS_CHECK")
	if raw == "" {
		t.Skip("runs inside TestRedisClusterTLS, with the test CAs trusted")
	}
	var clusters []tlsCluster
	if err := json.Unmarshal([]byte(raw), &clusters); err != nil {
		t.Fatal(err)
	}
	for _, c := range clusters {
		t.Run(c.Name, func(t *testing.T) {
			err := writeEveryMaster(t, c.Seed)
			var wrongName x509.HostnameError
			refused := errors.As(err, &wrongName) || strings.Contains(fmt.Sprint(err), "certificate is valid for")
			switch {
			case c.Refused && !refused:
				t.Errorf("a write through %s = %v, want it refused: the certificate does not name the node's announced address", c.Seed, err)
			case !c.Refused && err != nil:
				t.Errorf("a write to every master through %s = %v, want each node's certificate verified", c.Seed, err)
			}
		})
	}
}

// writeEveryMaster builds the functions' Redis client from the environment
// that the template gives them in cluster mode with in-transit encryption,
// seeded with seed, and writes keys until every master holds one; it
// returns the first error.
func writeEveryMaster(t *testing.T, seed string) error {
	t.Helper()
	ctx := context.Background()
	env := map[string]string{
		"HOLDFAST_REDIS_ADDR": seed, "HOLDFAST_REDIS_CLUSTER": "true", "HOLDFAST_REDIS_TLS": "true",
		"HOLDFAST_DB_DSN": "unused:unused@tcp(127.0.0.1:1)/unused",
	}
	cfg, err := config.Load(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	rdb, err := redisClient(ctx, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	cluster, ok := rdb.(*redis.ClusterClient)
	if !ok {
		t.Fatalf("HOLDFAST_REDIS_CLUSTER=true built a %T, want a cluster client", rdb)
	}
	// Keys in every third of the slots: each lands on its own master,
	// reached at the address CLUSTER SLOTS gives for it.
	for i := range 30 {
		if err := cluster.Set(ctx, fmt.Sprintf("tls-check-%d", i), i, 0).Err(); err != nil {
			return err
		}
	}
	var masters atomic.Int32 // ForEachMaster runs fn on every master at once
	err = cluster.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
		n, err := node.DBSize(ctx).Result()
		if err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("master %s holds none of the keys", node.Options().Addr)
		}
		masters.Add(1)
		return nil
	})
	if err == nil && masters.Load() != 3 {
		err = fmt.Errorf("reached %d masters, want 3", masters.Load())
	}
	return err
}
