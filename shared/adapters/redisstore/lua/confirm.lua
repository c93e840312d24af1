-- confirm.lua: confirm, in one call, HELD holds of one SKU that MySQL confirmed in one commit
-- (persist's batch). Exactly follow.lua's CONFIRMED case for a HELD hold of the decided token;
-- every other hold is left to follow.lua.
--
-- KEYS[1] stock (unused: every key of the SKU is named)  KEYS[2] meta  KEYS[3] exp  KEYS[4] users
-- KEYS[5..] the holds
-- ARGV[1] the stock row's version after the commit  ARGV[2] retention seconds for the finished holds
-- ARGV[1+2k], ARGV[2+2k] the reservation id and the decided token of hold KEYS[4+k]
--
-- Returns the positions k (1-based) of the holds it did not confirm: missing, not HELD, of another
-- token (a stray), or decided with no token. The caller follows those with follow.lua.
-- Idempotent: a confirmed hold is no longer HELD, so a repeat skips it (follow.lua then changes nothing).
local version, retention = tonumber(ARGV[1]), tonumber(ARGV[2])
local skipped, units = {}, 0
for k = 1, #KEYS - 4 do
  local id, token = ARGV[1 + 2 * k], ARGV[2 + 2 * k]
  local h = redis.call('HMGET', KEYS[4 + k], 'state', 'token', 'qty')
  if h[1] == 'HELD' and token ~= '' and h[2] == token then
    units = units + tonumber(h[3])
    redis.call('ZREM', KEYS[3], id)
    redis.call('HSET', KEYS[4 + k], 'state', 'CONFIRMED')
    redis.call('EXPIRE', KEYS[4 + k], retention)
  else
    skipped[#skipped + 1] = k
  end
end
if units > 0 then
  redis.call('HINCRBY', KEYS[2], 'held', -units)
  if version > tonumber(redis.call('HGET', KEYS[2], 'cver') or '0') then
    redis.call('HSET', KEYS[2], 'cver', version)
  end
end
return skipped
