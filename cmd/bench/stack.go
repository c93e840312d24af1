package main

// The whole stack's CPU per accepted order: make dev's binary (gateway,
// JWT, reserve, the event source, persist, compensate, the sweeper) and the
// servers it uses (goaws, redis-server, MariaDB), under wrk, a load
// generator outside the project, at a fixed concurrency on a fresh SKU
// with every per-SKU check on: a sale window, a per-user limit, a pay
// window and a waiting room (each buyer admitted before the run, each
// request with its admission token). Every answer is counted by status; each process's CPU (user + system,
// /proc/<pid>/stat) is read before the load and after the last accepted
// order is CONFIRMED in MySQL, so persist's work is in the figure.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/holdfast/holdfast/internal/devauth"
	"github.com/holdfast/holdfast/internal/services"
	"github.com/holdfast/holdfast/shared/adapters/redisstore"
	"github.com/holdfast/holdfast/shared/app"
)

// stackThreads are wrk's threads (-t).
const stackThreads = 2

// stackBuyers is how many buyers each of the stack part's runs has (each
// a token, and in the room's run an admission): more requests than these
// cores answer in stackDuration, so no buyer buys twice in a run.
const stackBuyers = 5000 * int(stackDuration/time.Second)

// stackAdmitFor is how long the stack part's admissions last: long enough
// for admitting the pool and the run (a buyer's own lasts HOLDFAST_ADMIT_FOR).
const stackAdmitFor = 15 * time.Minute

// Stack load settings: the method (32 connections, 20 s).
const (
	stackConnections = 32
	stackDuration    = 20 * time.Second
	// stackWarmUp is the uncounted run before them.
	stackWarmUp = 5 * time.Second
	// stackGoal is the goal for the whole stack's CPU per accepted order.
	stackGoal = 700 * time.Microsecond
)

// modeStack is the stack part's table row.
const modeStack = "make dev stack under wrk, c=32, 20 s"

// stackFigure is the stack part's measurement.
type stackFigure struct {
	accepted  int64 // answers 202, as wrk counted them
	confirmed int64 // CONFIRMED in MySQL: the accepted and those in flight when wrk stopped
	statuses  map[int]int64
	elapsed   time.Duration
	cpu       map[string]time.Duration // by process
	order     []string
	runs      []string  // each run's figure, when this is several runs'
	ref       hostSpeed // the host under the run's load (hostSampler)
}

// breakdown is each process's CPU per accepted order, the largest first.
func (f stackFigure) breakdown() string {
	var parts []string
	for _, name := range f.order {
		parts = append(parts, name+" "+f.per(f.cpu[name]))
	}
	return strings.Join(parts, ", ")
}

// add counts run g into f: its answers, time and each process's CPU.
func (f *stackFigure) add(g stackFigure) {
	if f.cpu == nil {
		f.cpu, f.statuses = map[string]time.Duration{}, map[int]int64{}
	}
	f.accepted += g.accepted
	f.confirmed += g.confirmed
	f.elapsed += g.elapsed
	for s, c := range g.statuses {
		f.statuses[s] += c
	}
	for name, d := range g.cpu {
		f.cpu[name] += d
	}
	f.order = append(f.order[:0], g.order...)
	sort.Slice(f.order, func(i, j int) bool { return f.cpu[f.order[i]] > f.cpu[f.order[j]] })
}

func (f stackFigure) total() time.Duration {
	var t time.Duration
	for _, d := range f.cpu {
		t += d
	}
	return t
}

// per is d per accepted order, in ms.
func (f stackFigure) per(d time.Duration) string {
	return fmt.Sprintf("%.3f ms", float64(d.Microseconds())/1000/float64(max(f.accepted, 1)))
}

// stackWrk is wrk's script: each request a buyer of its own, with the
// buyer's token and admission token (a line of the tokens file each,
// threads taking every THREADS-th line, none twice: a thread whose lines
// run out stops); each answer counted by status, and wrk's own duration
// (its threads' run, not its loading of the file), printed by done.
const stackWrk = `
local tokens = {}
for line in io.lines(os.getenv("HOLDFAST_WRK_TOKENS")) do
  local jwt, admission = line:match("^(%S+) (%S+)$")
  tokens[#tokens + 1] = {jwt, admission}
end
local body = os.getenv("HOLDFAST_WRK_BODY")
local threads = {}
local n = 0
counts = {}
function setup(thread)
  thread:set("index", #threads)
  threads[#threads + 1] = thread
end
function request()
  local i = n * THREADS + (index or 0) + 1
  if i > #tokens then
    wrk.thread:stop()
    i = #tokens
  end
  local t = tokens[i]
  n = n + 1
  local headers = {["Content-Type"] = "application/json", ["Authorization"] = "Bearer " .. t[1]}
  if t[2] ~= "-" then headers["Admission-Token"] = t[2] end
  return wrk.format("POST", "/reservations", headers, body)
end
function response(status, headers, body)
  counts[status] = (counts[status] or 0) + 1
end
function done(summary, latency, requests)
  local all = {}
  for _, t in ipairs(threads) do
    for s, c in pairs(t:get("counts")) do all[s] = (all[s] or 0) + c end
  end
  for s, c in pairs(all) do io.write(string.format("status %d %d\n", s, c)) end
  io.write(string.format("duration %d\n", summary.duration))
  io.write(string.format("errors %d %d %d %d %d\n", summary.errors.connect, summary.errors.read, summary.errors.write, summary.errors.status, summary.errors.timeout))
end
`

// stack runs the stack part.
func (b *bench) stack(ctx context.Context) error {
	wrk, err := exec.LookPath(services.Wrk)
	if err != nil {
		return errors.New("stack: wrk is not installed (make bench installs it: scripts/services.sh with HOLDFAST_BENCH=1)")
	}
	dir, err := os.MkdirTemp("", "holdfast-bench-stack-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	jwtDir := filepath.Join(dir, "jwt")
	issuer, err := devauth.Open(jwtDir)
	if err != nil {
		return err
	}
	tokens, script := filepath.Join(dir, "tokens"), filepath.Join(dir, "stack.lua")
	if err := os.WriteFile(script, []byte(strings.ReplaceAll(stackWrk, "THREADS", strconv.Itoa(stackThreads))), 0o600); err != nil {
		return err
	}
	// Admitting the pool takes a while: its admissions last stackAdmitFor,
	// in make dev and in the service here that admits them.
	dev, err := startDev(ctx, dir, jwtDir, b.o.devProfile, false, "HOLDFAST_ADMIT_FOR="+stackAdmitFor.String())
	if err != nil {
		return err
	}
	defer dev.stop()
	procs := map[string]int{"holdfast-dev": dev.cmd.Process.Pid}
	for name, addr := range map[string]string{"redis": b.cfg.RedisAddr, "goaws": b.cfg.AWSEndpoint, "mariadb": dsnAddr(b.getenv("HOLDFAST_DB_DSN"))} {
		pid, err := listener(addr)
		if err != nil {
			return fmt.Errorf("stack: %s: %w", name, err)
		}
		procs[name] = pid
	}
	// The buyers' tokens, minted once for both runs (on two SKUs): a
	// buyer each request, and one more for the first request.
	b.log("stack: minting %d buyers' tokens …", stackBuyers+1)
	jwts, err := mintAll(issuer, "stack-u", stackBuyers+1)
	if err != nil {
		return err
	}
	rig := stackRig{wrk: wrk, script: script, tokens: tokens, dev: dev, procs: procs, jwts: jwts}
	// A short run first, not counted: make dev, goaws and MariaDB have just
	// started. Then each configuration twice, in the order with, without,
	// without, with the room (the goal's first, so that no step early in the
	// part flatters it): the first timed run cost more per order whichever it
	// was (0.77 ms both ways, one morning), so one run each flattered the
	// second. Each figure is its two runs together.
	b.log("stack: warming make dev's stack up for %v …", stackWarmUp)
	if _, err := b.stackOnce(ctx, rig, false, stackWarmUp); err != nil {
		return fmt.Errorf("stack: warm-up: %w", err)
	}
	var with, without stackFigure
	for _, room := range []bool{true, false, false, true} {
		f, err := b.stackOnce(ctx, rig, room, stackDuration)
		if err != nil {
			return err
		}
		b.log("stack: waiting room %t: %s per accepted order (%d accepted): %s", room, f.per(f.total()), f.accepted, f.breakdown())
		run := fmt.Sprintf("%s (%v)", f.per(f.total()), f.ref)
		if room {
			with.add(f)
			with.runs = append(with.runs, run)
		} else {
			without.add(f)
			without.runs = append(without.runs, run)
		}
	}
	b.stackRun, b.stackNoRoom = &with, &without
	for _, f := range []struct {
		name string
		f    stackFigure
	}{{modeStackNoRoom, without}, {modeStack, with}} {
		b.results = append(b.results, result{group: "stack", name: f.name, ops: f.f.accepted, elapsed: f.f.elapsed,
			extra: map[string]string{"stack CPU": f.f.per(f.f.total()) + "/accepted", "runs": "2"}})
		b.checks = append(b.checks, fmt.Sprintf("%s: %d answers in 2 runs, all 202; %d CONFIRMED in MySQL (wrk does not count the answers in flight when it stops)", f.name, f.f.accepted, f.f.confirmed))
	}
	return nil
}

// modeStackNoRoom is the stack part's run on a SKU without a waiting room.
const modeStackNoRoom = modeStack + ", no room"

// stackRig is what the stack part's runs share: wrk, its script and the
// tokens file it reads, make dev's process, the processes whose CPU is
// read, and the buyers' tokens (buyer i is "stack-u<i>").
type stackRig struct {
	wrk, script, tokens string
	dev                 *devProcess
	procs               map[string]int
	jwts                []string
}

// mintAll mints n buyers' tokens (prefix and 0…n-1), on every core.
func mintAll(issuer *devauth.Issuer, prefix string, n int) ([]string, error) {
	out := make([]string, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, runtime.NumCPU())
	for w := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < n && errs[w] == nil; i = int(next.Add(1) - 1) {
				out[i], errs[w] = issuer.Mint(fmt.Sprintf("%s%d", prefix, i), time.Hour)
			}
		}()
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

// stackOnce is one wrk run of the stack part, for d, on a fresh SKU, with a
// waiting room (room) or not.
func (b *bench) stackOnce(ctx context.Context, rig stackRig, room bool, d time.Duration) (stackFigure, error) {
	var f stackFigure
	wrk, script, tokens, dev, procs := rig.wrk, rig.script, rig.tokens, rig.dev, rig.procs
	sku := fmt.Sprintf("bench-stack-%d", time.Now().UnixNano())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPut, dev.url+"/admin/skus/"+sku+"/stock", strings.NewReader(fmt.Sprintf(
		`{"stock":%d,"per_user_limit":1000,"pay_within_seconds":86400,"opens_at":%q,"closes_at":%q,"waiting_room":%t}`, // every per-SKU check on (a day to pay: no timeouts for the later parts to sweep)
		bigStock, time.Now().Add(-time.Minute).UTC().Format(time.RFC3339), time.Now().Add(time.Hour).UTC().Format(time.RFC3339), room)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return f, err
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return f, fmt.Errorf("stack: set stock: %d", resp.StatusCode)
	}
	// Each buyer admitted, and a token of theirs, before the run: what a
	// buyer does before buying (the room's join and polls) is not timed.
	// Without a room, "-" stands for no admission token.
	pool := stackBuyers
	admissions := make([]string, pool+1) // one more for the first request
	if room {
		b.log("stack: admitting %d buyers to the waiting room …", pool+1)
		cfg := b.cfg
		cfg.Protocol.AdmitFor = stackAdmitFor
		svc, err := b.service(ctx, cfg, app.Options{})
		if err != nil {
			return f, err
		}
		t0 := time.Now()
		if admissions, err = admitAll(ctx, svc, sku, "stack-u", pool+1); err != nil {
			return f, fmt.Errorf("stack: %w", err)
		}
		b.log("stack: %d admitted in %v", len(admissions), time.Since(t0).Round(time.Second))
	}
	lines := make([]string, len(admissions))
	for i, a := range admissions {
		if a == "" {
			a = "-"
		}
		lines[i] = rig.jwts[i] + " " + a
	}
	// One buyer's request first, outside the count: the run stops here, with
	// the answer, if a buyer's request is refused.
	jwt, adm, _ := strings.Cut(lines[len(lines)-1], " ")
	lines = lines[:len(lines)-1]
	req, _ = http.NewRequestWithContext(ctx, http.MethodPost, dev.url+"/reservations", strings.NewReader(fmt.Sprintf(`{"sku":%q,"qty":1}`, sku)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+jwt)
	if adm != "-" {
		req.Header.Set("Admission-Token", adm)
	}
	if resp, err = http.DefaultClient.Do(req); err != nil {
		return f, err
	}
	first, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		return f, fmt.Errorf("stack: a buyer's first request: %d %s", resp.StatusCode, first)
	}
	if err := os.WriteFile(tokens, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		return f, err
	}
	// The first request CONFIRMED before the CPU is read: its persist is
	// not in the figure.
	if err := b.awaitConfirmed(ctx, sku, 1); err != nil {
		return f, fmt.Errorf("stack: the first request: %w", err)
	}
	// The servers' work left from the run before (MariaDB's purge and
	// flushing of its rows) would land in this run's figure.
	if err := b.awaitQuiet(ctx, "stack"); err != nil {
		return f, err
	}
	b.log("stack: wrk, %d connections, %v, against make dev's stack (waiting room: %t) …", stackConnections, d, room)
	host, err := startHostSampler()
	if err != nil {
		return f, err
	}
	defer host.Stop()
	cpu0, err := cpuOf(procs)
	if err != nil {
		return f, err
	}
	cmd := exec.CommandContext(ctx, wrk, fmt.Sprintf("-t%d", stackThreads), fmt.Sprintf("-c%d", stackConnections), fmt.Sprintf("-d%ds", int(d.Seconds())),
		"--timeout", "10s", "-s", script, dev.url)
	cmd.Env = append(os.Environ(), "HOLDFAST_WRK_TOKENS="+tokens, fmt.Sprintf(`HOLDFAST_WRK_BODY={"sku":%q,"qty":1}`, sku))
	start := time.Now()
	out, err := cmd.CombinedOutput()
	elapsed := time.Since(start)
	speed := host.Stop()
	if err != nil {
		return f, fmt.Errorf("stack: wrk: %v\n%s", err, out)
	}
	f = stackFigure{statuses: map[int]int64{}, elapsed: elapsed, cpu: map[string]time.Duration{}, ref: speed}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var s, c int64
		var e [5]int64
		var us int64
		if n, _ := fmt.Sscanf(sc.Text(), "status %d %d", &s, &c); n == 2 {
			f.statuses[int(s)] = c
		} else if n, _ := fmt.Sscanf(sc.Text(), "duration %d", &us); n == 1 {
			f.elapsed = time.Duration(us) * time.Microsecond
		} else if n, _ := fmt.Sscanf(sc.Text(), "errors %d %d %d %d %d", &e[0], &e[1], &e[2], &e[3], &e[4]); n == 5 && e[0]+e[1]+e[2]+e[4] > 0 {
			return f, fmt.Errorf("stack: wrk saw socket errors (connect, read, write, status, timeout) %v\n%s", e, out)
		}
	}
	var answered int64
	for _, c := range f.statuses {
		answered += c
	}
	if answered >= int64(pool) {
		return f, fmt.Errorf("stack: %d answers for %d buyers: wrk ran out of buyers, raise stackBuyers", answered, pool)
	}
	f.accepted = f.statuses[http.StatusAccepted]
	if f.accepted == 0 || len(f.statuses) != 1 {
		return f, fmt.Errorf("stack: answers by status %v: want only 202\n%s", f.statuses, out)
	}
	// Persist's share: wait until every hold taken is CONFIRMED (the
	// accepted, those in flight when wrk stopped, and the first request).
	rs, err := redisstore.New(b.app.Redis, 0).Stock(ctx, sku)
	if err != nil {
		return f, err
	}
	taken := bigStock - rs.Available
	if taken < f.accepted+1 || taken > f.accepted+1+stackConnections {
		return f, fmt.Errorf("stack: %d holds taken for %d accepted", taken, f.accepted)
	}
	if err := b.awaitConfirmed(ctx, sku, taken); err != nil {
		return f, fmt.Errorf("stack: %w", err)
	}
	f.confirmed = taken
	cpu1, err := cpuOf(procs)
	if err != nil {
		return f, err
	}
	for name := range procs {
		f.cpu[name] = cpu1[name] - cpu0[name]
		f.order = append(f.order, name)
	}
	sort.Slice(f.order, func(i, j int) bool { return f.cpu[f.order[i]] > f.cpu[f.order[j]] })
	return f, nil
}

// awaitConfirmed waits until n of sku's reservations are CONFIRMED in MySQL
// (persist drains the queue meanwhile), five minutes at most.
func (b *bench) awaitConfirmed(ctx context.Context, sku string, n int64) error {
	settle, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	for {
		var got int64
		if err := b.app.DB.QueryRowContext(settle, `SELECT COUNT(*) FROM reservations WHERE sku = ? AND status = 'CONFIRMED'`, sku).Scan(&got); err != nil {
			return fmt.Errorf("%d of %d confirmed: %w", got, n, err)
		}
		if got > n {
			return fmt.Errorf("%d confirmed, %d taken", got, n)
		}
		if got == n {
			return nil
		}
		select {
		case <-settle.Done():
			return fmt.Errorf("%d of %d confirmed in 5 min", got, n)
		case <-time.After(100 * time.Millisecond): // polling MySQL while persist drains the queue
		}
	}
}

// stackLines are the stack part's summary lines.
func (b *bench) stackLines() []string {
	f := b.stackRun
	if f == nil {
		return nil
	}
	line := fmt.Sprintf("CPU per accepted order through make dev = %s (goal ≤ %.1f ms): %s; %d accepted at %.0f/s, wrk c=%d, 2 runs of %v (with, without, without, with the room: %s), make dev logging errors only, an admission token each (waiting room)",
		f.per(f.total()), float64(stackGoal.Microseconds())/1000, f.breakdown(), f.accepted,
		float64(f.accepted)/f.elapsed.Seconds(), stackConnections, stackDuration, strings.Join(f.runs, " and "))
	if n := b.stackNoRoom; n != nil {
		line += fmt.Sprintf("; without a waiting room %s (%s): %s; %d accepted at %.0f/s", n.per(n.total()), strings.Join(n.runs, " and "), n.breakdown(), n.accepted, float64(n.accepted)/n.elapsed.Seconds())
	}
	line += fmt.Sprintf("; each run with the host's speed under its load, the median thread CPU of a SHA-256 of 64 KiB and of a link of a random walk through 64 MiB, sampled every 25 ms (%v idle when the bench started)", b.refStart)
	return []string{line}
}

// cpuOf reads each process's CPU time so far.
func cpuOf(procs map[string]int) (map[string]time.Duration, error) {
	out := map[string]time.Duration{}
	for name, pid := range procs {
		d, err := pidCPU(pid)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		out[name] = d
	}
	return out, nil
}

var dsnAddrRe = regexp.MustCompile(`tcp\(([^)]+)\)`)

// dsnAddr is the host:port of a go-sql-driver DSN.
func dsnAddr(dsn string) string {
	if m := dsnAddrRe.FindStringSubmatch(dsn); m != nil {
		return m[1]
	}
	return ""
}

// listener returns the PID of the process listening on addr's port (a
// host:port or a URL), from /proc/net/tcp{,6} and the processes' sockets.
func listener(addr string) (int, error) {
	addr = strings.TrimPrefix(strings.TrimPrefix(addr, "http://"), "https://")
	_, p, err := net.SplitHostPort(strings.TrimSuffix(addr, "/"))
	if err != nil {
		return 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		return 0, err
	}
	inodes := map[string]bool{}
	for _, file := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(file)
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(l)
			if len(f) < 10 || f[3] != "0A" { // 0A: LISTEN
				continue
			}
			i := strings.LastIndexByte(f[1], ':')
			if lp, err := strconv.ParseInt(f[1][i+1:], 16, 32); err == nil && int(lp) == port {
				inodes["socket:["+f[9]+"]"] = true
			}
		}
	}
	if len(inodes) == 0 {
		return 0, fmt.Errorf("nothing listens on port %d", port)
	}
	dirs, _ := filepath.Glob("/proc/[0-9]*/fd")
	for _, d := range dirs {
		fds, _ := os.ReadDir(d)
		for _, fd := range fds {
			if l, err := os.Readlink(filepath.Join(d, fd.Name())); err == nil && inodes[l] {
				return strconv.Atoi(strings.Split(d, "/")[2])
			}
		}
	}
	return 0, fmt.Errorf("no process found for port %d", port)
}
