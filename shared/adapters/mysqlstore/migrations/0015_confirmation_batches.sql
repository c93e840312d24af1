-- 0015: a persist batch's confirmations are one outbox row (docs/design.md,
-- "The event outbox"). Until now each confirmation was its own events row:
-- three index entries at its insert and two more when it was marked
-- published, about half of what MySQL spent on an order of a hot SKU.
-- event_batches holds the ReservationConfirmed events ApplyBatch commits,
-- a JSON array (payload; events: how many), published_at set once every
-- one went out (sent: the ids out so far of a batch partly out, else
-- NULL); events keeps every other outcome, one row each. batch_id is derived from the batch's first
-- reservation inserted and its time (a refused row is deleted again, so
-- its id may come first in a later batch); each row the
-- batch confirmed names it in event_batch (no index: it is read by the
-- row's primary key), so a later event of that reservation finds, and goes
-- out after, the confirmation its batch still owes.
-- Across the deploy: the code of the release before neither writes nor
-- reads either; the new column has no default work (an instant ADD COLUMN
-- in MySQL 8 and MariaDB) and its inserts do not name it.
CREATE TABLE event_batches (
  seq          BIGINT       NOT NULL AUTO_INCREMENT,
  batch_id     VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  events       INT          NOT NULL,
  payload      JSON         NOT NULL,
  sent         JSON         NULL,
  occurred_at  DATETIME(3)  NOT NULL,
  published_at DATETIME(3)  NULL,
  PRIMARY KEY (seq),
  UNIQUE KEY event_batches_id (batch_id),
  KEY event_batches_unpublished (published_at, seq)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

ALTER TABLE reservations ADD COLUMN event_batch VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL;
