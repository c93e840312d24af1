-- credit.lua: the receiving side of a transfer: add its units to this bucket's stock, exactly
-- once. The refill that took the units out credits them at once, ahead of MySQL's record (version
-- 0), so the buyer waiting for them is served without MySQL; persist, the sweeper or compensate
-- credit again with the record's version once MySQL has recorded it, which the mark makes a no-op
-- unless this bucket lost the first credit. All keys share the receiving bucket's {hash tag}.
-- Prefixed with clock.lua.
--
-- KEYS[1] stock  KEYS[2] meta (wver)  KEYS[3] the transfer's mark in this bucket
-- ARGV[1] qty  ARGV[2] the stock row's version the transfer committed at; 0: MySQL has not recorded
--         it yet (the credit ahead of the record)
-- ARGV[3] retention seconds for the mark  ARGV[4] sku  ARGV[5] the giving bucket
-- ARGV[6] the transfer hold's deadline (unix ms): from it on the sweeper may record the transfer
--         and credit it with its version, so a credit ahead of the record is refused
-- ARGV[7] now (unix ms; "" = Redis's clock)
--
-- Returns
--   1  credited: stock += qty, the mark set
--   0  nothing moved: the mark exists (a repeat), or the stock was warmed from a level at or
--      past the transfer (meta.wver >= version: that level counts the units already)
--   2  the bucket has no stock figure: nothing changed (warm it, then credit again)
--   3  a credit ahead of the record at or past the hold's deadline: nothing changed (the record's
--      credit follows)
-- MySQL's released flag on the transfer's row ends the retries; the mark makes a repeat a no-op
-- until then.
if redis.call('EXISTS', KEYS[3]) == 1 then return 0 end
if redis.call('EXISTS', KEYS[1]) == 0 then return 2 end
local version = tonumber(ARGV[2])
if version == 0 and clock_ms(ARGV[7]) >= tonumber(ARGV[6]) then return 3 end
local credited = 0
if version == 0 or tonumber(redis.call('HGET', KEYS[2], 'wver') or '0') < version then
  redis.call('INCRBY', KEYS[1], tonumber(ARGV[1]))
  credited = 1
end
redis.call('HSET', KEYS[3], 'sku', ARGV[4], 'qty', ARGV[1], 'state', 'CREDITED', 'from', ARGV[5])
redis.call('EXPIRE', KEYS[3], tonumber(ARGV[3]))
return credited
