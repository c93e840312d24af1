-- 0013: a waiting room that knows the stock (docs/design.md, "The waiting
-- room"). admit_permille: the SKU's admit factor in thousandths (buyers
-- admitted per unit left × 1000), 0: no waiting room (the default). Redis
-- carries it in bucket 0's meta ("room"); the queue itself lives in Redis.
ALTER TABLE product_stock
  ADD COLUMN admit_permille INT NOT NULL DEFAULT 0 AFTER pay_within_seconds;

-- A retried admin change with another waiting room is another change.
ALTER TABLE stock_change_keys
  ADD COLUMN admit_to INT NULL AFTER pay_within_to;
