-- budget.lua: the prelude of every script that charges a buyer's attempt budget (reserve.lua,
-- charge.lua): one attempt budget per buyer and SKU (tokens refilled at the rate, up to the burst),
-- in the buyer's home bucket. Needs clock.lua.
--
-- spend(rate, burst, budget, now, default_rate, default_burst, last) charges one attempt:
--   rate, burst  the bucket's meta hash's rate and burst fields as HMGET read them (the caller
--           reads them with its other meta fields, in one command; 0 or absent: the defaults)
--   budget  the buyer's attempt budget hash: tokens, at (unix ms), last (the token of the last
--           attempt charged)
--   last    the attempt's token, recorded as last ("" records none)
-- It returns nil when charged (or when no rate applies), else the wait in ms until a token is
-- there (nothing charged). A clock that stepped back restarts the refill.
local function spend(rate, burst, budget, now, default_rate, default_burst, last)
  rate, burst = tonumber(rate or '0'), tonumber(burst or '0')
  if rate <= 0 then rate = tonumber(default_rate) end
  if burst <= 0 then burst = tonumber(default_burst) end
  if rate <= 0 or burst <= 0 then return nil end
  local b = redis.call('HMGET', budget, 'tokens', 'at')
  local tokens, at = tonumber(b[1]), tonumber(b[2])
  if not tokens or not at then tokens, at = burst, now end
  if now < at then at = now end
  tokens = math.min(burst, tokens + (now - at) * rate / 1000)
  local wait = nil
  if tokens < 1 then
    wait = math.ceil((1 - tokens) * 1000 / rate)
    redis.call('HSET', budget, 'tokens', tostring(tokens), 'at', now)
  elseif last ~= '' then
    redis.call('HSET', budget, 'tokens', tostring(tokens - 1), 'at', now, 'last', last)
  else
    redis.call('HSET', budget, 'tokens', tostring(tokens - 1), 'at', now)
  end
  redis.call('PEXPIRE', budget, math.ceil(burst * 1000 / rate) + 1000)
  return wait
end
