-- reserve.lua: check and pre-deduct stock for one reservation, atomically.
-- All keys share the SKU's {hash tag}. Prefixed with clock.lua and budget.lua.
--
-- KEYS[1] stock    string: units buyers can still reserve
-- KEYS[2] meta     hash: held (units HELD, not yet decided), limit (per-user units, 0 = none),
--                  rate, burst (per-user attempts per second and burst; 0 or absent = ARGV defaults),
--                  opens, closes (the sale window, unix ms; 0 or absent = no such bound)
-- KEYS[3] exp      sorted set: reservation id -> hold deadline (unix ms)
-- KEYS[4] users    hash: user -> units held or confirmed (for the per-user limit)
-- KEYS[5] hold     hash: the hold of this reservation id
-- KEYS[6] group    hash: capacity, remaining, status, deadline, formed_at (placeholder when no group)
-- KEYS[7] members  hash: user -> reservation id (placeholder when no group)
-- KEYS[8] attempts string: this user's attempt budget on the SKU, "tokens:at:last" (budget.lua)
-- KEYS[9] admitted sorted set: the waiting room's admitted tickets -> when admitted (queue.lua)
-- KEYS[10] done    hash: the waiting room's tickets done with -> "R" (reserved) or "L" (lapsed)
-- ARGV[1] sku  ARGV[2] reservation id  ARGV[3] qty  ARGV[4] user  ARGV[5] group id ("" = none)
-- ARGV[6] hold ttl (ms)  ARGV[7] token (names this incarnation of the hold)
-- ARGV[8] now (unix ms; "" = Redis's clock, as in production)
-- ARGV[9] default attempts per second per user  ARGV[10] default burst (0: no rate limit)
-- ARGV[11] "1": this call repeats an attempt already charged (reserve's retry after it refilled
--          the bucket), so it is not charged again
-- ARGV[12] the waiting-room ticket the request's admission token names ("" = none)
-- ARGV[13] when that admission ends (unix ms; the token's, which its signature fixes)
-- ARGV[14] the holds' retention (ms): how long a finished hold stays (whole, below)
--
-- Returns a flat array whose first element is the code:
--   {"OK", deadline, created, full, whole}  hold recorded HELD, stock deducted; full "1" when this join
--                                           took the group's last slot (the group stays OPEN until MySQL
--                                           records it FORMED and group_form.lua marks it: a join that is
--                                           never accepted must not form it); whole: see below
--   {"REPLAY", field1, value1, ...}         a hold with this id exists (its fields); nothing taken;
--                                           created 0: a tombstone follow.lua wrote, not a hold taken here
--   {"MISMATCH"}                            the id exists with another qty/user/group; nothing taken,
--                                           the attempt charged (RATE_LIMITED instead when over the rate)
--   {"RATE_LIMITED", retry_after_ms}       this user is over the SKU's attempt rate; nothing taken
--   {"NOT_OPEN", opens, wait_ms}            the sale window opens at opens (unix ms), wait_ms from now
--   {"SALE_CLOSED"}                         the sale window has closed
--   {"NOT_ADMITTED"}                        the SKU has a waiting room (meta.room) and no ticket came
--   {"ADMISSION_LAPSED"}                    the ticket is not admitted (any more): its admission
--                                           ended, or it was used for another hold
--   {"SALE_CLOSED", whole} {"ADMISSION_LAPSED", whole} {"SOLD_OUT", whole} {"LIMIT", whole}: as above
--   {"UNKNOWN_SKU"} {"SOLD_OUT"} {"LIMIT"} (LIMIT too: more than one unit under a waiting-room
--                                          admission of a SKU with no per-user limit)
--   {"UNKNOWN_GROUP"} {"GROUP_CLOSED"} {"ALREADY_JOINED"} {"GROUP_FULL"}
-- whole is "1" while this bucket holds every reservation of its SKU (warm.lua, from the SKU's creation,
-- with one bucket; a change of K ends it: stock.lua), each at least until its retention: until
-- meta.decided (when the bucket first gave a finished hold its TTL: confirm.lua, follow.lua) + the
-- lesser of meta.wholefor and ARGV[14], or for good while none is finished yet: an id it has no
-- hold of has no row in MySQL either, so
-- the caller need not ask MySQL about a keyed buy's new hold or refusal (docs/design.md, "A bucket
-- that holds every id"); "0" otherwise.
-- Idempotent: a retried call (the same token) finds the hold and answers REPLAY, free of charge;
-- another request for the same id (a client's replay, of a HELD hold or a decided one, or a request
-- that mismatches it) costs an attempt first: they are script calls on the SKU's shard like any
-- other, so a storm of them is RATE_LIMITED like any other (ARGV[11] "1" is free here too).
-- The order of the checks: a replay answers its hold whatever the window; every other attempt is
-- charged first (a refusal costs its token like a hold does), then the window, judged by this
-- script's clock, so nobody hears sold_out or is held outside it; then the per-user limit, then
-- the stock (a request both over the limit and over the stock is LIMIT: see below).
-- The cost: every redis.call is a large part of the script's Redis time, so the OK path sends as
-- few as its guarantees allow (docs/design.md, "The reserve script's cost"), 13 commands with
-- every feature on (TIME, the hold's HMGET, meta's HMGET, MGET, SET of the budget, the limit's
-- HINCRBY, PTTL of done, ZREM, DECRBY, HINCRBY of held, HSET of the hold, ZADD, HSET of done;
-- two more, PTTL of admitted and PEXPIRE of done, when the call writes a room's done hash first):
-- one HMGET of the hold both finds it and reads what a replay is judged by; one read of meta
-- for the window, the limit, the room and the attempt budget's rate; one MGET reads the stock and
-- the attempt budget (both strings of this slot), and one SET ... PX writes the budget with its
-- TTL; the per-user count is raised and judged in one HINCRBY (given back when refused); the
-- ticket is taken out and judged in one ZREM once nothing else can refuse; the done hash keeps
-- the TTL it has (the admitted set's, which queue.lua gives both). Its PTTL stays: reserve.lua
-- may be the first to write the done hash (queue.lua's EXPIRE finds no key to give a TTL to
-- before), and a done hash written without a TTL would live for good.
local sku, id, qty, user, gid = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5]

-- An attempt budget per user and SKU (budget.lua): every attempt costs one token — a new one, sold
-- out or refused, a client's replay (of a HELD hold, which re-sends the message, or a decided one)
-- and a request that mismatches the id's hold — so a script hammering from one account can neither
-- crowd out other buyers nor flood the queue, nor run this script for free. A retry of this very
-- call (the same token: go-redis after a timeout) is free.
local now = clock_ms(ARGV[8])

-- Every hold hash has its qty (reserve.lua and follow.lua write it with the hold; the scripts that
-- add a field to a hold read its state first), so a qty read as false is no hold.
local h = redis.call('HMGET', KEYS[5], 'qty', 'user', 'group', 'token')
if h[1] then
  if h[4] ~= ARGV[7] and ARGV[11] ~= '1' then
    local m = redis.call('HMGET', KEYS[2], 'rate', 'burst')
    local wait = spend(m[1], m[2], KEYS[8], redis.call('GET', KEYS[8]), now, ARGV[9], ARGV[10], '')
    if wait then return {'RATE_LIMITED', tostring(wait)} end
  end
  if tonumber(h[1]) ~= qty or h[2] ~= user or (h[3] or '') ~= gid then
    return {'MISMATCH'}
  end
  local out = redis.call('HGETALL', KEYS[5])
  table.insert(out, 1, 'REPLAY')
  return out
end

local m = redis.call('HMGET', KEYS[2], 'opens', 'closes', 'limit', 'room', 'rate', 'burst', 'whole', 'wholefor', 'decided')
-- The stock and the attempt budget are both strings of this slot: one MGET reads them. Nothing
-- writes between it and their use (a script runs alone).
local sb = redis.call('MGET', KEYS[1], KEYS[8])
if ARGV[11] ~= '1' then
  local wait = spend(m[5], m[6], KEYS[8], sb[2], now, ARGV[9], ARGV[10], '')
  if wait then return {'RATE_LIMITED', tostring(wait)} end
end

local stock = sb[1]
if not stock then return {'UNKNOWN_SKU'} end
local since, decided = tonumber(m[7] or '0'), tonumber(m[9] or '')
local whole = '0'
if since > 0 and (not decided or now < decided + math.min(tonumber(m[8] or '0'), tonumber(ARGV[14] or '') or 0)) then
  whole = '1'
end
local opens, closes = tonumber(m[1] or '0'), tonumber(m[2] or '0')
if opens > 0 and now < opens then return {'NOT_OPEN', tostring(opens), tostring(opens - now)} end
if closes > 0 and now >= closes then return {'SALE_CLOSED', whole} end
-- A waiting-room SKU sells to admitted tickets only, one hold each: the ticket leaves the admitted
-- set with its hold (below), so a second request under it (another id: the id is the ticket's, so
-- only a forged one) is refused here.
local ticket = ARGV[12] or ''
local room = tonumber(m[4] or '0') > 0
if room then
  if ticket == '' then return {'NOT_ADMITTED'} end
  if now >= tonumber(ARGV[13]) then return {'ADMISSION_LAPSED', whole} end
end

-- The per-user limit before the stock: a request the limit refuses is LIMIT even at a dry bucket,
-- so it never makes the caller refill the bucket from another (a transfer, and a version of the
-- stock row at persist, for a request that could not be served anyway). A buy the stock can serve
-- raises the buyer's count and judges the new figure (counted); a refusal gives it back exactly
-- (follow.lua deletes a count that reaches 0), so nothing refused changes it.
local limit, left = tonumber(m[3] or '0'), tonumber(stock)
local refusal, counted = nil, false
local function uncount()
  if redis.call('HINCRBY', KEYS[4], user, -qty) <= 0 then redis.call('HDEL', KEYS[4], user) end
end
if limit > 0 then
  if gid == '' and left >= qty then
    if redis.call('HINCRBY', KEYS[4], user, qty) > limit then
      uncount()
      refusal = 'LIMIT'
    else
      counted = true
    end
  elseif tonumber(redis.call('HGET', KEYS[4], user) or '0') + qty > limit then
    refusal = 'LIMIT'
  end
end
-- An admission is for the per-user limit's units, one when the SKU sets none (queue.lua admits
-- by that much), so a buyer behind never takes the units the room admitted the one ahead for.
if not refusal and room and limit <= 0 and qty > 1 then refusal = 'LIMIT' end
if not refusal and left < qty then refusal = 'SOLD_OUT' end

-- The ticket: a lapsed one answers ADMISSION_LAPSED before any refusal above. When nothing is left
-- to refuse a buy (no group to judge), one ZREM both judges and takes it out. life: the admitted
-- set's TTL for a done hash that has none yet (read before the ZREM may empty the set).
local life, taken = nil, false
local function take()
  if redis.call('PTTL', KEYS[10]) <= 0 then life = redis.call('PTTL', KEYS[9]) end
  return redis.call('ZREM', KEYS[9], ticket) == 1
end
if room then
  if refusal or gid ~= '' then
    if not redis.call('ZSCORE', KEYS[9], ticket) then return {'ADMISSION_LAPSED', whole} end
  elseif take() then
    taken = true
  else
    if counted then uncount() end
    return {'ADMISSION_LAPSED', whole}
  end
end
if refusal then return {refusal, whole} end

local full = '0'
if gid ~= '' then
  local g = redis.call('HMGET', KEYS[6], 'status', 'remaining', 'deadline')
  if not g[1] then return {'UNKNOWN_GROUP'} end
  if g[1] == 'FAILED' or now >= tonumber(g[3]) then return {'GROUP_CLOSED'} end
  if redis.call('HEXISTS', KEYS[7], user) == 1 then return {'ALREADY_JOINED'} end
  if g[1] ~= 'OPEN' or tonumber(g[2]) <= 0 then return {'GROUP_FULL'} end
  local remaining = redis.call('HINCRBY', KEYS[6], 'remaining', -1)
  if remaining == 0 then
    redis.call('HSET', KEYS[6], 'full_at', now)
    full = '1'
  end
  redis.call('HSET', KEYS[7], user, id)
  local pttl = redis.call('PTTL', KEYS[6])
  if pttl > 0 then redis.call('PEXPIRE', KEYS[7], pttl) end
end

local deadline = now + tonumber(ARGV[6])
redis.call('DECRBY', KEYS[1], qty)
redis.call('HINCRBY', KEYS[2], 'held', qty)
if not counted then redis.call('HINCRBY', KEYS[4], user, qty) end
redis.call('HSET', KEYS[5], 'sku', sku, 'qty', qty, 'user', user, 'group', gid, 'token', ARGV[7],
  'state', 'HELD', 'deadline', deadline, 'created', now)
redis.call('ZADD', KEYS[3], deadline, id)
if room then
  if not taken then take() end -- a join: its ZSCORE above holds, nothing ran in between
  redis.call('HSET', KEYS[10], ticket, 'R')
  if life and life > 0 then redis.call('PEXPIRE', KEYS[10], life) end
end
return {'OK', tostring(deadline), tostring(now), full, whole}
