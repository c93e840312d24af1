// Command reserve is the API Gateway (HTTP API) function: it holds stock in
// Redis and hands each reservation to the queue, and serves status, cancel,
// group-buy and admin routes.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/holdfast/holdfast/shared/app"
	"github.com/holdfast/holdfast/shared/config"
	"github.com/holdfast/holdfast/shared/handlers/httpapi"
	"github.com/holdfast/holdfast/shared/metrics"
)

func main() {
	if err := run(context.Background(), os.Getenv); err != nil {
		fmt.Fprintln(os.Stderr, "reserve:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, getenv func(string) string) error {
	cfg, err := config.Load(getenv)
	if err != nil {
		return err
	}
	if err := cfg.NeedsQueue(); err != nil {
		return err
	}
	a, err := app.Build(ctx, cfg, app.Options{Function: "reserve", Out: os.Stdout})
	if err != nil {
		return err
	}
	defer a.Close()
	lambda.StartWithOptions(httpapi.Invoker(metrics.Flushing(a.Metrics, a.Handlers(nil).API.Invoke)), lambda.WithContext(ctx))
	return nil
}
