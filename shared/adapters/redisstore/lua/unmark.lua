-- unmark.lua: end a SKU's live mark once it has passed (or at once, withdrawn), unless it moved.
-- Prefixed with clock.lua.
--
-- KEYS[1] live  sorted set: sku -> the mark's end (unix ms)
-- ARGV[1] sku  ARGV[2] the mark's end as the sweeper listed it (unix ms)
-- ARGV[3] now (unix ms; "" = Redis's clock)
-- ARGV[4] "1": end it even if it has not passed (a withdrawal: the SKU does not exist in MySQL)
--
-- Returns 1 if the mark ended; 0 if it moved since it was listed (a reserve marked the SKU again:
-- its holds may be on their way), has not passed yet, or is gone.
local cur = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]) or 'nil')
if cur == nil or cur ~= tonumber(ARGV[2]) then return 0 end
if ARGV[4] ~= '1' and cur >= clock_ms(ARGV[3]) then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
return 1
