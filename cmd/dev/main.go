// Command dev runs holdfast on one machine the way Lambda runs it (see
// package devstack): the API on 127.0.0.1:3000, persist and compensate fed
// from the queues, the sweeper on its schedule — every setting taken from
// template.yaml. scripts/dev.sh starts the services and exports HOLDFAST_*.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/holdfast/holdfast/shared/config"
	"github.com/holdfast/holdfast/shared/devstack"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
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
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg, err := config.Load(getenv)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				a.Value = slog.StringValue(a.Value.Time().Format("15:04:05.000"))
			}
			return a
		},
	}))
	s, err := devstack.Start(ctx, cfg, devstack.Options{
		Addr: *addr, Template: *tpl, DLQURL: getenv("HOLDFAST_DLQ_URL"), CreateQueues: true,
		Seed: map[string]int64{"demo-phone": 100, "demo-tee": 1000}, Log: log, SweepEvery: *sweep,
	})
	if err != nil {
		return err
	}
	<-ctx.Done()
	start := time.Now()
	s.Stop()
	log.Info("holdfast stopped", "took", time.Since(start).Round(time.Millisecond))
	return nil
}
