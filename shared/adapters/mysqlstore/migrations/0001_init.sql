-- 0001: stock, reservations and group-buys. MySQL is the arbiter of the protocol:
-- a reservation's row decides its fate (docs/design.md).

CREATE TABLE product_stock (
  sku            VARCHAR(64)  NOT NULL,
  available      INT          NOT NULL,
  version        BIGINT       NOT NULL DEFAULT 0,
  per_user_limit INT          NOT NULL DEFAULT 0,
  updated_at     DATETIME(3)  NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
  PRIMARY KEY (sku),
  CONSTRAINT product_stock_available_nonnegative CHECK (available >= 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

-- One row per decided reservation. status CONFIRMED: its stock is taken here.
-- CANCELLED: it takes no stock (never did, or refunded = 1 gave it back).
-- notified = 0 on a CANCELLED row: its event has not gone out yet (outbox).
CREATE TABLE reservations (
  reservation_id VARCHAR(64)  NOT NULL,
  sku            VARCHAR(64)  NOT NULL,
  qty            INT          NOT NULL,
  user_id        VARCHAR(64)  NOT NULL,
  group_id       VARCHAR(64)  NULL,
  status         ENUM('CONFIRMED','CANCELLED') NOT NULL,
  reason         VARCHAR(32)  NULL,
  refunded       TINYINT(1)   NOT NULL DEFAULT 0,
  notified       TINYINT(1)   NOT NULL DEFAULT 1,
  expires_at     DATETIME(3)  NULL,
  created_at     DATETIME(3)  NOT NULL,
  updated_at     DATETIME(3)  NOT NULL,
  PRIMARY KEY (reservation_id),
  KEY reservations_sku (sku, status),
  KEY reservations_group (group_id, status),
  KEY reservations_outbox (notified, updated_at),
  CONSTRAINT reservations_qty_positive CHECK (qty > 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

-- Not named `groups`: a reserved word in MySQL 8.
CREATE TABLE group_buys (
  group_id   VARCHAR(64)  NOT NULL,
  sku        VARCHAR(64)  NOT NULL,
  capacity   INT          NOT NULL,
  members    INT          NOT NULL DEFAULT 0,
  status     ENUM('OPEN','FORMED','FAILED') NOT NULL,
  deadline   DATETIME(3)  NOT NULL,
  settled_at DATETIME(3)  NULL,
  created_at DATETIME(3)  NOT NULL,
  updated_at DATETIME(3)  NOT NULL,
  PRIMARY KEY (group_id),
  KEY group_buys_due (status, deadline),
  CONSTRAINT group_buys_members_within_capacity CHECK (members >= 0 AND members <= capacity)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

-- A confirmed member of a group: one row per user per group.
CREATE TABLE group_members (
  group_id       VARCHAR(64) NOT NULL,
  user_id        VARCHAR(64) NOT NULL,
  reservation_id VARCHAR(64) NOT NULL,
  PRIMARY KEY (group_id, user_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
