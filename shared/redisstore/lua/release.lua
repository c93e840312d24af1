-- release.lua: end a hold CANCELLED and return its stock exactly once.
-- Called only after MySQL holds the CANCELLED row (the fence).
--
-- KEYS[1] stock  KEYS[2] meta  KEYS[3] exp  KEYS[4] users  KEYS[5] hold
-- KEYS[6] group  KEYS[7] members   (as in reserve.lua; group keys are placeholders when no group)
-- ARGV[1] sku  ARGV[2] reservation id  ARGV[3] refund ("1": also return a CONFIRMED hold's stock)
-- ARGV[4] reason  ARGV[5] retention seconds for the finished hold
-- ARGV[6] qty  ARGV[7] user  ARGV[8] group id   (from MySQL; used when the hold is missing)
--
-- Returns 1 if this call returned stock, 0 otherwise.
--   HELD       -> CANCELLED, stock and group slot returned, held and per-user units reduced
--   CONFIRMED  -> CANCELLED with stock returned when refund is "1"; untouched otherwise
--   CANCELLED  -> nothing (a repeat)
--   missing    -> a CANCELLED tombstone, so a replayed reserve cannot take stock; on a refund
--                 the stock is returned if Redis still has the SKU (a warm-up would count it)
local sku, id, refund, reason, retention = ARGV[1], ARGV[2], ARGV[3] == '1', ARGV[4], tonumber(ARGV[5])

local function give_back(qty, user, gid)
  if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('INCRBY', KEYS[1], qty) end
  local left = redis.call('HINCRBY', KEYS[4], user, -qty)
  if left <= 0 then redis.call('HDEL', KEYS[4], user) end
  if gid ~= '' and redis.call('HGET', KEYS[7], user) == id then
    redis.call('HDEL', KEYS[7], user)
    if redis.call('EXISTS', KEYS[6]) == 1 then
      redis.call('HINCRBY', KEYS[6], 'remaining', 1)
      if redis.call('HGET', KEYS[6], 'status') == 'FORMED' then
        redis.call('HSET', KEYS[6], 'status', 'OPEN')
      end
    end
  end
end

local h = redis.call('HMGET', KEYS[5], 'state', 'qty', 'user', 'group')
local state = h[1]
if not state then
  local qty, user, gid = tonumber(ARGV[6]), ARGV[7], ARGV[8]
  redis.call('HSET', KEYS[5], 'sku', sku, 'qty', qty, 'user', user, 'group', gid,
    'state', 'CANCELLED', 'reason', reason, 'deadline', 0, 'created', 0)
  redis.call('EXPIRE', KEYS[5], retention)
  if refund and redis.call('EXISTS', KEYS[1]) == 1 then
    give_back(qty, user, gid)
    return 1
  end
  return 0
end
if state == 'CANCELLED' then return 0 end
if state == 'CONFIRMED' and not refund then return 0 end

local qty, user, gid = tonumber(h[2]), h[3], h[4] or ''
if state == 'HELD' then
  redis.call('HINCRBY', KEYS[2], 'held', -qty)
  redis.call('ZREM', KEYS[3], id)
end
give_back(qty, user, gid)
redis.call('HSET', KEYS[5], 'state', 'CANCELLED', 'reason', reason)
if refund then redis.call('HSET', KEYS[5], 'refunded', '1') end
redis.call('EXPIRE', KEYS[5], retention)
return 1
