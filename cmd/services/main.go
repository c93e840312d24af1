// Command services installs, starts and stops the local data tier
// (redis-server, MariaDB, goaws) on loopback; scripts/services.sh wraps it.
//
//	services install          install what is missing (apt, the pinned goaws;
//	                          chromium too when HOLDFAST_BROWSER=1, wrk
//	                          when HOLDFAST_BENCH=1)
//	services start DIR        install, then start everything with data under
//	                          DIR; writes DIR/env (shell exports) and DIR/pids
//	services stop DIR         stop what `start DIR` started, by PID
//
// Ports are free ones unless HOLDFAST_REDIS_PORT, HOLDFAST_DB_PORT or
// HOLDFAST_SQS_PORT say; HOLDFAST_DB_DURABLE=1 syncs MariaDB at every commit;
// HOLDFAST_BROWSER=1 (make test) installs chromium as well, for the buyer
// page's browser test; HOLDFAST_BENCH=1 (make bench) installs wrk, the load
// generator of its stack part.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"

	"github.com/holdfast/holdfast/internal/services"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Getenv); err != nil {
		fmt.Fprintln(os.Stderr, "services:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, getenv func(string) string) error {
	root, err := os.Getwd()
	if err != nil {
		return err
	}
	usage := errors.New("usage: services install | start DIR | stop DIR")
	if len(args) == 0 {
		return usage
	}
	extras := services.Extras{Browser: getenv("HOLDFAST_BROWSER") == "1", Wrk: getenv("HOLDFAST_BENCH") == "1"}
	switch {
	case args[0] == "install" && len(args) == 1:
		return services.Install(ctx, root, extras, os.Stderr)
	case args[0] == "start" && len(args) == 2:
		if err := services.Install(ctx, root, extras, os.Stderr); err != nil {
			return err
		}
		port := func(key string) int { n, _ := strconv.Atoi(getenv(key)); return n }
		return services.Start(ctx, root, args[1], services.Options{
			Ports:   services.Ports{Redis: port("HOLDFAST_REDIS_PORT"), DB: port("HOLDFAST_DB_PORT"), SQS: port("HOLDFAST_SQS_PORT")},
			Durable: getenv("HOLDFAST_DB_DURABLE") == "1",
			Log:     os.Stderr,
		})
	case args[0] == "stop" && len(args) == 2:
		services.Stop(args[1], os.Stderr)
		return nil
	}
	return usage
}
