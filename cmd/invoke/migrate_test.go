package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/adapters/mysqlstore"
)

// cfnAnswer is what the migrate function PUT on the response URL.
type cfnAnswer struct {
	Method, ContentType string
	Body                struct {
		Status, Reason, PhysicalResourceId, StackId, RequestId, LogicalResourceId string
		Data                                                                      map[string]string
	}
}

// responseURL stands in for CloudFormation's pre-signed S3 URL: it records
// every request it gets.
type responseURL struct {
	*httptest.Server
	mu      sync.Mutex
	answers []cfnAnswer
}

func newResponseURL(t *testing.T) *responseURL {
	r := &responseURL{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		var a cfnAnswer
		a.Method, a.ContentType = req.Method, req.Header.Get("Content-Type")
		b, _ := io.ReadAll(req.Body)
		if err := json.Unmarshal(b, &a.Body); err != nil {
			t.Errorf("response body %q: %v", b, err)
		}
		r.mu.Lock()
		r.answers = append(r.answers, a)
		r.mu.Unlock()
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *responseURL) take(t *testing.T) cfnAnswer {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.answers) != 1 {
		t.Fatalf("CloudFormation got %d answers, want exactly 1: %+v", len(r.answers), r.answers)
	}
	a := r.answers[0]
	r.answers = nil
	if a.Method != http.MethodPut || a.ContentType != "" {
		t.Errorf("answer sent as %s with Content-Type %q; the pre-signed URL takes a PUT with none", a.Method, a.ContentType)
	}
	return a
}

// stage is a fresh database name and an app user that do not exist yet, as
// on a first deploy, dropped at the end of the test.
type stage struct {
	adminDSN, appDSN, database, user string
}

func newStage(t *testing.T, env testservices.Env) stage {
	t.Helper()
	admin, err := mysql.ParseDSN(env.AdminDSN)
	if err != nil {
		t.Fatal(err)
	}
	s := stage{adminDSN: env.AdminDSN, database: testservices.Name("holdfast_t"), user: testservices.Name("hfapp")}
	app := admin.Clone()
	app.User, app.Passwd, app.DBName = s.user, testservices.Name("app-password"), s.database
	s.appDSN = app.FormatDSN()
	db := openDB(t, env.AdminDSN)
	t.Cleanup(func() {
		_, _ = db.Exec("DROP DATABASE IF EXISTS `" + s.database + "`")
		_, _ = db.Exec("DROP USER IF EXISTS '" + s.user + "'@'%'")
	})
	return s
}

// migrateUnderTheEmulator invokes the migrate function's real bootstrap with
// event (a custom resource request when it has a ResponseURL) and the
// admin and app DSNs of s.
func migrateUnderTheEmulator(t *testing.T, s stage, bin string, event any, vars map[string]string) map[string]any {
	t.Helper()
	b, _ := json.Marshal(event)
	path := filepath.Join(t.TempDir(), "event.json")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"HOLDFAST_DB_ADMIN_DSN": s.adminDSN, "HOLDFAST_DB_DSN": s.appDSN}
	for k, v := range vars {
		env[k] = v
	}
	out, err := invoke(context.Background(), options{
		Root: "../..", Function: "migrate", Event: path, EnvFile: "events/env.json",
		Inherit: true, Getenv: func(k string) string { return env[k] }, Logs: io.Discard, BinDir: bin,
	})
	if err != nil {
		t.Fatalf("invoke migrate: %v", err)
	}
	var m map[string]any
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatalf("migrate response %s: %v", out, err)
	}
	return m
}

func cfnEvent(kind, url, physical string) map[string]any {
	ev := map[string]any{
		"RequestType": kind, "ResponseURL": url + "/cfn-response?X-Amz-Signature=abc",
		"StackId":   "arn:aws:cloudformation:us-east-1:123456789012:stack/holdfast-dev/1",
		"RequestId": "req-" + strings.ToLower(kind), "LogicalResourceId": "Schema",
		"ResourceType": "AWS::CloudFormation::CustomResource",
		"ResourceProperties": map[string]any{
			"ServiceToken": "arn:aws:lambda:us-east-1:123456789012:function:holdfast-dev-migrate", "SchemaVersion": "5",
		},
	}
	if physical != "" {
		ev["PhysicalResourceId"] = physical
	}
	return ev
}

// The first deploy has nothing: no database, no schema, no app user. The
// custom resource's Create makes all three, Update keeps them (and takes
// back any privilege the app user gained), Delete leaves the data, and
// every request is answered on the response URL exactly once, failures
// included.
func TestMigrateCustomResourceUnderTheEmulator(t *testing.T) {
	env := testservices.Require(t)
	s := newStage(t, env)
	cfn := newResponseURL(t)
	bin := t.TempDir()
	admin := openDB(t, env.AdminDSN)

	// Create.
	if out := migrateUnderTheEmulator(t, s, bin, cfnEvent("Create", cfn.URL, ""), nil); out["Status"] != "SUCCESS" {
		t.Fatalf("create returned %v: %+v", out, cfn.answers)
	}
	a := cfn.take(t)
	if a.Body.Status != "SUCCESS" || a.Body.RequestId != "req-create" || a.Body.LogicalResourceId != "Schema" ||
		!strings.HasSuffix(a.Body.StackId, "stack/holdfast-dev/1") || a.Body.PhysicalResourceId == "" {
		t.Fatalf("create answer = %+v", a.Body)
	}
	physical := a.Body.PhysicalResourceId
	if a.Body.Data["SchemaVersion"] != itoa(mysqlstore.Latest()) || a.Body.Data["AppUser"] != s.user || a.Body.Data["Database"] != s.database {
		t.Errorf("create data = %v, want schema %d, user %s, database %s", a.Body.Data, mysqlstore.Latest(), s.user, s.database)
	}
	var versions int
	if err := admin.QueryRow("SELECT COUNT(*) FROM `" + s.database + "`.schema_migrations").Scan(&versions); err != nil || versions != mysqlstore.Latest() {
		t.Fatalf("schema_migrations has %d rows (%v), want %d", versions, err, mysqlstore.Latest())
	}

	// The app user reads and writes rows, and nothing more.
	app := openDB(t, s.appDSN)
	if _, err := app.Exec(`INSERT INTO product_stock (sku, available) VALUES ('least-privilege', 3)`); err != nil {
		t.Fatalf("app user cannot write a row: %v", err)
	}
	if _, err := app.Exec(`DELETE FROM product_stock WHERE sku = 'least-privilege'`); err != nil {
		t.Fatalf("app user cannot delete a row: %v", err)
	}
	// MySQL applies database grants to a connection when it selects the
	// database: each check logs in afresh.
	denied := func(stmt string) {
		t.Helper()
		fresh := openDB(t, s.appDSN)
		_, err := fresh.Exec(stmt)
		_ = fresh.Close()
		var me *mysql.MySQLError
		if !errors.As(err, &me) || (me.Number != 1142 && me.Number != 1044 && me.Number != 1227) {
			t.Errorf("app user ran %q: %v, want a privilege error", stmt, err)
		}
	}
	denied(`CREATE TABLE intruder (id INT)`)
	denied(`DROP TABLE reservations`)
	denied(`ALTER TABLE product_stock ADD COLUMN x INT`)
	denied(`CREATE USER 'intruder'@'%'`)
	// The tables migrations keep (steps, the accounts this database owns) are
	// not the functions' to read or write.
	denied(`SELECT * FROM schema_app_users`)
	denied(`INSERT INTO schema_app_users (user_name) VALUES ('root')`)
	denied(`DELETE FROM schema_migrations`)

	// Someone widened the app user's grants by hand; Update puts them back.
	if _, err := admin.Exec("GRANT ALTER ON `" + s.database + "`.* TO '" + s.user + "'@'%'"); err != nil {
		t.Fatal(err)
	}
	if out := migrateUnderTheEmulator(t, s, bin, cfnEvent("Update", cfn.URL, physical), nil); out["Status"] != "SUCCESS" {
		t.Fatalf("update returned %v", out)
	}
	if a := cfn.take(t); a.Body.Status != "SUCCESS" || a.Body.PhysicalResourceId != physical || a.Body.RequestId != "req-update" {
		t.Fatalf("update answer = %+v, want SUCCESS for %s", a.Body, physical)
	}
	denied(`ALTER TABLE product_stock ADD COLUMN x INT`)
	if err := admin.QueryRow("SELECT COUNT(*) FROM `" + s.database + "`.schema_migrations").Scan(&versions); err != nil || versions != mysqlstore.Latest() {
		t.Errorf("after update schema_migrations has %d rows (%v), want %d", versions, err, mysqlstore.Latest())
	}

	// Delete answers and keeps the data and the user.
	if out := migrateUnderTheEmulator(t, s, bin, cfnEvent("Delete", cfn.URL, physical), nil); out["Status"] != "SUCCESS" {
		t.Fatalf("delete returned %v", out)
	}
	if a := cfn.take(t); a.Body.Status != "SUCCESS" || a.Body.PhysicalResourceId != physical {
		t.Fatalf("delete answer = %+v", a.Body)
	}
	if err := app.Ping(); err != nil {
		t.Errorf("the app user is gone after Delete: %v", err)
	}

	// Failures are answered too, with a reason and no secret in it.
	wrong, _ := mysql.ParseDSN(s.adminDSN)
	wrong.Passwd = "not-the-password-0123456789"
	_ = migrateUnderTheEmulator(t, s, bin, cfnEvent("Update", cfn.URL, physical), map[string]string{"HOLDFAST_DB_ADMIN_DSN": wrong.FormatDSN()})
	if a := cfn.take(t); a.Body.Status != "FAILED" || a.Body.PhysicalResourceId != physical || !strings.Contains(a.Body.Reason, "Access denied") ||
		strings.Contains(a.Body.Reason, wrong.Passwd) {
		t.Errorf("answer with a wrong master password = %+v, want FAILED naming the denied access", a.Body)
	}
	_ = migrateUnderTheEmulator(t, s, bin, cfnEvent("Create", cfn.URL, ""), map[string]string{"HOLDFAST_DB_ADMIN_DSN": ""})
	if a := cfn.take(t); a.Body.Status != "FAILED" || !strings.Contains(a.Body.Reason, "HOLDFAST_DB_ADMIN_SECRET_ID") || a.Body.PhysicalResourceId == "" {
		t.Errorf("answer of a misconfigured function = %+v, want FAILED naming the missing setting", a.Body)
	}

	// Invoked directly (no response URL), it reports what it did.
	out := migrateUnderTheEmulator(t, s, bin, map[string]any{}, nil)
	if out["schema_version"] != float64(mysqlstore.Latest()) || out["app_user"] != s.user {
		t.Errorf("direct invocation = %v", out)
	}
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }
