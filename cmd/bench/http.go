package main

// The honest end-to-end figures: make dev's own binary, serving the API
// alone, under fixed-concurrency HTTP load; accepted reservations and
// sold-out answers measured apart, and the server's CPU per answer.

import (
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
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/holdfast/holdfast/internal/devauth"
)

// httpConcurrency are the fixed client concurrencies of the HTTP figures.
var httpConcurrency = []int{32, 128}

// httpUsers is the pool of buyers (and their tokens) the load cycles
// through: each makes a few attempts, within the per-user attempt rate.
const httpUsers = 8192

// devProcess is make dev's binary running with -api-only.
type devProcess struct {
	cmd    *exec.Cmd
	url    string
	stderr bytes.Buffer
}

// startDev builds cmd/dev and starts it on a free port (API only, or the
// whole stack), with the bench's settings and env besides (KEY=value); it
// returns once the API answers.
func startDev(ctx context.Context, dir, jwtDir, profile string, apiOnly bool, env ...string) (*devProcess, error) {
	bin := filepath.Join(dir, "dev")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/dev").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build cmd/dev: %v\n%s", err, out)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	d := &devProcess{url: "http://" + addr}
	args := []string{"-addr", addr, "-jwt-dir", jwtDir}
	if apiOnly {
		args = append(args, "-api-only")
	}
	if profile != "" {
		args = append(args, "-cpuprofile", profile)
	}
	d.cmd = exec.CommandContext(ctx, bin, args...)
	d.cmd.Env = append(append(os.Environ(), "HOLDFAST_LOG_LEVEL=error"), env...)
	d.cmd.Stdout, d.cmd.Stderr = io.Discard, &d.stderr
	if err := d.cmd.Start(); err != nil {
		return nil, err
	}
	up, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for {
		req, _ := http.NewRequestWithContext(up, http.MethodGet, d.url+"/admin/skus/bench-probe/stock", nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_ = resp.Body.Close()
			return d, nil
		}
		select {
		case <-up.Done():
			d.stop()
			return nil, fmt.Errorf("cmd/dev did not answer within 60 s: %s", d.stderr.String())
		case <-time.After(50 * time.Millisecond): // polling a process that is starting
		}
	}
}

func (d *devProcess) stop() {
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	_ = d.cmd.Wait()
}

// cpu returns the process's CPU time so far (user + system, all threads).
func (d *devProcess) cpu() (time.Duration, error) { return pidCPU(d.cmd.Process.Pid) }

// pidCPU returns a process's CPU time so far (user + system, all threads).
func pidCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command name (which may hold spaces) in parentheses.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	if len(f) < 13 {
		return 0, errors.New("short /proc stat")
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * (time.Second / 100), nil // USER_HZ = 100 on Linux
}

// mintTokens mints an hour's token for each of httpUsers buyers, named
// prefix0, prefix1, ….
func mintTokens(issuer *devauth.Issuer, prefix string) ([]string, error) {
	tokens := make([]string, httpUsers)
	for i := range tokens {
		var err error
		if tokens[i], err = issuer.Mint(fmt.Sprintf("%s%d", prefix, i), time.Hour); err != nil {
			return nil, err
		}
	}
	return tokens, nil
}

// httpFigures: accepted reservations per second and sold-out answers per
// second, each at c = 32 and 128, through real HTTP against make dev's
// binary; and the dev process's CPU per answer.
func (b *bench) httpFigures(ctx context.Context) error {
	dir, err := os.MkdirTemp("", "holdfast-bench-http-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	jwtDir := filepath.Join(dir, "jwt")
	issuer, err := devauth.Open(jwtDir)
	if err != nil {
		return err
	}
	// No persist takes this part's holds (API only): benchHoldTTL.
	dev, err := startDev(ctx, dir, jwtDir, b.o.devProfile, true, "HOLDFAST_HOLD_TTL="+benchHoldTTL.String())
	if err != nil {
		return err
	}
	defer dev.stop()
	tokens, err := mintTokens(issuer, "http-u")
	if err != nil {
		return err
	}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConns: 512, MaxIdleConnsPerHost: 512}}
	call := func(method, path, body, token string) (int, error) {
		req, err := http.NewRequestWithContext(ctx, method, dev.url+path, strings.NewReader(body))
		if err != nil {
			return 0, err
		}
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp.StatusCode, nil
	}
	for _, c := range httpConcurrency {
		for _, phase := range []struct {
			name  string
			stock int
			want  int
		}{{"accepted (202)", bigStock, http.StatusAccepted}, {"sold out (409)", 0, http.StatusConflict}} {
			sku := fmt.Sprintf("bench-http-%d-%d", c, time.Now().UnixNano())
			if code, err := call(http.MethodPut, "/admin/skus/"+sku+"/stock", fmt.Sprintf(`{"stock":%d}`, phase.stock), ""); err != nil || code != http.StatusOK {
				return fmt.Errorf("http: set stock: %d %v", code, err)
			}
			body := fmt.Sprintf(`{"sku":%q,"qty":1}`, sku)
			b.log("http: c=%d, %s …", c, phase.name)
			cpu0, err := dev.cpu()
			if err != nil {
				return err
			}
			ops, el, lat, err := hammer(c, b.o.duration, func(w, i int) error {
				code, err := call(http.MethodPost, "/reservations", body, tokens[(w*7919+i*c)%httpUsers])
				if err == nil && code != phase.want {
					err = fmt.Errorf("POST /reservations answered %d, want %d", code, phase.want)
				}
				return err
			})
			if err != nil {
				return fmt.Errorf("http c=%d %s: %w", c, phase.name, err)
			}
			cpu1, err := dev.cpu()
			if err != nil {
				return err
			}
			b.results = append(b.results, result{group: fmt.Sprintf("http c=%d", c), name: phase.name, ops: ops, elapsed: el, lat: lat,
				extra: map[string]string{"server CPU": fmt.Sprintf("%.0f µs/answer", float64((cpu1-cpu0).Microseconds())/float64(max(ops, 1)))}})
			if _, err := b.app.SQS.PurgeQueue(ctx, &sqs.PurgeQueueInput{QueueUrl: &b.cfg.QueueURL}); err != nil {
				b.log("purge: %v", err)
			}
		}
	}
	return nil
}
