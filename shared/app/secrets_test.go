package app_test

import (
	"context"
	"io"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/go-sql-driver/mysql"
	"github.com/holdfast/holdfast/internal/testkit/awstest"
	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/app"
	"github.com/holdfast/holdfast/shared/config"
	"github.com/holdfast/holdfast/shared/reservation"
)

// In AWS the functions get the database credentials and the Redis AUTH token
// from Secrets Manager (a secret id in the environment, nothing secret in
// it). Here Secrets Manager is moto, Redis demands a password, and the
// service must work with what it read.
func TestCredentialsComeFromSecretsManager(t *testing.T) {
	env := testservices.Require(t)
	endpoint := testservices.StartMoto(t)
	const token = "s3cr3t-t0ken-0f-at-least-16"
	rds := testservices.StartRedis(t, "--requirepass", token)
	dsn := env.Database(t)
	mc, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}

	ctx := context.Background()
	awsCfg, err := awstest.Config(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sm := secretsmanager.NewFromConfig(awsCfg, func(o *secretsmanager.Options) { o.BaseEndpoint = aws.String(endpoint) })
	create := func(name, value string) string {
		out, err := sm.CreateSecret(ctx, &secretsmanager.CreateSecretInput{Name: aws.String(name), SecretString: aws.String(value)})
		if err != nil {
			t.Fatalf("create secret %s: %v", name, err)
		}
		return aws.ToString(out.ARN)
	}
	dbSecret := create(testservices.Name("db"), `{"username":"`+mc.User+`","password":"`+mc.Passwd+`"}`)
	redisSecret := create(testservices.Name("redis"), `{"token":"`+token+`"}`)

	idSecret := create(testservices.Name("id"), "a-generated-key-of-forty-eight-characters-000000")
	vars := map[string]string{
		"HOLDFAST_REDIS_ADDR": rds.Addr, "HOLDFAST_REDIS_SECRET_ID": redisSecret,
		"HOLDFAST_DB_HOST": mc.Addr, "HOLDFAST_DB_NAME": mc.DBName, "HOLDFAST_DB_SECRET_ID": dbSecret,
		"HOLDFAST_EVENT_BUS": "holdfast-test", "HOLDFAST_AWS_ENDPOINT": endpoint,
		"HOLDFAST_DB_TLS": "off", // the local MariaDB has no certificate; AWS verifies one
		// The reserve function's id key, read from Secrets Manager too (the
		// queue makes it a function that derives ids; Build fails without it).
		"HOLDFAST_ID_SECRET_ID": idSecret, "HOLDFAST_QUEUE_URL": "http://127.0.0.1:1/unused",
	}
	cfg, err := config.Load(func(k string) string { return vars[k] })
	if err != nil {
		t.Fatal(err)
	}
	if cfg.DBDSN != "" || cfg.RedisPassword != "" {
		t.Fatal("the configuration holds a credential")
	}
	a, err := app.Build(ctx, cfg, app.Options{Function: "test", Out: io.Discard, Enqueuer: func(reservation.Enqueuer) reservation.Enqueuer {
		return discardEnqueuer{}
	}})
	if err != nil {
		t.Fatalf("build with secrets: %v", err)
	}
	defer a.Close()
	sku := testservices.Name("secret")
	if _, err := a.Service.ChangeStock(ctx, reservation.SetTo(sku, 3)); err != nil {
		t.Fatalf("SetStock through secret-held credentials: %v", err)
	}
	if _, _, err := a.Service.Reserve(ctx, reservation.ReserveRequest{SKU: sku, Qty: 1, UserID: "u"}); err != nil {
		t.Fatalf("Reserve through the AUTH token from the secret: %v", err)
	}
	if n, err := a.Service.Available(ctx, sku); err != nil || n != 2 {
		t.Errorf("Available = %d %v, want 2", n, err)
	}
}

// A function that takes reservations (it has the queue) refuses to start
// without the key of the ids it derives from an Idempotency-Key: never a
// bare hash anyone could compute.
func TestReserveNeedsTheIDKey(t *testing.T) {
	vars := map[string]string{
		"HOLDFAST_REDIS_ADDR": "127.0.0.1:1", "HOLDFAST_DB_DSN": "u@tcp(127.0.0.1:1)/db",
		"HOLDFAST_QUEUE_URL": "http://127.0.0.1:1/q", "HOLDFAST_EVENTS_QUEUE_URL": "http://127.0.0.1:1/e",
	}
	cfg, err := config.Load(func(k string) string { return vars[k] })
	if err != nil {
		t.Fatal(err)
	}
	_, err = app.Build(context.Background(), cfg, app.Options{Function: "reserve", Out: io.Discard})
	if err == nil || !strings.Contains(err.Error(), "HOLDFAST_ID_SECRET_ID") {
		t.Errorf("Build without an id key = %v, want a clear error", err)
	}
}

// discardEnqueuer accepts every message and sends none.
type discardEnqueuer struct{}

func (discardEnqueuer) Enqueue(context.Context, reservation.Reservation) error { return nil }
