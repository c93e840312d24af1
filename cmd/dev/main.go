// Command dev runs holdfast on one machine the way Lambda runs it: an HTTP
// server on 127.0.0.1:3000 turns requests into API Gateway HTTP API v2 events
// for the reserve handler, pollers feed the persist and compensate handlers
// from the queue and its DLQ like Lambda's SQS event source, and the sweeper
// runs on a timer. It reads the same HOLDFAST_* settings as the functions
// (scripts/dev.sh starts the services and exports them).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/holdfast/holdfast/shared/app"
	"github.com/holdfast/holdfast/shared/config"
	"github.com/holdfast/holdfast/shared/consumer"
	"github.com/holdfast/holdfast/shared/eventsource"
	"github.com/holdfast/holdfast/shared/httpapi"
	"github.com/holdfast/holdfast/shared/mysqlstore"
	"github.com/holdfast/holdfast/shared/schedule"
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
	addr := fs.String("addr", "127.0.0.1:3000", "HTTP listen address")
	sweepEvery := fs.Duration("sweep-every", time.Minute, "sweeper period (the template's schedule)")
	seed := fs.Bool("seed", true, "create the demo SKUs if they do not exist")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg, err := config.Load(getenv)
	if err != nil {
		return err
	}
	if err := cfg.NeedsQueue(); err != nil {
		return err
	}
	dlq := getenv("HOLDFAST_DLQ_URL")
	if dlq == "" {
		return errors.New("HOLDFAST_DLQ_URL is required")
	}
	a, err := app.Build(ctx, cfg, app.Options{Function: "dev", Out: io.Discard})
	if err != nil {
		return err
	}
	defer a.Close()
	log := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{Level: slog.LevelInfo}))

	if err := mysqlstore.Migrate(ctx, a.DB); err != nil {
		return err
	}
	if *seed {
		for sku, n := range map[string]int64{"demo-phone": 100, "demo-tee": 1000} {
			if _, err := a.Service.Available(ctx, sku); err == nil {
				continue
			}
			if _, err := a.Service.SetStock(ctx, sku, n, nil); err != nil {
				return fmt.Errorf("seed %s: %w", sku, err)
			}
			log.Info("seeded", "sku", sku, "stock", n)
		}
	}

	api := httpapi.New(a.Service, slog.New(slog.NewTextHandler(os.Stderr, nil)))
	persist := consumer.New("persist", a.Service.Persist, a.Metrics, slog.New(slog.DiscardHandler))
	compensate := consumer.New("compensate", a.Service.Compensate, a.Metrics, slog.New(slog.DiscardHandler))
	sweeper := schedule.New(a.Service, slog.New(slog.DiscardHandler))

	var wg sync.WaitGroup
	poll := func(name, url string, h eventsource.Handler, concurrency int) {
		p := &eventsource.Poller{Client: a.SQS, QueueURL: url, BatchSize: 10, Visibility: 30, WaitTime: 1, Handler: h}
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.Run(ctx, concurrency, func(r eventsource.Result, err error) {
				if err != nil {
					log.Warn(name+" poll", "error", err)
					return
				}
				log.Info(name+" batch", "size", r.Received, "failures", r.Failed)
			})
		}()
	}
	poll("persist", cfg.QueueURL, persist.Handle, 4)
	poll("compensate", dlq, compensate.Handle, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(*sweepEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				rep, err := sweeper.Handle(ctx, json.RawMessage(`{}`))
				log.Info("sweep", "expired", rep.Expired, "released", rep.Released, "groups_failed", rep.GroupsFailed,
					"warmed", rep.Warmed, "errors", rep.Errors, "error", err)
			}
		}
	}()

	srv := &http.Server{Addr: *addr, Handler: gateway(api, log), ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	log.Info("holdfast is up", "api", "http://"+*addr, "sweep_every", *sweepEvery)
	select {
	case <-ctx.Done():
	case err := <-errc:
		return err
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(shutdown)
	wg.Wait()
	log.Info("holdfast stopped")
	return nil
}

// gateway turns HTTP requests into API Gateway HTTP API v2 events, as
// `sam local start-api` does, and logs one line per request.
func gateway(api *httpapi.Handler, log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		body, err := io.ReadAll(io.LimitReader(r.Body, httpapi.MaxBody+1))
		if err != nil {
			http.Error(w, `{"error":"invalid_request","message":"unreadable body"}`, http.StatusBadRequest)
			return
		}
		headers := map[string]string{}
		for k, v := range r.Header {
			headers[strings.ToLower(k)] = strings.Join(v, ",")
		}
		ev := events.APIGatewayV2HTTPRequest{
			Version: "2.0", RouteKey: "$default", RawPath: r.URL.Path, RawQueryString: r.URL.RawQuery,
			Headers: headers, Body: string(body),
			RequestContext: events.APIGatewayV2HTTPRequestContext{
				Stage: "$default", RequestID: fmt.Sprintf("dev-%d", start.UnixNano()), TimeEpoch: start.UnixMilli(),
				HTTP: events.APIGatewayV2HTTPRequestContextHTTPDescription{
					Method: r.Method, Path: r.URL.Path, Protocol: r.Proto, SourceIP: r.RemoteAddr, UserAgent: r.UserAgent(),
				},
			},
		}
		resp, err := api.Handle(r.Context(), ev)
		if err != nil {
			resp = events.APIGatewayV2HTTPResponse{StatusCode: http.StatusBadGateway, Body: `{"error":"internal","message":"handler error"}`}
		}
		for k, v := range resp.Headers {
			w.Header().Set(k, v)
		}
		w.WriteHeader(resp.StatusCode)
		_, _ = io.WriteString(w, resp.Body)
		log.Info(r.Method+" "+r.URL.Path, "status", resp.StatusCode, "latency", time.Since(start).Round(time.Microsecond))
	})
}
