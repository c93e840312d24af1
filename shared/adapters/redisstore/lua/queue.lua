-- queue.lua: a waiting room's queue, admitted from the stock (docs/design.md, "The waiting room"):
-- join it, or look at it (the SKU's state, and a ticket's). Both admit first: tickets in queue order
-- while the units the admitted who have not reserved may take (each the per-user limit, one when
-- the SKU sets none) < ceil((available + back) × factor) - back, back = held + unpaid: the units that
-- may still return (a holder of one is one of the buyers its factor stands for). All keys share bucket
-- 0's {hash tag} (a SKU with a waiting room has one bucket). Prefixed with clock.lua and
-- budget.lua.
--
-- KEYS[1] stock     string: units buyers can still reserve
-- KEYS[2] meta      hash: held (units HELD, which may still return), unpaid (units CONFIRMED, unpaid
--                   within a pay window, which return if the window lapses), room (the admit factor in
--                   thousandths; 0 or absent = no waiting room), opens, closes (unix ms; 0 = none),
--                   limit (per-user units: what one admission may take; 0 = none, one unit),
--                   rate, burst (the attempt budget's: budget.lua)
-- KEYS[3] queue     sorted set: ticket -> place, by rounds (a round: the tickets of one opening):
--                   base + a random fraction in [0, 1) for a ticket taken before the opening (so
--                   they are shuffled at it), base + 1 + its arrival number after; a round's base
--                   is past every place before it, so a place never goes before one admitted
-- KEYS[4] qmeta     hash: round (the opens, unix ms, of the current round), base (its places'),
--                   seq (arrivals since its opening), through (places admitted, from the first),
--                   rthrough (through when the round began), sold (1: a look of this round told
--                   its waiters SOLD_OUT, so the next round starts without them)
-- KEYS[5] admitted  sorted set: ticket -> when it was admitted (unix ms): admitted, not reserved yet
--                   and not lapsed (reserve.lua takes a ticket out when it holds for it)
-- KEYS[6] done      hash: ticket -> "R" (reserved) or "L" (lapsed: admitted, not reserved in time)
-- KEYS[7] attempts  string: the buyer's attempt budget on the SKU (reserve.lua's, in bucket 0, the
--                   home of every buyer of a one-bucket SKU), charged when ARGV[8] is set
-- ARGV[1] "join" or "look"  ARGV[2] ticket ("" with look: the SKU's state only)
-- ARGV[3] join: the ticket's random fraction, [0, 1)  ARGV[4] join: how long before opens the queue
--         opens (ms)  ARGV[5] how long an admission lasts (ms)  ARGV[6] now (unix ms; "" = Redis's
--         clock, as in production)  ARGV[7] how long the queue's keys live after its last write
--         (a join, an admission, a lapse; s)  ARGV[8] "1": charge the call to the buyer's attempt
--         budget (a join, a ticket's look; "" for the public look)  ARGV[9] default rate
--         ARGV[10] default burst (the SKU's meta rate/burst, when set, win)
--
-- Returns {code, now, opens, closes, through, length, available, held, position, state, admitted_at,
--          unpaid}:
--   code         OK; UNKNOWN_SKU (no stock figure: warm bucket 0 and ask again); NO_ROOM (the SKU has
--                no waiting room); QUEUE_NOT_OPEN (a join before opens - lead); SALE_CLOSED (a join
--                from closes on); nothing changed but for the admission; RATE_LIMITED (the
--                buyer's budget is spent: {code, now, opens, closes, wait ms}; nothing changed)
--   position     the ticket's place from 1 once the sale opened; 0 before it, or when not queued
--   state        the ticket's: "" (not queued), WAITING, ADMITTED, RESERVED, EXPIRED, SOLD_OUT, CLOSED
--   admitted_at  unix ms, when ADMITTED (the admission lasts ARGV[5] from it)
-- The admission never goes back: through only grows, a lapsed ticket is not admitted again, and a
-- place after through is admitted only once every place before it was. Without its queue (lost,
-- or expired) the room starts over: what the other keys kept of it goes too.
local op, ticket = ARGV[1], ARGV[2]
local now, ttl = clock_ms(ARGV[6]), tonumber(ARGV[5])
local stock = redis.call('GET', KEYS[1])
if not stock then return {'UNKNOWN_SKU'} end
local m = redis.call('HMGET', KEYS[2], 'held', 'room', 'opens', 'closes', 'limit', 'rate', 'burst', 'unpaid')
local held, room = tonumber(m[1] or '0'), tonumber(m[2] or '0')
local unpaid = tonumber(m[8] or '0')
local back = math.max(held, 0) + math.max(unpaid, 0) -- units that may still return
local opens, closes = tonumber(m[3] or '0'), tonumber(m[4] or '0')
if room <= 0 then return {'NO_ROOM'} end
if ARGV[8] ~= '' then -- before anything else: a refused call changes nothing
  local wait = spend(m[6], m[7], KEYS[7], redis.call('GET', KEYS[7]), now, ARGV[9], ARGV[10], '')
  if wait then return {'RATE_LIMITED', tostring(now), tostring(opens), tostring(closes), tostring(wait)} end
end
local available = tonumber(stock)
local open = opens <= 0 or now >= opens
local closed = closes > 0 and now >= closes
if redis.call('EXISTS', KEYS[3]) == 0 then redis.call('DEL', KEYS[4], KEYS[5], KEYS[6]) end

local wrote = false -- the keys' lifetime restarts with every write (a look that only reads keeps it)
if op == 'join' and redis.call('ZSCORE', KEYS[3], ticket) == false then
  local lead = tonumber(ARGV[4])
  if opens > 0 and now < opens - lead then return {'QUEUE_NOT_OPEN', tostring(now), tostring(opens), tostring(closes)} end
  if closed then return {'SALE_CLOSED', tostring(now), tostring(opens), tostring(closes)} end
  local q = redis.call('HMGET', KEYS[4], 'round', 'base', 'seq', 'through', 'rthrough')
  local base, through = tonumber(q[2] or '0'), tonumber(q[4] or '0')
  if tonumber(q[1] or '0') ~= opens then
    -- Another opening (the admin set or moved the window). If the round so far opened (a place
    -- of it was admitted, or arrived after its opening), the new round starts past every place
    -- so far; if not, its tickets stay where they are, shuffled with the new ones.
    if tonumber(q[3] or '0') > 0 or through > tonumber(q[5] or '0') then
      if redis.call('HGET', KEYS[4], 'sold') == '1' then
        -- The rounds so far sold out and told their waiters so (SOLD_OUT): their pages may be
        -- gone, so they do not go ahead of the new drop's buyers (each would be admitted to
        -- nobody and lapse in turn while units wait); a waiter still there joins it again.
        redis.call('ZREMRANGEBYRANK', KEYS[3], through, -1)
      end
      local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
      if #last == 2 then base = math.floor(tonumber(last[2])) + 1 end
      redis.call('HSET', KEYS[4], 'base', base, 'seq', 0, 'rthrough', through, 'sold', 0)
    end
    redis.call('HSET', KEYS[4], 'round', opens)
  end
  local place = base + tonumber(ARGV[3])
  if open then place = base + 1 + redis.call('HINCRBY', KEYS[4], 'seq', 1) end
  redis.call('ZADD', KEYS[3], place, ticket)
  wrote = true
end

local through = tonumber(redis.call('HGET', KEYS[4], 'through') or '0')
if open then -- admissions lapse after the close too; none is made from it on
  local lapsed = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now - ttl)
  for _, t in ipairs(lapsed) do redis.call('HSET', KEYS[6], t, 'L') end
  if #lapsed > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now - ttl)
    wrote = true
  end
end
if open and not closed then
  local h, each = back, math.max(tonumber(m[5] or '0'), 1)
  local units = math.ceil((math.max(available, 0) + h) * room / 1000) - h
  local budget = math.ceil(units / each) - redis.call('ZCARD', KEYS[5])
  if budget > 0 then
    local next = redis.call('ZRANGE', KEYS[3], through, through + budget - 1)
    for _, t in ipairs(next) do redis.call('ZADD', KEYS[5], now, t) end
    if #next > 0 then
      through = through + #next
      redis.call('HSET', KEYS[4], 'through', through)
      wrote = true
    end
  end
end

-- Waiters told SOLD_OUT (below) are not carried into another round: remember it, once.
if open and available <= 0 and back <= 0 and through < redis.call('ZCARD', KEYS[3])
    and redis.call('HGET', KEYS[4], 'sold') ~= '1' then
  redis.call('HSET', KEYS[4], 'sold', 1)
  wrote = true
end

if wrote then
  for i = 3, 6 do redis.call('EXPIRE', KEYS[i], tonumber(ARGV[7])) end
end

local position, state, admitted = 0, '', 0
if ticket ~= '' then
  local rank = redis.call('ZRANK', KEYS[3], ticket)
  if rank then
    if open then position = rank + 1 end
    local d = redis.call('HGET', KEYS[6], ticket)
    local at = redis.call('ZSCORE', KEYS[5], ticket)
    if d == 'R' then
      state = 'RESERVED'
    elseif d == 'L' or (open and rank < through and not at) then
      state = 'EXPIRED'
    elseif at then
      state, admitted = 'ADMITTED', tonumber(at)
    elseif closed then
      state = 'CLOSED'
    elseif open and available <= 0 and back <= 0 then
      state = 'SOLD_OUT'
    else
      state = 'WAITING'
    end
  end
end
return {'OK', tostring(now), tostring(opens), tostring(closes), tostring(through), tostring(redis.call('ZCARD', KEYS[3])),
  tostring(available), tostring(held), tostring(position), state, tostring(admitted), tostring(unpaid)}
