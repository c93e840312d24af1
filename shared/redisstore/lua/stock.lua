-- stock.lua: load or move a SKU's stock from MySQL without double-counting live holds.
--
-- KEYS[1] stock  KEYS[2] meta
-- ARGV[1] mode: "warm" (only if Redis has no stock) or "adjust" (apply a delta once per version)
-- ARGV[2] MySQL available  ARGV[3] MySQL version  ARGV[4] per-user limit  ARGV[5] delta (adjust)
--
-- Returns 1 if the stock was set or moved, 0 if nothing changed.
--   missing stock -> stock = MySQL available - units still HELD (both modes)
--   adjust        -> stock += delta, unless meta.ver >= version (a replay or an older change)
-- Every path records meta.ver = version and meta.limit.
local mode, available, version, limit, delta = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5])
if redis.call('EXISTS', KEYS[1]) == 0 then
  local held = tonumber(redis.call('HGET', KEYS[2], 'held') or '0')
  redis.call('SET', KEYS[1], available - held)
  redis.call('HSET', KEYS[2], 'ver', version, 'limit', limit)
  return 1
end
if mode == 'warm' then return 0 end
local ver = tonumber(redis.call('HGET', KEYS[2], 'ver') or '-1')
if ver >= version then return 0 end
redis.call('INCRBY', KEYS[1], delta)
redis.call('HSET', KEYS[2], 'ver', version, 'limit', limit)
return 1
