-- 0010: every outcome is an event, written in the decision's transaction
-- (docs/design.md, "The event outbox"). One row per event, as published:
-- event_id is derived from the aggregate (a reservation or a group) and its
-- version, so a redelivery or a re-publish carries the same id. seq orders
-- the outbox: an aggregate's later event is always written after its earlier
-- one committed. published_at NULL: not published yet; the deciding path
-- publishes after its commit, the sweeper drains what is left, oldest first.
CREATE TABLE events (
  seq          BIGINT       NOT NULL AUTO_INCREMENT,
  event_id     VARCHAR(96)  NOT NULL,
  aggregate_id VARCHAR(64)  NOT NULL,
  version      INT          NOT NULL,
  type         VARCHAR(32)  NOT NULL,
  payload      JSON         NOT NULL,
  occurred_at  DATETIME(3)  NOT NULL,
  published_at DATETIME(3)  NULL,
  PRIMARY KEY (seq),
  UNIQUE KEY events_id (event_id),
  KEY events_aggregate (aggregate_id, version),
  KEY events_unpublished (published_at, seq)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

-- The row's notified flag was the cancellations' outbox until now: the
-- cancellations it still owes move to the table, in the shape the code
-- writes (reservation.CancelledEvent), and the flag is no longer read.
-- Resumable: a second run finds the event ids and inserts nothing.
INSERT INTO events (event_id, aggregate_id, version, type, payload, occurred_at)
  SELECT CONCAT('reservation/', reservation_id, '/', IF(refunded = 1, 2, 1)), reservation_id, IF(refunded = 1, 2, 1),
    'ReservationCancelled',
    JSON_MERGE_PATCH(JSON_OBJECT('event_id', CONCAT('reservation/', reservation_id, '/', IF(refunded = 1, 2, 1)),
      'type', 'ReservationCancelled', 'aggregate_id', reservation_id, 'version', IF(refunded = 1, 2, 1),
      'occurred_at', DATE_FORMAT(updated_at, '%Y-%m-%dT%H:%i:%s.%fZ'),
      'reservation_id', reservation_id, 'sku', sku, 'qty', qty, 'user_id', user_id, 'reason', reason),
      IF(group_id IS NULL, '{}', JSON_OBJECT('group_id', group_id)),
      IF(refunded = 1, JSON_OBJECT('refunded', TRUE), '{}')),
    updated_at
  FROM reservations
  WHERE notified = 0 AND status = 'CANCELLED' AND into_bucket IS NULL
  ON DUPLICATE KEY UPDATE event_id = events.event_id;
UPDATE reservations SET notified = 1 WHERE notified = 0;
