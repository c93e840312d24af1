-- 0014: every confirmed row stops paying for an index nothing reads
-- (docs/design.md, "MySQL"). reservations_outbox (notified, updated_at) was
-- the cancellations' outbox until 0010 moved it to the events table; since
-- then no statement reads notified, yet each inserted row (a sale's
-- confirmations, hundreds per persist batch) still added an entry to it.
-- The column stays: the code of the release before writes it. No query
-- names the index, so that code runs unchanged on this schema.
ALTER TABLE reservations DROP KEY reservations_outbox;
