-- 0005: per-user reserve rate limits per SKU (attempts per second and burst);
-- 0 takes the service's defaults (HOLDFAST_USER_RATE, HOLDFAST_USER_BURST).
ALTER TABLE product_stock
  ADD COLUMN user_rate INT NOT NULL DEFAULT 0 AFTER per_user_limit,
  ADD COLUMN user_burst INT NOT NULL DEFAULT 0 AFTER user_rate;
