-- 0012: the order service pays or releases (docs/design.md, "Payment").
-- A SKU's pay window (0: none). A CONFIRMED row's payment deadline, pay_by
-- (NULL: no window, or a group join whose group has not formed: its window
-- opens when the group forms), and paid_at once the order service recorded
-- its payment: the row is PAID, final (its status stays CONFIRMED: its
-- stock is taken, as every query of taken stock counts it). cancel_note is
-- the order service's own reason for its cancel (reason order_cancelled).
-- The index serves the sweeper's list of payments due.
ALTER TABLE product_stock
  ADD COLUMN pay_within_seconds INT NOT NULL DEFAULT 0 AFTER closes_at;

ALTER TABLE reservations
  ADD COLUMN pay_by DATETIME(3) NULL,
  ADD COLUMN paid_at DATETIME(3) NULL,
  ADD COLUMN cancel_note VARCHAR(64) NULL,
  ADD KEY reservations_payment_due (status, paid_at, pay_by);

-- A retried admin change with another pay window is another change.
ALTER TABLE stock_change_keys
  ADD COLUMN pay_within_to INT NULL AFTER closes_to;
