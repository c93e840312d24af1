-- group_close.lua: end a group once its deadline passed by Redis's clock. Prefixed with clock.lua.
-- A group whose last slot was taken before the deadline is FORMED, and that is final.
--
-- KEYS[1] group hash  KEYS[2] members hash (user -> reservation id)
-- ARGV[1] now (unix ms; "" = Redis's clock)
--
-- Returns
--   {"UNKNOWN"}                 Redis has no such group (lost, or retention passed)
--   {"FORMED", formed_at}       it formed (formed_at in unix ms, 0 if not recorded); nothing changes
--   {"NOT_DUE"}                 OPEN and the deadline has not passed: nothing changes
--   {"FAILED", id1, id2, ...}   now FAILED (no more joins); the ids holding its slots
if redis.call('EXISTS', KEYS[1]) == 0 then return {'UNKNOWN'} end
local g = redis.call('HMGET', KEYS[1], 'status', 'deadline', 'formed_at')
if g[1] == 'FORMED' then return {'FORMED', g[3] or '0'} end
if g[1] == 'OPEN' then
  if clock_ms(ARGV[1]) < tonumber(g[2]) then return {'NOT_DUE'} end
  redis.call('HSET', KEYS[1], 'status', 'FAILED')
end
local out = redis.call('HVALS', KEYS[2])
table.insert(out, 1, 'FAILED')
return out
