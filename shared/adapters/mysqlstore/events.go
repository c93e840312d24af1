package mysqlstore

// The event outbox: every decision's event, written in the decision's transaction, published after it.
// Two tables: events, one row per outcome, and event_batches, one row per
// persist batch holding its ReservationConfirmed events (ApplyBatch).

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
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

// batchOf is the id of the event_batches row of a persist batch whose first
// inserted reservation is first, settled at now. The time is part of it: a
// row the batch refuses is deleted again, so its id may be first in a later
// batch too (its fence never ran), never at the same instant.
func batchOf(first string, now time.Time) string {
	return "confirmations/" + first + "/" + strconv.FormatInt(now.UnixNano(), 36)
}

// writeBatch inserts a persist batch's confirmations evs (none: nothing)
// as one event_batches row, id, inside the batch's transaction tx: one
// insert and one entry per index for the whole batch, where a row per
// event cost each of them (migration 0015).
func writeBatch(ctx context.Context, tx querier, id string, evs []reservation.Event, now time.Time) error {
	if len(evs) == 0 {
		return nil
	}
	payload, err := json.Marshal(evs)
	if err != nil {
		return fmt.Errorf("encode event batch %s: %w", id, err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO event_batches (batch_id, events, payload, occurred_at) VALUES (?, ?, ?, ?)`,
		id, len(evs), string(payload), utc(now)); err != nil {
		return translate("write event batch", err)
	}
	return nil
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

// eventBatch is an event_batches row: its events not out yet, in the order
// written, and the ids of those out (sent).
type eventBatch struct {
	seq    int64
	events []reservation.Event
	sent   map[string]bool
}

// batchColumns are what scanBatch reads.
const batchColumns = `seq, payload, sent`

func scanBatch(row interface{ Scan(...any) error }) (eventBatch, error) {
	var payload, sent []byte
	var seq int64
	if err := row.Scan(&seq, &payload, &sent); err != nil {
		return eventBatch{}, err
	}
	return decodeBatch(seq, payload, sent)
}

// decodeBatch is the batch seq of payload and sent (batchColumns).
func decodeBatch(seq int64, payload, sent []byte) (eventBatch, error) {
	b := eventBatch{seq: seq}
	if err := json.Unmarshal(payload, &b.events); err != nil {
		return b, fmt.Errorf("decode event batch: %w", err)
	}
	if sent == nil {
		return b, nil
	}
	var out []string
	if err := json.Unmarshal(sent, &out); err != nil {
		return b, fmt.Errorf("decode event batch: %w", err)
	}
	b.sent = make(map[string]bool, len(out))
	for _, id := range out {
		b.sent[id] = true
	}
	left := b.events[:0]
	for _, e := range b.events {
		if !b.sent[e.ID] {
			left = append(left, e)
		}
	}
	b.events = left
	return b, nil
}

// EventsOf implements reservation.Ledger: a reservation's confirmation its
// batch still owes (found through the row's event_batch, by primary key),
// then the index (aggregate_id, version).
func (s *Store) EventsOf(ctx context.Context, aggregates []string) ([]reservation.Event, error) {
	ids := make([]any, 0, len(aggregates))
	for _, id := range aggregates {
		if id != "" {
			ids = append(ids, id)
		}
	}
	out, err := s.owed(ctx, ids, nil)
	if err != nil {
		return nil, err
	}
	err = inChunks(len(ids), func(lo, hi int) error {
		evs, err := queryAll(ctx, s.db, "events of", scanEvent, `SELECT payload FROM events
			WHERE aggregate_id IN (?`+strings.Repeat(",?", hi-lo-1)+`) AND published_at IS NULL ORDER BY seq`, ids[lo:hi]...)
		out = append(out, evs...)
		return err
	})
	return out, err // an aggregate's events are all in one chunk, in order
}

// owed returns the confirmations of the reservations ids that an
// unpublished event_batches row still holds (but the batches of skip,
// read already): a confirmation is its reservation's first event, so it
// goes out before any other of that reservation's.
func (s *Store) owed(ctx context.Context, ids []any, skip map[int64]bool) ([]reservation.Event, error) {
	named := make(map[string]bool, len(ids))
	for _, id := range ids {
		named[id.(string)] = true
	}
	done := make(map[int64]bool, len(skip)) // skip, and the batches listed so far
	for seq := range skip {
		done[seq] = true
	}
	var out []reservation.Event
	err := inChunks(len(ids), func(lo, hi int) error {
		batches, err := queryAll(ctx, s.db, "events owed by batches", scanBatch, `SELECT `+batchColumns+` FROM event_batches
			WHERE published_at IS NULL AND batch_id IN (SELECT event_batch FROM reservations
				WHERE reservation_id IN (?`+strings.Repeat(",?", hi-lo-1)+`) AND event_batch IS NOT NULL) ORDER BY seq`, ids[lo:hi]...)
		for _, b := range batches {
			if done[b.seq] {
				continue
			}
			done[b.seq] = true // a batch two chunks both name goes out once
			for _, e := range b.events {
				if named[e.AggregateID] {
					out = append(out, e)
				}
			}
		}
		return err
	})
	return out, err
}

// Unpublished implements reservation.Ledger: the unpublished batches and
// events rows merged oldest first (by occurred_at; each table's own in seq
// order), each batch whole (its events are marked published together)
// and counted by the events it still owes, until limit events are taken.
// Each reservation's confirmation a batch not taken still owes comes first
// (a batch's clock may run ahead of a later decision's).
func (s *Store) Unpublished(ctx context.Context, t time.Time, limit int) ([]reservation.Event, error) {
	// The batches' sizes first, then the payloads of those taken: a batch
	// is hundreds of events, so one or two fill a drain.
	type size struct {
		seq  int64
		at   time.Time
		owes int
	}
	sizes, err := queryAll(ctx, s.db, "unpublished event batches", func(row interface{ Scan(...any) error }) (size, error) {
		var v size
		err := row.Scan(&v.seq, &v.at, &v.owes)
		return v, err
	}, `SELECT seq, occurred_at, events - COALESCE(JSON_LENGTH(sent), 0) FROM event_batches
		WHERE published_at IS NULL AND occurred_at < ? ORDER BY seq LIMIT ?`, utc(t), limit)
	if err != nil {
		return nil, err
	}
	evs, err := queryAll(ctx, s.db, "unpublished events", scanEvent, `SELECT payload FROM events
		WHERE published_at IS NULL AND occurred_at < ? ORDER BY seq LIMIT ?`, utc(t), limit)
	if err != nil {
		return nil, err
	}
	// The merge: a batch (b >= 0) or an events row (e >= 0) at each place.
	type place struct{ b, e int }
	var order []place
	var seqs []any
	for i, j, n := 0, 0, 0; n < limit && (i < len(sizes) || j < len(evs)); {
		if j == len(evs) || i < len(sizes) && !evs[j].OccurredAt.Before(sizes[i].at) {
			order = append(order, place{b: i, e: -1})
			seqs = append(seqs, sizes[i].seq)
			n += max(1, sizes[i].owes)
			i++
			continue
		}
		order = append(order, place{b: -1, e: j})
		n++
		j++
	}
	batches := map[int64]eventBatch{}
	if len(seqs) > 0 {
		rows, err := queryAll(ctx, s.db, "unpublished event batches", scanBatch, `SELECT `+batchColumns+` FROM event_batches
			WHERE seq IN (?`+strings.Repeat(",?", len(seqs)-1)+`) AND published_at IS NULL`, seqs...)
		if err != nil {
			return nil, err
		}
		for _, b := range rows {
			batches[b.seq] = b
		}
	}
	read := map[int64]bool{}
	holder := map[string]int64{} // a taken batch's reservations → its seq
	for _, p := range order {
		if p.b >= 0 {
			for _, e := range batches[sizes[p.b].seq].events {
				holder[e.AggregateID] = sizes[p.b].seq
			}
		}
	}
	var ids []any
	var out []reservation.Event
	for _, p := range order {
		if p.b >= 0 {
			seq := sizes[p.b].seq
			if !read[seq] {
				read[seq] = true
				out = append(out, batches[seq].events...)
			}
			continue
		}
		e := evs[p.e]
		if seq, ok := holder[e.AggregateID]; ok && !read[seq] {
			read[seq] = true // the batch owes e's first event: it goes first, whole
			out = append(out, batches[seq].events...)
		}
		out = append(out, e)
		if e.ReservationID != "" {
			ids = append(ids, e.AggregateID)
		}
	}
	owed, err := s.owed(ctx, ids, read)
	if err != nil {
		return nil, err
	}
	return append(owed, out...), nil
}

// MarkPublished implements reservation.Ledger. A batch's confirmation is
// found by its row's event_batch (primary key reads). A batch all of whose
// events went out is marked published in one update (events is how many
// it was written with); one partly out records which (markPartly).
func (s *Store) MarkPublished(ctx context.Context, evs []reservation.Event, at time.Time) error {
	var confirmed []any
	unique := make(map[string]reservation.Event, len(evs))
	for _, e := range evs {
		if _, ok := unique[e.ID]; ok {
			continue
		}
		unique[e.ID] = e
		if e.Type == reservation.EventConfirmed {
			confirmed = append(confirmed, e.AggregateID)
		}
	}
	inBatch := map[string]string{} // reservation id → its batch
	err := inChunks(len(confirmed), func(lo, hi int) error {
		type rb struct{ id, batch string }
		rows, err := queryAll(ctx, s.db, "mark published", func(row interface{ Scan(...any) error }) (rb, error) {
			var v rb
			err := row.Scan(&v.id, &v.batch)
			return v, err
		}, `SELECT reservation_id, event_batch FROM reservations
			WHERE reservation_id IN (?`+strings.Repeat(",?", hi-lo-1)+`) AND event_batch IS NOT NULL`, confirmed[lo:hi]...)
		for _, v := range rows {
			inBatch[v.id] = v.batch
		}
		return err
	})
	if err != nil {
		return err
	}
	sent := map[string]map[string]bool{} // batch → the ids of its events among evs
	ids := make([]string, 0, len(unique))
	for id, e := range unique {
		if b, ok := inBatch[e.AggregateID]; ok && e.Type == reservation.EventConfirmed {
			if sent[b] == nil {
				sent[b] = map[string]bool{}
			}
			sent[b][id] = true
			continue
		}
		ids = append(ids, id)
	}
	for b, out := range sent {
		if err := retryDeadlocks(ctx, func() error { return s.markBatch(ctx, b, out, at) }); err != nil {
			return err
		}
	}
	sort.Strings(ids)
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

// markBatch records the events out (ids) of batch b. Every event the batch
// was written with: published in one update, whatever a partial mark
// recorded before; fewer: markPartly.
func (s *Store) markBatch(ctx context.Context, b string, out map[string]bool, at time.Time) error {
	res, err := s.db.ExecContext(ctx, `UPDATE event_batches SET published_at = ?
		WHERE batch_id = ? AND events <= ? AND published_at IS NULL`, utc(at), b, len(out))
	if err != nil {
		return translate("mark batch published", err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return translate("mark batch published", err)
	} else if n == 1 {
		return nil
	}
	return s.markPartly(ctx, b, out, at)
}

// markPartly records the events out (ids) of the unpublished batch b as
// sent: the batch is published once none of its events is left. The row's
// lock orders it with every other mark of b (the batch's own publish, a
// later decision's, the sweeper's drain), so none undoes another's. The
// payload stays whole: the record of what was decided.
func (s *Store) markPartly(ctx context.Context, b string, out map[string]bool, at time.Time) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return translate("mark batch partly begin", err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	// Locked through batch_id alone, as markBatch's update is (one lock
	// order); a deadlock all the same is retried (markBatch's caller).
	type locked struct {
		batch     eventBatch
		published bool
	}
	batches, err := queryAll(ctx, tx, "mark batch partly", func(row interface{ Scan(...any) error }) (locked, error) {
		var payload, sent []byte
		var l locked
		if err := row.Scan(&l.batch.seq, &payload, &sent, &l.published); err != nil {
			return l, err
		}
		l.batch, err = decodeBatch(l.batch.seq, payload, sent)
		return l, err
	}, `SELECT `+batchColumns+`, published_at IS NOT NULL FROM event_batches WHERE batch_id = ? FOR UPDATE`, b)
	if err != nil || len(batches) == 0 || batches[0].published {
		return err // published already: nothing to do
	}
	sent := make([]string, 0, len(batches[0].batch.sent)+len(out))
	for id := range batches[0].batch.sent {
		sent = append(sent, id)
	}
	left := false
	for _, e := range batches[0].batch.events {
		if out[e.ID] {
			sent = append(sent, e.ID)
		} else {
			left = true
		}
	}
	if !left {
		_, err = tx.ExecContext(ctx, `UPDATE event_batches SET published_at = ? WHERE seq = ?`, utc(at), batches[0].batch.seq)
	} else {
		sort.Strings(sent)
		var list []byte
		if list, err = json.Marshal(sent); err != nil {
			return fmt.Errorf("encode event batch %s: %w", b, err)
		}
		_, err = tx.ExecContext(ctx, `UPDATE event_batches SET sent = ? WHERE seq = ?`, string(list), batches[0].batch.seq)
	}
	if err != nil {
		return translate("mark batch partly", err)
	}
	if err := tx.Commit(); err != nil {
		return translate("mark batch partly commit", err)
	}
	return nil
}

// OldestUnpublished implements reservation.Ledger: the first unpublished
// event written and the first unpublished batch (one index entry each).
func (s *Store) OldestUnpublished(ctx context.Context) (time.Time, bool, error) {
	var oldest time.Time
	found := false
	for _, q := range []string{
		`SELECT occurred_at FROM events WHERE published_at IS NULL ORDER BY seq LIMIT 1`,
		`SELECT occurred_at FROM event_batches WHERE published_at IS NULL ORDER BY seq LIMIT 1`,
	} {
		rows, err := queryAll(ctx, s.db, "oldest unpublished event", func(row interface{ Scan(...any) error }) (time.Time, error) {
			var t time.Time
			err := row.Scan(&t)
			return t, err
		}, q)
		if err != nil {
			return time.Time{}, false, err
		}
		if len(rows) > 0 && (!found || rows[0].Before(oldest)) {
			oldest, found = rows[0], true
		}
	}
	return oldest, found, nil
}
