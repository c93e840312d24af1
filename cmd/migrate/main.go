// Command migrate applies holdfast's MySQL migrations to the database named by
// HOLDFAST_DB_DSN: the one command that brings a schema up to date.
package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/holdfast/holdfast/shared/adapters/mysqlstore"
)

func main() {
	if err := run(context.Background(), os.Getenv); err != nil {
		fmt.Fprintln(os.Stderr, "migrate:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, getenv func(string) string) error {
	dsn := getenv("HOLDFAST_DB_DSN")
	if dsn == "" {
		return fmt.Errorf("HOLDFAST_DB_DSN is required")
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := mysqlstore.Migrate(ctx, db); err != nil {
		return err
	}
	fmt.Println("migrate: schema up to date")
	return nil
}
