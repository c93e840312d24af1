-- 0011: the last audit of each SKU's books (docs/design.md, "The ledger
-- audit"). The sweeper audits every live SKU: stock put in (admin_delta) =
-- available + taken (the buyers' CONFIRMED rows), and the Redis drift it
-- measured. One row per SKU, overwritten by each audit.
CREATE TABLE stock_audits (
  sku        VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  audited_at DATETIME(3) NOT NULL,
  put_in     BIGINT      NOT NULL,
  available  BIGINT      NOT NULL,
  taken      BIGINT      NOT NULL,
  mismatch   BIGINT      NOT NULL,
  drift      BIGINT      NOT NULL,
  PRIMARY KEY (sku)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
