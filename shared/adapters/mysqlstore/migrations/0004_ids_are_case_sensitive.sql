-- 0004: ids compare byte for byte, as Redis keys do. Under a case-insensitive
-- collation "SKU-1" and "sku-1" were one row in MySQL and two SKUs in Redis,
-- each warmed with the whole stock; "Ann" and "ann" one member in MySQL and
-- two in Redis. (No existing data can hold two such spellings: they collided.)
ALTER TABLE product_stock
  MODIFY sku VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL;
ALTER TABLE reservations
  MODIFY reservation_id VARCHAR(100) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  MODIFY sku VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  MODIFY user_id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  MODIFY group_id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
  MODIFY hold_token VARCHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL;
ALTER TABLE group_buys
  MODIFY group_id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  MODIFY sku VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL;
ALTER TABLE group_members
  MODIFY group_id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  MODIFY user_id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  MODIFY reservation_id VARCHAR(100) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL;
ALTER TABLE user_units
  MODIFY sku VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  MODIFY user_id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL;

-- A retried admin change is the same change: what it asked is kept, so a key
-- reused for a different change is refused instead of silently ignored.
ALTER TABLE stock_change_keys
  MODIFY sku VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  MODIFY change_key VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  ADD COLUMN set_to BIGINT NULL,
  ADD COLUMN add_by BIGINT NULL,
  ADD COLUMN limit_to INT NULL;
