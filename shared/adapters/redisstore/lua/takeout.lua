-- takeout.lua: the giving side of a transfer between two buckets of one SKU: hold qty units of
-- this bucket's stock for the transfer, as reserve.lua holds a buyer's. MySQL then records the
-- transfer (the hold becomes CONFIRMED through follow.lua, and the receiving bucket is credited
-- by credit.lua), or the sweeper fences it at its deadline and follow.lua returns the units here.
-- All keys share the bucket's {hash tag}. Prefixed with clock.lua.
--
-- KEYS[1] stock  KEYS[2] meta (held; moving: the units of transfers out of this bucket not yet
--          decided, which a refill counts as on their way)  KEYS[3] exp  KEYS[4] hold (of the transfer id)
-- ARGV[1] sku  ARGV[2] transfer id  ARGV[3] qty  ARGV[4] the receiving bucket
-- ARGV[5] hold ttl (ms)  ARGV[6] token  ARGV[7] now (unix ms; "" = Redis's clock)
--
-- Returns
--   {"OK", deadline, created}   held: stock -= qty, held += qty, moving += qty, the hold HELD with its deadline
--   {"REPLAY", field1, value1, ...}  the transfer's hold exists (a retried call): nothing taken
--   {"UNKNOWN_SKU"}             the bucket has no stock figure (warm it first)
--   {"SOLD_OUT", available}     fewer than qty units: nothing taken
local qty, ttl = tonumber(ARGV[3]), tonumber(ARGV[5])
local now = clock_ms(ARGV[7])
if redis.call('EXISTS', KEYS[4]) == 1 then
  local out = redis.call('HGETALL', KEYS[4])
  table.insert(out, 1, 'REPLAY')
  return out
end
local stock = redis.call('GET', KEYS[1])
if not stock then return {'UNKNOWN_SKU'} end
if tonumber(stock) < qty then return {'SOLD_OUT', stock} end
local deadline = now + ttl
redis.call('DECRBY', KEYS[1], qty)
redis.call('HINCRBY', KEYS[2], 'held', qty)
redis.call('HINCRBY', KEYS[2], 'moving', qty)
redis.call('HSET', KEYS[4], 'sku', ARGV[1], 'qty', qty, 'user', '', 'group', '', 'into', ARGV[4],
  'token', ARGV[6], 'state', 'HELD', 'deadline', deadline, 'created', now)
redis.call('ZADD', KEYS[3], deadline, ARGV[2])
return {'OK', tostring(deadline), tostring(now)}
