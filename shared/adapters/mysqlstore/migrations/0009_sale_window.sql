-- 0009: a SKU's sale window (docs/design.md, "The sale window"). NULL: no such
-- bound (no window by default). Redis carries it in every bucket's meta, and
-- reserve.lua judges it by Redis's clock; MySQL keeps it for the warm-up.
-- The index serves the sweeper's list of SKUs about to open, which it warms.
ALTER TABLE product_stock
  ADD COLUMN opens_at DATETIME(3) NULL AFTER buckets,
  ADD COLUMN closes_at DATETIME(3) NULL AFTER opens_at,
  ADD KEY product_stock_opening (opens_at);

-- A retried admin change with another window is another change: unix
-- milliseconds, 0 for a bound the change cleared, NULL for one it left alone.
ALTER TABLE stock_change_keys
  ADD COLUMN opens_to BIGINT NULL AFTER buckets_to,
  ADD COLUMN closes_to BIGINT NULL AFTER opens_to;
