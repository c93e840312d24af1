-- credit.lua: the receiving side of a transfer: add its units to this bucket's stock, exactly
-- once. The refill that took the units out credits them at once, ahead of MySQL's record (version
-- 0), so the buyer waiting for them is served without MySQL. Persist, the sweeper or compensate
-- credit again with the record's version once MySQL has recorded it. All keys share the receiving
-- bucket's {hash tag}. Prefixed with clock.lua.
--
-- KEYS[1] stock  KEYS[2] meta (wver; ahead: units credited ahead of their record and still counted
--          in stock; wn: the warm-ups so far)  KEYS[3] the transfer's mark in this bucket
-- KEYS[4] ahead: sorted set, transfer id -> its hold's deadline, of the credits ahead of their record
-- ARGV[1] qty  ARGV[2] the stock row's version the transfer committed at; 0: MySQL has not recorded
--         it yet (the credit ahead of the record)
-- ARGV[3] retention seconds for the mark once CREDITED (an AHEAD mark stays until its record)  ARGV[4] sku  ARGV[5] the giving bucket
-- ARGV[6] the transfer hold's deadline (unix ms): from it on the sweeper may record the transfer
--         and credit it with its version, so a credit ahead of the record is refused
-- ARGV[7] now (unix ms; "" = Redis's clock)  ARGV[8] the transfer hold's token  ARGV[9] transfer id
--
-- The mark's state:
--   AHEAD     credited ahead of the record, at warm-up wn: its units are in stock unless the bucket
--             was warmed since (meta.wn moved on: the warm-up replaced the figure with MySQL's share)
--   CREDITED  the record's credit ran: its units are in MySQL's share and in stock once
-- Returns
--   1  credited: stock += qty
--   0  nothing moved: a repeat; the record's credit of units already counted (credited ahead, or
--      in a warm-up from a level at or past the transfer: meta.wver >= version)
--   2  the bucket has no stock figure: nothing changed (warm it, then credit again)
--   3  a credit ahead of the record at or past the hold's deadline: nothing changed (the record's
--      credit follows)
-- MySQL's released flag on the transfer's row ends the retries; the mark makes a repeat a no-op.
local qty, version = tonumber(ARGV[1]), tonumber(ARGV[2])
local mark = redis.call('HMGET', KEYS[3], 'state', 'wn')
if mark[1] == 'CREDITED' or (mark[1] == 'AHEAD' and version == 0) then return 0 end
if redis.call('EXISTS', KEYS[1]) == 0 then return 2 end
local wn = redis.call('HGET', KEYS[2], 'wn') or '0'
if version == 0 then
  if clock_ms(ARGV[7]) >= tonumber(ARGV[6]) then return 3 end
  redis.call('INCRBY', KEYS[1], qty)
  redis.call('HINCRBY', KEYS[2], 'ahead', qty)
  redis.call('HSET', KEYS[3], 'sku', ARGV[4], 'qty', qty, 'state', 'AHEAD', 'from', ARGV[5],
    'token', ARGV[8], 'deadline', ARGV[6], 'wn', wn)
  redis.call('ZADD', KEYS[4], tonumber(ARGV[6]), ARGV[9])
  return 1 -- no retention until the record's credit: the sweeper records it past its deadline
end
local credited = 0
if mark[1] == 'AHEAD' and mark[2] == wn then
  redis.call('HINCRBY', KEYS[2], 'ahead', -qty) -- counted since the credit ahead: now in the share too
elseif tonumber(redis.call('HGET', KEYS[2], 'wver') or '0') < version then
  redis.call('INCRBY', KEYS[1], qty) -- never credited, or warmed since from a level without it
  credited = 1
end
redis.call('HSET', KEYS[3], 'sku', ARGV[4], 'qty', qty, 'state', 'CREDITED', 'from', ARGV[5])
redis.call('ZREM', KEYS[4], ARGV[9])
redis.call('EXPIRE', KEYS[3], tonumber(ARGV[3]))
return credited
