package loadgen

// The servers' own counts of work, read around a burst of waiting-room
// polls: what a poll costs Redis and MySQL, whoever sends the commands.

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"

	_ "github.com/go-sql-driver/mysql" // the DSN's driver
	"github.com/redis/go-redis/v9"
)

// Counters reads what the servers counted so far. The counts are the
// whole server's: every client's work between two readings is in their
// difference.
type Counters interface {
	Read(ctx context.Context) (ServerCount, error)
}

// ServerCount is one reading of the servers' counters.
type ServerCount struct {
	// RedisCommands is every command Redis ran (INFO commandstats, the
	// INFO the reading sends left out); RedisScripts those that were
	// EVAL or EVALSHA (the waiting room's look is one).
	RedisCommands, RedisScripts int64
	// MySQLStatements is MySQL's Questions (statements clients sent),
	// less the readings' own SHOW statements up to this one.
	MySQLStatements int64
}

// Sub is the work counted between earlier and c.
func (c ServerCount) Sub(earlier ServerCount) ServerCount {
	return ServerCount{RedisCommands: c.RedisCommands - earlier.RedisCommands, RedisScripts: c.RedisScripts - earlier.RedisScripts,
		MySQLStatements: c.MySQLStatements - earlier.MySQLStatements}
}

// ServerCounters reads Redis's INFO commandstats and MariaDB's (or
// MySQL's) global Questions, each on one connection of its own, held from
// the start so no connection's handshake is counted between readings.
type ServerCounters struct {
	rconn *redis.Conn
	mconn *sql.Conn
	own   int64 // SHOW statements sent so far
	close []func() error
}

var _ Counters = (*ServerCounters)(nil)

// NewServerCounters reads the counters of the Redis server at redisAddr
// and the MySQL server of dsn (make dev's: .holdfast/dev/env names both).
func NewServerCounters(ctx context.Context, redisAddr, dsn string) (*ServerCounters, error) {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr, PoolSize: 1})
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		_ = rdb.Close()
		return nil, err
	}
	c, err := CountersOf(ctx, rdb, db)
	if err != nil {
		_ = rdb.Close()
		_ = db.Close()
		return nil, err
	}
	c.close = append(c.close, rdb.Close, db.Close)
	return c, nil
}

// CountersOf reads the counters through clients the caller has (and
// closes after Close).
func CountersOf(ctx context.Context, rdb *redis.Client, db *sql.DB) (*ServerCounters, error) {
	c := &ServerCounters{rconn: rdb.Conn()}
	c.close = []func() error{c.rconn.Close}
	var err error
	if c.mconn, err = db.Conn(ctx); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("loadgen: counters: %w", err)
	}
	c.close = append([]func() error{c.mconn.Close}, c.close...)
	if _, err := c.Read(ctx); err != nil { // the connections' handshakes, before any reading counts
		_ = c.Close()
		return nil, err
	}
	return c, nil
}

// Close releases the connections.
func (c *ServerCounters) Close() error {
	var errs []error
	for _, f := range c.close {
		errs = append(errs, f())
	}
	return errors.Join(errs...)
}

// Read implements Counters.
func (c *ServerCounters) Read(ctx context.Context) (ServerCount, error) {
	info, err := c.rconn.Info(ctx, "commandstats").Result()
	if err != nil {
		return ServerCount{}, fmt.Errorf("loadgen: redis INFO commandstats: %w", err)
	}
	var n ServerCount
	if n.RedisCommands, n.RedisScripts, err = commandStats(info); err != nil {
		return ServerCount{}, err
	}
	var name string
	var q int64
	if err := c.mconn.QueryRowContext(ctx, "SHOW GLOBAL STATUS LIKE 'Questions'").Scan(&name, &q); err != nil {
		return ServerCount{}, fmt.Errorf("loadgen: mysql Questions: %w", err)
	}
	c.own++ // Questions counts this SHOW too, before it answers
	n.MySQLStatements = q - c.own
	return n, nil
}

// commandStats sums INFO commandstats' calls: every command but INFO, and
// the EVAL and EVALSHA ones.
func commandStats(info string) (all, scripts int64, err error) {
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		name, rest, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		name, found := strings.CutPrefix(name, "cmdstat_")
		if !ok || !found || name == "info" {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			v, ok := strings.CutPrefix(kv, "calls=")
			if !ok {
				continue
			}
			n, perr := strconv.ParseInt(v, 10, 64)
			if perr != nil {
				return 0, 0, fmt.Errorf("loadgen: INFO commandstats: %q", sc.Text())
			}
			all += n
			if name == "eval" || name == "evalsha" || name == "eval_ro" || name == "evalsha_ro" {
				scripts += n
			}
		}
	}
	return all, scripts, sc.Err()
}
