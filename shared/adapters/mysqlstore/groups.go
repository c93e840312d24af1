package mysqlstore

// Group-buys: created, read, formed, failed, settled.

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"time"

	"github.com/holdfast/holdfast/shared/reservation"
)

// CreateGroup implements reservation.Ledger.
func (s *Store) CreateGroup(ctx context.Context, g reservation.Group) error {
	res, err := s.db.ExecContext(ctx, `INSERT INTO group_buys (group_id, sku, capacity, members, status, deadline, created_at, updated_at)
		SELECT ?, sku, ?, 0, 'OPEN', ?, ?, ? FROM product_stock WHERE sku = ?`,
		g.ID, g.Capacity, utc(g.Deadline), utc(g.CreatedAt), utc(g.CreatedAt), g.SKU)
	if err != nil {
		return translate("create group", err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return translate("create group", err)
	} else if n == 0 {
		return reservation.ErrUnknownSKU
	}
	return nil
}

const groupColumns = `group_id, sku, capacity, members, status, deadline, formed_at, created_at`

func scanGroup(row interface{ Scan(...any) error }) (reservation.Group, error) {
	var g reservation.Group
	var status string
	var formed sql.NullTime
	err := row.Scan(&g.ID, &g.SKU, &g.Capacity, &g.Members, &status, &g.Deadline, &formed, &g.CreatedAt)
	g.Status, g.FormedAt = reservation.GroupStatus(status), formed.Time
	return g, err
}

// Group implements reservation.Ledger.
func (s *Store) Group(ctx context.Context, id string) (reservation.Group, error) {
	g, err := scanGroup(s.db.QueryRowContext(ctx, `SELECT `+groupColumns+` FROM group_buys WHERE group_id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return g, reservation.ErrUnknownGroup
	}
	if err != nil {
		return g, translate("read group", err)
	}
	return g, nil
}

// DueGroups implements reservation.Ledger: keyset pages over the index
// (status, deadline), whose entries end in the primary key.
func (s *Store) DueGroups(ctx context.Context, t time.Time, after reservation.Group, limit int) ([]reservation.Group, error) {
	if after.ID == "" {
		return queryAll(ctx, s.db, "due groups", scanGroup, `SELECT `+groupColumns+` FROM group_buys
			WHERE status = 'OPEN' AND deadline <= ? ORDER BY deadline, group_id LIMIT ?`, utc(t), limit)
	}
	return queryAll(ctx, s.db, "due groups", scanGroup, `SELECT `+groupColumns+` FROM group_buys
		WHERE status = 'OPEN' AND deadline <= ? AND (deadline > ? OR (deadline = ? AND group_id > ?))
		ORDER BY deadline, group_id LIMIT ?`, utc(t), utc(after.Deadline), utc(after.Deadline), after.ID, limit)
}

// UnsettledGroups implements reservation.Ledger.
// FORMED groups and FAILED ones are listed apart, each over its end of the
// index (status, settled_at), so that FAILED groups whose settling keeps
// failing cannot crowd FORMED ones out of Redis's news (nor the reverse).
func (s *Store) UnsettledGroups(ctx context.Context, limit int) ([]reservation.Group, error) {
	formed, err := queryAll(ctx, s.db, "unsettled groups", scanGroup, `SELECT `+groupColumns+` FROM group_buys
		WHERE status = 'FORMED' AND settled_at IS NULL LIMIT ?`, max(1, limit/2))
	if err != nil {
		return nil, err
	}
	failed, err := queryAll(ctx, s.db, "unsettled groups", scanGroup, `SELECT `+groupColumns+` FROM group_buys
		WHERE status = 'FAILED' AND settled_at IS NULL LIMIT ?`, max(1, limit-len(formed)))
	if err != nil {
		return nil, err
	}
	return append(formed, failed...), nil
}

// FormGroup implements reservation.Ledger: the transition and its
// GroupFormed in one transaction.
// The pay windows of the members confirmed so far open with it
// (startPayWindows), from now: the GroupFormed carries their deadline.
func (s *Store) FormGroup(ctx context.Context, id string, formedAt, now time.Time) (bool, error) {
	err := retryDeadlocks(ctx, func() error {
		return s.endGroup(ctx, "form group", id, reservation.GroupFormed, formedAt, now, `UPDATE group_buys g SET status = 'FORMED', formed_at = ?, updated_at = ?
		WHERE group_id = ? AND status = 'OPEN' AND NOT EXISTS (SELECT 1 FROM reservations r
			WHERE r.group_id = g.group_id AND r.status = 'CANCELLED' AND r.released = 0)`,
			utc(formedAt), utc(formedAt), id)
	})
	if err != nil {
		return false, err
	}
	var status string
	err = s.db.QueryRowContext(ctx, `SELECT status FROM group_buys WHERE group_id = ?`, id).Scan(&status)
	if errors.Is(err, sql.ErrNoRows) {
		return false, reservation.ErrUnknownGroup
	}
	if err != nil {
		return false, translate("form group read", err)
	}
	return status == string(reservation.GroupFormed), nil
}

// endGroup runs update, the transition of group id to status, and writes
// the group's event with it when the group moved. A FORMED one's members
// confirmed so far get their pay windows from now.
func (s *Store) endGroup(ctx context.Context, op, id string, status reservation.GroupStatus, at, now time.Time, update string, args ...any) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return translate(op+" begin", err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	res, err := tx.ExecContext(ctx, update, args...)
	if err != nil {
		return translate(op, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return translate(op, err)
	} else if n == 1 {
		g, err := scanGroup(tx.QueryRowContext(ctx, `SELECT `+groupColumns+` FROM group_buys WHERE group_id = ?`, id))
		if err != nil {
			return translate(op+" read", err)
		}
		ev := reservation.GroupEvent(g, status, at)
		if status == reservation.GroupFormed {
			var within int
			if err := tx.QueryRowContext(ctx, `SELECT pay_within_seconds FROM product_stock WHERE sku = ?`, g.SKU).Scan(&within); err != nil {
				return translate(op+" read pay window", err)
			}
			if within > 0 {
				d := time.Duration(within) * time.Second
				opened, err := startPayWindows(ctx, tx, id, now, d)
				if err != nil {
					return err
				}
				if opened {
					ev = ev.WithPayBy(utc(now).Add(d))
				}
			}
		}
		if err := writeEvents(ctx, tx, []reservation.Event{ev}); err != nil {
			return err
		}
	}
	if err := tx.Commit(); err != nil {
		return translate(op+" commit", err)
	}
	return nil
}

// FailGroup implements reservation.Ledger: the transition and its
// GroupFailed in one transaction.
func (s *Store) FailGroup(ctx context.Context, id string, now time.Time) (reservation.Group, error) {
	if err := s.endGroup(ctx, "fail group", id, reservation.GroupFailed, now, now, `UPDATE group_buys SET status = 'FAILED', updated_at = ?
		WHERE group_id = ? AND status = 'OPEN' AND deadline <= ?`, utc(now), id, utc(now)); err != nil {
		return reservation.Group{}, err
	}
	return s.Group(ctx, id)
}

// FailEmptyGroups implements reservation.Ledger: per inChunks-sized run of
// ids, one transaction locks the groups it ends, ends them in one statement
// and writes their GroupFailed events in another.
func (s *Store) FailEmptyGroups(ctx context.Context, ids []string, now time.Time) (int, error) {
	total := 0
	err := inChunks(len(ids), func(lo, hi int) error {
		n, err := s.failEmptyGroups(ctx, ids[lo:hi], now)
		total += n
		return err
	})
	return total, err
}

func (s *Store) failEmptyGroups(ctx context.Context, ids []string, now time.Time) (int, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, translate("fail empty groups begin", err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	args := make([]any, 0, len(ids)+1)
	for _, id := range ids {
		args = append(args, id)
	}
	args = append(args, utc(now))
	ending, err := queryAll(ctx, tx, "fail empty groups", scanGroup, `SELECT `+groupColumns+` FROM group_buys
		WHERE group_id IN (?`+strings.Repeat(",?", len(ids)-1)+`) AND status = 'OPEN' AND members = 0 AND deadline <= ? FOR UPDATE`, args...)
	if err != nil || len(ending) == 0 {
		return 0, err
	}
	ended := make([]any, 0, len(ending)+2)
	ended = append(ended, utc(now), utc(now))
	evs := make([]reservation.Event, len(ending))
	for i, g := range ending {
		ended = append(ended, g.ID)
		evs[i] = reservation.GroupEvent(g, reservation.GroupFailed, now)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE group_buys SET status = 'FAILED', settled_at = ?, updated_at = ?
		WHERE group_id IN (?`+strings.Repeat(",?", len(ending)-1)+`)`, ended...); err != nil {
		return 0, translate("fail empty groups", err)
	}
	if err := writeEvents(ctx, tx, evs); err != nil {
		return 0, err
	}
	if err := tx.Commit(); err != nil {
		return 0, translate("fail empty groups commit", err)
	}
	return len(ending), nil
}

// GroupSettled implements reservation.Ledger.
func (s *Store) GroupSettled(ctx context.Context, id string) error {
	if _, err := s.db.ExecContext(ctx, `UPDATE group_buys SET settled_at = CURRENT_TIMESTAMP(3)
		WHERE group_id = ? AND status IN ('FORMED', 'FAILED') AND settled_at IS NULL`, id); err != nil {
		return translate("settle group", err)
	}
	return nil
}
