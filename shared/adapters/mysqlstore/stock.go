package mysqlstore

// Stock: the admin's changes (preconditions, keys, admin_delta) and the reads of a SKU's level.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/holdfast/holdfast/shared/reservation"
)

// ChangeStock implements reservation.Ledger. A change that may create the
// SKU inserts its row first; a change of an existing SKU reads the row FOR
// UPDATE, so the precondition, the new figure and admin_delta are one
// decision. Turning a per-user limit on rebuilds user_units from the
// confirmed rows under the same lock (no persist can commit in between:
// each takes it).
//
// No statement here takes a lock on a row that is not there, so writes to
// distinct SKUs never wait for each other. Under REPEATABLE READ a locking
// read of an absent key locks the gap before the next key instead: that is
// what a catalog import of distinct new SKUs deadlocked on (1213) when this
// began with SELECT ... FOR UPDATE. InnoDB reported, for two creations of
// neighbouring SKUs, each holding "lock_mode X locks gap before rec" on the
// next SKU of product_stock's PRIMARY (the missing row's read) and each
// waiting for "lock_mode X locks gap before rec insert intention" on the
// same record (its INSERT). Gap locks do not conflict with each other, so
// both got one; each insert waits for the other's gap lock. Now:
//   - a creating change inserts the row first: an insert takes an insert
//     intention lock on the gap, which only a gap lock conflicts with, and a
//     duplicate of the primary key locks that record alone (not the gap);
//   - a change of a SKU looks for its row with a plain read before locking,
//     so a change of a SKU that is not there locks nothing;
//   - the Idempotency-Key row is a plain insert into stock_change_keys
//     (primary key (sku, change_key)): the same rules, no gap.
func (s *Store) ChangeStock(ctx context.Context, c reservation.StockChange) (level reservation.StockLevel, err error) {
	// No deadlock of a change is known (rebuildUserUnits reads the SKU's
	// reservations without locking them): this stays as a guard, should
	// InnoDB roll one back, it runs again.
	err = retryDeadlocks(ctx, func() error {
		if creates(c) {
			var created bool
			level, created, err = s.createStock(ctx, c)
			if err != nil || created {
				return err
			}
			// The SKU exists: change it as such, in a fresh transaction.
			level, err = s.changeStock(ctx, c, true)
			return err
		}
		level, err = s.changeStock(ctx, c, false)
		return err
	})
	return level, err
}

// creates reports whether c may create its SKU: an absolute figure without
// a precondition (a creation), or with If-Match: 0 (a creation only).
func creates(c reservation.StockChange) bool {
	return c.Set != nil && !c.IfExists && (c.IfVersion == nil || *c.IfVersion == 0)
}

// maxStock bounds a SKU's available units (an INT column).
const maxStock = 1_000_000_000

// createStock inserts c's SKU as a new row; created is false, and nothing
// changed, if the SKU exists.
func (s *Store) createStock(ctx context.Context, c reservation.StockChange) (level reservation.StockLevel, created bool, err error) {
	level, err = changed(reservation.StockLevel{SKU: c.SKU}, c)
	if err != nil {
		return reservation.StockLevel{}, false, err
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return reservation.StockLevel{}, false, translate("create stock begin", err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	_, err = tx.ExecContext(ctx, `INSERT INTO product_stock (sku, available, version, per_user_limit, admin_delta, user_rate, user_burst, buckets, opens_at, closes_at,
		pay_within_seconds, admit_permille) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		c.SKU, level.Available, level.Version, level.PerUserLimit, level.AdminDelta, level.UserRate, level.UserBurst, level.Buckets,
		nullTime(level.OpensAt), nullTime(level.ClosesAt), payWithinSeconds(level), level.AdmitPermille)
	if isDuplicate(err) {
		return reservation.StockLevel{}, false, nil
	}
	if err != nil {
		return reservation.StockLevel{}, false, translate("create stock", err)
	}
	if c.Key != "" {
		if err := insertKey(ctx, tx, c); isDuplicate(err) {
			// A key of a SKU that was not there: only a row removed by
			// hand leaves one. Answer as a retry of that change would.
			level, err := s.replayChange(ctx, tx, c)
			return level, err == nil, err
		} else if err != nil {
			return reservation.StockLevel{}, false, err
		}
	}
	levels := []reservation.StockLevel{level}
	if err := withShares(ctx, tx, levels); err != nil {
		return reservation.StockLevel{}, false, err
	}
	if err := tx.Commit(); err != nil {
		return reservation.StockLevel{}, false, translate("create stock commit", err)
	}
	levels[0].Created = true
	return levels[0], true, nil
}

// insertKey records c under its Idempotency-Key (a duplicate: the key was
// used before).
func insertKey(ctx context.Context, tx *sql.Tx, c reservation.StockChange) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO stock_change_keys (sku, change_key, set_to, add_by, limit_to, rate_to, burst_to, if_version, buckets_to, opens_to, closes_to,
		pay_within_to, admit_to) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		c.SKU, c.Key, nullInt(c.Set), nullInt(c.Add), nullInt(c.Limit), nullInt(c.Rate), nullInt(c.Burst), ifVersion(c), nullInt(c.Buckets),
		nullMS(c.OpensAt), nullMS(c.ClosesAt), nullSeconds(c.PayWithin), roomTo(c))
	if err != nil && !isDuplicate(err) {
		return translate("change stock key", err)
	}
	return err
}

// changeStock applies c to its SKU's row. exists: the row is known to be
// there (SKUs are never removed); otherwise a plain read looks for it first,
// outside the transaction, so that a change of a missing SKU is answered
// without a locking read of an absent row (a gap lock other SKUs' creations
// would wait for).
func (s *Store) changeStock(ctx context.Context, c reservation.StockChange, exists bool) (reservation.StockLevel, error) {
	if !exists {
		var one int
		err := s.db.QueryRowContext(ctx, `SELECT 1 FROM product_stock WHERE sku = ?`, c.SKU).Scan(&one)
		if errors.Is(err, sql.ErrNoRows) {
			return reservation.StockLevel{}, missing(c)
		}
		if err != nil {
			return reservation.StockLevel{}, translate("change stock find", err)
		}
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return reservation.StockLevel{}, translate("change stock begin", err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit

	level, err := scanLevel(tx.QueryRowContext(ctx, `SELECT `+levelColumns+` FROM product_stock WHERE sku = ? FOR UPDATE`, c.SKU))
	if errors.Is(err, sql.ErrNoRows) { // not reached while SKUs are never removed
		return reservation.StockLevel{}, missing(c)
	}
	if err != nil {
		return reservation.StockLevel{}, translate("change stock read", err)
	}
	if c.Key != "" {
		// A retried change (the same key) is answered before its
		// precondition: the first one moved the version it was based on.
		if err := insertKey(ctx, tx, c); isDuplicate(err) {
			return s.replayChange(ctx, tx, c)
		} else if err != nil {
			return reservation.StockLevel{}, err
		}
	}
	switch {
	case c.Set != nil && c.IfVersion == nil && !c.IfExists:
		return reservation.StockLevel{}, reservation.ErrPreconditionRequired
	case c.IfVersion != nil && *c.IfVersion != level.Version:
		return reservation.StockLevel{}, fmt.Errorf("change stock %s: version is %d, not %d: %w", c.SKU, level.Version, *c.IfVersion, reservation.ErrPreconditionFailed)
	}
	oldLimit := level.PerUserLimit
	if level, err = changed(level, c); err != nil {
		return reservation.StockLevel{}, err
	}
	_, err = tx.ExecContext(ctx, `UPDATE product_stock SET available = ?, version = ?, per_user_limit = ?, admin_delta = ?,
		user_rate = ?, user_burst = ?, buckets = ?, opens_at = ?, closes_at = ?, pay_within_seconds = ?, admit_permille = ? WHERE sku = ?`,
		level.Available, level.Version, level.PerUserLimit, level.AdminDelta, level.UserRate, level.UserBurst, level.Buckets,
		nullTime(level.OpensAt), nullTime(level.ClosesAt), payWithinSeconds(level), level.AdmitPermille, c.SKU)
	if err != nil {
		return reservation.StockLevel{}, translate("change stock write", err)
	}
	if oldLimit == 0 && level.PerUserLimit > 0 {
		if err := rebuildUserUnits(ctx, tx, c.SKU); err != nil {
			return reservation.StockLevel{}, err
		}
	}
	levels := []reservation.StockLevel{level}
	if err := withShares(ctx, tx, levels); err != nil {
		return reservation.StockLevel{}, err
	}
	if err := tx.Commit(); err != nil {
		return reservation.StockLevel{}, translate("change stock commit", err)
	}
	return levels[0], nil
}

// rebuildUserUnits sets sku's user_units to its confirmed rows' units per
// buyer (a per-user limit being turned on: while it was off, persist kept
// no figures). The caller holds sku's product_stock row lock, which every
// writer of the SKU's reservations' units and of its user_units takes first
// (persist, refund, a stock change), so nothing of this SKU changes in
// either table until it commits.
//
// Plain reads, then writes by primary key, at REPEATABLE READ: no gap lock.
// It was `DELETE … WHERE sku = ?` then `INSERT … SELECT`: the delete of a
// SKU with no rows locked the gap where they would be (the supremum of an
// empty table), the insert waited for every other such gap lock, and two
// admins turning a limit on for two SKUs waited for each other and
// deadlocked; the INSERT … SELECT also took shared next-key locks on the
// SKU's reservations, gaps other SKUs' persists insert into, and waited on
// a persist of its own SKU that had inserted its row and waited for the
// stock row (a deadlock, retried). READ COMMITTED would drop the gap locks
// too, but at the price of a SET before every such transaction (a round
// trip, and a session change RDS Proxy may pin on) and of a binlog format
// constraint; this keeps the whole store at one isolation level.
//
// The reads are consistent reads, and they see every change of this SKU
// that committed: the transaction's snapshot is taken by its first
// consistent read, and nothing before this in changeStock reads without
// locking (the stock row is read FOR UPDATE), so the snapshot is taken
// after the lock was granted. A persist of this SKU still in flight has at
// most inserted its reservations row (uncommitted, so not counted here) and
// waits for the stock row; it then reads the limit this change set and adds
// its own units. Keep it so: a plain read added before the stock row's
// lock would make these reads miss what commits in between.
func rebuildUserUnits(ctx context.Context, tx *sql.Tx, sku string) error {
	type uu struct {
		user  string
		units int64
	}
	scan := func(row interface{ Scan(...any) error }) (uu, error) {
		var u uu
		err := row.Scan(&u.user, &u.units)
		return u, err
	}
	confirmed, err := queryAll(ctx, tx, "rebuild user units read", scan, `SELECT user_id, SUM(qty) FROM reservations
		WHERE sku = ? AND status = 'CONFIRMED' AND into_bucket IS NULL GROUP BY user_id`, sku)
	if err != nil {
		return err
	}
	old, err := queryAll(ctx, tx, "rebuild user units read", scan, `SELECT user_id, units FROM user_units WHERE sku = ?`, sku)
	if err != nil {
		return err
	}
	units := make(map[string]int64, len(confirmed))
	for _, u := range confirmed {
		units[u.user] = u.units
	}
	var stale []any // rows of buyers with no confirmed units: each found by its key
	for _, u := range old {
		if _, ok := units[u.user]; !ok {
			stale = append(stale, u.user)
		}
	}
	err = inChunks(len(stale), func(lo, hi int) error {
		_, err := tx.ExecContext(ctx, `DELETE FROM user_units WHERE sku = ? AND user_id IN (?`+strings.Repeat(",?", hi-lo-1)+`)`,
			append([]any{sku}, stale[lo:hi]...)...)
		return err
	})
	if err != nil {
		return translate("rebuild user units", err)
	}
	return upsertUserUnits(ctx, tx, sku, units, `units = VALUES(units)`)
}

// missing is the answer to c on a SKU that is not there (c does not create).
func missing(c reservation.StockChange) error {
	if c.Set == nil {
		return reservation.ErrUnknownSKU
	}
	return fmt.Errorf("change stock %s: no such sku: %w", c.SKU, reservation.ErrPreconditionFailed)
}

// changed is level after c (its precondition already checked): the new
// figure, admin_delta, settings, window and the next version.
func changed(level reservation.StockLevel, c reservation.StockChange) (reservation.StockLevel, error) {
	level, err := c.ApplyWindow(level)
	if err != nil {
		return reservation.StockLevel{}, err
	}
	var delta int64
	switch {
	case c.Set != nil:
		delta = *c.Set - level.Available
	case c.Add != nil:
		delta = *c.Add
	}
	if level.Available+delta < 0 {
		return reservation.StockLevel{}, fmt.Errorf("change stock %s: %d available, cannot remove %d: %w", c.SKU, level.Available, -delta, reservation.ErrInsufficient)
	}
	if level.Available+delta > maxStock {
		return reservation.StockLevel{}, &reservation.InvalidError{Field: "add",
			Msg: fmt.Sprintf("%d available: adding %d passes the most a sku can hold (%d)", level.Available, delta, maxStock)}
	}
	level.Buckets = max(level.Buckets, 1)
	if c.Buckets != nil {
		if *c.Buckets < level.Buckets {
			return reservation.StockLevel{}, &reservation.InvalidError{Field: "buckets",
				Msg: fmt.Sprintf("%s: %s has %d", errFewerBuckets, c.SKU, level.Buckets)}
		}
		level.Buckets = *c.Buckets
	}
	if c.Limit != nil {
		level.PerUserLimit = *c.Limit
	}
	if c.Rate != nil {
		level.UserRate = *c.Rate
	}
	if c.Burst != nil {
		level.UserBurst = *c.Burst
	}
	if c.PayWithin != nil {
		level.PayWithin = *c.PayWithin
	}
	if level, err = c.ApplyRoom(level); err != nil {
		return reservation.StockLevel{}, err
	}
	level.Available += delta
	level.AdminDelta += delta
	level.Version++
	return level, nil
}

// replayChange answers a change whose key was used before: the same change
// is the level as it stands (applied once already); another change under
// the key is refused.
func (s *Store) replayChange(ctx context.Context, tx *sql.Tx, c reservation.StockChange) (reservation.StockLevel, error) {
	var set, add, limit, rate, burst, version, buckets, opens, closes, payWithin, room sql.NullInt64
	err := tx.QueryRowContext(ctx, `SELECT set_to, add_by, limit_to, rate_to, burst_to, if_version, buckets_to, opens_to, closes_to, pay_within_to, admit_to
		FROM stock_change_keys WHERE sku = ? AND change_key = ?`, c.SKU, c.Key).
		Scan(&set, &add, &limit, &rate, &burst, &version, &buckets, &opens, &closes, &payWithin, &room)
	if err != nil {
		return reservation.StockLevel{}, translate("change stock replay", err)
	}
	_ = tx.Rollback()
	if set != nullInt(c.Set) || add != nullInt(c.Add) || limit != nullInt(c.Limit) ||
		rate != nullInt(c.Rate) || burst != nullInt(c.Burst) || version != ifVersion(c) || buckets != nullInt(c.Buckets) ||
		opens != nullMS(c.OpensAt) || closes != nullMS(c.ClosesAt) || payWithin != nullSeconds(c.PayWithin) || room != roomTo(c) {
		return reservation.StockLevel{}, fmt.Errorf("change stock %s: key %q: %w", c.SKU, c.Key, reservation.ErrIdempotencyMismatch)
	}
	return s.Stock(ctx, c.SKU)
}

// ifVersion is the precondition a keyed change was based on: its version,
// -1 for If-Match: *, none.
func ifVersion(c reservation.StockChange) sql.NullInt64 {
	if c.IfExists {
		return sql.NullInt64{Int64: -1, Valid: true}
	}
	return nullInt(c.IfVersion)
}

// nullMS is a window bound a keyed change recorded: unix milliseconds, 0
// for a bound it cleared, NULL for one it left alone.
func nullMS(p *time.Time) sql.NullInt64 {
	switch {
	case p == nil:
		return sql.NullInt64{}
	case p.IsZero():
		return sql.NullInt64{Valid: true}
	}
	return sql.NullInt64{Int64: p.UnixMilli(), Valid: true}
}

// roomTo is the waiting room a keyed change recorded: -1 turned off, the
// admit factor in thousandths (0: on, factor left alone), NULL: left alone.
func roomTo(c reservation.StockChange) sql.NullInt64 {
	switch {
	case c.WaitingRoom != nil && !*c.WaitingRoom:
		return sql.NullInt64{Int64: -1, Valid: true}
	case c.AdmitFactor != nil:
		return sql.NullInt64{Int64: int64(*c.AdmitFactor*1000 + 0.5), Valid: true}
	case c.WaitingRoom != nil:
		return sql.NullInt64{Valid: true}
	}
	return sql.NullInt64{}
}

// payWithinSeconds is a level's pay window as its column stores it.
func payWithinSeconds(l reservation.StockLevel) int64 { return int64(l.PayWithin / time.Second) }

// nullSeconds is a pay window a keyed change recorded, in seconds (NULL:
// left alone).
func nullSeconds(p *time.Duration) sql.NullInt64 {
	if p == nil {
		return sql.NullInt64{}
	}
	return sql.NullInt64{Int64: int64(*p / time.Second), Valid: true}
}

func nullInt[T int | int64](p *T) sql.NullInt64 {
	if p == nil {
		return sql.NullInt64{}
	}
	return sql.NullInt64{Int64: int64(*p), Valid: true}
}

// Stock implements reservation.Ledger: one consistent read of the level
// and its bucket shares.
func (s *Store) Stock(ctx context.Context, sku string) (reservation.StockLevel, error) {
	level, _, err := s.snapshot(ctx, sku, nil, false)
	return level, err
}

// CountWarmUp implements reservation.Ledger: an update whose
// LAST_INSERT_ID carries the new count back, then any reservation row of
// the SKU, through the index (sku, status).
func (s *Store) CountWarmUp(ctx context.Context, sku string) (int64, bool, error) {
	res, err := s.db.ExecContext(ctx, `UPDATE product_stock SET warm_ups = LAST_INSERT_ID(warm_ups + 1) WHERE sku = ?`, sku)
	if err != nil {
		return 0, false, translate("count warm-up", err)
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		if err == nil {
			err = reservation.ErrUnknownSKU
		}
		return 0, false, err
	}
	n, err := res.LastInsertId()
	if err != nil {
		return 0, false, translate("count warm-up", err)
	}
	var reserved bool
	if err := s.db.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM reservations WHERE sku = ?)`, sku).Scan(&reserved); err != nil {
		return 0, false, translate("count warm-up: any reservation", err)
	}
	return n, reserved, nil
}

// Snapshot implements reservation.Ledger: one consistent read.
func (s *Store) Snapshot(ctx context.Context, sku string, held []string) (reservation.StockLevel, []reservation.Reservation, error) {
	return s.snapshot(ctx, sku, held, true)
}

// snapshot is Snapshot, and Stock without the rows (withRows false).
func (s *Store) snapshot(ctx context.Context, sku string, held []string, withRows bool) (reservation.StockLevel, []reservation.Reservation, error) {
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return reservation.StockLevel{}, nil, translate("snapshot begin", err)
	}
	defer tx.Rollback() //nolint:errcheck // read-only
	level, err := scanLevel(tx.QueryRowContext(ctx, `SELECT `+levelColumns+` FROM product_stock WHERE sku = ?`, sku))
	if errors.Is(err, sql.ErrNoRows) {
		return reservation.StockLevel{SKU: sku}, nil, reservation.ErrUnknownSKU
	}
	if err != nil {
		return level, nil, translate("snapshot stock", err)
	}
	levels := []reservation.StockLevel{level}
	if err := withShares(ctx, tx, levels); err != nil {
		return level, nil, err
	}
	level = levels[0]
	if !withRows {
		return level, nil, nil
	}
	var confirmed []reservation.Reservation
	err = inChunks(len(held), func(lo, hi int) error {
		rows, err := queryAll(ctx, tx, "snapshot confirmed", scanReservation, `SELECT `+reservationColumns+` FROM reservations
			WHERE reservation_id IN (?`+strings.Repeat(",?", hi-lo-1)+`) AND status = 'CONFIRMED'`, anys(held[lo:hi])...)
		confirmed = append(confirmed, rows...)
		return err
	})
	if err != nil {
		return level, nil, err
	}
	// The units that may still return unpaid (Redis's unpaid hash is rebuilt
	// from them), through the index (sku, status).
	unpaid, err := queryAll(ctx, tx, "snapshot unpaid", scanReservation, `SELECT `+reservationColumns+` FROM reservations
		WHERE sku = ? AND status = 'CONFIRMED' AND paid_at IS NULL AND pay_by IS NOT NULL`, sku)
	if err != nil {
		return level, nil, err
	}
	seen := make(map[string]bool, len(confirmed))
	for _, r := range confirmed {
		seen[r.ID] = true
	}
	for _, r := range unpaid {
		if !seen[r.ID] {
			confirmed = append(confirmed, r)
		}
	}
	return level, confirmed, nil
}

// anys returns ss as query arguments.
func anys(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

const levelColumns = `sku, available, version, per_user_limit, admin_delta, user_rate, user_burst, buckets, opens_at, closes_at, pay_within_seconds,
	admit_permille`

func scanLevel(row interface{ Scan(...any) error }) (reservation.StockLevel, error) {
	var l reservation.StockLevel
	var opens, closes sql.NullTime
	var payWithin int64
	err := row.Scan(&l.SKU, &l.Available, &l.Version, &l.PerUserLimit, &l.AdminDelta, &l.UserRate, &l.UserBurst, &l.Buckets, &opens, &closes, &payWithin,
		&l.AdmitPermille)
	l.PayWithin = time.Duration(payWithin) * time.Second
	if opens.Valid {
		l.OpensAt = utc(opens.Time)
	}
	if closes.Valid {
		l.ClosesAt = utc(closes.Time)
	}
	return l, err
}

// StocksAfter implements reservation.Ledger: a range of the primary key,
// then the shares of SKUs with buckets (one consistent read).
func (s *Store) StocksAfter(ctx context.Context, after string, limit int) ([]reservation.StockLevel, error) {
	return s.levels(ctx, "list stock", `SELECT `+levelColumns+` FROM product_stock WHERE sku > ? ORDER BY sku LIMIT ?`, after, limit)
}

// Opening implements reservation.Ledger: a range of product_stock_opening.
func (s *Store) Opening(ctx context.Context, after, until time.Time, limit int) ([]reservation.StockLevel, error) {
	return s.levels(ctx, "list opening", `SELECT `+levelColumns+` FROM product_stock WHERE opens_at > ? AND opens_at <= ? ORDER BY opens_at, sku LIMIT ?`,
		utc(after), utc(until), limit)
}

// levels reads levels and their bucket shares in one read-only transaction.
func (s *Store) levels(ctx context.Context, op, q string, args ...any) ([]reservation.StockLevel, error) {
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, translate(op+" begin", err)
	}
	defer tx.Rollback() //nolint:errcheck // read-only
	levels, err := queryAll(ctx, tx, op, scanLevel, q, args...)
	if err != nil {
		return nil, err
	}
	if err := withShares(ctx, tx, levels); err != nil {
		return nil, err
	}
	return levels, nil
}

// Levels implements reservation.Ledger: primary-key lookups, rowsPerStatement a query.
func (s *Store) Levels(ctx context.Context, skus []string) ([]reservation.StockLevel, error) {
	var out []reservation.StockLevel
	err := inChunks(len(skus), func(lo, hi int) error {
		levels, err := s.levels(ctx, "read levels",
			`SELECT `+levelColumns+` FROM product_stock WHERE sku IN (?`+strings.Repeat(",?", hi-lo-1)+`)`, anys(skus[lo:hi])...)
		out = append(out, levels...)
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
