// Command dev runs holdfast on one machine the way Lambda runs it (see
// package devstack): the API on 127.0.0.1:3000, persist and compensate fed
// from the queues, the sweeper on its schedule — every setting taken from
// template.yaml. scripts/dev.sh starts the services and exports HOLDFAST_*.
//
// Buyer routes want a JWT as API Gateway's authorizer does; dev checks them
// against the dev issuer's key in -jwt-dir (created on first use), the key
// `make token SUB=ann` mints with. Admin routes are open on loopback. Beside
// the API it serves the buyer page at /shop/?sku=... and the page's dev
// sign-in, POST /dev/token, which mints with the same key; neither exists in
// AWS.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"runtime/pprof"
	"syscall"
	"time"

	"github.com/holdfast/holdfast/internal/devauth"
	"github.com/holdfast/holdfast/internal/devstack"
	"github.com/holdfast/holdfast/shared/config"
)

// devGCPercent is the dev stack's GOGC unless the environment sets one.
const devGCPercent = 400

func main() {
	// Ctrl-C, kill, and a closed terminal (SIGHUP) all stop it the same way.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	if os.Getenv("GOGC") == "" {
		// Every function shares this one process and two cores: a larger
		// heap goal spends memory (tens of MB) instead of CPU on the
		// collector, about 8% of the process under load (docs/benchmarks.md).
		debug.SetGCPercent(devGCPercent)
	}
	if err := run(ctx, os.Args[1:], os.Getenv); err != nil {
		fmt.Fprintln(os.Stderr, "dev:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, getenv func(string) string) error {
	fs := flag.NewFlagSet("dev", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:3000", "HTTP listen address (sam local start-api's default)")
	tpl := fs.String("template", "template.yaml", "SAM template to take the settings from")
	sweep := fs.Duration("sweep-every", 0, "sweeper period (default: the template's schedule)")
	jwtDir := fs.String("jwt-dir", devauth.DefaultDir, "dev JWT issuer key directory (make token mints with it)")
	apiOnly := fs.Bool("api-only", false, "serve the API alone: no persist, compensate or sweeper in this process")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg, err := config.Load(getenv)
	if err != nil {
		return err
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	var level slog.Level // HOLDFAST_LOG_LEVEL: error keeps the per-request lines out (make bench)
	if err := level.UnmarshalText([]byte(cfg.LogLevel)); err != nil {
		return fmt.Errorf("HOLDFAST_LOG_LEVEL=%q: %w", cfg.LogLevel, err)
	}
	log := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		Level: level,
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				a.Value = slog.StringValue(a.Value.Time().Format("15:04:05.000"))
			}
			return a
		},
	}))
	issuer, err := devauth.Open(*jwtDir)
	if err != nil {
		return err
	}
	s, err := devstack.Start(ctx, cfg, devstack.Options{
		Addr: *addr, Template: *tpl, DLQURL: getenv("HOLDFAST_DLQ_URL"), CreateQueues: true,
		Seed: map[string]int64{"demo-phone": 100, "demo-tee": 1000}, Log: log, SweepEvery: *sweep,
		Verifier: issuer.Verifier(), APIOnly: *apiOnly, Shop: true, SignIn: issuer,
	})
	if err != nil {
		return err
	}
	mint := "make -s token SUB=ann"
	if *jwtDir != devauth.DefaultDir {
		mint = "go run ./cmd/token -sub ann -dir " + *jwtDir
	}
	fmt.Printf("buyer routes need a JWT from the dev issuer: curl -H \"Authorization: Bearer $(%s)\" %s/skus/demo-phone\n", mint, s.URL)
	fmt.Printf("the buyer page (sign in as anyone): %s/shop/?sku=demo-phone\n", s.URL)
	<-ctx.Done()
	start := time.Now()
	s.Stop()
	log.Info("holdfast stopped", "took", time.Since(start).Round(time.Millisecond))
	return nil
}
