// Command sweeper runs on a schedule: it decides holds past their deadline,
// fails group-buys that did not form, warms Redis from MySQL and measures drift.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/holdfast/holdfast/shared/app"
	"github.com/holdfast/holdfast/shared/config"
	"github.com/holdfast/holdfast/shared/metrics"
)

func main() {
	if err := run(context.Background(), os.Getenv); err != nil {
		fmt.Fprintln(os.Stderr, "sweeper:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, getenv func(string) string) error {
	cfg, err := config.Load(getenv)
	if err != nil {
		return err
	}
	a, err := app.Build(ctx, cfg, app.Options{Function: "sweeper", Out: os.Stdout})
	if err != nil {
		return err
	}
	defer a.Close()
	lambda.StartWithOptions(metrics.Flushing(a.Metrics, a.Handlers(nil).Sweeper.Handle), lambda.WithContext(ctx))
	return nil
}
