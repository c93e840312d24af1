-- 0003: MySQL decides every unit that moves, in both stores (docs/design.md).

-- hold_token: the Redis incarnation of the hold this row decided; a hold of
-- another token under the same id is a stray that MySQL never took.
-- released = 0 on a CANCELLED row: Redis has not yet followed this
-- cancellation (its give-back is owed); the release outbox the sweeper drains.
-- refund_version: product_stock.version right after this row's refund; a
-- warm-up from a level at or past it already counts the refunded units.
ALTER TABLE reservations
  ADD COLUMN hold_token VARCHAR(32) NULL AFTER group_id,
  ADD COLUMN released TINYINT(1) NOT NULL DEFAULT 1 AFTER refunded,
  ADD COLUMN refund_version BIGINT NULL AFTER released,
  ADD KEY reservations_release_outbox (released, updated_at);

-- admin_delta: the sum of every admin change ever made to the SKU. Redis
-- records the figure it applied and moves by the difference, so each change
-- reaches Redis exactly once, whatever order the updates arrive in.
ALTER TABLE product_stock
  ADD COLUMN admin_delta BIGINT NOT NULL DEFAULT 0 AFTER per_user_limit;

-- A retried admin change (the same Idempotency-Key) is applied once.
CREATE TABLE stock_change_keys (
  sku        VARCHAR(64)  NOT NULL,
  change_key VARCHAR(128) NOT NULL,
  created_at DATETIME(3)  NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  PRIMARY KEY (sku, change_key)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

-- Units each user holds CONFIRMED, kept for SKUs with a per-user limit: persist
-- enforces the limit here, so losing Redis cannot bypass it.
CREATE TABLE user_units (
  sku     VARCHAR(64) NOT NULL,
  user_id VARCHAR(64) NOT NULL,
  units   INT         NOT NULL,
  PRIMARY KEY (sku, user_id),
  CONSTRAINT user_units_nonnegative CHECK (units >= 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

-- Resumable: a run that lost its connection after MySQL applied this
-- statement runs it again and sets the same figures.
INSERT INTO user_units (sku, user_id, units)
  SELECT r.sku, r.user_id, SUM(r.qty) FROM reservations r
  JOIN product_stock p ON p.sku = r.sku AND p.per_user_limit > 0
  WHERE r.status = 'CONFIRMED' GROUP BY r.sku, r.user_id
  ON DUPLICATE KEY UPDATE units = VALUES(units);

-- formed_at: when the group's last slot was taken in Redis; FORMED is final.
ALTER TABLE group_buys
  ADD COLUMN formed_at DATETIME(3) NULL AFTER deadline;
