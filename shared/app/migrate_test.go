package app_test

// The migrate function's preparation run as in AWS: credentials from Secrets
// Manager (moto), the DSN secretDSN builds (TLS off locally), the config the
// template gives it.

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/go-sql-driver/mysql"
	"github.com/holdfast/holdfast/internal/testkit/awstest"
	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/adapters/mysqlstore"
	"github.com/holdfast/holdfast/shared/app"
	"github.com/holdfast/holdfast/shared/config"
)

type migrateStage struct {
	cfg      config.Config
	database string
	user     string
	password string
}

// newMigrateStage creates, in moto, the master secret (the local admin) and
// an app secret naming secretUser, and returns the migrate function's config
// for database with HOLDFAST_DB_APP_USER=stageUser ("" for none).
func newMigrateStage(t *testing.T, env testservices.Env, moto, database, stageUser, secretUser, password string) migrateStage {
	t.Helper()
	ctx := context.Background()
	admin, err := mysql.ParseDSN(env.AdminDSN)
	if err != nil {
		t.Fatal(err)
	}
	awsCfg, err := awstest.Config(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sm := secretsmanager.NewFromConfig(awsCfg, func(o *secretsmanager.Options) { o.BaseEndpoint = aws.String(moto) })
	create := func(name, value string) string {
		out, err := sm.CreateSecret(ctx, &secretsmanager.CreateSecretInput{Name: aws.String(name), SecretString: aws.String(value)})
		if err != nil {
			t.Fatalf("create secret %s: %v", name, err)
		}
		return aws.ToString(out.ARN)
	}
	vars := map[string]string{
		"HOLDFAST_DB_HOST": admin.Addr, "HOLDFAST_DB_NAME": database, "HOLDFAST_DB_APP_USER": stageUser,
		"HOLDFAST_DB_ADMIN_SECRET_ID": create(testservices.Name("db"), `{"username":"`+admin.User+`","password":"`+admin.Passwd+`"}`),
		"HOLDFAST_DB_SECRET_ID":       create(testservices.Name("db-app"), `{"username":"`+secretUser+`","password":"`+password+`"}`),
		"HOLDFAST_AWS_ENDPOINT":       moto, "HOLDFAST_DB_TLS": "off",
	}
	cfg, err := config.LoadMigrate(func(k string) string { return vars[k] })
	if err != nil {
		t.Fatal(err)
	}
	root := openAdmin(t, env)
	t.Cleanup(func() {
		_, _ = root.Exec("DROP DATABASE IF EXISTS `" + database + "`")
		_, _ = root.Exec("DROP USER IF EXISTS '" + secretUser + "'@'%'")
	})
	return migrateStage{cfg: cfg, database: database, user: secretUser, password: password}
}

func openAdmin(t *testing.T, env testservices.Env) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", env.AdminDSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// login reports whether user/password opens database.
func login(t *testing.T, env testservices.Env, user, password, database string) error {
	t.Helper()
	c, _ := mysql.ParseDSN(env.AdminDSN)
	c.User, c.Passwd, c.DBName = user, password, database
	db, err := sql.Open("mysql", c.FormatDSN())
	if err != nil {
		return err
	}
	defer db.Close()
	return db.Ping()
}

// Another migrator holding the lock (an operator's invoke during a deploy)
// is waited for, not timed out: the admin connection has no read timeout
// (the function's deadline bounds it), and statements that run long
// (an ALTER on real data) are waited for the same way.
func TestMigrateWaitsForAnotherMigrator(t *testing.T) {
	t.Parallel()
	env := testservices.Require(t)
	moto := testservices.StartMoto(t)
	s := newMigrateStage(t, env, moto, testservices.Name("holdfast_m"), "", testservices.Name("hfapp"), "app-password-0123456789")

	holder, err := openAdmin(t, env).Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	lock := mysqlstore.MigrateLock(s.database)
	var got int
	if err := holder.QueryRowContext(context.Background(), `SELECT GET_LOCK(?, 0)`, lock).Scan(&got); err != nil || got != 1 {
		t.Fatalf("take the lock: %d %v", got, err)
	}
	var lettingGo atomic.Bool
	go func() {
		// Longer than a driver read timeout of 10 s would have allowed.
		time.Sleep(11 * time.Second)
		lettingGo.Store(true) // before the release: the migrator cannot run earlier
		_, _ = holder.ExecContext(context.Background(), `DO RELEASE_LOCK(?)`, lock)
		_ = holder.Close()
	}()
	rep, err := app.PrepareDatabase(s.cfg)(context.Background())
	if !lettingGo.Load() {
		t.Errorf("prepared before the other migrator let go of the lock")
	}
	if err != nil || rep.SchemaVersion != mysqlstore.Latest() {
		t.Fatalf("prepare = %+v, %v; want the schema at %d once the lock was free", rep, err, mysqlstore.Latest())
	}
}

// Two stages on one MySQL server, named alike by mistake: the second never
// takes over the first's account (password or grants), and says why.
func TestMigrateNeverTakesAnotherStagesAccount(t *testing.T) {
	t.Parallel()
	env := testservices.Require(t)
	moto := testservices.StartMoto(t)
	user := testservices.Name("hfapp")
	prod := newMigrateStage(t, env, moto, testservices.Name("holdfast_prod"), user, user, "prod-password-0123456789")
	dev := newMigrateStage(t, env, moto, testservices.Name("holdfast_dev"), user, user, "dev-password-01234567890")
	if _, err := app.PrepareDatabase(prod.cfg)(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := app.PrepareDatabase(dev.cfg)(context.Background()); !errors.Is(err, mysqlstore.ErrForeignAccount) {
		t.Errorf("the second stage's prepare = %v, want %v", err, mysqlstore.ErrForeignAccount)
	}
	if err := login(t, env, user, prod.password, prod.database); err != nil {
		t.Errorf("the first stage's functions cannot log in any more: %v", err)
	}
	// Deploying the first stage again still works: the account is its own.
	if _, err := app.PrepareDatabase(prod.cfg)(context.Background()); err != nil {
		t.Errorf("the first stage's second deploy: %v", err)
	}
}

// Whoever can write the app secret cannot make the master user re-password
// or strip somebody else's account: the stage names its account, and an
// account this database did not create is never changed.
func TestMigrateRefusesAnAccountTheSecretNames(t *testing.T) {
	t.Parallel()
	env := testservices.Require(t)
	moto := testservices.StartMoto(t)
	root := openAdmin(t, env)
	victim, other := testservices.Name("orders"), testservices.Name("holdfast_orders")
	for _, q := range []string{
		"CREATE DATABASE `" + other + "`",
		"CREATE USER '" + victim + "'@'%' IDENTIFIED BY 'victims-own-password-1'",
		"GRANT ALL ON `" + other + "`.* TO '" + victim + "'@'%'",
	} {
		if _, err := root.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() { _, _ = root.Exec("DROP DATABASE IF EXISTS `" + other + "`") })

	// The stage names its own account: a secret naming another is refused.
	s := newMigrateStage(t, env, moto, testservices.Name("holdfast_m"), "holdfast_stage", victim, "attacker-chosen-pass-01")
	if _, err := app.PrepareDatabase(s.cfg)(context.Background()); err == nil {
		t.Errorf("prepare with a secret naming %s succeeded", victim)
	}
	// Without a stage name (locally), the account is still not this database's.
	s = newMigrateStage(t, env, moto, testservices.Name("holdfast_m"), "", victim, "attacker-chosen-pass-01")
	if _, err := app.PrepareDatabase(s.cfg)(context.Background()); !errors.Is(err, mysqlstore.ErrForeignAccount) {
		t.Errorf("prepare of an existing foreign account = %v, want %v", err, mysqlstore.ErrForeignAccount)
	}
	if err := login(t, env, victim, "victims-own-password-1", other); err != nil {
		t.Errorf("the victim's own password no longer works: %v", err)
	}
	if err := login(t, env, victim, "attacker-chosen-pass-01", ""); err == nil {
		t.Errorf("the secret's password logs in as %s", victim)
	}
	// Nor the master user itself.
	admin, _ := mysql.ParseDSN(env.AdminDSN)
	s = newMigrateStage(t, env, moto, testservices.Name("holdfast_m"), "", admin.User, "attacker-chosen-pass-01")
	if _, err := app.PrepareDatabase(s.cfg)(context.Background()); !errors.Is(err, mysqlstore.ErrAppUserIsAdmin) {
		t.Errorf("prepare of the master user = %v, want %v", err, mysqlstore.ErrAppUserIsAdmin)
	}
}

// privateStage is a migrate config against a MariaDB of the test's own whose
// master account ("hfadmin") has exactly adminGrants.
type privateStage struct {
	cfg  config.Config
	root *sql.DB
	user string
}

func newPrivateStage(t *testing.T, moto string, mariadbArgs, adminGrants []string) privateStage {
	t.Helper()
	ctx := context.Background()
	m := testservices.StartMariaDB(t, mariadbArgs...)
	root, err := sql.Open("mysql", m.RootDSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = root.Close() })
	const adminPass = "Admin-password-0123456789!"
	for _, q := range append([]string{"CREATE USER 'hfadmin'@'127.0.0.1' IDENTIFIED BY '" + adminPass + "'"}, adminGrants...) {
		if _, err := root.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	awsCfg, err := awstest.Config(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sm := secretsmanager.NewFromConfig(awsCfg, func(o *secretsmanager.Options) { o.BaseEndpoint = aws.String(moto) })
	create := func(name, value string) string {
		out, err := sm.CreateSecret(ctx, &secretsmanager.CreateSecretInput{Name: aws.String(name), SecretString: aws.String(value)})
		if err != nil {
			t.Fatalf("create secret %s: %v", name, err)
		}
		return aws.ToString(out.ARN)
	}
	const user = "holdfast_priv"
	vars := map[string]string{
		"HOLDFAST_DB_HOST": m.Addr, "HOLDFAST_DB_NAME": "holdfast_priv", "HOLDFAST_DB_APP_USER": user,
		"HOLDFAST_DB_ADMIN_SECRET_ID": create(testservices.Name("db"), `{"username":"hfadmin","password":"`+adminPass+`"}`),
		"HOLDFAST_DB_SECRET_ID":       create(testservices.Name("db-app"), `{"username":"`+user+`","password":"App-password-0123456789!x"}`),
		"HOLDFAST_AWS_ENDPOINT":       moto, "HOLDFAST_DB_TLS": "off",
	}
	cfg, err := config.LoadMigrate(func(k string) string { return vars[k] })
	if err != nil {
		t.Fatal(err)
	}
	return privateStage{cfg: cfg, root: root, user: user}
}

func showGrants(t *testing.T, db *sql.DB, user string) string {
	t.Helper()
	rows, err := db.Query("SHOW GRANTS FOR '" + user + "'@'%'")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var g string
		if err := rows.Scan(&g); err != nil {
			t.Fatal(err)
		}
		out = append(out, g)
	}
	return strings.Join(out, "\n")
}

// A server with a password-reuse policy (MariaDB's password_reuse_check,
// MySQL's password_history) refuses setting the password it already has:
// the second deploy does not try.
func TestMigrateOnAServerThatRefusesPasswordReuse(t *testing.T) {
	t.Parallel()
	moto := testservices.StartMoto(t)
	s := newPrivateStage(t, moto, []string{"--plugin-load-add=password_reuse_check"},
		[]string{"GRANT ALL PRIVILEGES ON *.* TO 'hfadmin'@'127.0.0.1' WITH GRANT OPTION"})
	for i := range 2 {
		if _, err := app.PrepareDatabase(s.cfg)(context.Background()); err != nil {
			t.Fatalf("deploy %d: %v", i+1, err)
		}
	}
}

// Grants added by hand in every form (column, database, global, a role) are
// taken back, and the functions keep their own table grants throughout. (A
// role the master user cannot administer fails the deploy, naming it.)
func TestMigrateTakesBackEveryExtraGrant(t *testing.T) {
	t.Parallel()
	moto := testservices.StartMoto(t)
	s := newPrivateStage(t, moto, nil, []string{"GRANT ALL PRIVILEGES ON *.* TO 'hfadmin'@'127.0.0.1' WITH GRANT OPTION"})
	if _, err := app.PrepareDatabase(s.cfg)(context.Background()); err != nil {
		t.Fatalf("first deploy: %v", err)
	}
	for _, q := range []string{
		"GRANT SELECT (sku), UPDATE (available, version) ON holdfast_priv.product_stock TO '" + s.user + "'@'%'",
		"GRANT ALL PRIVILEGES ON holdfast_priv.* TO '" + s.user + "'@'%'",
		"GRANT PROCESS ON *.* TO '" + s.user + "'@'%'",
		"CREATE ROLE hf_extra",
		"GRANT hf_extra TO 'hfadmin'@'127.0.0.1' WITH ADMIN OPTION", // as the master user administers roles
		"GRANT ALL PRIVILEGES ON holdfast_priv.* TO hf_extra",
		"GRANT hf_extra TO '" + s.user + "'@'%'",
		"SET DEFAULT ROLE hf_extra FOR '" + s.user + "'@'%'",
	} {
		if _, err := s.root.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if _, err := app.PrepareDatabase(s.cfg)(context.Background()); err != nil {
		t.Fatalf("second deploy: %v", err)
	}
	grants := showGrants(t, s.root, s.user)
	for _, extra := range []string{"(sku)", "ALL PRIVILEGES ON `holdfast_priv`.*", "PROCESS", "GRANT `hf_extra`"} {
		if strings.Contains(grants, extra) {
			t.Errorf("after the deploy the app user still has %s:\n%s", extra, grants)
		}
	}
	if !strings.Contains(grants, "SELECT, INSERT, UPDATE, DELETE ON `holdfast_priv`.`product_stock`") {
		t.Errorf("the functions lost their grants on product_stock:\n%s", grants)
	}
}

// A master user that cannot read other accounts' grants fails the deploy,
// saying so, rather than reporting success with the extras still there.
func TestMigrateFailsWhenItCannotSeeTheGrants(t *testing.T) {
	t.Parallel()
	moto := testservices.StartMoto(t)
	s := newPrivateStage(t, moto, nil, []string{
		"GRANT CREATE USER ON *.* TO 'hfadmin'@'127.0.0.1'",
		"GRANT ALL PRIVILEGES ON `holdfast\\_priv`.* TO 'hfadmin'@'127.0.0.1' WITH GRANT OPTION",
	})
	if _, err := app.PrepareDatabase(s.cfg)(context.Background()); !errors.Is(err, mysqlstore.ErrGrantsHidden) {
		t.Errorf("prepare without read access to the mysql schema = %v, want %v", err, mysqlstore.ErrGrantsHidden)
	}
}
