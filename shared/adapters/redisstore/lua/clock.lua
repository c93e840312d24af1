-- clock.lua: the prelude of every script that tells the time.
--
-- clock_ms(arg) returns the script's "now" in unix milliseconds: Redis's own
-- clock (TIME), so that no caller's clock moves a deadline. Tests that move
-- time pass their clock's reading in arg; production passes "".
local function clock_ms(arg)
  if arg ~= nil and arg ~= '' then return tonumber(arg) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
