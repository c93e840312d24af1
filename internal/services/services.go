// Package services installs, starts and stops the local data tier holdfast
// runs against — redis-server, MariaDB and an SQS-API server (goaws), all on
// loopback — for make dev, make test and make bench (through
// scripts/services.sh, a thin wrapper of cmd/services), and the private
// servers of single tests (internal/testkit/testservices). One way to start
// them, in Go, with nothing else needed for free ports or health checks.
package services

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	_ "github.com/go-sql-driver/mysql" // the root login over the socket
)

// SQLMode is MySQL 8's default strictness, which MariaDB is started with so
// that it rejects what MySQL rejects.
const SQLMode = "ONLY_FULL_GROUP_BY,STRICT_TRANS_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION"

// idSecret keys the ids derived from an Idempotency-Key locally: the same on
// every machine, so events/ name the ids make dev derives (in AWS it is a
// generated Secrets Manager secret).
const idSecret = "holdfast-local-dev-id-key (not a secret; AWS uses Secrets Manager)\n"

// Chromium is the browser the buyer page's end-to-end test drives
// (Debian's package of that name; about 2 minutes to install).
const Chromium = "chromium"

// FreePort returns a loopback port nothing listens on now.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Wrk is the HTTP load generator make bench's stack part drives make dev
// with (Debian's package of that name).
const Wrk = "wrk"

// Extras are what Install installs beyond the data tier.
type Extras struct {
	Browser bool // Chromium, for the buyer page's browser test (make test)
	Wrk     bool // Wrk, for make bench
}

// Install installs with apt what is missing (redis-server, MariaDB and the
// extras asked for) and builds the pinned goaws into root/bin.
func Install(ctx context.Context, root string, extras Extras, log io.Writer) error {
	bins := map[string]string{"redis-server": "redis-server", "mariadbd": "mariadb-server", "mariadb-install-db": "mariadb-server"}
	if extras.Browser {
		bins[Chromium] = "chromium"
	}
	if extras.Wrk {
		bins[Wrk] = "wrk"
	}
	var need []string
	for bin, pkg := range bins {
		if _, err := exec.LookPath(bin); err != nil && !contains(need, pkg) {
			need = append(need, pkg)
		}
	}
	if len(need) > 0 {
		fmt.Fprintf(log, "services: installing %s with apt (a minute or a few the first time; apt's progress follows)\n", strings.Join(need, " "))
		sudo := []string{}
		if os.Geteuid() != 0 {
			sudo = []string{"sudo"}
		}
		for _, args := range [][]string{
			append(sudo, "apt-get", "update"),
			append(sudo, append([]string{"apt-get", "install", "-y", "--no-install-recommends"}, need...)...),
		} {
			// apt's own lines (Get:, Unpacking, Setting up) stream to log as
			// they come, so a long first install shows it is moving.
			cmd := exec.CommandContext(ctx, args[0], args[1:]...)
			cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
			cmd.Stdout = &prefixWriter{w: log, prefix: "  apt: "}
			cmd.Stderr = cmd.Stdout
			if err := cmd.Run(); err != nil {
				return fmt.Errorf("%s: %v", strings.Join(args, " "), err)
			}
		}
	}
	if _, err := os.Stat(filepath.Join(root, "bin", "goaws")); err != nil {
		fmt.Fprintln(log, "services: building the SQS-API server (goaws, pinned in go.mod as a tool)")
		cmd := exec.CommandContext(ctx, "go", "build", "-o", "bin/goaws", "github.com/Admiral-Piett/goaws/app/cmd")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("build goaws: %v\n%s", err, out)
		}
	}
	return nil
}

// prefixWriter writes each line to w behind prefix.
type prefixWriter struct {
	w       io.Writer
	prefix  string
	midLine bool
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	for _, line := range bytes.SplitAfter(b, []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		if !p.midLine {
			if _, err := io.WriteString(p.w, p.prefix); err != nil {
				return 0, err
			}
		}
		if _, err := p.w.Write(line); err != nil {
			return 0, err
		}
		p.midLine = line[len(line)-1] != '\n'
	}
	return len(b), nil
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// Ports are the loopback ports to use; 0 picks a free one.
type Ports struct{ Redis, DB, SQS int }

// Options of Start.
type Options struct {
	Ports Ports
	// Durable runs MariaDB as production runs MySQL: a flush and a binlog
	// sync at every commit (make bench). Tests trade that for speed.
	Durable bool
	Log     io.Writer
}

// Start starts the three servers with their data under dir, each in its own
// session (they outlive the caller until Stop), waits until each answers,
// and writes dir/env (shell exports of every setting) and dir/pids.
func Start(ctx context.Context, root, dir string, o Options) error {
	if o.Log == nil {
		o.Log = io.Discard
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(dir, "pids")); err == nil {
		Stop(dir, o.Log)
	}
	pids, err := os.Create(filepath.Join(dir, "pids"))
	if err != nil {
		return err
	}
	defer pids.Close()
	for _, p := range []*int{&o.Ports.Redis, &o.Ports.DB, &o.Ports.SQS} {
		if *p == 0 {
			if *p, err = FreePort(); err != nil {
				return err
			}
		}
	}
	started := func(name string, cmd *exec.Cmd) {
		fmt.Fprintf(pids, "%s %d\n", name, cmd.Process.Pid)
	}

	// Redis: no persistence; holds are never evicted (as on ElastiCache with noeviction).
	rdir := filepath.Join(dir, "redis")
	if err := os.MkdirAll(rdir, 0o755); err != nil {
		return err
	}
	redis, err := spawn(filepath.Join(dir, "redis.log"), "redis-server", RedisArgs(o.Ports.Redis, rdir)...)
	if err != nil {
		return err
	}
	started("redis", redis)
	if err := waitFor(ctx, "redis-server", func() error { return redisPing(o.Ports.Redis) }); err != nil {
		return err
	}

	// MariaDB: a private datadir, strict SQL mode like MySQL 8; its socket
	// outside dir (SocketDir).
	sockDir := SocketDir(dir)
	if err := os.MkdirAll(sockDir, 0o700); err != nil {
		return err
	}
	sock := filepath.Join(sockDir, "mysql.sock")
	maria, err := StartMariaDB(filepath.Join(dir, "mysql"), sock, filepath.Join(dir, "mariadb.log"), o.Ports.DB, o.Durable)
	if err != nil {
		return err
	}
	started("mariadb", maria)
	root0, err := sql.Open("mysql", "root@unix("+sock+")/")
	if err != nil {
		return err
	}
	defer root0.Close()
	if err := waitFor(ctx, "mariadbd", func() error { return root0.PingContext(ctx) }); err != nil {
		tail, _ := os.ReadFile(filepath.Join(dir, "mariadb.log"))
		return fmt.Errorf("%w\n%s", err, lastLines(string(tail), 20))
	}
	// A local, loopback-only user without a password: nothing secret exists,
	// so nothing can leak into the repo, env files or logs. It may create the
	// functions' user as Aurora's master user may (the migrate function).
	for _, q := range []string{
		"CREATE DATABASE IF NOT EXISTS holdfast CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci",
		"CREATE USER IF NOT EXISTS 'holdfast'@'127.0.0.1'",
		"ALTER USER 'holdfast'@'127.0.0.1' IDENTIFIED BY ''",
		"GRANT ALL PRIVILEGES ON `holdfast%`.* TO 'holdfast'@'127.0.0.1' WITH GRANT OPTION",
		"GRANT CREATE USER ON *.* TO 'holdfast'@'127.0.0.1'",
		"GRANT SELECT ON mysql.* TO 'holdfast'@'127.0.0.1'",
	} {
		if _, err := root0.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("mariadb: %s: %w", q, err)
		}
	}

	// The SQS-API server. Queues are created before traffic (goaws is not
	// safe otherwise): by cmd/dev from template.yaml, or per test.
	cfg := filepath.Join(dir, "goaws.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`Local:
  Host: 127.0.0.1
  Port: %d
  Region: us-east-1
  AccountId: "100010001000"
  LogToFile: false
  EnableDuplicates: false
  QueueAttributeDefaults:
    VisibilityTimeout: 30
    ReceiveMessageWaitTimeSeconds: 0
    MaximumMessageSize: 262144
  Queues: []
`, o.Ports.SQS)), 0o644); err != nil {
		return err
	}
	goaws, err := spawn(filepath.Join(dir, "goaws.log"), filepath.Join(root, "bin", "goaws"), "-config", cfg, "-loglevel", "error")
	if err != nil {
		return err
	}
	started("goaws", goaws)
	health := fmt.Sprintf("http://127.0.0.1:%d/health", o.Ports.SQS)
	if err := waitFor(ctx, "goaws", func() error { return httpOK(ctx, health) }); err != nil {
		return err
	}

	secret := filepath.Join(dir, "id-secret")
	if _, err := os.Stat(secret); err != nil {
		if err := os.WriteFile(secret, []byte(idSecret), 0o600); err != nil {
			return err
		}
	}
	sqs := fmt.Sprintf("http://127.0.0.1:%d", o.Ports.SQS)
	env := []string{
		fmt.Sprintf("HOLDFAST_REDIS_ADDR=127.0.0.1:%d", o.Ports.Redis),
		fmt.Sprintf("HOLDFAST_DB_DSN='holdfast@tcp(127.0.0.1:%d)/holdfast?parseTime=true&interpolateParams=true'", o.Ports.DB),
		fmt.Sprintf("HOLDFAST_DB_ADMIN_DSN='holdfast@tcp(127.0.0.1:%d)/?parseTime=true&interpolateParams=true'", o.Ports.DB),
		"HOLDFAST_AWS_ENDPOINT=" + sqs, "AWS_ENDPOINT_URL_SQS=" + sqs,
		"HOLDFAST_QUEUE_URL=" + sqs + "/100010001000/holdfast-reservations",
		"HOLDFAST_DLQ_URL=" + sqs + "/100010001000/holdfast-reservations-dlq",
		"HOLDFAST_EVENTS_QUEUE_URL=" + sqs + "/100010001000/holdfast-events",
		"HOLDFAST_ID_SECRET_FILE=" + secret,
		"AWS_REGION=us-east-1", "AWS_ACCESS_KEY_ID=local", "AWS_SECRET_ACCESS_KEY=local",
	}
	var b strings.Builder
	for _, e := range env {
		b.WriteString("export " + e + "\n")
	}
	if err := os.WriteFile(filepath.Join(dir, "env"), []byte(b.String()), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(o.Log, "services: redis-server  127.0.0.1:%d\n", o.Ports.Redis)
	fmt.Fprintf(o.Log, "services: mariadb       127.0.0.1:%d (database holdfast, user holdfast)\n", o.Ports.DB)
	fmt.Fprintf(o.Log, "services: sqs (goaws)   %s\n", sqs)
	fmt.Fprintf(o.Log, "services: settings in   %s\n", filepath.Join(dir, "env"))
	return nil
}

// RedisArgs are redis-server's arguments for a loopback port and a data dir.
func RedisArgs(port int, dir string) []string {
	return []string{"--bind", "127.0.0.1", "--port", strconv.Itoa(port), "--dir", dir,
		"--save", "", "--appendonly", "no", "--maxmemory-policy", "noeviction", "--daemonize", "no"}
}

// StartMariaDB initialises datadir if it is empty and starts mariadbd on a
// loopback port and a Unix socket, in its own session, logging to logFile.
func StartMariaDB(datadir, sock, logFile string, port int, durable bool, extra ...string) (*exec.Cmd, error) {
	// A temporary directory of its own: servers installed or running at once
	// (tests in parallel packages) must not share /tmp's temporary tables.
	tmp := datadir + ".tmp"
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(datadir, "mysql")); err != nil {
		if err := os.MkdirAll(datadir, 0o755); err != nil {
			return nil, err
		}
		out, err := exec.Command("mariadb-install-db", "--no-defaults", "--basedir=/usr", "--datadir="+datadir,
			"--tmpdir="+tmp, "--user=root", "--auth-root-authentication-method=normal", "--skip-test-db").CombinedOutput()
		if err != nil {
			return nil, fmt.Errorf("mariadb-install-db: %v\n%s", err, out)
		}
	}
	durability := []string{"--innodb-flush-log-at-trx-commit=2", "--skip-log-bin"}
	if durable {
		durability = []string{"--innodb-flush-log-at-trx-commit=1", "--log-bin=" + filepath.Join(datadir, "binlog"), "--sync-binlog=1", "--server-id=1"}
	}
	// --no-defaults first, or /etc/mysql forces its datadir and user.
	args := append([]string{"--no-defaults", "--user=root", "--datadir=" + datadir, "--tmpdir=" + tmp, "--socket=" + sock,
		"--port=" + strconv.Itoa(port), "--bind-address=127.0.0.1", "--skip-name-resolve",
		"--pid-file=" + filepath.Join(filepath.Dir(sock), filepath.Base(sock)+".pid"), "--max-connections=500",
		"--sql-mode=" + SQLMode}, durability...)
	return spawn(logFile, "mariadbd", append(args, extra...)...)
}

// spawn starts a server in its own session, its output to logFile.
func spawn(logFile, name string, args ...string) (*exec.Cmd, error) {
	f, err := os.Create(logFile)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = f, f
	if filepath.Base(name) == "goaws" && os.Getenv("GOGC") == "" {
		// goaws stands in for SQS on the same two cores as everything
		// else: a larger heap goal spends memory instead of CPU on its
		// collector (about a tenth of its CPU per message, docs/benchmarks.md).
		cmd.Env = append(os.Environ(), "GOGC=400")
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	return cmd, nil
}

// waitFor polls ready until it succeeds: up to a minute (a busy machine can
// take a while to start MariaDB).
func waitFor(ctx context.Context, what string, ready func() error) error {
	deadline := time.Now().Add(time.Minute)
	for {
		err := ready()
		if err == nil {
			return nil
		}
		if errors.Is(err, errExited) {
			return err // a server that is gone will not become ready
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s did not become ready: %w", what, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func redisPing(port int) error {
	c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 200*time.Millisecond)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	buf := make([]byte, 16)
	n, err := c.Read(buf)
	if err != nil {
		return err
	}
	if !strings.HasPrefix(string(buf[:n]), "+PONG") {
		return fmt.Errorf("redis answered %q", buf[:n])
	}
	return nil
}

func httpOK(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Timeout: time.Second}).Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return errors.New(resp.Status)
	}
	return nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Stop stops what Start started in dir, by the PIDs it recorded: TERM, then
// KILL after 10 s.
func Stop(dir string, log io.Writer) {
	b, err := os.ReadFile(filepath.Join(dir, "pids"))
	if err != nil {
		fmt.Fprintf(log, "services: nothing started in %s\n", dir)
		return
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		name, pidText, ok := strings.Cut(line, " ")
		pid, err := strconv.Atoi(pidText)
		if !ok || err != nil {
			continue
		}
		if !alive(pid) {
			fmt.Fprintf(log, "services: %s (pid %d) had already exited\n", name, pid)
			continue
		}
		_ = syscall.Kill(pid, syscall.SIGTERM)
		for i := 0; i < 200 && alive(pid); i++ {
			time.Sleep(50 * time.Millisecond)
		}
		if alive(pid) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		fmt.Fprintf(log, "services: stopped %s (pid %d)\n", name, pid)
	}
	_ = os.Remove(filepath.Join(dir, "pids"))
	_ = os.RemoveAll(SocketDir(dir))
}

// SocketDir is where Start puts MariaDB's Unix socket (and its pid file)
// for the data under dir: a short directory of its own under the system's
// temporary directory, never inside dir. make dev keeps its data in the
// checkout (.holdfast/dev), and sam build copies the checkout for each
// function: a socket there fails the copy, so `make deploy` would fail while
// make dev runs. (A short path also keeps under the 108 bytes a socket's
// path may have, however deep the checkout.)
func SocketDir(dir string) string {
	abs, err := filepath.Abs(dir)
	if err != nil {
		abs = dir
	}
	sum := sha256.Sum256([]byte(abs))
	return filepath.Join(os.TempDir(), "holdfast-"+hex.EncodeToString(sum[:6]))
}

// alive reports whether pid runs (a zombie, exited but not reaped by its new
// parent, counts as gone).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndex(s, ") ")
	return i >= 0 && len(s) > i+2 && s[i+2] != 'Z'
}
