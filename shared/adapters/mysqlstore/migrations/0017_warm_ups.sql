-- 0017: product_stock.warm_ups counts the warm-ups of each SKU's Redis
-- buckets (docs/design.md, "A bucket that holds every id"). Every warm-up
-- counts itself before it loads a bucket; the warm-up of the change that
-- created a SKU may make a bucket that holds every reservation of it only
-- if, after it loaded the bucket, it is the SKU's first. A column added at
-- the end of the row with a default is instant in MySQL 8 and MariaDB: no
-- copy of the table, writes go on. Across the deploy: the code of the
-- release before neither reads nor writes it; its warm-ups are not counted,
-- which docs/design.md says what it means for a SKU created in that window.
ALTER TABLE product_stock ADD COLUMN warm_ups BIGINT NOT NULL DEFAULT 0;
