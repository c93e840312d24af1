// Command invoke runs one holdfast function the way `sam local invoke` does,
// without Docker: it builds the function's real bootstrap for this machine,
// starts it under the Lambda Runtime Interface Emulator with a clean
// environment made only of the variables template.yaml declares for that
// function (values from events/env.json, the --env-vars file of sam local
// invoke), posts the event and prints the function's response.
//
//	go run ./cmd/invoke -fn persist -event events/persist-batch.json
//
// With -inherit (the default), a declared variable that is set in the
// current environment wins over env.json, so `make invoke` can point the
// function at the services of a running `make dev` or a test.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/holdfast/holdfast/internal/samtemplate"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "invoke:", err)
		os.Exit(1)
	}
}

// options of one invocation.
type options struct {
	Root     string // repository root (template.yaml, functions/, bin/)
	Function string // reserve, persist, compensate or sweeper (or the logical id)
	Event    string // path of the event JSON
	EnvFile  string // sam local --env-vars file
	Inherit  bool
	Getenv   func(string) string
	Logs     io.Writer // the function's own output (stderr of the emulator)
	// BinDir, when set, keeps built bootstraps between invocations
	// (BinDir/<function>/bootstrap); otherwise each invocation builds afresh.
	BinDir string
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("invoke", flag.ContinueOnError)
	o := options{Getenv: getenv, Logs: stderr}
	fs.StringVar(&o.Root, "root", ".", "repository root")
	fs.StringVar(&o.Function, "fn", "", "function: reserve, persist, compensate or sweeper")
	fs.StringVar(&o.Event, "event", "", "event JSON file")
	fs.StringVar(&o.EnvFile, "env", "events/env.json", "environment file in sam local --env-vars format")
	fs.BoolVar(&o.Inherit, "inherit", true, "declared variables set in this environment win over the env file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.Function == "" || o.Event == "" {
		return errors.New("usage: invoke -fn FUNCTION -event FILE [-env events/env.json]")
	}
	out, err := invoke(ctx, o)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(stdout, string(out))
	return err
}

// logicalID maps "persist" to "PersistFunction"; a logical id passes through.
func logicalID(fn string) string {
	if strings.HasSuffix(fn, "Function") {
		return fn
	}
	return strings.ToUpper(fn[:1]) + fn[1:] + "Function"
}

// invoke runs the function once and returns the emulator's response body.
func invoke(ctx context.Context, o options) ([]byte, error) {
	id := logicalID(o.Function)
	tpl, err := samtemplate.Load(filepath.Join(o.Root, "template.yaml"))
	if err != nil {
		return nil, err
	}
	fn, ok := tpl.Functions()[id]
	if !ok {
		return nil, fmt.Errorf("template.yaml has no function %s", id)
	}
	event, err := os.ReadFile(o.Event)
	if err != nil {
		return nil, err
	}
	env, err := environment(o, fn)
	if err != nil {
		return nil, err
	}
	name := strings.ToLower(strings.TrimSuffix(id, "Function"))
	dir := filepath.Join(o.BinDir, name)
	if o.BinDir == "" {
		if dir, err = os.MkdirTemp("", "holdfast-invoke-"); err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
	}
	bootstrap, err := filepath.Abs(filepath.Join(dir, "bootstrap"))
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(bootstrap); err != nil || o.BinDir == "" {
		fmt.Fprintf(o.Logs, "invoke: building the %s bootstrap\n", name)
		if err := gobuild(ctx, o.Root, bootstrap, "./functions/"+name, "-tags", "lambda.norpc"); err != nil {
			return nil, err
		}
	}
	rie, err := filepath.Abs(filepath.Join(o.Root, "bin", "aws-lambda-rie"))
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(rie); err != nil {
		fmt.Fprintln(o.Logs, "invoke: building the Lambda Runtime Interface Emulator into bin/ (pinned in go.mod; once: a few minutes on the first run)")
		if err := gobuild(ctx, o.Root, rie, "github.com/aws/aws-lambda-runtime-interface-emulator/cmd/aws-lambda-rie"); err != nil {
			return nil, err
		}
	}
	emu, api := freeAddr(), freeAddr()
	cmd := exec.Command(rie, "--runtime-interface-emulator-address", emu, "--runtime-api-address", api, bootstrap)
	cmd.Env = env
	logs := &emulatorLogs{w: o.Logs}
	defer logs.Flush()
	cmd.Stdout, cmd.Stderr = logs, logs
	started := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start emulator: %w", err)
	}
	defer func() {
		logs.answered.Store(true) // what it says while being stopped is not the function's
		_ = cmd.Process.Kill()    // the emulator we started, by its PID
		_ = cmd.Wait()
	}()
	if err := waitListening(ctx, emu, 10*time.Second); err != nil {
		return nil, err
	}
	timeout := time.Duration(fn.Timeout+5) * time.Second
	req, err := http.NewRequestWithContext(ctx, http.MethodPost,
		"http://"+emu+"/2015-03-31/functions/function/invocations", bytes.NewReader(event))
	if err != nil {
		return nil, err
	}
	resp, err := (&http.Client{Timeout: timeout}).Do(req)
	if err != nil {
		return nil, fmt.Errorf("invoke %s: %w", id, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return body, fmt.Errorf("invoke %s: emulator answered %s: %s", id, resp.Status, body)
	}
	fmt.Fprintf(o.Logs, "invoke: cold invocation answered %v after the emulator started\n", time.Since(started).Round(time.Microsecond))
	return body, nil
}

// environment is the clean environment of the function: its declared
// variables (template literal < env file Parameters < env file function
// section < this environment, with -inherit) and what Lambda itself sets.
func environment(o options, fn samtemplate.Function) ([]string, error) {
	vals := map[string]string{}
	for _, name := range fn.EnvNames() {
		if s, ok := fn.Literal(name); ok {
			vals[name] = s
		} else {
			vals[name] = ""
		}
	}
	if o.EnvFile != "" {
		b, err := os.ReadFile(filepath.Join(o.Root, o.EnvFile))
		if err != nil {
			return nil, err
		}
		var file map[string]map[string]string
		if err := json.Unmarshal(b, &file); err != nil {
			return nil, fmt.Errorf("%s: %w", o.EnvFile, err)
		}
		for _, section := range []string{"Parameters", fn.LogicalID} {
			for k, v := range file[section] {
				if _, declared := vals[k]; declared { // sam local sets only declared variables
					vals[k] = v
				}
			}
		}
	}
	if o.Inherit {
		for k := range vals {
			if v := o.Getenv(k); v != "" {
				vals[k] = v
			}
		}
	}
	def := func(k, d string) string {
		if v := o.Getenv(k); v != "" {
			return v
		}
		return d
	}
	env := []string{
		"AWS_LAMBDA_FUNCTION_NAME=" + fn.LogicalID,
		"AWS_LAMBDA_FUNCTION_TIMEOUT=" + strconv.Itoa(fn.Timeout),
		"AWS_LAMBDA_FUNCTION_MEMORY_SIZE=512",
		"AWS_REGION=" + def("AWS_REGION", "us-east-1"),
		"AWS_DEFAULT_REGION=" + def("AWS_REGION", "us-east-1"),
		"AWS_ACCESS_KEY_ID=" + def("AWS_ACCESS_KEY_ID", "local"),
		"AWS_SECRET_ACCESS_KEY=" + def("AWS_SECRET_ACCESS_KEY", "local"),
	}
	for k, v := range vals {
		env = append(env, k+"="+v)
	}
	return env, nil
}

func gobuild(ctx context.Context, root, out, pkg string, flags ...string) error {
	args := append([]string{"build", "-o", out}, flags...)
	args = append(args, pkg)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %v\n%s", pkg, err, b)
	}
	return nil
}

func freeAddr() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "127.0.0.1:9001"
	}
	defer l.Close()
	return l.Addr().String()
}

func waitListening(ctx context.Context, addr string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			_ = c.Close()
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("emulator did not listen on %s: %w", addr, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// emulatorLogs passes the function's and the emulator's lines to w, less
// the emulator's noise that would make a success look like a failure:
//   - once the answer is in, the runtime's "failed to get the next invoke"
//     (the emulator is being stopped under it) is dropped;
//   - the REPORT line's "Max Memory Used" is the configured MemorySize,
//     not a measurement, and is said so;
//   - the REPORT line's "Init Duration" (a few hundredths of a millisecond,
//     whatever the init took) becomes the init phase's duration that the
//     emulator's INIT REPORT line measured, as Lambda's REPORT gives it.
type emulatorLogs struct {
	w        io.Writer
	answered atomic.Bool
	mu       sync.Mutex
	partial  []byte
	initMs   string // from INIT REPORT(durationMs: …)
}

var (
	maxMemory    = regexp.MustCompile(`Max Memory Used: \d+ MB`)
	initReport   = regexp.MustCompile(`INIT REPORT\(durationMs: ([0-9.]+)\)`)
	initDuration = regexp.MustCompile(`Init Duration: [0-9.]+ ms`)
)

func (l *emulatorLogs) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.partial = append(l.partial, b...)
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			return len(b), nil
		}
		l.line(l.partial[:i+1])
		l.partial = l.partial[i+1:]
	}
}

func (l *emulatorLogs) line(line []byte) {
	if l.answered.Load() && bytes.Contains(line, []byte("failed to get the next invoke")) {
		return
	}
	if m := initReport.FindSubmatch(line); m != nil {
		if ms, err := strconv.ParseFloat(string(m[1]), 64); err == nil {
			l.initMs = strconv.FormatFloat(ms, 'f', 2, 64)
		}
	}
	line = maxMemory.ReplaceAll(line, []byte("Max Memory Used: not measured by the emulator"))
	if l.initMs != "" {
		line = initDuration.ReplaceAll(line, []byte("Init Duration: "+l.initMs+" ms"))
	}
	_, _ = l.w.Write(line)
}

// Flush writes a last line without its newline.
func (l *emulatorLogs) Flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.partial) > 0 {
		l.line(l.partial)
		l.partial = nil
	}
}
