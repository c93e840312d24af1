// Command persist consumes the reservation queue and settles each reservation
// in MySQL exactly once, reporting partial batch failures.
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
		fmt.Fprintln(os.Stderr, "persist:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, getenv func(string) string) error {
	cfg, err := config.Load(getenv)
	if err != nil {
		return err
	}
	a, err := app.Build(ctx, cfg, app.Options{Function: "persist", Out: os.Stdout})
	if err != nil {
		return err
	}
	defer a.Close()
	lambda.StartWithOptions(metrics.Flushing(a.Metrics, a.Handlers(nil).Persist.Handle), lambda.WithContext(ctx))
	return nil
}
