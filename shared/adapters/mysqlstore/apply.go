package mysqlstore

// Persist's decisions: a reservation, or a batch of one SKU, applied once, with its per-user units and group slot.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/holdfast/holdfast/shared/reservation"
)

// Apply implements reservation.Ledger.
func (s *Store) Apply(ctx context.Context, r reservation.Reservation, lock reservation.Locking, now time.Time) (reservation.BatchResult, error) {
	out := reservation.BatchResult{Row: r}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return out, translate("apply begin", err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit

	_, err = tx.ExecContext(ctx, `INSERT INTO reservations
		(reservation_id, sku, qty, user_id, group_id, bucket, hold_token, status, expires_at, created_at, updated_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, 'CONFIRMED', ?, ?, ?)`,
		r.ID, r.SKU, r.Qty, r.UserID, nullString(r.GroupID), r.Bucket, nullString(r.Token), nullTime(r.ExpiresAt), utc(r.CreatedAt), utc(now))
	if isDuplicate(err) {
		_ = tx.Rollback()
		row, err := s.Reservation(ctx, r.ID)
		if err != nil {
			return out, err
		}
		if row.Status == reservation.StatusConfirmed {
			return reservation.BatchResult{Result: reservation.AlreadyConfirmed, Row: row}, nil
		}
		return reservation.BatchResult{Result: reservation.AlreadyCancelled, Row: row}, nil
	}
	if err != nil {
		return out, translate("apply insert", err)
	}

	read := `SELECT available, version, per_user_limit, buckets, pay_within_seconds FROM product_stock WHERE sku = ?`
	if lock == reservation.Pessimistic {
		read += ` FOR UPDATE`
	}
	var available, version int64
	var limit, buckets, payWithin int
	err = tx.QueryRowContext(ctx, read, r.SKU).Scan(&available, &version, &limit, &buckets, &payWithin)
	if errors.Is(err, sql.ErrNoRows) || (err == nil && !inBuckets(r, buckets)) {
		out.Result = reservation.NoSuchSKU // no such SKU, or no such bucket of it
		return out, nil
	}
	if err != nil {
		return out, translate("apply read stock", err)
	}
	if available < int64(r.Qty) {
		out.Result = reservation.Insufficient
		return out, nil
	}
	res, err := tx.ExecContext(ctx, `UPDATE product_stock SET available = available - ?, version = version + 1
		WHERE sku = ? AND version = ? AND available >= ?`, r.Qty, r.SKU, version, r.Qty)
	if err != nil {
		return out, translate("apply update stock", err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return out, translate("apply update stock", err)
	} else if n == 0 {
		return out, fmt.Errorf("apply %s: %w", r.ID, reservation.ErrVersionConflict)
	}
	if err := moveShares(ctx, tx, r.SKU, map[int]int64{r.Bucket: -int64(r.Qty)}); err != nil {
		return out, err
	}
	if limit > 0 {
		have, err := userUnits(ctx, tx, r.SKU, []any{r.UserID})
		if err != nil {
			return out, err
		}
		if have[r.UserID]+int64(r.Qty) > int64(limit) {
			out.Result = reservation.OverLimit
			return out, nil
		}
		if err := addUserUnits(ctx, tx, r.SKU, map[string]int64{r.UserID: int64(r.Qty)}); err != nil {
			return out, err
		}
	}

	within := time.Duration(payWithin) * time.Second
	if r.GroupID != "" {
		result, formed, err := joinGroup(ctx, tx, r, now, within)
		if err != nil || result != reservation.Applied {
			out.Result = result
			return out, err
		}
		if formed && within > 0 {
			r.PayBy = utc(now).Add(within)
		}
	} else if within > 0 {
		r.PayBy = utc(now).Add(within)
		if _, err := tx.ExecContext(ctx, `UPDATE reservations SET pay_by = ? WHERE reservation_id = ?`, r.PayBy, r.ID); err != nil {
			return out, translate("apply pay window", err)
		}
	}
	out.Row = r
	if err := writeEvents(ctx, tx, []reservation.Event{reservation.ConfirmedEvent(r, now)}); err != nil {
		return out, err
	}
	if err := tx.Commit(); err != nil {
		return out, translate("apply commit", err)
	}
	out.Result, out.Version = reservation.Applied, version+1
	return out, nil
}

// userUnits reads the confirmed units of users of a SKU with a per-user
// limit, locking their rows (lock order: after product_stock, which every
// writer of the SKU's user_units holds first: persist, refund, a stock
// change).
//
// No statement here locks a row that is not there (design.md, "Stock
// changes"). Under REPEATABLE READ a locking read of a user who has no row
// yet locks the gap before the next key of user_units instead — another
// SKU's row, or the supremum — and an insert into that gap, another SKU's
// persist adding its first units, waits for it: two persists of distinct
// limited SKUs, each with a new buyer, each held the gap and each waited
// for the other's with its insert (1213). So each user's row is made first,
// with 0 units where it had none: an insert takes only an insert intention
// lock (which no gap lock of anyone's blocks now: nothing takes one here),
// and ON DUPLICATE KEY UPDATE on a duplicate primary key locks that record
// alone. Then every row read is found by its primary key: a record lock.
// A zero row left by a buyer a batch refused counts as no row.
func userUnits(ctx context.Context, tx *sql.Tx, sku string, users []any) (map[string]int64, error) {
	type uu struct {
		user  string
		units int64
	}
	zero := make(map[string]int64, len(users))
	for _, u := range users {
		zero[u.(string)] = 0
	}
	if err := upsertUserUnits(ctx, tx, sku, zero, `units = units`); err != nil {
		return nil, err
	}
	have := make(map[string]int64, len(users))
	err := inChunks(len(users), func(lo, hi int) error {
		rows, err := queryAll(ctx, tx, "read user units", func(row interface{ Scan(...any) error }) (uu, error) {
			var u uu
			err := row.Scan(&u.user, &u.units)
			return u, err
		}, `SELECT user_id, units FROM user_units WHERE sku = ? AND user_id IN (?`+strings.Repeat(",?", hi-lo-1)+`) FOR UPDATE`,
			append([]any{sku}, users[lo:hi]...)...)
		for _, u := range rows {
			have[u.user] = u.units
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return have, nil
}

// addUserUnits adds confirmed units to users of a SKU in one statement.
func addUserUnits(ctx context.Context, tx *sql.Tx, sku string, add map[string]int64) error {
	return upsertUserUnits(ctx, tx, sku, add, `units = units + VALUES(units)`)
}

// upsertUserUnits inserts the rows of units, and sets those that exist by
// onDuplicate, in primary-key order (one lock order for every statement),
// rowsPerStatement rows a statement. Each row is one primary key: a new one
// takes an insert intention lock, an existing one a lock on its record
// alone, never a gap.
func upsertUserUnits(ctx context.Context, tx *sql.Tx, sku string, units map[string]int64, onDuplicate string) error {
	if len(units) == 0 {
		return nil
	}
	users := make([]string, 0, len(units))
	for user := range units {
		users = append(users, user)
	}
	sort.Strings(users)
	err := inChunks(len(users), func(lo, hi int) error {
		args := make([]any, 0, 3*(hi-lo))
		for _, user := range users[lo:hi] {
			args = append(args, sku, user, units[user])
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO user_units (sku, user_id, units) VALUES `+
			strings.TrimSuffix(strings.Repeat(`(?, ?, ?),`, hi-lo), ",")+
			` ON DUPLICATE KEY UPDATE `+onDuplicate, args...)
		return err
	})
	if err != nil {
		return translate("write user units", err)
	}
	return nil
}

// rowsPerStatement bounds the rows of one batch statement: 1,000 rows of at
// most 10 placeholders stay far below the protocol's 65,535 placeholders, and
// their few hundred kilobytes far below max_allowed_packet (16 MiB by
// default in MariaDB, 64 MiB in RDS MySQL).
const rowsPerStatement = 1000

// inChunks calls f on [lo, hi) ranges of at most rowsPerStatement covering
// [0, n), stopping at the first error.
func inChunks(n int, f func(lo, hi int) error) error {
	for lo := 0; lo < n; lo += rowsPerStatement {
		if err := f(lo, min(n, lo+rowsPerStatement)); err != nil {
			return err
		}
	}
	return nil
}

// ApplyBatch implements reservation.Ledger: the hot-SKU path of persist.
// One transaction: the rows of ids not yet present are inserted in
// multi-row statements (rowsPerStatement rows each), then the stock row is read FOR UPDATE (after the inserts, so the
// lock order stays reservations → product_stock, as everywhere), the
// reservations that fit are kept — the rows of those that do not are deleted
// again — and their summed quantity is taken with one version-checked update.
// Reading under the lock means concurrent batches queue on the hot row instead
// of wasting optimistic attempts; the version check still guards the update.
//
// The first attempt inserts without reading first: a batch of new messages
// (the sale's common case) costs no read of its ids. If one of its rows
// exists (a redelivery, a fence), the insert fails as a whole and the batch
// runs again, reading which rows exist first.
func (s *Store) ApplyBatch(ctx context.Context, sku string, rs []reservation.Reservation, now time.Time) ([]reservation.BatchResult, error) {
	out, err := s.applyBatch(ctx, sku, rs, now, false)
	if errors.Is(err, errRowsExist) {
		out, err = s.applyBatch(ctx, sku, rs, now, true)
	}
	return out, err
}

// errRowsExist: a batch inserted without reading first met an existing row.
var errRowsExist = errors.New("a row of the batch exists")

// applyBatch is one attempt of ApplyBatch; read says whether it reads
// which rows exist before it inserts.
func (s *Store) applyBatch(ctx context.Context, sku string, rs []reservation.Reservation, now time.Time, read bool) ([]reservation.BatchResult, error) {
	out := make([]reservation.BatchResult, len(rs))
	if len(rs) == 0 {
		return out, nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, translate("batch begin", err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit

	have := map[string]reservation.Reservation{}
	if read {
		err = inChunks(len(rs), func(lo, hi int) error {
			ids := make([]any, 0, hi-lo)
			for _, r := range rs[lo:hi] {
				ids = append(ids, r.ID)
			}
			existing, err := queryAll(ctx, tx, "batch read rows", scanReservation,
				`SELECT `+reservationColumns+` FROM reservations WHERE reservation_id IN (?`+strings.Repeat(",?", len(ids)-1)+`)`, ids...)
			for _, row := range existing {
				have[row.ID] = row
			}
			return err
		})
		if err != nil {
			return nil, err
		}
	}
	var fresh []int // indexes of reservations to insert, each id once
	seen := map[string]bool{}
	for i, r := range rs {
		switch row, ok := have[r.ID]; {
		case ok && row.Status == reservation.StatusConfirmed:
			out[i] = reservation.BatchResult{Result: reservation.AlreadyConfirmed, Row: row}
		case ok:
			out[i] = reservation.BatchResult{Result: reservation.AlreadyCancelled, Row: row}
		case seen[r.ID]: // the same message twice in one batch: decided with its twin below
			out[i] = reservation.BatchResult{Result: reservation.AlreadyConfirmed, Row: r}
		default:
			seen[r.ID] = true
			fresh = append(fresh, i)
		}
	}
	if len(fresh) == 0 {
		return out, nil
	}
	batchID := batchOf(rs[fresh[0]].ID, now) // the outbox row of the batch's confirmations (writeBatch)
	// The rows go in due by the pay window the SKU's last batch here read:
	// a row's pay_by is then written once, not inserted and updated (and
	// moved in reservations_payment_due). The read under the lock below
	// decides; openPayWindows corrects the rows when the guess was wrong.
	// A refused row is deleted, so its pay_by never counts.
	guess, _ := s.payWithin.Load(sku)
	guessed := payDeadline(now, intOr0(guess))
	err = insertBatch(ctx, tx, rs, fresh, now, batchID, guessed)
	if isDuplicate(err) && !read {
		return nil, errRowsExist
	}
	if isDuplicate(err) {
		// A fence (or another persist) wrote one of these rows since the read.
		return nil, fmt.Errorf("batch %s: %w", sku, reservation.ErrVersionConflict)
	}
	if err != nil {
		return nil, translate("batch insert", err)
	}
	var available, version int64
	var limit, buckets, payWithin int
	err = tx.QueryRowContext(ctx, `SELECT available, version, per_user_limit, buckets, pay_within_seconds FROM product_stock WHERE sku = ? FOR UPDATE`, sku).
		Scan(&available, &version, &limit, &buckets, &payWithin)
	if errors.Is(err, sql.ErrNoRows) {
		for i := range out {
			out[i].Result = reservation.NoSuchSKU
		}
		return out, nil // rolled back
	}
	if err != nil {
		return nil, translate("batch read stock", err)
	}
	s.payWithin.Store(sku, payWithin)
	var units map[string]int64 // confirmed units per user, when the SKU has a limit
	if limit > 0 {
		users := make([]any, 0, len(fresh))
		listed := map[string]bool{}
		for _, i := range fresh {
			if u := rs[i].UserID; !listed[u] {
				listed[u] = true
				users = append(users, u)
			}
		}
		if units, err = userUnits(ctx, tx, sku, users); err != nil {
			return nil, err
		}
	}
	payBy := payDeadline(now, payWithin) // every confirmation of the batch is due at once
	var sum int64
	var refused, applied []any
	added := map[string]int64{}
	shares := map[int]int64{} // units taken per bucket
	for _, i := range fresh {
		r := rs[i]
		switch {
		case !inBuckets(r, buckets):
			out[i] = reservation.BatchResult{Result: reservation.NoSuchSKU, Row: r}
		case sum+int64(r.Qty) > available:
			out[i] = reservation.BatchResult{Result: reservation.Insufficient, Row: r}
		case limit > 0 && units[r.UserID]+added[r.UserID]+int64(r.Qty) > int64(limit):
			out[i] = reservation.BatchResult{Result: reservation.OverLimit, Row: r}
		default:
			sum += int64(r.Qty)
			shares[r.Bucket] -= int64(r.Qty)
			if limit > 0 {
				added[r.UserID] += int64(r.Qty)
			}
			r.PayBy = payBy
			out[i] = reservation.BatchResult{Result: reservation.Applied, Row: r, Version: version + 1}
			applied = append(applied, r.ID)
			continue
		}
		refused = append(refused, r.ID)
	}
	first := make(map[string]int, len(fresh))
	for _, j := range fresh {
		first[rs[j].ID] = j
	}
	for i, r := range rs { // a twin follows its first copy
		if j, ok := first[r.ID]; ok && j != i {
			out[i] = out[j]
		}
	}
	err = inChunks(len(refused), func(lo, hi int) error {
		_, err := tx.ExecContext(ctx, `DELETE FROM reservations WHERE reservation_id IN (?`+strings.Repeat(",?", hi-lo-1)+`)`, refused[lo:hi]...)
		return err
	})
	if err != nil {
		return nil, translate("batch drop refused", err)
	}
	if !payBy.Equal(guessed) {
		if err := openPayWindows(ctx, tx, payBy, applied); err != nil {
			return nil, err
		}
	}
	if sum > 0 {
		res, err := tx.ExecContext(ctx, `UPDATE product_stock SET available = available - ?, version = version + 1
			WHERE sku = ? AND version = ? AND available >= ?`, sum, sku, version, sum)
		if err != nil {
			return nil, translate("batch update stock", err)
		}
		if n, err := res.RowsAffected(); err != nil {
			return nil, translate("batch update stock", err)
		} else if n == 0 {
			return nil, fmt.Errorf("batch %s: %w", sku, reservation.ErrVersionConflict)
		}
	}
	if err := moveShares(ctx, tx, sku, shares); err != nil {
		return nil, err
	}
	if err := addUserUnits(ctx, tx, sku, added); err != nil {
		return nil, err
	}
	if err := writeBatch(ctx, tx, batchID, confirmations(rs, fresh, out, now), now); err != nil { // one row for the batch's
		return nil, err
	}
	if err := tx.Commit(); err != nil {
		return nil, translate("batch commit", err)
	}
	return out, nil
}

// payDeadline is a payment deadline: within seconds after now (zero when
// the SKU has no pay window).
func payDeadline(now time.Time, within int) time.Time {
	if within <= 0 {
		return time.Time{}
	}
	return utc(now).Add(time.Duration(within) * time.Second)
}

// insertBatch inserts the rows rs[fresh] of a batch, CONFIRMED, each
// naming the batch's outbox row and due by payBy (none when zero).
func insertBatch(ctx context.Context, tx *sql.Tx, rs []reservation.Reservation, fresh []int, now time.Time, batchID string, payBy time.Time) error {
	return inChunks(len(fresh), func(lo, hi int) error {
		args := make([]any, 0, (hi-lo)*11)
		for _, i := range fresh[lo:hi] {
			r := rs[i]
			args = append(args, r.ID, r.SKU, r.Qty, r.UserID, r.Bucket, nullString(r.Token), nullTime(r.ExpiresAt), utc(r.CreatedAt), utc(now), batchID, nullTime(payBy))
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO reservations
			(reservation_id, sku, qty, user_id, bucket, hold_token, status, expires_at, created_at, updated_at, event_batch, pay_by) VALUES `+
			strings.TrimSuffix(strings.Repeat(`(?, ?, ?, ?, ?, ?, 'CONFIRMED', ?, ?, ?, ?, ?),`, hi-lo), ","), args...)
		return err
	})
}

// intOr0 is v's int, or 0 when v is none.
func intOr0(v any) int {
	n, _ := v.(int)
	return n
}

// openPayWindows sets the payment deadline of the rows ids (a batch's
// confirmations) to payBy, or to none when the SKU has no pay window (zero).
func openPayWindows(ctx context.Context, tx *sql.Tx, payBy time.Time, ids []any) error {
	err := inChunks(len(ids), func(lo, hi int) error {
		_, err := tx.ExecContext(ctx, `UPDATE reservations SET pay_by = ? WHERE reservation_id IN (?`+strings.Repeat(",?", hi-lo-1)+`)`,
			append([]any{nullTime(payBy)}, ids[lo:hi]...)...)
		return err
	})
	if err != nil {
		return translate("batch pay window", err)
	}
	return nil
}

// confirmations are the ReservationConfirmed events of the batch's fresh
// reservations that were Applied.
func confirmations(rs []reservation.Reservation, fresh []int, out []reservation.BatchResult, now time.Time) []reservation.Event {
	evs := make([]reservation.Event, 0, len(fresh))
	for _, i := range fresh {
		if out[i].Result == reservation.Applied {
			evs = append(evs, reservation.ConfirmedEvent(out[i].Row, now))
		}
	}
	return evs
}

// joinGroup takes a slot of r's group inside the persist transaction. A
// FORMED group still admits the members whose slots Redis gave before the
// deadline and whose messages arrive late (members < capacity bounds them).
// The status assignment comes first so that it reads members before the
// increment. formed reports that the group is FORMED with r in it: its
// members' pay windows (within, when the SKU has one) open now, r's
// included (startPayWindows).
func joinGroup(ctx context.Context, tx *sql.Tx, r reservation.Reservation, now time.Time, within time.Duration) (result reservation.ApplyResult, formed bool, err error) {
	_, err = tx.ExecContext(ctx, `INSERT INTO group_members (group_id, user_id, reservation_id) VALUES (?, ?, ?)`,
		r.GroupID, r.UserID, r.ID)
	if isDuplicate(err) {
		return reservation.GroupDuplicate, false, nil
	}
	if err != nil {
		return 0, false, translate("apply join group", err)
	}
	var before string // FORMED already: this join is a late member (opens its own pay window only)
	if within > 0 {   // only a pay window needs to know: a SKU without one reads nothing more
		err = tx.QueryRowContext(ctx, `SELECT status FROM group_buys WHERE group_id = ? AND sku = ? FOR UPDATE`, r.GroupID, r.SKU).Scan(&before)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return 0, false, translate("apply lock group", err)
		}
	}
	res, err := tx.ExecContext(ctx, `UPDATE group_buys
		SET formed_at = IF(members + 1 >= capacity, COALESCE(formed_at, ?), formed_at),
			status = IF(members + 1 >= capacity, 'FORMED', status), members = members + 1, updated_at = ?
		WHERE group_id = ? AND sku = ? AND status IN ('OPEN', 'FORMED') AND members < capacity`, utc(now), utc(now), r.GroupID, r.SKU)
	if err != nil {
		return 0, false, translate("apply take slot", err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return 0, false, translate("apply take slot", err)
	} else if n == 1 {
		formed, err := formedByJoin(ctx, tx, r, now, within, before == string(reservation.GroupFormed))
		return reservation.Applied, formed, err
	}
	var status string
	err = tx.QueryRowContext(ctx, `SELECT status FROM group_buys WHERE group_id = ? AND sku = ?`, r.GroupID, r.SKU).Scan(&status)
	if errors.Is(err, sql.ErrNoRows) || (err == nil && status == string(reservation.GroupFailed)) {
		return reservation.GroupNotOpen, false, nil
	}
	if err != nil {
		return 0, false, translate("apply read group", err)
	}
	return reservation.GroupNoSlot, false, nil
}

// formedByJoin writes the group's GroupFormed when the join that just took
// a slot (joinGroup) took its last one: FORMED with every slot a member's.
// A group FormGroup recorded FORMED first has its event already; the write
// then leaves it as it is. formed reports that the group is FORMED (by this
// join, or before it: late, r is a late member): the pay windows open — the
// members' confirmed so far when this join formed it, r's alone when late
// (a member confirmed before keeps the window it was given, none included).
func formedByJoin(ctx context.Context, tx *sql.Tx, r reservation.Reservation, now time.Time, within time.Duration, late bool) (formed bool, err error) {
	g, err := scanGroup(tx.QueryRowContext(ctx, `SELECT `+groupColumns+` FROM group_buys WHERE group_id = ?`, r.GroupID))
	if err != nil {
		return false, translate("apply read group", err)
	}
	if g.Status != reservation.GroupFormed {
		return false, nil
	}
	if within > 0 { // r's own: its ReservationConfirmed carries it
		if _, err := tx.ExecContext(ctx, `UPDATE reservations SET pay_by = ? WHERE reservation_id = ?`, utc(now).Add(within), r.ID); err != nil {
			return false, translate("apply pay window", err)
		}
	}
	if late {
		return true, nil
	}
	opened, err := startPayWindows(ctx, tx, g.ID, now, within) // the members confirmed before it
	if err != nil {
		return false, err
	}
	if g.Members < g.Capacity {
		return true, nil
	}
	ev := reservation.GroupEvent(g, reservation.GroupFormed, now)
	if opened {
		ev = ev.WithPayBy(utc(now).Add(within))
	}
	return true, writeEvents(ctx, tx, []reservation.Event{ev})
}

// startPayWindows opens the pay windows of a FORMED group's CONFIRMED
// members that have none yet: due within after now (nothing when the SKU
// has no pay window). A join's window opens when its group forms (design.md,
// "Payment"), for a member never paid before its group is sure. opened
// reports whether any member's did: the GroupFormed then carries the
// deadline (theirs: their ReservationConfirmed had none).
func startPayWindows(ctx context.Context, tx *sql.Tx, group string, now time.Time, within time.Duration) (opened bool, err error) {
	if within <= 0 {
		return false, nil
	}
	res, err := tx.ExecContext(ctx, `UPDATE reservations SET pay_by = ? WHERE group_id = ? AND status = 'CONFIRMED' AND pay_by IS NULL`,
		utc(now).Add(within), group)
	if err != nil {
		return false, translate("open pay windows", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, translate("open pay windows", err)
	}
	return n > 0, nil
}
