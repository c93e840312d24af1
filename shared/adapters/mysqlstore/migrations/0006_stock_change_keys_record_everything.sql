-- 0006: an admin change's Idempotency-Key records every field of the change,
-- so the same key with another rate, burst or precondition is refused (422),
-- not answered as if applied. if_version is the version the change was based
-- on (-1 for If-Match: *).
ALTER TABLE stock_change_keys
  ADD COLUMN rate_to INT NULL AFTER limit_to,
  ADD COLUMN burst_to INT NULL AFTER rate_to,
  ADD COLUMN if_version BIGINT NULL AFTER burst_to;
