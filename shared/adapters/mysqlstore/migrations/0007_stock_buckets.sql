-- 0007: one SKU's stock over K Redis buckets (docs/design.md, "One SKU over K buckets").
-- buckets: K. Redis keeps each bucket under its own hash tag, so a cluster can
-- spread one hot SKU over K shards.
ALTER TABLE product_stock
  ADD COLUMN buckets INT NOT NULL DEFAULT 1 AFTER user_burst;

-- Each bucket's share of available, for buckets 1..K-1 (bucket 0 has the rest),
-- so a bucket Redis lost is warmed alone. Sales and refunds move the share of
-- their bucket; transfers move units between shares; admin changes land in
-- bucket 0. A share may go below zero for a while (a bucket that owes units an
-- admin removed or a stray took): MySQL's available is what never oversells.
CREATE TABLE stock_buckets (
  sku       VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  bucket    SMALLINT    NOT NULL,
  available BIGINT      NOT NULL,
  PRIMARY KEY (sku, bucket)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

-- bucket: the bucket the decided hold was in. into_bucket: set on a transfer's
-- row (no user, no event): the bucket its units went to; released = 0 on a
-- CONFIRMED transfer until Redis credited that bucket.
ALTER TABLE reservations
  ADD COLUMN bucket SMALLINT NOT NULL DEFAULT 0 AFTER group_id,
  ADD COLUMN into_bucket SMALLINT NULL AFTER bucket;

-- A retried admin change with another K is another change.
ALTER TABLE stock_change_keys
  ADD COLUMN buckets_to INT NULL AFTER if_version;
