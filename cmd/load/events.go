package main

// Where the run reads its events: make dev's events queue by default, the
// queue -events-queue names, or none.

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/holdfast/holdfast/internal/loadgen"
)

// eventsQueueVar is the setting naming the local events queue: make dev's
// holdfast reads it from the environment (shared/config), which
// scripts/dev.sh loads from the services' env file.
const eventsQueueVar = "HOLDFAST_EVENTS_QUEUE_URL"

// eventsQueueURL returns the queue to read the run's events from, or "" and
// why none. explicit is -events-queue when given. Without it, a run against
// a loopback API (make dev) reads make dev's queue, found as make dev finds
// it: HOLDFAST_EVENTS_QUEUE_URL, else that line of devEnv (the services'
// env file, .holdfast/dev/env); a deployed stage has no default (its
// events go to EventBridge: give the queue a rule delivers them to).
func eventsQueueURL(explicit *string, apiURL, devEnv string, getenv func(string) string) (string, string) {
	if explicit != nil {
		if *explicit == "" {
			return "", `-events-queue ""`
		}
		return *explicit, ""
	}
	if !loopback(apiURL) {
		return "", "a deployed stage publishes to EventBridge: -events-queue names a queue its rule delivers to"
	}
	if u := getenv(eventsQueueVar); u != "" {
		return u, ""
	}
	u, err := envFileValue(devEnv, eventsQueueVar)
	if err != nil {
		return "", fmt.Sprintf("make dev's events queue not found (%v); -events-queue names it", err)
	}
	if u == "" {
		return "", fmt.Sprintf("%s sets no %s; -events-queue names the queue", devEnv, eventsQueueVar)
	}
	return u, ""
}

// envFileValue reads key's value from a file of `export KEY=VALUE` lines
// (the value possibly single-quoted), as internal/services writes it.
func envFileValue(path, key string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimPrefix(strings.TrimSpace(sc.Text()), "export ")
		if v, ok := strings.CutPrefix(line, key+"="); ok {
			return strings.Trim(v, `'"`), nil
		}
	}
	return "", sc.Err()
}

// loopback reports whether rawURL's host is this machine.
func loopback(rawURL string) bool {
	u, err := url.Parse(rawURL)
	if err != nil {
		return false
	}
	h := u.Hostname()
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// eventsQueue opens the SQS queue at queueURL. A loopback queue (make dev's
// SQS server) is reached at its own address with the local credentials,
// never the developer's; another with the default AWS chain, in the
// region its host names when none is configured.
func eventsQueue(ctx context.Context, queueURL string) (*loadgen.SQSQueue, error) {
	u, err := url.Parse(queueURL)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("-events-queue %q: not a queue URL", queueURL)
	}
	if loopback(queueURL) {
		endpoint := u.Scheme + "://" + u.Host
		client := sqs.New(sqs.Options{
			Region: "us-east-1", BaseEndpoint: aws.String(endpoint),
			Credentials: credentials.NewStaticCredentialsProvider("local", "local", ""),
		})
		return loadgen.NewSQSQueue(client, queueURL), nil
	}
	cfg, err := awsconfig.LoadDefaultConfig(ctx)
	if err != nil {
		return nil, err
	}
	if cfg.Region == "" { // https://sqs.<region>.amazonaws.com/<account>/<name>
		if parts := strings.Split(u.Hostname(), "."); len(parts) > 2 && parts[0] == "sqs" {
			cfg.Region = parts[1]
		}
	}
	return loadgen.NewSQSQueue(sqs.NewFromConfig(cfg), queueURL), nil
}

// serverCounters returns the counters of the servers a -room run reads
// around its burst of polls, or nil and why none. redisAddr and dsn are
// -redis-addr and -db-dsn when given; without them a run against a
// loopback API (make dev) reads make dev's servers, found as make dev
// finds them: HOLDFAST_REDIS_ADDR and HOLDFAST_DB_DSN, else those lines of
// devEnv. A deployed stage has none (its ElastiCache and RDS are not the
// load tool's to reach).
func serverCounters(ctx context.Context, redisAddr, dsn *string, apiURL, devEnv string, getenv func(string) string) (*loadgen.ServerCounters, string, error) {
	setting := func(explicit *string, key, flag string) (string, string) {
		if explicit != nil {
			if *explicit == "" {
				return "", flag + ` ""`
			}
			return *explicit, ""
		}
		if !loopback(apiURL) {
			return "", "a deployed stage's servers are not the load tool's to read: " + flag + " names one"
		}
		if v := getenv(key); v != "" {
			return v, ""
		}
		v, err := envFileValue(devEnv, key)
		if err != nil || v == "" {
			return "", fmt.Sprintf("make dev's %s not found in %s (%v); %s names it", key, devEnv, err, flag)
		}
		return v, ""
	}
	addr, skip := setting(redisAddr, "HOLDFAST_REDIS_ADDR", "-redis-addr")
	if skip != "" {
		return nil, skip, nil
	}
	d, skip := setting(dsn, "HOLDFAST_DB_DSN", "-db-dsn")
	if skip != "" {
		return nil, skip, nil
	}
	c, err := loadgen.NewServerCounters(ctx, addr, d)
	if err != nil {
		return nil, "", err
	}
	return c, "", nil
}
