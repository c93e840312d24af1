package mysqlstore

// The event outbox: every decision's event, written in the decision's transaction, published after it.

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/holdfast/holdfast/shared/reservation"
)

// writeEvents inserts evs into the outbox inside the decision's transaction
// tx, rowsPerStatement rows a statement (a persist batch's confirmations in
// one). An event whose id is there already (the same transition written by
// another path first: a group's formation) is left as it is.
func writeEvents(ctx context.Context, tx querier, evs []reservation.Event) error {
	err := inChunks(len(evs), func(lo, hi int) error {
		args := make([]any, 0, 6*(hi-lo))
		for _, e := range evs[lo:hi] {
			payload, err := json.Marshal(e)
			if err != nil {
				return fmt.Errorf("encode event %s: %w", e.ID, err)
			}
			args = append(args, e.ID, e.AggregateID, e.Version, string(e.Type), string(payload), utc(e.OccurredAt))
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO events (event_id, aggregate_id, version, type, payload, occurred_at) VALUES `+
			strings.TrimSuffix(strings.Repeat(`(?, ?, ?, ?, ?, ?),`, hi-lo), ",")+
			` ON DUPLICATE KEY UPDATE event_id = event_id`, args...)
		if err != nil {
			return translate("write events", err)
		}
		return nil
	})
	return err
}

func scanEvent(row interface{ Scan(...any) error }) (reservation.Event, error) {
	var payload []byte
	var e reservation.Event
	if err := row.Scan(&payload); err != nil {
		return e, err
	}
	if err := json.Unmarshal(payload, &e); err != nil {
		return e, fmt.Errorf("decode event: %w", err)
	}
	return e, nil
}

// EventsOf implements reservation.Ledger: the index (aggregate_id, version).
func (s *Store) EventsOf(ctx context.Context, aggregates []string) ([]reservation.Event, error) {
	ids := make([]any, 0, len(aggregates))
	for _, id := range aggregates {
		if id != "" {
			ids = append(ids, id)
		}
	}
	var out []reservation.Event
	err := inChunks(len(ids), func(lo, hi int) error {
		evs, err := queryAll(ctx, s.db, "events of", scanEvent, `SELECT payload FROM events
			WHERE aggregate_id IN (?`+strings.Repeat(",?", hi-lo-1)+`) AND published_at IS NULL ORDER BY seq`, ids[lo:hi]...)
		out = append(out, evs...)
		return err
	})
	return out, err // an aggregate's events are all in one chunk, in order
}

// Unpublished implements reservation.Ledger: the index (published_at, seq)
// read in order from its NULL end.
func (s *Store) Unpublished(ctx context.Context, t time.Time, limit int) ([]reservation.Event, error) {
	return queryAll(ctx, s.db, "unpublished events", scanEvent, `SELECT payload FROM events
		WHERE published_at IS NULL AND occurred_at < ? ORDER BY seq LIMIT ?`, utc(t), limit)
}

// MarkPublished implements reservation.Ledger.
func (s *Store) MarkPublished(ctx context.Context, ids []string, at time.Time) error {
	return inChunks(len(ids), func(lo, hi int) error {
		args := make([]any, 0, hi-lo+1)
		args = append(args, utc(at))
		for _, id := range ids[lo:hi] {
			args = append(args, id)
		}
		if _, err := s.db.ExecContext(ctx, `UPDATE events SET published_at = ?
			WHERE event_id IN (?`+strings.Repeat(",?", hi-lo-1)+`) AND published_at IS NULL`, args...); err != nil {
			return translate("mark published", err)
		}
		return nil
	})
}

// OldestUnpublished implements reservation.Ledger: the first unpublished
// event written (one index entry).
func (s *Store) OldestUnpublished(ctx context.Context) (time.Time, bool, error) {
	rows, err := queryAll(ctx, s.db, "oldest unpublished event", func(row interface{ Scan(...any) error }) (time.Time, error) {
		var t time.Time
		err := row.Scan(&t)
		return t, err
	}, `SELECT occurred_at FROM events WHERE published_at IS NULL ORDER BY seq LIMIT 1`)
	if err != nil || len(rows) == 0 {
		return time.Time{}, false, err
	}
	return rows[0], true, nil
}
