// Package app is the composition root shared by the four Lambda functions,
// the local dev stack and the integration tests: it turns a config.Config
// into connected clients, adapters and the reservation service, so that
// every entry point runs exactly the same wiring.
package app

import (
	"context"
	"crypto/tls"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/go-sql-driver/mysql"
	"github.com/holdfast/holdfast/shared/adapters/eventbus"
	"github.com/holdfast/holdfast/shared/adapters/mysqlstore"
	"github.com/holdfast/holdfast/shared/adapters/queue"
	"github.com/holdfast/holdfast/shared/adapters/redisstore"
	"github.com/holdfast/holdfast/shared/awsjson"
	"github.com/holdfast/holdfast/shared/config"
	"github.com/holdfast/holdfast/shared/handlers/consumer"
	"github.com/holdfast/holdfast/shared/handlers/httpapi"
	"github.com/holdfast/holdfast/shared/handlers/schedule"
	"github.com/holdfast/holdfast/shared/metrics"
	"github.com/holdfast/holdfast/shared/reservation"
	"github.com/redis/go-redis/v9"
)

// App is a wired holdfast: the service and what it needs to be closed.
type App struct {
	Service *reservation.Service
	Metrics *metrics.Recorder
	Log     *slog.Logger
	Redis   redis.UniversalClient
	DB      *sql.DB
	SQS     *sqs.Client

	cfg     config.Config
	closers []func() error
	// edgeSecret is what the CDN sends in httpapi.EdgeHeader ("": no check).
	edgeSecret string
}

// Options adjusts the wiring for tests and the dev stack.
type Options struct {
	Function string            // the function name in logs and metrics
	Out      io.Writer         // where logs and EMF lines go (stdout in Lambda)
	Clock    reservation.Clock // the function's clock (the Lambda's own)
	// ScriptClock, when set, replaces Redis's clock in the Lua scripts:
	// tests that move time set it. Production leaves it nil, so scripts read
	// Redis's TIME and no function's clock moves a deadline.
	ScriptClock reservation.Clock
	// Enqueuer, when set, wraps or replaces the SQS publisher (tests inject
	// lost messages and failed sends). Production wiring leaves it nil.
	Enqueuer func(sqs reservation.Enqueuer) reservation.Enqueuer
	// Notifier, when set, wraps the event publisher (tests inject a bus
	// that fails for a while).
	Notifier func(bus reservation.Notifier) reservation.Notifier
	// Hooks are crash points for fault-injection tests; nil in production.
	Hooks reservation.Hooks
	// Metrics, when set, also receives every count the service makes
	// (bench and tests read them); EMF lines are written either way.
	Metrics reservation.Metrics
}

// Build connects to Redis, MySQL, SQS and the event bus as cfg says and
// returns the service. Connections are lazy: nothing is dialled until the
// first request, so a cold start does no network work but reading secrets.
func Build(ctx context.Context, cfg config.Config, opt Options) (*App, error) {
	if opt.Clock == nil {
		opt.Clock = reservation.SystemClock{}
	}
	level := slog.LevelInfo
	_ = level.UnmarshalText([]byte(cfg.LogLevel))
	log := slog.New(slog.NewJSONHandler(opt.Out, &slog.HandlerOptions{Level: level})).With("function", opt.Function)
	rec := metrics.New(opt.Out, opt.Function, cfg.Stage, opt.Clock.Now)

	awsCfg, err := awsconfig.LoadDefaultConfig(ctx)
	if err != nil {
		return nil, fmt.Errorf("aws config: %w", err)
	}
	if cfg.AWSEndpoint != "" {
		awsCfg.BaseEndpoint = aws.String(cfg.AWSEndpoint)
	}
	var secrets *secretsmanager.Client
	if cfg.DBSecretID != "" || cfg.RedisSecretID != "" || cfg.IDSecretID != "" || cfg.EdgeSecretID != "" {
		secrets = secretsmanager.NewFromConfig(awsCfg)
	}

	a := &App{Log: log, Metrics: rec, cfg: cfg}
	rdb, err := redisClient(ctx, cfg, secrets)
	if err != nil {
		return nil, err
	}
	a.Redis = rdb
	a.closers = append(a.closers, rdb.Close)

	db, database, err := openDB(ctx, cfg, secrets)
	if err != nil {
		_ = a.Close()
		return nil, err
	}
	a.DB = db
	a.closers = append(a.closers, db.Close)

	idSecret, err := idSecret(ctx, cfg, secrets)
	if err != nil {
		_ = a.Close()
		return nil, err
	}
	a.edgeSecret = cfg.EdgeSecret
	if cfg.EdgeSecretID != "" {
		if a.edgeSecret, err = secretString(ctx, secrets, cfg.EdgeSecretID); err != nil {
			_ = a.Close()
			return nil, err
		}
	}
	a.edgeSecret = strings.TrimSpace(a.edgeSecret)

	a.SQS = sqs.NewFromConfig(awsCfg)
	var enq reservation.Enqueuer
	switch {
	case cfg.QueueURL == "":
	case cfg.SQSSend == "sdk":
		enq = queue.NewPublisher(a.SQS, cfg.QueueURL)
	default:
		if enq, err = directPublisher(ctx, a.SQS, cfg.QueueURL); err != nil {
			_ = a.Close()
			return nil, err
		}
	}
	notifier, err := eventPublisher(ctx, cfg, awsCfg, a.SQS)
	if err != nil {
		_ = a.Close()
		return nil, err
	}
	if opt.Enqueuer != nil {
		enq = opt.Enqueuer(enq)
	}
	if opt.Notifier != nil {
		notifier = opt.Notifier(notifier)
	}

	holdOpts := []redisstore.Option{redisstore.WithUserRate(cfg.UserRate, cfg.UserBurst), redisstore.WithLedger(database)}
	if opt.ScriptClock != nil {
		holdOpts = append(holdOpts, redisstore.WithClock(opt.ScriptClock))
	}
	a.Service = reservation.NewService(cfg.Protocol, reservation.Deps{
		Redis:    redisstore.New(rdb, cfg.HoldRetention, holdOpts...),
		Ledger:   mysqlstore.New(db),
		Queue:    enq,
		Notifier: notifier,
		Metrics:  teeMetrics(rec, opt.Metrics),
		Clock:    opt.Clock,
		Log:      log,
		Hooks:    opt.Hooks,
		IDSecret: idSecret,
	})
	return a, nil
}

// idSecret reads the key of ids derived from an Idempotency-Key: from
// Secrets Manager in AWS, from a local file in make dev. A function that
// takes reservations (it has the queue) needs one; the others do not.
func idSecret(ctx context.Context, cfg config.Config, secrets *secretsmanager.Client) ([]byte, error) {
	var key string
	switch {
	case cfg.IDSecretID != "":
		s, err := secretString(ctx, secrets, cfg.IDSecretID)
		if err != nil {
			return nil, err
		}
		key = s
	case cfg.IDSecretFile != "":
		b, err := os.ReadFile(cfg.IDSecretFile)
		if err != nil {
			return nil, fmt.Errorf("id secret file: %w", err)
		}
		key = string(b)
	}
	key = strings.TrimSpace(key)
	if key == "" && cfg.QueueURL != "" {
		return nil, errors.New("config: set HOLDFAST_ID_SECRET_ID (or HOLDFAST_ID_SECRET_FILE locally): reservation ids derived from an Idempotency-Key are keyed with it")
	}
	if key != "" && len(key) < 16 {
		return nil, errors.New("config: the id secret is shorter than 16 characters")
	}
	return []byte(key), nil
}

// Handlers are the Lambda handlers of the four functions, wired one way
// for the mains, make dev's stack, the system tests and bench.
type Handlers struct {
	API        *httpapi.Handler  // reserve (API Gateway)
	Persist    *consumer.Handler // persist (the reservation queue, in batches)
	Compensate *consumer.Handler // compensate (the DLQ)
	Sweeper    *schedule.Handler // sweeper (the schedule)
}

// Handlers returns the handlers over the app's service, logging to log
// (the app's own when nil).
func (a *App) Handlers(log *slog.Logger) Handlers {
	if log == nil {
		log = a.Log
	}
	return Handlers{
		API:        httpapi.New(a.Service, log, httpapi.WithUserClaim(a.cfg.UserClaim), httpapi.WithEdgeSecret(a.edgeSecret)),
		Persist:    consumer.NewBatch("persist", a.Service.PersistBatch, a.Metrics, log),
		Compensate: consumer.New("compensate", a.Service.Compensate, a.Metrics, log),
		Sweeper:    schedule.New(a.Service, log),
	}
}

// teeMetrics counts into the recorder and, when set, extra.
func teeMetrics(rec *metrics.Recorder, extra reservation.Metrics) reservation.Metrics {
	if extra == nil {
		return rec
	}
	return tee{rec, extra}
}

type tee [2]reservation.Metrics

func (t tee) Count(name string, n int) { t[0].Count(name, n); t[1].Count(name, n) }

// Close closes the clients.
func (a *App) Close() error {
	var errs []error
	for i := len(a.closers) - 1; i >= 0; i-- {
		errs = append(errs, a.closers[i]())
	}
	return errors.Join(errs...)
}

func redisClient(ctx context.Context, cfg config.Config, secrets *secretsmanager.Client) (redis.UniversalClient, error) {
	password := cfg.RedisPassword
	if cfg.RedisSecretID != "" {
		s, err := secretString(ctx, secrets, cfg.RedisSecretID)
		if err != nil {
			return nil, err
		}
		password = strings.TrimSpace(s)
		var token struct {
			Token string `json:"token"`
		}
		if json.Unmarshal([]byte(s), &token) == nil && token.Token != "" {
			password = token.Token
		}
	}
	var tlsCfg *tls.Config
	if cfg.RedisTLS {
		// No ServerName: each connection verifies the name it dials, which in
		// cluster mode is the node's address from CLUSTER SLOTS (DNS names on
		// ElastiCache), not the configuration endpoint (TestRedisClusterTLS).
		tlsCfg = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	// Short timeouts: reserve fails closed fast when Redis is slow. go-redis
	// retries (3 by default); every script is safe to run twice.
	opts := &redis.UniversalOptions{
		Addrs:        strings.Split(cfg.RedisAddr, ","),
		Password:     password,
		TLSConfig:    tlsCfg,
		DialTimeout:  time.Second,
		ReadTimeout:  500 * time.Millisecond,
		WriteTimeout: 500 * time.Millisecond,
		PoolTimeout:  time.Second,
	}
	if cfg.RedisCluster {
		return redis.NewClusterClient(opts.Cluster()), nil
	}
	return redis.NewClient(opts.Simple()), nil
}

// directPublisher is reserve's sender (sqsDirect).
func directPublisher(ctx context.Context, client *sqs.Client, queueURL string) (*queue.DirectPublisher, error) {
	c, err := sqsDirect(ctx, client)
	if err != nil {
		return nil, err
	}
	return queue.NewDirectPublisher(queue.DirectConfig{QueueURL: queueURL, Config: c})
}

// eventPublisher is the event bus persist, compensate and the sweeper
// publish to: EventBridge in AWS, the SQS stand-in locally, each sent
// directly (eventbridgeDirect, sqsDirect).
func eventPublisher(ctx context.Context, cfg config.Config, awsCfg aws.Config, sqsClient *sqs.Client) (reservation.Notifier, error) {
	switch {
	case cfg.EventBusName != "":
		c, err := eventbridgeDirect(ctx, eventbridge.NewFromConfig(awsCfg))
		if err != nil {
			return nil, err
		}
		return eventbus.NewEventBridge(c, cfg.EventBusName)
	case cfg.EventsQueueURL != "":
		c, err := sqsDirect(ctx, sqsClient)
		if err != nil {
			return nil, err
		}
		return eventbus.NewQueue(c, cfg.EventsQueueURL)
	default:
		return nil, cfg.NeedsEvents()
	}
}

// sqsDirect and eventbridgeDirect configure the direct sends (awsjson):
// the endpoint, region and credentials are those the SDK client resolved
// (an endpoint override such as AWS_ENDPOINT_URL_SQS included, FIPS and
// dual-stack as configured), the endpoint resolved once here, not per call.
func sqsDirect(ctx context.Context, client *sqs.Client) (awsjson.Config, error) {
	o := client.Options()
	fips, dual := endpointVariants(o.EndpointOptions.UseFIPSEndpoint, o.EndpointOptions.UseDualStackEndpoint)
	ep, err := o.EndpointResolverV2.ResolveEndpoint(ctx, sqs.EndpointParameters{Region: aws.String(o.Region), Endpoint: o.BaseEndpoint,
		UseFIPS: fips, UseDualStack: dual})
	return directConfig("sqs", ep.URI, err, o.Region, o.Credentials)
}

func eventbridgeDirect(ctx context.Context, client *eventbridge.Client) (awsjson.Config, error) {
	o := client.Options()
	fips, dual := endpointVariants(o.EndpointOptions.UseFIPSEndpoint, o.EndpointOptions.UseDualStackEndpoint)
	ep, err := o.EndpointResolverV2.ResolveEndpoint(ctx, eventbridge.EndpointParameters{Region: aws.String(o.Region), Endpoint: o.BaseEndpoint,
		UseFIPS: fips, UseDualStack: dual})
	return directConfig("eventbridge", ep.URI, err, o.Region, o.Credentials)
}

func endpointVariants(fips aws.FIPSEndpointState, dual aws.DualStackEndpointState) (useFIPS, useDualStack *bool) {
	return aws.Bool(fips == aws.FIPSEndpointStateEnabled), aws.Bool(dual == aws.DualStackEndpointStateEnabled)
}

func directConfig(service string, endpoint url.URL, resolveErr error, region string, creds aws.CredentialsProvider) (awsjson.Config, error) {
	if resolveErr != nil {
		return awsjson.Config{}, fmt.Errorf("%s endpoint: %w", service, resolveErr)
	}
	return awsjson.Config{Endpoint: endpoint.String(), Region: region, Credentials: creds, HTTPClient: sendClient()}, nil
}

// sendClient is the HTTP client of the direct sends: the SDK's transport
// settings, with enough idle connections kept alive for a process serving
// many requests at once (make dev; a Lambda serves one at a time, but
// publishes up to eight calls at once), so no send pays for a new
// connection.
func sendClient() *awshttp.BuildableClient {
	return awshttp.NewBuildableClient().WithTransportOptions(func(t *http.Transport) { t.MaxIdleConnsPerHost = 256 })
}

// openDB opens the functions' database; database is its name.
func openDB(ctx context.Context, cfg config.Config, secrets *secretsmanager.Client) (db *sql.DB, database string, err error) {
	dsn := cfg.DBDSN
	if cfg.DBSecretID != "" {
		s, err := secretString(ctx, secrets, cfg.DBSecretID)
		if err != nil {
			return nil, "", err
		}
		var cred struct {
			Username string `json:"username"`
			Password string `json:"password"`
		}
		if err := json.Unmarshal([]byte(s), &cred); err != nil {
			return nil, "", errors.New("db secret: not a JSON object with username and password")
		}
		dsn = secretDSN(cfg, cred.Username, cred.Password)
	}
	mc, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, "", fmt.Errorf("db dsn: %w", redactDSNError(err))
	}
	mc.ParseTime = true
	mc.Loc = time.UTC
	connector, err := mysql.NewConnector(mc)
	if err != nil {
		return nil, "", fmt.Errorf("db connector: %w", err)
	}
	db = sql.OpenDB(connector)
	db.SetMaxOpenConns(cfg.DBMaxOpen)
	db.SetMaxIdleConns(cfg.DBMaxOpen)
	db.SetConnMaxLifetime(5 * time.Minute)
	db.SetConnMaxIdleTime(time.Minute) // a frozen Lambda's idle connections are closed by the proxy anyway
	return db, mc.DBName, nil
}

// secretDSN is the DSN of the database in AWS: the RDS Proxy (or cluster)
// with the secret's credentials over TLS whose certificate is verified
// against the roots the runtime trusts (RDS Proxy presents a public ACM
// certificate). Never "preferred": that checks nothing and falls back to
// plaintext. HOLDFAST_DB_TLS=off exists for local tests only.
func secretDSN(cfg config.Config, user, password string) string {
	mc := mysql.NewConfig()
	mc.User, mc.Passwd, mc.Net, mc.Addr, mc.DBName = user, password, "tcp", cfg.DBHost, cfg.DBName
	mc.ParseTime, mc.InterpolateParams, mc.TLSConfig = true, true, "true"
	if cfg.DBTLS == "off" {
		mc.TLSConfig = "false"
	}
	mc.Timeout, mc.ReadTimeout, mc.WriteTimeout = 2*time.Second, 10*time.Second, 10*time.Second
	return mc.FormatDSN()
}

// redactDSNError keeps a malformed DSN (which may hold a password) out of logs.
func redactDSNError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return errors.New("malformed DSN")
	}
	return errors.New("malformed DSN: " + strings.SplitN(err.Error(), ":", 2)[0])
}

func secretString(ctx context.Context, c *secretsmanager.Client, arn string) (string, error) {
	out, err := c.GetSecretValue(ctx, &secretsmanager.GetSecretValueInput{SecretId: aws.String(arn)})
	if err != nil {
		return "", fmt.Errorf("read secret %s: %w", arn, err)
	}
	return aws.ToString(out.SecretString), nil
}
