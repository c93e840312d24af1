// Command migrate prepares a stage's database: a CloudFormation custom
// resource runs it on every deploy (migrations, the functions' user), and an
// operator may invoke it directly to do the same.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/holdfast/holdfast/shared/app"
	"github.com/holdfast/holdfast/shared/config"
	"github.com/holdfast/holdfast/shared/handlers/provision"
)

func main() {
	if err := run(context.Background(), os.Getenv); err != nil {
		fmt.Fprintln(os.Stderr, "migrate:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, getenv func(string) string) error {
	log := slog.New(slog.NewJSONHandler(os.Stdout, nil)).With("function", "migrate")
	cfg, err := config.LoadMigrate(getenv)
	prepare := provision.Prepare(func(context.Context) (provision.Report, error) { return provision.Report{}, err })
	if err == nil {
		prepare = app.PrepareDatabase(cfg)
	}
	// Even misconfigured, the function starts and answers CloudFormation
	// (FAILED, with the reason) rather than leaving the stack waiting.
	lambda.StartWithOptions(provision.NewHandler(prepare, log).Handle, lambda.WithContext(ctx))
	return nil
}
