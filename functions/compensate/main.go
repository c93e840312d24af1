// Command compensate consumes the reservation queue's dead-letter queue: MySQL
// first, then the fenced cancel that returns the hold's stock once.
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
		fmt.Fprintln(os.Stderr, "compensate:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, getenv func(string) string) error {
	cfg, err := config.Load(getenv)
	if err != nil {
		return err
	}
	a, err := app.Build(ctx, cfg, app.Options{Function: "compensate", Out: os.Stdout})
	if err != nil {
		return err
	}
	defer a.Close()
	lambda.StartWithOptions(metrics.Flushing(a.Metrics, a.Handlers(nil).Compensate.Handle), lambda.WithContext(ctx))
	return nil
}
