-- stock.lua: make a SKU Redis knows follow MySQL's admin changes, each exactly once, in any order.
--
-- KEYS[1] stock  KEYS[2] meta (held, ver, added, limit, rate, burst, k, opens, closes, room)
-- ARGV[1] MySQL version  ARGV[2] per-user limit
-- ARGV[3] MySQL admin delta (the sum of every admin change ever made)
-- ARGV[4] per-user attempts per second  ARGV[5] burst (0: the service's defaults)
-- ARGV[6] the SKU's bucket count K (meta.k: reserve picks buckets by it; a change of K ends the
--         bucket's meta.whole: a reservation may now be held in another bucket)
-- ARGV[7] ARGV[8] the sale window: opens, closes (unix ms; 0 = no such bound)
-- ARGV[9] the waiting room: buyers admitted per unit left, in thousandths (0 = no waiting room)
--
-- Returns
--   4  missing: Redis has no stock for the SKU (warm.lua loads it); nothing changed
--   2  adjusted: stock += admin delta - meta.added (the changes not applied yet)
--   0  no stock moved (an older or equal version, or no admin change since: a newer version's
--      settings and window are applied all the same)
-- meta.ver orders the levels: an older one is ignored, so a delayed update never undoes a newer
-- one. A SKU written before meta.added existed counts as 0 applied, as MySQL's admin_delta
-- started at 0 when it was added.
local version, limit, delta = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
if redis.call('EXISTS', KEYS[1]) == 0 then return 4 end
if version <= tonumber(redis.call('HGET', KEYS[2], 'ver') or '-1') then return 0 end
local m = redis.call('HMGET', KEYS[2], 'added', 'k')
local added = tonumber(m[1] or '0')
redis.call('HSET', KEYS[2], 'ver', version, 'added', delta, 'limit', limit, 'rate', ARGV[4], 'burst', ARGV[5], 'k', ARGV[6],
  'opens', ARGV[7], 'closes', ARGV[8], 'room', ARGV[9])
if tonumber(m[2] or '1') ~= tonumber(ARGV[6]) then redis.call('HSET', KEYS[2], 'whole', 0) end
local d = delta - added
if d == 0 then return 0 end
redis.call('INCRBY', KEYS[1], d)
return 2
