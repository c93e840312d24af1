-- confirm.lua: confirm, in one call, HELD holds of one SKU that MySQL confirmed in one commit
-- (persist's batch). Exactly follow.lua's CONFIRMED case for a HELD hold of the decided token;
-- every other hold is left to follow.lua.
--
-- KEYS[1] meta  KEYS[2] exp  KEYS[3..] the holds
-- ARGV[1] the stock row's version after the commit  ARGV[2] retention seconds for the finished holds
-- ARGV[1+2k], ARGV[2+2k] the reservation id and the decided token of hold KEYS[2+k]
--
-- Returns the positions k (1-based) of the holds it did not confirm: missing, not HELD, of another
-- token (a stray), or decided with no token. The caller follows those with follow.lua.
-- Idempotent: a confirmed hold is no longer HELD, so a repeat skips it (follow.lua then changes nothing).
local version, retention = tonumber(ARGV[1]), tonumber(ARGV[2])
local skipped, units = {}, 0
for k = 1, #KEYS - 2 do
  local id, token = ARGV[1 + 2 * k], ARGV[2 + 2 * k]
  local h = redis.call('HMGET', KEYS[2 + k], 'state', 'token', 'qty')
  if h[1] == 'HELD' and token ~= '' and h[2] == token then
    units = units + tonumber(h[3])
    redis.call('ZREM', KEYS[2], id)
    redis.call('HSET', KEYS[2 + k], 'state', 'CONFIRMED')
    redis.call('EXPIRE', KEYS[2 + k], retention)
  else
    skipped[#skipped + 1] = k
  end
end
if units > 0 then
  redis.call('HINCRBY', KEYS[1], 'held', -units)
  if version > tonumber(redis.call('HGET', KEYS[1], 'cver') or '0') then
    redis.call('HSET', KEYS[1], 'cver', version)
  end
end
return skipped
