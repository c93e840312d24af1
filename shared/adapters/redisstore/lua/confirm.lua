-- confirm.lua: confirm, in one call, HELD holds of one SKU that MySQL confirmed in one commit
-- (persist's batch). Exactly follow.lua's CONFIRMED case for a HELD hold of the decided token;
-- every other hold is left to follow.lua. Prefixed with clock.lua.
--
-- KEYS[1] meta (held; unpaid: the units in KEYS[3]; decided: when the bucket first gave a finished
--         hold its TTL, as follow.lua's retain)  KEYS[2] exp
-- KEYS[3] unpaid  hash: reservation id -> qty of the CONFIRMED ones still unpaid within a pay window
--                 (they may return: queue.lua counts them)
-- KEYS[4..] the holds
-- ARGV[1] the stock row's version after the commit  ARGV[2] retention seconds for the finished holds
-- ARGV[3] now (unix ms; "" = Redis's clock)
-- ARGV[1+3k], ARGV[2+3k], ARGV[3+3k] the reservation id, the decided token and the row's pay_by
--   (unix ms; 0: no pay window) of hold KEYS[3+k]
--
-- Returns the positions k (1-based) of the holds it did not confirm: missing, not HELD, of another
-- token (a stray), or decided with no token. The caller follows those with follow.lua.
-- A confirmed hold with a pay window enters unpaid (once: HSETNX).
-- Idempotent: a confirmed hold is no longer HELD, so a repeat skips it (follow.lua then changes nothing).
local version, retention = tonumber(ARGV[1]), tonumber(ARGV[2])
-- The first decision's time is read before any TTL is set, so no hold of this call expires before
-- decided + retention (reserve.lua's whole).
local first = nil
if redis.call('HEXISTS', KEYS[1], 'decided') == 0 then first = clock_ms(ARGV[3]) end
local skipped, units, unpaid = {}, 0, 0
for k = 1, #KEYS - 3 do
  local id, token = ARGV[1 + 3 * k], ARGV[2 + 3 * k]
  local h = redis.call('HMGET', KEYS[3 + k], 'state', 'token', 'qty')
  if h[1] == 'HELD' and token ~= '' and h[2] == token then
    units = units + tonumber(h[3])
    redis.call('ZREM', KEYS[2], id)
    redis.call('HSET', KEYS[3 + k], 'state', 'CONFIRMED')
    redis.call('EXPIRE', KEYS[3 + k], retention)
    if tonumber(ARGV[3 + 3 * k]) > 0 and redis.call('HSETNX', KEYS[3], id, h[3]) == 1 then
      unpaid = unpaid + tonumber(h[3])
    end
  else
    skipped[#skipped + 1] = k
  end
end
if units > 0 then
  redis.call('HINCRBY', KEYS[1], 'held', -units)
  if first then redis.call('HSET', KEYS[1], 'decided', first) end
  if version > tonumber(redis.call('HGET', KEYS[1], 'cver') or '0') then
    redis.call('HSET', KEYS[1], 'cver', version)
  end
end
if unpaid > 0 then redis.call('HINCRBY', KEYS[1], 'unpaid', unpaid) end
return skipped
