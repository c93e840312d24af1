-- credit.lua: the receiving side of a transfer MySQL recorded: add its units to this bucket's
-- stock, exactly once (before the giving bucket confirms its hold, so that the units are never
-- counted nowhere). All keys share the receiving bucket's {hash tag}.
--
-- KEYS[1] stock  KEYS[2] meta (wver)  KEYS[3] the transfer's mark in this bucket
-- ARGV[1] qty  ARGV[2] the stock row's version the transfer committed at
-- ARGV[3] retention seconds for the mark  ARGV[4] sku  ARGV[5] the giving bucket
--
-- Returns
--   1  credited: stock += qty, the mark set
--   0  nothing moved: the mark exists (a repeat), or the stock was warmed from a level at or
--      past the transfer (meta.wver >= version: that level counts the units already)
--   2  the bucket has no stock figure: nothing changed (warm it, then credit again)
-- MySQL's released flag on the transfer's row ends the retries; the mark makes a repeat a no-op
-- until then.
if redis.call('EXISTS', KEYS[3]) == 1 then return 0 end
if redis.call('EXISTS', KEYS[1]) == 0 then return 2 end
local credited = 0
if tonumber(redis.call('HGET', KEYS[2], 'wver') or '0') < tonumber(ARGV[2]) then
  redis.call('INCRBY', KEYS[1], tonumber(ARGV[1]))
  credited = 1
end
redis.call('HSET', KEYS[3], 'sku', ARGV[4], 'qty', ARGV[1], 'state', 'CREDITED', 'from', ARGV[5])
redis.call('EXPIRE', KEYS[3], tonumber(ARGV[3]))
return credited
