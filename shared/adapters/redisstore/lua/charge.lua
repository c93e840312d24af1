-- charge.lua: charge one attempt of a buyer's on a SKU to their attempt budget, and, for a group
-- they open, claim one of their open-group places. For what reserve.lua cannot charge in the same
-- call: a group-buy's creation, and a join (bucket 0) of a buyer whose budget lives in another
-- bucket, or whose keyed join must be charged before MySQL is asked. Prefixed with clock.lua and
-- budget.lua.
-- All keys are the buyer's home bucket's ({sku} or {sku#b}): the one budget per buyer and SKU,
-- whatever K, that reserve.lua's charge() spends for a buy in that bucket.
--
-- KEYS[1] meta    hash of the home bucket: rate, burst (per-user attempts per second and burst; 0 or
--                 absent = ARGV defaults)
-- KEYS[2] attempts string: the buyer's attempt budget, "tokens:at:last" (budget.lua; last: the
--                 token of the last attempt charged here)
-- KEYS[3] opened  sorted set: group id -> until when it counts as the buyer's open group (unix ms)
-- ARGV[1] now (unix ms; "" = Redis's clock)  ARGV[2] default rate  ARGV[3] default burst (0: no rate)
-- ARGV[4] token (names this attempt: a repeat of this very call is free)
-- ARGV[5] group id ("" = no group to claim)  ARGV[6] until (unix ms: the group's deadline plus the
--         time the sweeper may take to end it)  ARGV[7] most open groups (0 = no cap)
--
-- Returns
--   {"OK"}                         charged (and the group's place claimed)
--   {"RATE_LIMITED", wait_ms}      no token left; nothing charged or claimed
--   {"TOO_MANY_GROUPS", wait_ms}   charged, but the buyer holds the most open groups already; wait_ms
--                                  until the first of them stops counting; nothing claimed
-- Idempotent: a repeat of the same call (the same token) is not charged again, and a group claimed
-- once is claimed once.
local now, token, gid = clock_ms(ARGV[1]), ARGV[4], ARGV[5]
if gid ~= '' and redis.call('ZSCORE', KEYS[3], gid) then return {'OK'} end
local cur = redis.call('GET', KEYS[2])
local charged = token ~= '' and select(3, budget_of(cur)) == token

if not charged then
  local m = redis.call('HMGET', KEYS[1], 'rate', 'burst')
  local wait = spend(m[1], m[2], KEYS[2], cur, now, ARGV[2], ARGV[3], token)
  if wait then return {'RATE_LIMITED', tostring(wait)} end
end

if gid == '' then return {'OK'} end
local until_ms, most = tonumber(ARGV[6]), tonumber(ARGV[7])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
if most > 0 and redis.call('ZCARD', KEYS[3]) >= most then
  local first = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
  return {'TOO_MANY_GROUPS', tostring(math.max(1, tonumber(first[2]) - now))}
end
redis.call('ZADD', KEYS[3], until_ms, gid)
local pttl = redis.call('PTTL', KEYS[3])
if pttl < 0 or pttl < until_ms - now then redis.call('PEXPIREAT', KEYS[3], until_ms) end
return {'OK'}
