package mysqlstore

import (
	"context"
	"crypto/sha1"
	"database/sql"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
)

//go:embed migrations/*.sql
var migrations embed.FS

// MigrateLock names the MySQL user lock that serialises the migrators of one
// database (the deploy's custom resource, an operator's invoke, make
// migrate): one applies, the others wait and then find nothing to do.
// Databases of other stages on the same server do not wait for each other.
func MigrateLock(database string) string {
	sum := sha1.Sum([]byte(database))
	return "hf.migrate." + hex.EncodeToString(sum[:])
}

// Latest is the number of the newest embedded migration: the schema version
// this build expects (template.yaml passes it to the schema custom resource,
// so a release that adds a migration makes CloudFormation run it).
func Latest() int {
	files, err := migrationFiles()
	if err != nil || len(files) == 0 {
		return 0
	}
	return files[len(files)-1].version
}

type migrationFile struct {
	version int
	name    string
}

func migrationFiles() ([]migrationFile, error) {
	paths, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	sort.Strings(paths)
	out := make([]migrationFile, 0, len(paths))
	for _, p := range paths {
		base := strings.TrimPrefix(p, "migrations/")
		v, err := strconv.Atoi(strings.SplitN(base, "_", 2)[0])
		if err != nil {
			return nil, fmt.Errorf("%s has no number prefix", base)
		}
		out = append(out, migrationFile{version: v, name: base})
	}
	return out, nil
}

// takeLock takes the named MySQL user lock on conn, waiting as long as ctx
// allows (60 s without a deadline): another migrator may be running a long
// migration.
func takeLock(ctx context.Context, conn *sql.Conn, name string) (release func(), err error) {
	wait := 60
	if d, ok := ctx.Deadline(); ok {
		wait = max(1, int(time.Until(d).Seconds()))
	}
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, `SELECT GET_LOCK(?, ?)`, name, wait).Scan(&got); err != nil {
		return nil, fmt.Errorf("lock: %w", err)
	}
	if got.Int64 != 1 {
		return nil, fmt.Errorf("another migrator of this database held the lock for %d s", wait)
	}
	return func() { _, _ = conn.ExecContext(context.WithoutCancel(ctx), `DO RELEASE_LOCK(?)`, name) }, nil
}

// Migrate applies the numbered migrations in migrations/ that the database
// has not seen, in order, and returns the versions it applied. MySQL commits
// DDL statement by statement, so each statement's completion is recorded
// (schema_migration_steps) and a run that died half-way resumes after the
// last statement that finished. Concurrent runs take turns on a user lock.
func Migrate(ctx context.Context, db *sql.DB) (applied []int, err error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	defer conn.Close()
	var database sql.NullString
	if err := conn.QueryRowContext(ctx, `SELECT DATABASE()`).Scan(&database); err != nil || !database.Valid {
		return nil, fmt.Errorf("migrate: no database selected (%v)", err)
	}
	release, err := takeLock(ctx, conn, MigrateLock(database.String))
	if err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	defer release()

	for _, ddl := range []string{
		`CREATE TABLE IF NOT EXISTS schema_migrations (
			version INT NOT NULL PRIMARY KEY,
			applied_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3))`,
		`CREATE TABLE IF NOT EXISTS schema_migration_steps (
			version INT NOT NULL,
			step INT NOT NULL,
			PRIMARY KEY (version, step))`,
		// The MySQL accounts this database's migrate created (EnsureAppUser
		// changes no other).
		`CREATE TABLE IF NOT EXISTS schema_app_users (
			user_name VARCHAR(32) NOT NULL PRIMARY KEY,
			created_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3))`,
	} {
		if _, err := conn.ExecContext(ctx, ddl); err != nil {
			return nil, fmt.Errorf("migrate: %w", err)
		}
	}
	files, err := migrationFiles()
	if err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	for _, f := range files {
		var n int
		if err := conn.QueryRowContext(ctx, `SELECT COUNT(*) FROM schema_migrations WHERE version = ?`, f.version).Scan(&n); err != nil {
			return applied, fmt.Errorf("migrate: %w", err)
		}
		if n > 0 {
			continue
		}
		body, err := migrations.ReadFile("migrations/" + f.name)
		if err != nil {
			return applied, fmt.Errorf("migrate: %w", err)
		}
		done := map[int]bool{}
		rows, err := conn.QueryContext(ctx, `SELECT step FROM schema_migration_steps WHERE version = ?`, f.version)
		if err != nil {
			return applied, fmt.Errorf("migrate %s: %w", f.name, err)
		}
		for rows.Next() {
			var s int
			if err := rows.Scan(&s); err != nil {
				rows.Close()
				return applied, fmt.Errorf("migrate %s: %w", f.name, err)
			}
			done[s] = true
		}
		if err := rows.Close(); err != nil {
			return applied, fmt.Errorf("migrate %s: %w", f.name, err)
		}
		for i, stmt := range statements(string(body)) {
			if done[i] {
				continue
			}
			if _, err := conn.ExecContext(ctx, stmt); err != nil && !alreadyApplied(err) {
				return applied, fmt.Errorf("migrate %s, statement %d: %w", f.name, i+1, err)
			}
			if _, err := conn.ExecContext(ctx, `INSERT INTO schema_migration_steps (version, step) VALUES (?, ?)`, f.version, i); err != nil {
				return applied, fmt.Errorf("migrate %s: %w", f.name, err)
			}
		}
		if _, err := conn.ExecContext(ctx, `INSERT INTO schema_migrations (version) VALUES (?)`, f.version); err != nil {
			return applied, fmt.Errorf("migrate %s: %w", f.name, err)
		}
		applied = append(applied, f.version)
	}
	return applied, nil
}

// alreadyApplied reports the errors of a DDL statement whose effect is
// already there: MySQL applies each DDL statement atomically, so a run that
// lost its connection mid-statement (a timeout, the function's deadline) may
// have applied it without recording the step. Re-running it says so.
func alreadyApplied(err error) bool {
	var me *mysql.MySQLError
	if !errors.As(err, &me) {
		return false
	}
	switch me.Number {
	case 1050, // table exists
		1060, // duplicate column
		1061, // duplicate key name
		1091: // can't drop: it is gone
		return true
	}
	return false
}

// Version returns the newest migration the database has applied (0 for
// none).
func Version(ctx context.Context, db *sql.DB) (int, error) {
	var v sql.NullInt64
	if err := db.QueryRowContext(ctx, `SELECT MAX(version) FROM schema_migrations`).Scan(&v); err != nil {
		return 0, fmt.Errorf("schema version: %w", err)
	}
	return int(v.Int64), nil
}

// statements splits a migration into statements at semicolons that end a
// line, dropping comment lines.
func statements(body string) []string {
	var out []string
	var cur strings.Builder
	for _, line := range strings.Split(body, "\n") {
		t := strings.TrimSpace(line)
		if t == "" || strings.HasPrefix(t, "--") {
			continue
		}
		cur.WriteString(line)
		cur.WriteByte('\n')
		if strings.HasSuffix(t, ";") {
			out = append(out, strings.TrimSuffix(strings.TrimSpace(cur.String()), ";"))
			cur.Reset()
		}
	}
	if s := strings.TrimSpace(cur.String()); s != "" {
		out = append(out, s)
	}
	return out
}
