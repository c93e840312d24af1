// Package testservices gives integration tests isolated pieces of the real
// local servers that scripts/services.sh starts (redis-server, MariaDB, the
// SQS-API server): a fresh migrated database, uniquely named queues and keys.
//
// The servers are found through the environment file that services.sh
// writes (make test exports it). When they are absent the tests skip, unless
// HOLDFAST_REQUIRE_SERVICES=1 (set by make test and CI), where they fail.
package testservices

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"database/sql"
	"encoding/hex"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/go-sql-driver/mysql"
	"github.com/holdfast/holdfast/internal/services"
	"github.com/holdfast/holdfast/internal/testkit/awstest"
	"github.com/holdfast/holdfast/shared/adapters/eventbus"
	"github.com/holdfast/holdfast/shared/adapters/mysqlstore"
	"github.com/holdfast/holdfast/shared/adapters/queue"
	"github.com/holdfast/holdfast/shared/awsjson"
	"github.com/redis/go-redis/v9"
)

// Env holds what services.sh started.
type Env struct {
	RedisAddr   string
	AdminDSN    string // no database selected; may create holdfast* databases
	SQSEndpoint string
}

// Require returns the running services or skips (fails under
// HOLDFAST_REQUIRE_SERVICES=1) when they are not there.
func Require(t testing.TB) Env {
	t.Helper()
	e := Env{
		RedisAddr:   os.Getenv("HOLDFAST_REDIS_ADDR"),
		AdminDSN:    os.Getenv("HOLDFAST_DB_ADMIN_DSN"),
		SQSEndpoint: os.Getenv("AWS_ENDPOINT_URL_SQS"),
	}
	if e.RedisAddr == "" || e.AdminDSN == "" || e.SQSEndpoint == "" {
		if os.Getenv("HOLDFAST_REQUIRE_SERVICES") == "1" {
			t.Fatal("integration services are required but HOLDFAST_REDIS_ADDR, HOLDFAST_DB_ADMIN_DSN or AWS_ENDPOINT_URL_SQS is unset; run `make test`")
		}
		t.Skip("integration services not running; `make test` starts them")
	}
	return e
}

// Name returns a name unique to this test run, safe for SKUs, queues and databases.
func Name(prefix string) string {
	var b [5]byte
	_, _ = rand.Read(b[:])
	return prefix + "_" + hex.EncodeToString(b[:])
}

// Redis returns a client of the test Redis, closed at the end of the test.
func (e Env) Redis(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: e.RedisAddr, PoolSize: 64})
	t.Cleanup(func() { _ = c.Close() })
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("redis ping: %v", err)
	}
	return c
}

// Database creates a fresh database, applies the migrations and returns its
// DSN; the database is dropped at the end of the test.
func (e Env) Database(t testing.TB) string {
	t.Helper()
	dsn := e.EmptyDatabase(t)
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatalf("open db: %v", err)
	}
	defer db.Close()
	if _, err := mysqlstore.Migrate(context.Background(), db); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return dsn
}

// EmptyDatabase creates a fresh database without a schema and returns its
// DSN; the database is dropped at the end of the test.
func (e Env) EmptyDatabase(t testing.TB) string {
	t.Helper()
	ctx := context.Background()
	admin, err := sql.Open("mysql", e.AdminDSN)
	if err != nil {
		t.Fatalf("open admin db: %v", err)
	}
	t.Cleanup(func() { _ = admin.Close() })
	name := Name("holdfast_t")
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE `"+name+"` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci"); err != nil {
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() { _, _ = admin.ExecContext(context.Background(), "DROP DATABASE `"+name+"`") })
	cfg, err := mysql.ParseDSN(e.AdminDSN)
	if err != nil {
		t.Fatalf("admin dsn: %v", err)
	}
	cfg.DBName = name
	return cfg.FormatDSN()
}

// SQS returns a client of the test SQS server.
func (e Env) SQS(t testing.TB) *sqs.Client {
	t.Helper()
	cfg, err := awstest.Config(context.Background())
	if err != nil {
		t.Fatalf("aws config: %v", err)
	}
	return sqs.NewFromConfig(cfg)
}

// SQSDirect configures a direct sender (awsjson) to the test SQS server,
// with the test credentials and region, as the functions' wiring does.
func (e Env) SQSDirect(t testing.TB) awsjson.Config {
	t.Helper()
	cfg, err := awstest.Config(context.Background())
	if err != nil {
		t.Fatalf("aws config: %v", err)
	}
	return awsjson.Config{Endpoint: e.SQSEndpoint, Region: cfg.Region, Credentials: cfg.Credentials, HTTPClient: http.DefaultClient}
}

// EventsQueue is the event bus's local stand-in publishing to the queue at
// url, as make dev wires it.
func (e Env) EventsQueue(t testing.TB, url string) *eventbus.Queue {
	t.Helper()
	p, err := eventbus.NewQueue(e.SQSDirect(t), url)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Queues are a reservation queue with its dead-letter queue, and an events queue.
type Queues struct {
	URL, DLQURL, EventsURL string
	ARN, DLQARN            string
}

// CreateQueues creates uniquely named queues: the main one redrives to the
// DLQ after maxReceive receives. Create them before any traffic (goaws).
func (e Env) CreateQueues(t testing.TB, client *sqs.Client, maxReceive int) Queues {
	t.Helper()
	ctx := context.Background()
	base := strings.ReplaceAll(Name("hf"), "_", "-")
	create := func(name string, attrs map[string]string) string {
		out, err := client.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name), Attributes: attrs})
		if err != nil {
			t.Fatalf("create queue %s: %v", name, err)
		}
		return aws.ToString(out.QueueUrl)
	}
	q := Queues{DLQARN: "arn:aws:sqs:us-east-1:100010001000:" + base + "-dlq", ARN: "arn:aws:sqs:us-east-1:100010001000:" + base}
	q.DLQURL = create(base+"-dlq", nil)
	q.EventsURL = create(base+"-events", nil)
	q.URL = create(base, map[string]string{
		"RedrivePolicy": queue.RedrivePolicy(maxReceive, q.DLQARN),
	})
	return q
}

// Eventually polls cond until it holds or the timeout passes; it fails the
// test with msg otherwise. It waits on a condition, not on a guess of time.
func Eventually(t testing.TB, timeout time.Duration, msg string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v: %s", timeout, msg)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Redis is a private redis-server for tests that stop, restart or flush it.
type Redis struct {
	Addr  string
	dir   string
	extra []string
	cmd   *exec.Cmd
	t     testing.TB
}

// StartRedis starts a redis-server of the test's own on a free loopback port
// (no persistence, like ElastiCache losing a node), stopped at the end.
func StartRedis(t testing.TB, extraArgs ...string) *Redis {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("HOLDFAST_REQUIRE_SERVICES") == "1" {
			t.Fatal("redis-server is required (make test installs it)")
		}
		t.Skip("redis-server not installed")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	r := &Redis{Addr: addr, dir: t.TempDir(), extra: extraArgs, t: t}
	r.start()
	t.Cleanup(r.stop)
	return r
}

func (r *Redis) start() {
	r.t.Helper()
	_, port, _ := net.SplitHostPort(r.Addr)
	p, _ := strconv.Atoi(port)
	r.cmd = exec.Command("redis-server", append(services.RedisArgs(p, r.dir), r.extra...)...)
	if err := r.cmd.Start(); err != nil {
		r.t.Fatalf("start redis-server: %v", err)
	}
	c := redis.NewClient(&redis.Options{Addr: r.Addr, MaxRetries: -1})
	defer c.Close()
	Eventually(r.t, 10*time.Second, "redis-server answers", func() bool {
		err := c.Ping(context.Background()).Err()
		return err == nil || strings.HasPrefix(err.Error(), "NOAUTH")
	})
}

// Stop kills the server (by its PID): Redis is down until Restart.
func (r *Redis) Stop() { r.stop() }

func (r *Redis) stop() {
	if r.cmd != nil && r.cmd.Process != nil {
		_ = r.cmd.Process.Kill() // the server this test started, by its PID
		_, _ = r.cmd.Process.Wait()
		r.cmd = nil
	}
}

// Restart kills the server and starts it again, empty: every write is
// lost, as when a node is replaced with no replica.
func (r *Redis) Restart() {
	r.t.Helper()
	r.stop()
	_ = os.Remove(filepath.Join(r.dir, "dump.rdb"))
	r.start()
}

// Snapshot writes the dataset to disk now (SAVE).
func (r *Redis) Snapshot() {
	r.t.Helper()
	c := redis.NewClient(&redis.Options{Addr: r.Addr})
	defer c.Close()
	if err := c.Save(context.Background()).Err(); err != nil {
		r.t.Fatalf("SAVE: %v", err)
	}
}

// RestartFromSnapshot kills the server and starts it from the last
// Snapshot: the writes since then are lost, as in a failover to a replica
// that had not caught up.
func (r *Redis) RestartFromSnapshot() {
	r.t.Helper()
	r.stop()
	r.start()
}

// StartCluster starts a three-master Redis Cluster of the test's own on
// loopback (three redis-server --cluster-enabled plus redis-cli --cluster
// create) and returns the seed addresses; it is stopped at the end.
func StartCluster(t testing.TB) []string {
	t.Helper()
	for _, bin := range []string{"redis-server", "redis-cli"} {
		if _, err := exec.LookPath(bin); err != nil {
			if os.Getenv("HOLDFAST_REQUIRE_SERVICES") == "1" {
				t.Fatalf("%s is required (make test installs it)", bin)
			}
			t.Skipf("%s not installed", bin)
		}
	}
	c, err := services.StartCluster(context.Background(), t.TempDir(), 3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	addrs := c.Addrs
	return addrs
}

// StartTLSCluster is StartCluster with TLS only, every server presenting
// certs' server certificate (services.StartTLSCluster); extra goes to
// every redis-server. It returns the masters' TLS addresses.
func StartTLSCluster(t testing.TB, certs Certs, extra ...string) []string {
	t.Helper()
	for _, bin := range []string{"redis-server", "redis-cli"} {
		if _, err := exec.LookPath(bin); err != nil {
			if os.Getenv("HOLDFAST_REQUIRE_SERVICES") == "1" {
				t.Fatalf("%s is required (make test installs it)", bin)
			}
			t.Skipf("%s not installed", bin)
		}
	}
	files := services.TLSFiles{CAFile: certs.CAFile, CertFile: certs.CertFile, KeyFile: certs.KeyFile}
	c, err := services.StartTLSCluster(context.Background(), t.TempDir(), 3, files, extra...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	return c.Addrs
}

// StartMoto starts moto_server (preinstalled on the project's machines) on a
// free loopback port for the AWS APIs goaws lacks (Secrets Manager), and
// returns its endpoint; it is stopped at the end of the test.
func StartMoto(t testing.TB) string {
	t.Helper()
	if _, err := exec.LookPath("moto_server"); err != nil {
		if os.Getenv("HOLDFAST_REQUIRE_SERVICES") == "1" {
			t.Fatal("moto_server is required (preinstalled on the image; pip install 'moto[server]' elsewhere)")
		}
		t.Skip("moto_server not installed")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	host, port, _ := net.SplitHostPort(addr)
	cmd := exec.Command("moto_server", "-H", host, "-p", port)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _, _ = cmd.Process.Wait() })
	Eventually(t, 30*time.Second, "moto_server listens", func() bool {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			_ = c.Close()
		}
		return err == nil
	})
	return "http://" + addr
}

// MariaDB is a private mariadbd for tests that need a server configured
// unlike the shared one (e.g. with TLS).
type MariaDB struct {
	Addr string // 127.0.0.1:port
	// RootDSN logs in as root over the server's Unix socket.
	RootDSN string
	cmd     *exec.Cmd
}

// Stop kills the server (by its PID): MySQL is down for the rest of the test.
func (m *MariaDB) Stop() {
	if m.cmd != nil && m.cmd.Process != nil {
		_ = m.cmd.Process.Kill()
		_, _ = m.cmd.Process.Wait()
		m.cmd = nil
	}
}

// StartMariaDB initialises a datadir and starts mariadbd on a free loopback
// port with extraArgs; it is stopped, by its PID, at the end of the test.
func StartMariaDB(t testing.TB, extraArgs ...string) *MariaDB {
	t.Helper()
	for _, bin := range []string{"mariadbd", "mariadb-install-db"} {
		if _, err := exec.LookPath(bin); err != nil {
			if os.Getenv("HOLDFAST_REQUIRE_SERVICES") == "1" {
				t.Fatalf("%s is required (make test installs it)", bin)
			}
			t.Skipf("%s not installed", bin)
		}
	}
	dir := t.TempDir()
	data, sock := filepath.Join(dir, "data"), filepath.Join(dir, "mysql.sock")
	port, err := services.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	cmd, err := services.StartMariaDB(data, sock, filepath.Join(dir, "mariadb.log"), port, false, extraArgs...)
	if err != nil {
		t.Fatal(err)
	}
	m := &MariaDB{Addr: addr, RootDSN: "root@unix(" + sock + ")/", cmd: cmd}
	t.Cleanup(m.Stop)
	db, err := sql.Open("mysql", m.RootDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	Eventually(t, 60*time.Second, "mariadbd answers", func() bool { return db.Ping() == nil })
	return m
}

// Certs are a private certificate authority and a server certificate it
// signed, as PEM files.
type Certs struct {
	CAFile, CertFile, KeyFile string
}

// NewCerts makes a CA and a server certificate for the given IP addresses
// and host names, valid for an hour, under the test's temporary directory.
// The certificate also authenticates a client: the nodes of a TLS cluster
// present it to each other on the cluster bus.
func NewCerts(t testing.TB, ips []net.IP, names []string) Certs {
	t.Helper()
	dir := t.TempDir()
	newKey := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	caKey, srvKey := newKey(), newKey()
	now := time.Now()
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "holdfast test CA"},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	srv := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "holdfast test server"},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, // a cluster node is its peers' client too
		IPAddresses: ips, DNSNames: names,
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srv, ca, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(srvKey)
	if err != nil {
		t.Fatal(err)
	}
	c := Certs{CAFile: filepath.Join(dir, "ca.pem"), CertFile: filepath.Join(dir, "server.pem"), KeyFile: filepath.Join(dir, "server-key.pem")}
	for path, block := range map[string]*pem.Block{
		c.CAFile:   {Type: "CERTIFICATE", Bytes: caDER},
		c.CertFile: {Type: "CERTIFICATE", Bytes: srvDER},
		c.KeyFile:  {Type: "PRIVATE KEY", Bytes: keyDER},
	} {
		if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// Receive waits (up to 30 s: the test SQS server is shared by every
// package make test runs at once, and its receives slow down under the race
// detector's pass) until n messages arrived on the queue at url, deletes
// them and returns their bodies.
func Receive(t testing.TB, client *sqs.Client, url string, n int) [][]byte {
	t.Helper()
	ctx := context.Background()
	var out [][]byte
	deadline := time.Now().Add(30 * time.Second)
	for len(out) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d messages arrived on %s", len(out), n, url)
		}
		got, err := client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(url), MaxNumberOfMessages: 10, WaitTimeSeconds: 1})
		if err != nil {
			t.Fatalf("receive from %s: %v", url, err)
		}
		for _, m := range got.Messages {
			out = append(out, []byte(aws.ToString(m.Body)))
			if _, err := client.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(url), ReceiptHandle: m.ReceiptHandle}); err != nil {
				t.Fatalf("delete from %s: %v", url, err)
			}
		}
	}
	return out
}
