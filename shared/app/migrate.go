package app

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/go-sql-driver/mysql"
	"github.com/holdfast/holdfast/shared/adapters/mysqlstore"
	"github.com/holdfast/holdfast/shared/config"
	"github.com/holdfast/holdfast/shared/handlers/provision"
)

// PrepareDatabase returns what the migrate function runs on every Create and
// Update of the stack: as the master user, create the database if it is
// missing, apply the migrations, and ensure the functions' own user with
// the least privileges they need. Credentials are read afresh each time.
func PrepareDatabase(cfg config.Config) provision.Prepare {
	return func(ctx context.Context) (provision.Report, error) {
		var secrets *secretsmanager.Client
		if cfg.DBAdminSecretID != "" || cfg.DBSecretID != "" {
			awsCfg, err := awsconfig.LoadDefaultConfig(ctx)
			if err != nil {
				return provision.Report{}, fmt.Errorf("aws config: %w", err)
			}
			if cfg.AWSEndpoint != "" {
				awsCfg.BaseEndpoint = aws.String(cfg.AWSEndpoint)
			}
			secrets = secretsmanager.NewFromConfig(awsCfg)
		}
		app, err := appAccount(ctx, cfg, secrets)
		if err != nil {
			return provision.Report{}, err
		}
		if cfg.DBAppUser != "" && app.User != cfg.DBAppUser {
			// The secret names the password; the stage names the account.
			return provision.Report{}, fmt.Errorf("the functions' secret names user %q, but this stage's user is %q: refusing to manage another account", app.User, cfg.DBAppUser)
		}
		admin, err := adminConfig(ctx, cfg, secrets)
		if err != nil {
			return provision.Report{}, err
		}
		// No read or write timeout: a migration's ALTER may run for minutes,
		// and GET_LOCK waits for another migrator; the function's deadline
		// (ctx) bounds it all.
		admin.ReadTimeout, admin.WriteTimeout = 0, 0
		database := app.DBName
		if database == "" {
			database = cfg.DBName
		}
		admin.DBName = ""
		// Account statements cannot be prepared; the driver interpolates.
		admin.InterpolateParams, admin.ParseTime = true, true

		server, err := openWhenReady(ctx, admin)
		if err != nil {
			return provision.Report{}, err
		}
		defer server.Close()
		if _, err := server.ExecContext(ctx, "CREATE DATABASE IF NOT EXISTS `"+database+"` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci"); err != nil {
			return provision.Report{}, fmt.Errorf("create database %s: %w", database, err)
		}
		admin.DBName = database
		schema, err := openWhenReady(ctx, admin)
		if err != nil {
			return provision.Report{}, err
		}
		defer schema.Close()
		applied, err := mysqlstore.Migrate(ctx, schema)
		if err != nil {
			return provision.Report{}, err
		}
		// Where the password already works, it is not set again: a server
		// with a password-reuse policy refuses the same password twice.
		login := admin.Clone()
		login.User, login.Passwd = app.User, app.Passwd
		if err := mysqlstore.EnsureAppUser(ctx, schema, database, app.User, app.Passwd, admin.User, canLogIn(ctx, login)); err != nil {
			return provision.Report{}, err
		}
		version, err := mysqlstore.Version(ctx, schema)
		if err != nil {
			return provision.Report{}, err
		}
		return provision.Report{Database: database, SchemaVersion: version, Applied: applied, AppUser: app.User}, nil
	}
}

// appAccount is the functions' user: the one their secret names (in AWS),
// or the one of HOLDFAST_DB_DSN (locally).
func appAccount(ctx context.Context, cfg config.Config, secrets *secretsmanager.Client) (*mysql.Config, error) {
	if cfg.DBSecretID != "" {
		user, password, err := credentials(ctx, secrets, cfg.DBSecretID)
		if err != nil {
			return nil, err
		}
		return &mysql.Config{User: user, Passwd: password, DBName: cfg.DBName}, nil
	}
	mc, err := mysql.ParseDSN(cfg.DBDSN)
	if err != nil {
		return nil, fmt.Errorf("db dsn: %w", redactDSNError(err))
	}
	return mc, nil
}

// adminConfig is the master user's connection: the proxy with the master
// secret over verified TLS (in AWS), or HOLDFAST_DB_ADMIN_DSN (locally).
func adminConfig(ctx context.Context, cfg config.Config, secrets *secretsmanager.Client) (*mysql.Config, error) {
	dsn := cfg.DBAdminDSN
	if cfg.DBAdminSecretID != "" {
		user, password, err := credentials(ctx, secrets, cfg.DBAdminSecretID)
		if err != nil {
			return nil, err
		}
		dsn = secretDSN(cfg, user, password)
	}
	mc, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("admin dsn: %w", redactDSNError(err))
	}
	return mc, nil
}

func credentials(ctx context.Context, secrets *secretsmanager.Client, id string) (user, password string, err error) {
	s, err := secretString(ctx, secrets, id)
	if err != nil {
		return "", "", err
	}
	var cred struct {
		Username string `json:"username"`
		Password string `json:"password"`
	}
	if err := json.Unmarshal([]byte(s), &cred); err != nil || cred.Username == "" {
		return "", "", fmt.Errorf("secret %s: not a JSON object with username and password", id)
	}
	return cred.Username, cred.Password, nil
}

// canLogIn reports whether mc's user logs in with mc's password now.
func canLogIn(ctx context.Context, mc *mysql.Config) bool {
	connector, err := mysql.NewConnector(mc)
	if err != nil {
		return false
	}
	db := sql.OpenDB(connector)
	defer db.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return db.PingContext(ctx) == nil
}

// permanent reports connection errors that waiting does not cure: access
// denied, and a certificate the runtime does not trust or that names
// another host (a cluster endpoint given for the proxy's).
func permanent(err error) bool {
	var me *mysql.MySQLError
	var unknown x509.UnknownAuthorityError
	var host x509.HostnameError
	var verify *tls.CertificateVerificationError
	return errors.As(err, &me) && (me.Number == 1045 || me.Number == 1044) ||
		errors.As(err, &unknown) || errors.As(err, &host) || errors.As(err, &verify) ||
		errors.Is(err, mysql.ErrNoTLS)
}

// openWhenReady opens one connection and retries until the server answers
// or ctx ends: on a first deploy the proxy's target may still be
// registering when the custom resource runs.
func openWhenReady(ctx context.Context, mc *mysql.Config) (*sql.DB, error) {
	connector, err := mysql.NewConnector(mc)
	if err != nil {
		return nil, fmt.Errorf("db connector: %w", err)
	}
	db := sql.OpenDB(connector)
	db.SetMaxOpenConns(2)
	wait := 500 * time.Millisecond
	for {
		err := db.PingContext(ctx)
		if err == nil {
			return db, nil
		}
		if permanent(err) {
			_ = db.Close()
			return nil, fmt.Errorf("connect as %s: %w", mc.User, err)
		}
		select {
		case <-ctx.Done():
			_ = db.Close()
			return nil, fmt.Errorf("connect as %s: %w (last error: %v)", mc.User, ctx.Err(), err)
		case <-time.After(wait):
		}
		wait = min(2*wait, 5*time.Second)
	}
}
