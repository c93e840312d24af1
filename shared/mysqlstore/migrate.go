package mysqlstore

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

//go:embed migrations/*.sql
var migrations embed.FS

// migrateLock names the MySQL user lock that serialises migrators (the
// deploy's custom resource, an operator's make migrate, a second stack
// update): one applies, the others wait and then find nothing to do.
const migrateLock = "holdfast.migrate"

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
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, `SELECT GET_LOCK(?, 60)`, migrateLock).Scan(&got); err != nil {
		return nil, fmt.Errorf("migrate: lock: %w", err)
	}
	if got.Int64 != 1 {
		return nil, errors.New("migrate: another migration held the lock for 60 s")
	}
	defer func() { _, _ = conn.ExecContext(context.WithoutCancel(ctx), `DO RELEASE_LOCK(?)`, migrateLock) }()

	for _, ddl := range []string{
		`CREATE TABLE IF NOT EXISTS schema_migrations (
			version INT NOT NULL PRIMARY KEY,
			applied_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3))`,
		`CREATE TABLE IF NOT EXISTS schema_migration_steps (
			version INT NOT NULL,
			step INT NOT NULL,
			PRIMARY KEY (version, step))`,
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
			if _, err := conn.ExecContext(ctx, stmt); err != nil {
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

// AppPrivileges are all the functions need on their database: they read and
// write rows (DELETE undoes refused inserts and clears per-user tallies);
// they create, alter and drop nothing.
const AppPrivileges = "SELECT, INSERT, UPDATE, DELETE"

var (
	userName = regexp.MustCompile(`^[A-Za-z0-9_]{1,32}$`)
	dbName   = regexp.MustCompile(`^[A-Za-z0-9_]{1,64}$`)
)

// ErrBadAccount reports a user name, password or database name that cannot be
// used safely in an account statement.
var ErrBadAccount = errors.New("mysqlstore: unusable account")

// EnsureAppUser creates (or updates the password of) the functions' database
// user and grants it AppPrivileges on database, and nothing else; a grant the
// user holds beyond those on database is revoked. db must be a connection
// with CREATE USER and GRANT OPTION (the master user) and interpolated
// parameters (account statements cannot be prepared).
func EnsureAppUser(ctx context.Context, db *sql.DB, database, user, password string) error {
	switch {
	case !userName.MatchString(user):
		return fmt.Errorf("%w: user name %q (letters, digits and _, at most 32)", ErrBadAccount, user)
	case !dbName.MatchString(database):
		return fmt.Errorf("%w: database name %q", ErrBadAccount, database)
	case len(password) < 16 || strings.ContainsAny(password, `'"\`):
		return fmt.Errorf("%w: the password of %s must have at least 16 characters and no quotes or backslashes", ErrBadAccount, user)
	}
	account := "'" + user + "'@'%'"
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{`CREATE USER IF NOT EXISTS ` + account + ` IDENTIFIED BY ?`, []any{password}},
		{`ALTER USER ` + account + ` IDENTIFIED BY ?`, []any{password}},
		{`REVOKE ALL PRIVILEGES, GRANT OPTION FROM ` + account, nil},
		{`GRANT ` + AppPrivileges + ` ON ` + "`" + database + "`" + `.* TO ` + account, nil},
	} {
		if _, err := db.ExecContext(ctx, q.sql, q.args...); err != nil {
			return fmt.Errorf("app user %s: %w", user, err)
		}
	}
	return nil
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
