-- budget.lua: the prelude of every script that charges a buyer's attempt budget (reserve.lua,
-- charge.lua, queue.lua): one attempt budget per buyer and SKU (tokens refilled at the rate, up to
-- the burst), in the buyer's home bucket. Needs clock.lua.
--
-- The budget is one string, "tokens:at:last": tokens (a decimal), at (unix ms), last (the token
-- of the last attempt charge.lua charged; "" for none; it may contain ':', it is the rest). The
-- caller reads it with GET (or with MGET beside another string of its slot), so that a charge is
-- two commands: that read and one SET ... PX. It expires when full again.
--
-- budget_of(cur) parses the budget as the caller read it (false: none): tokens, at, last (nil,
-- nil, "" when there is none).
--
-- spend(rate, burst, budget, cur, now, default_rate, default_burst, last) charges one attempt:
--   rate, burst  the bucket's meta hash's rate and burst fields as HMGET read them (the caller
--           reads them with its other meta fields, in one command; 0 or absent: the defaults)
--   budget  the key of the buyer's attempt budget
--   cur     its value as the caller read it, in this script call (false: none)
--   last    the attempt's token, recorded as last ("" keeps the one recorded)
-- It returns nil when charged (or when no rate applies), else the wait in ms until a token is
-- there (nothing charged). A clock that stepped back restarts the refill.
local function budget_of(cur)
  if not cur then return nil, nil, '' end
  local tokens, at, last = string.match(cur, '^([^:]*):([^:]*):?(.*)$')
  return tonumber(tokens), tonumber(at), last or ''
end

local function spend(rate, burst, budget, cur, now, default_rate, default_burst, last)
  rate, burst = tonumber(rate or '0'), tonumber(burst or '0')
  if rate <= 0 then rate = tonumber(default_rate) end
  if burst <= 0 then burst = tonumber(default_burst) end
  if rate <= 0 or burst <= 0 then return nil end
  local tokens, at, was = budget_of(cur)
  if not tokens or not at then tokens, at = burst, now end
  if now < at then at = now end
  tokens = math.min(burst, tokens + (now - at) * rate / 1000)
  local wait = nil
  if tokens < 1 then
    wait = math.ceil((1 - tokens) * 1000 / rate)
  else
    tokens = tokens - 1
  end
  if wait or last == '' then last = was end
  redis.call('SET', budget, tostring(tokens) .. ':' .. tostring(now) .. ':' .. last,
    'PX', math.ceil(burst * 1000 / rate) + 1000)
  return wait
end
