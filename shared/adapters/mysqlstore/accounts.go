package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/go-sql-driver/mysql"
)

// The functions' MySQL account: created and kept to the least privilege by
// the migrate function (EnsureAppUser), never changed when another owns it.

// AppPrivileges are all the functions need, on each of their tables: they
// read and write rows (DELETE undoes refused inserts and clears per-user
// tallies); they create, alter and drop nothing, and never see the
// schema_* tables migrations keep.
const AppPrivileges = "SELECT, INSERT, UPDATE, DELETE"

var (
	accountName  = regexp.MustCompile(`^[A-Za-z0-9_-]{1,32}$`)
	databaseName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
)

// ErrBadAccount reports a user name, password or database name that cannot be
// used safely in an account statement.
var ErrBadAccount = errors.New("mysqlstore: unusable account")

// ErrForeignAccount reports an account that exists but was not created for
// this database: another stage's, another application's, a person's.
// EnsureAppUser never changes such an account.
var ErrForeignAccount = errors.New("mysqlstore: the account exists and is not this database's")

// ErrAppUserIsAdmin reports an app user named like the master user.
var ErrAppUserIsAdmin = errors.New("mysqlstore: the functions' user cannot be the master user")

// ErrGrantsHidden reports a master user that cannot see other accounts'
// grants (no read access to the mysql schema): extras could not be revoked.
var ErrGrantsHidden = errors.New("mysqlstore: the master user cannot read other accounts' grants (grant it SELECT on the mysql schema)")

// EnsureAppUser creates the functions' database user for database (or, if
// this database created it before, sets its password unless passwordSet
// says it already works) and leaves it exactly AppPrivileges on each of the
// database's tables but schema_*: missing grants are added first and extra
// ones (global, database, table, column, routine grants and roles) revoked
// after, so a live function never loses a privilege it uses. An account
// this database did not create (recorded in schema_app_users) is refused,
// never re-passworded. db is the master user's connection (CREATE USER,
// GRANT OPTION, and read access to the mysql schema, as Aurora's master
// user has), on the migrated database, with interpolated parameters
// (account statements cannot be prepared); admin is its user name.
func EnsureAppUser(ctx context.Context, db *sql.DB, database, user, password, admin string, passwordSet bool) error {
	switch {
	case !accountName.MatchString(user):
		return fmt.Errorf("%w: user name %q (letters, digits, _ and -, at most 32)", ErrBadAccount, user)
	case !databaseName.MatchString(database):
		return fmt.Errorf("%w: database name %q", ErrBadAccount, database)
	case len(password) < 16 || strings.ContainsAny(password, `'"\`):
		return fmt.Errorf("%w: the password of %s must have at least 16 characters and no quotes or backslashes", ErrBadAccount, user)
	case strings.EqualFold(user, admin):
		return fmt.Errorf("%w: %s", ErrAppUserIsAdmin, user)
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("app user %s: %w", user, err)
	}
	defer conn.Close()
	release, err := takeLock(ctx, conn, MigrateLock(database))
	if err != nil {
		return fmt.Errorf("app user %s: %w", user, err)
	}
	defer release()

	account := "'" + user + "'@'%'"
	owners := ident(database) + ".schema_app_users"
	// The ownership record first, then the account: a run that dies between
	// the two finds its own record and creates the account next time. A
	// record this run added for an account that turns out to exist already
	// is taken back: that account is not ours.
	res, err := conn.ExecContext(ctx, `INSERT IGNORE INTO `+owners+` (user_name) VALUES (?)`, user)
	if err != nil {
		return fmt.Errorf("app user %s: record: %w", user, err)
	}
	recordedNow, _ := res.RowsAffected()
	_, err = conn.ExecContext(ctx, `CREATE USER `+account+` IDENTIFIED BY ?`, password)
	var me *mysql.MySQLError
	switch {
	case err == nil:
	case errors.As(err, &me) && me.Number == 1396 && recordedNow == 1: // it exists, and not by us
		_, _ = conn.ExecContext(ctx, `DELETE FROM `+owners+` WHERE user_name = ?`, user)
		return fmt.Errorf("%w: %s was not created for database %s; refusing to change its password or grants (another stage's? drop it, or deploy with another Stage)", ErrForeignAccount, user, database)
	case errors.As(err, &me) && me.Number == 1396: // ours, from an earlier run
		if !passwordSet {
			// A server with a password-reuse policy refuses setting the same
			// password again: the caller checks a login first.
			if _, err := conn.ExecContext(ctx, `ALTER USER `+account+` IDENTIFIED BY ?`, password); err != nil {
				return fmt.Errorf("app user %s: %w", user, err)
			}
		}
	default:
		return fmt.Errorf("app user %s: %w", user, err)
	}

	tables, err := column(ctx, conn, `SELECT table_name FROM information_schema.tables
		WHERE table_schema = ? AND table_type = 'BASE TABLE' AND table_name NOT LIKE 'schema\_%'`, database)
	if err != nil {
		return fmt.Errorf("app user %s: tables: %w", user, err)
	}
	want := map[string]bool{}
	for _, t := range tables {
		want[t] = true
		if _, err := conn.ExecContext(ctx, `GRANT `+AppPrivileges+` ON `+ident(database)+`.`+ident(t)+` TO `+account); err != nil {
			return fmt.Errorf("app user %s: grant on %s: %w", user, t, err)
		}
	}
	return revokeExtras(ctx, conn, user, account, database, want)
}

// revokeExtras takes back every privilege and role account holds beyond
// AppPrivileges on the wanted tables of database.
func revokeExtras(ctx context.Context, conn *sql.Conn, user, account, database string, want map[string]bool) error {
	wantPriv := map[string]bool{}
	for _, p := range strings.Split(AppPrivileges, ", ") {
		wantPriv[p] = true
	}
	grantee := account
	// Every account has a USAGE row at least; none means the grants are
	// hidden from this user, and nothing could be checked.
	var visible int
	if err := conn.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.USER_PRIVILEGES WHERE GRANTEE = ?`, grantee).Scan(&visible); err != nil {
		return fmt.Errorf("app user grants: %w", err)
	}
	if visible == 0 {
		return ErrGrantsHidden
	}
	var revokes []string
	seen := map[string]bool{}
	add := func(q string) {
		if !seen[q] {
			seen[q] = true
			revokes = append(revokes, q)
		}
	}
	rows, err := conn.QueryContext(ctx, `
		SELECT '*', '*', '', PRIVILEGE_TYPE, IS_GRANTABLE FROM information_schema.USER_PRIVILEGES WHERE GRANTEE = ?
		UNION ALL SELECT TABLE_SCHEMA, '*', '', PRIVILEGE_TYPE, IS_GRANTABLE FROM information_schema.SCHEMA_PRIVILEGES WHERE GRANTEE = ?
		UNION ALL SELECT TABLE_SCHEMA, TABLE_NAME, '', PRIVILEGE_TYPE, IS_GRANTABLE FROM information_schema.TABLE_PRIVILEGES WHERE GRANTEE = ?
		UNION ALL SELECT TABLE_SCHEMA, TABLE_NAME, COLUMN_NAME, PRIVILEGE_TYPE, IS_GRANTABLE FROM information_schema.COLUMN_PRIVILEGES WHERE GRANTEE = ?`,
		grantee, grantee, grantee, grantee)
	if err != nil {
		return fmt.Errorf("app user grants: %w", err)
	}
	for rows.Next() {
		var schema, table, col, priv, grantable string
		if err := rows.Scan(&schema, &table, &col, &priv, &grantable); err != nil {
			rows.Close()
			return fmt.Errorf("app user grants: %w", err)
		}
		on := "*.*"
		if schema != "*" {
			on = ident(schema) + ".*"
			if table != "*" {
				on = ident(schema) + "." + ident(table)
			}
		}
		wanted := schema == database && table != "*" && col == "" && want[table] && wantPriv[priv]
		switch {
		case priv == "USAGE" || wanted:
		case col != "":
			add(`REVOKE ` + priv + ` (` + ident(col) + `) ON ` + on + ` FROM ` + account)
		default:
			add(`REVOKE ` + priv + ` ON ` + on + ` FROM ` + account)
		}
		if grantable == "YES" {
			add(`REVOKE GRANT OPTION ON ` + on + ` FROM ` + account)
		}
	}
	if err := rows.Close(); err != nil {
		return fmt.Errorf("app user grants: %w", err)
	}
	// Routine grants, and roles (MySQL 8: mysql.role_edges; MariaDB:
	// mysql.roles_mapping), which information_schema does not list.
	routines, err := conn.QueryContext(ctx, `SELECT Db, Routine_name, Routine_type FROM mysql.procs_priv WHERE User = ? AND Host = '%'`, user)
	if err != nil {
		return fmt.Errorf("app user routine grants: %w", err)
	}
	for routines.Next() {
		var rdb, name, typ string
		if err := routines.Scan(&rdb, &name, &typ); err != nil {
			routines.Close()
			return fmt.Errorf("app user routine grants: %w", err)
		}
		add(`REVOKE ALL PRIVILEGES ON ` + typ + ` ` + ident(rdb) + `.` + ident(name) + ` FROM ` + account)
	}
	if err := routines.Close(); err != nil {
		return fmt.Errorf("app user routine grants: %w", err)
	}
	for _, q := range []string{
		`SELECT FROM_USER, FROM_HOST FROM mysql.role_edges WHERE TO_USER = ? AND TO_HOST = '%'`,
		`SELECT Role, '' FROM mysql.roles_mapping WHERE User = ? AND Host = '%' AND Role <> ''`,
	} {
		roles, err := conn.QueryContext(ctx, q, user)
		var me *mysql.MySQLError
		if errors.As(err, &me) && me.Number == 1146 { // this server keeps roles in the other table
			continue
		}
		if err != nil {
			return fmt.Errorf("app user roles: %w", err)
		}
		for roles.Next() {
			var name, host string
			if err := roles.Scan(&name, &host); err != nil {
				roles.Close()
				return fmt.Errorf("app user roles: %w", err)
			}
			role := ident(name) // MariaDB: a role has no host
			if host != "" {
				role = quote(name) + "@" + quote(host)
			}
			add(`REVOKE ` + role + ` FROM ` + account)
		}
		if err := roles.Close(); err != nil {
			return fmt.Errorf("app user roles: %w", err)
		}
	}
	for _, q := range revokes {
		if _, err := conn.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("app user: %s: %w", q, err)
		}
	}
	return nil
}

func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

func ident(name string) string { return "`" + strings.ReplaceAll(name, "`", "``") + "`" }

func column(ctx context.Context, db interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}, q string, args ...any) ([]string, error) {
	rows, err := db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var v string
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}
