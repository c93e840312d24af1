-- warm.lua: load a SKU Redis has no stock for from one consistent MySQL read, counting every unit
-- once: MySQL's available has the confirmed units out already, held has every HELD hold in.
--
-- KEYS[1] stock  KEYS[2] meta (held, cver)  KEYS[3..n] the holds of HELD ids MySQL has CONFIRMED
-- ARGV[1] MySQL available  ARGV[2] MySQL version  ARGV[3] per-user limit  ARGV[4] MySQL admin delta
-- ARGV[5..] the token of each of KEYS[3..n] as MySQL decided it
--
-- Returns
--   0  the stock exists: nothing changed
--   3  stale: a confirm of a newer version (meta.cver) already left held, so the level misses
--      its deduction; nothing changed, read again
--   1  warmed: stock = available - held + the qty of those holds still HELD with MySQL's token
--      (confirmed in MySQL, their confirm not yet in Redis); meta.wver = version, so a refund
--      MySQL made at or before it is not given back again (follow.lua)
local available, version, limit, delta = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
if tonumber(redis.call('HGET', KEYS[2], 'cver') or '0') > version then return 3 end
local held = tonumber(redis.call('HGET', KEYS[2], 'held') or '0')
for i = 3, #KEYS do
  local h = redis.call('HMGET', KEYS[i], 'state', 'qty', 'token')
  if h[1] == 'HELD' and (ARGV[i + 2] == '' or h[3] == ARGV[i + 2]) then
    held = held - tonumber(h[2])
  end
end
redis.call('SET', KEYS[1], available - held)
redis.call('HSET', KEYS[2], 'ver', version, 'added', delta, 'limit', limit, 'wver', version)
return 1
