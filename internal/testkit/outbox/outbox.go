// Package outbox reads MySQL's event outbox as one table, for tests and
// checks: every event written, one row each, whichever table holds it
// (events, or a persist batch's row in event_batches: migration 0015).
package outbox

// Table is a derived table of every event of the outbox, one row each:
// event_id, aggregate_id, version, type, sku, payload (the event's JSON)
// and published (1 once it went out). Use it as a table: FROM `+Table+`.
const Table = `(SELECT event_id, aggregate_id, version, type, JSON_UNQUOTE(JSON_EXTRACT(payload, '$.sku')) AS sku, payload,
		published_at IS NOT NULL AS published
	FROM events
	UNION ALL
	SELECT j.event_id, j.aggregate_id, j.version, j.type, j.sku, JSON_EXTRACT(b.payload, CONCAT('$[', j.n - 1, ']')),
		b.published_at IS NOT NULL OR COALESCE(JSON_CONTAINS(b.sent, JSON_QUOTE(j.event_id)), 0)
	FROM event_batches b, JSON_TABLE(b.payload, '$[*]' COLUMNS (
		n FOR ORDINALITY,
		event_id VARCHAR(128) PATH '$.event_id',
		aggregate_id VARCHAR(100) PATH '$.aggregate_id',
		version INT PATH '$.version',
		type VARCHAR(32) PATH '$.type',
		sku VARCHAR(64) PATH '$.sku')) AS j) AS outbox`
