-- confirm.lua: mark a HELD hold CONFIRMED once MySQL has taken its stock.
--
-- KEYS[1] meta  KEYS[2] exp  KEYS[3] hold
-- ARGV[1] reservation id  ARGV[2] retention seconds for the finished hold
-- ARGV[3] sku  ARGV[4] qty  ARGV[5] user  ARGV[6] group id   (for a tombstone when the hold is missing)
--
-- Returns 1 if the hold went HELD -> CONFIRMED (held units reduced, deadline index cleared), 0 otherwise
-- (already final; or missing, which leaves a CONFIRMED tombstone so a replayed reserve takes nothing).
local id, retention = ARGV[1], tonumber(ARGV[2])
local h = redis.call('HMGET', KEYS[3], 'state', 'qty')
if not h[1] then
  redis.call('HSET', KEYS[3], 'sku', ARGV[3], 'qty', ARGV[4], 'user', ARGV[5], 'group', ARGV[6],
    'state', 'CONFIRMED', 'deadline', 0, 'created', 0)
  redis.call('EXPIRE', KEYS[3], retention)
  return 0
end
if h[1] ~= 'HELD' then return 0 end
redis.call('HINCRBY', KEYS[1], 'held', -tonumber(h[2]))
redis.call('ZREM', KEYS[2], id)
redis.call('HSET', KEYS[3], 'state', 'CONFIRMED')
redis.call('EXPIRE', KEYS[3], retention)
return 1
