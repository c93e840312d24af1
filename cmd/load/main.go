// Command load fires a flash sale at holdfast and prints the invariant
// report (see package loadgen). By default it targets `make dev`:
//
//	go run ./cmd/load -n 2000 -c 64 -stock 150 -groups 2 -chart load.png
//
// Against a deployed stage: -url https://…/dev -token <buyer JWT> -sigv4
// (admin routes are IAM-signed with the default AWS credentials).
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/holdfast/holdfast/shared/loadgen"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	ok, err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "load:", err)
		os.Exit(2)
	}
	if !ok {
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) (bool, error) {
	fs := flag.NewFlagSet("load", flag.ContinueOnError)
	cfg := loadgen.Config{Progress: stderr}
	fs.StringVar(&cfg.BaseURL, "url", "http://127.0.0.1:3000", "holdfast API base URL")
	fs.IntVar(&cfg.N, "n", 2000, "reservations to fire")
	fs.IntVar(&cfg.Concurrency, "c", 64, "concurrent buyers")
	fs.StringVar(&cfg.SKU, "sku", fmt.Sprintf("flash-%d", time.Now().Unix()), "hot SKU (set to this stock first)")
	fs.IntVar(&cfg.Stock, "stock", 150, "units of the hot SKU")
	fs.IntVar(&cfg.Groups, "groups", 0, "group-buy rounds (2 × capacity joiners each, some users twice)")
	fs.IntVar(&cfg.GroupCapacity, "group-capacity", 3, "slots per group")
	fs.DurationVar(&cfg.Settle, "settle", 3*time.Minute, "longest wait for every reservation to be decided")
	fs.StringVar(&cfg.Token, "token", "", "bearer token for buyer routes (a deployed stage)")
	sigv4 := fs.Bool("sigv4", false, "sign admin requests with SigV4 (a deployed stage's IAM routes)")
	chart := fs.String("chart", "load.png", "chart file (.png or .svg); empty for none")
	if err := fs.Parse(args); err != nil {
		return false, err
	}
	if *sigv4 {
		sign, err := signer(ctx)
		if err != nil {
			return false, err
		}
		cfg.Sign = sign
	}
	rep, err := loadgen.Run(ctx, cfg)
	if err != nil {
		return false, err
	}
	rep.Print(stdout)
	if *chart != "" {
		if err := loadgen.WriteChart(rep, *chart); err != nil {
			return false, err
		}
		fmt.Fprintf(stdout, "  chart    %s\n", *chart)
	}
	return rep.Passed(), nil
}

// signer signs requests for API Gateway's IAM authorizer.
func signer(ctx context.Context) (func(*http.Request) error, error) {
	awsCfg, err := awsconfig.LoadDefaultConfig(ctx)
	if err != nil {
		return nil, err
	}
	s := v4.NewSigner()
	return func(req *http.Request) error {
		creds, err := awsCfg.Credentials.Retrieve(req.Context())
		if err != nil {
			return err
		}
		var body []byte
		if req.GetBody != nil {
			rc, err := req.GetBody()
			if err != nil {
				return err
			}
			body, _ = io.ReadAll(rc)
		}
		sum := sha256.Sum256(body)
		return s.SignHTTP(req.Context(), creds, req, hex.EncodeToString(sum[:]), "execute-api", aws.ToString(&awsCfg.Region), time.Now())
	}, nil
}
