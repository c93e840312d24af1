-- 0002: a reservation id is "<sku>.<26 base32>" (it names its SKU, so a hold is
-- found from the id alone): up to 64 + 1 + 26 characters.
ALTER TABLE reservations MODIFY reservation_id VARCHAR(100) NOT NULL;
ALTER TABLE group_members MODIFY reservation_id VARCHAR(100) NOT NULL;
