package app

import (
	"context"
	"crypto/x509"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/config"
)

// tlsServers are a redis-server and a MariaDB serving TLS with a certificate
// for 127.0.0.1 signed by a private CA, and a MariaDB login over TCP.
type tlsServers struct {
	Redis, DB, User, Password, Database, CAFile string
}

// prodClients builds the Redis client and the MySQL pool exactly as the
// functions do in AWS (TLS on, the DSN a secret yields), for the given
// addresses.
func prodClients(t *testing.T, s tlsServers, redisAddr, dbAddr string) (redisErr, dbErr error) {
	t.Helper()
	ctx := context.Background()
	cfg := config.Config{RedisAddr: redisAddr, RedisTLS: true, DBHost: dbAddr, DBName: s.Database, DBTLS: "verify", DBMaxOpen: 1}
	rdb, err := redisClient(ctx, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	redisErr = rdb.Ping(ctx).Err()
	cfg.DBDSN = secretDSN(cfg, s.User, s.Password)
	db, _, err := openDB(ctx, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	return redisErr, db.PingContext(ctx)
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	return port
}

// Both clients verify the server's certificate: one from a CA the runtime
// does not trust is refused, as is one for another name even from a CA it
// trusts; only the right certificate from a trusted CA connects. And the
// database never falls back to plaintext.
func TestTLSRefusesAWrongCertificate(t *testing.T) {
	env := testservices.Require(t)
	certs := testservices.NewCerts(t, []net.IP{net.IPv4(127, 0, 0, 1)}, nil)
	tlsPort := freePort(t)
	testservices.StartRedis(t, "--tls-port", tlsPort, "--tls-cert-file", certs.CertFile, "--tls-key-file", certs.KeyFile,
		"--tls-ca-cert-file", certs.CAFile, "--tls-auth-clients", "no")
	maria := testservices.StartMariaDB(t, "--ssl-cert="+certs.CertFile, "--ssl-key="+certs.KeyFile,
		"--ssl-ca="+certs.CAFile, "--require-secure-transport=ON")
	s := tlsServers{Redis: "127.0.0.1:" + tlsPort, DB: maria.Addr, User: "holdfast_tls", Password: "a-password-of-the-test-000", Database: "tlscheck", CAFile: certs.CAFile}
	root, err := sql.Open("mysql", maria.RootDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	for _, q := range []string{
		"CREATE DATABASE tlscheck",
		"CREATE USER 'holdfast_tls'@'127.0.0.1' IDENTIFIED BY 'a-password-of-the-test-000'",
		"GRANT SELECT ON tlscheck.* TO 'holdfast_tls'@'127.0.0.1'",
	} {
		if _, err := root.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}

	// This process trusts only the system's CAs: both refuse the servers.
	redisErr, dbErr := prodClients(t, s, s.Redis, s.DB)
	for name, err := range map[string]error{"redis": redisErr, "mysql": dbErr} {
		var unknown x509.UnknownAuthorityError
		if !errors.As(err, &unknown) && !strings.Contains(fmt.Sprint(err), "certificate signed by unknown authority") {
			t.Errorf("%s with a certificate from an unknown CA: %v, want it refused as unknown authority", name, err)
		}
	}

	// A MySQL server without TLS: refused, never plaintext.
	plain, err := mysql.ParseDSN(env.AdminDSN)
	if err != nil {
		t.Fatal(err)
	}
	if _, dbErr := prodClients(t, s, s.Redis, plain.Addr); !errors.Is(dbErr, mysql.ErrNoTLS) {
		t.Errorf("mysql without TLS: %v, want %v (no fallback to plaintext)", dbErr, mysql.ErrNoTLS)
	}

	// A process that trusts the CA (as the runtime trusts the proxy's and
	// ElastiCache's): the right name connects, another name is refused.
	runTrusting(t, certs.CAFile, "TestTLSWithTheCATrusted", "HOLDFAST_TLS_CHECK", s)
}

// runTrusting runs test in a child process of this test binary whose only
// trusted CAs are those in caFile (as the runtime trusts the proxy's and
// ElastiCache's), with spec as JSON in the environment variable env, and
// requires it to pass.
func runTrusting(t *testing.T, caFile, test, env string, spec any) {
	t.Helper()
	raw, _ := json.Marshal(spec)
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), "SSL_CERT_FILE="+caFile, "SSL_CERT_DIR=", env+"="+string(raw))
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: "+test) {
		t.Errorf("%s with the CA trusted: %v\n%s", test, err, out)
	}
}

// TestTLSWithTheCATrusted runs in the child process TestTLSRefusesAWrongCertificate
// starts with SSL_CERT_FILE naming the test CA.
func TestTLSWithTheCATrusted(t *testing.T) {
	raw := os.Getenv("HOLDFAST_TLS_CHECK")
	if raw == "" {
		t.Skip("runs inside TestTLSRefusesAWrongCertificate, with the test CA trusted")
	}
	var s tlsServers
	if err := json.Unmarshal([]byte(raw), &s); err != nil {
		t.Fatal(err)
	}
	if redisErr, dbErr := prodClients(t, s, s.Redis, s.DB); redisErr != nil || dbErr != nil {
		t.Fatalf("the right certificate from a trusted CA: redis %v, mysql %v; want both connected", redisErr, dbErr)
	}
	// The certificate names 127.0.0.1 only: reached as localhost, it is
	// somebody else's.
	_, rport, _ := net.SplitHostPort(s.Redis)
	_, dport, _ := net.SplitHostPort(s.DB)
	redisErr, dbErr := prodClients(t, s, "localhost:"+rport, "localhost:"+dport)
	for name, err := range map[string]error{"redis": redisErr, "mysql": dbErr} {
		var wrongName x509.HostnameError
		if !errors.As(err, &wrongName) && !strings.Contains(fmt.Sprint(err), "certificate is valid for") {
			t.Errorf("%s with a certificate for another name: %v, want it refused", name, err)
		}
	}
}
