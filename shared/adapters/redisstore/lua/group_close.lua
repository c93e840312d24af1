-- group_close.lua: end a group once its deadline passed by Redis's clock. Prefixed with clock.lua.
-- A group whose slots are all taken at the deadline is FULL: MySQL decides whether it FORMED.
--
-- KEYS[1] group hash  KEYS[2] members hash (user -> reservation id)
-- ARGV[1] now (unix ms; "" = Redis's clock)
--
-- Returns
--   {"UNKNOWN"}                 Redis has no such group (lost, or retention passed)
--   {"FORMED", formed_at}       it formed (formed_at in unix ms, 0 if not recorded); nothing changes
--   {"NOT_DUE"}                 OPEN and the deadline has not passed: nothing changes
--   {"FULL", full_at}           OPEN, past the deadline, every slot taken: nothing changes (the
--                               caller records FORMED in MySQL, then group_form.lua)
--   {"FAILED", id1, id2, ...}   now FAILED (no more joins); the ids holding its slots
if redis.call('EXISTS', KEYS[1]) == 0 then return {'UNKNOWN'} end
local g = redis.call('HMGET', KEYS[1], 'status', 'deadline', 'formed_at')
if g[1] == 'FORMED' then return {'FORMED', g[3] or '0'} end
if g[1] == 'OPEN' then
  if clock_ms(ARGV[1]) < tonumber(g[2]) then return {'NOT_DUE'} end
  if tonumber(redis.call('HGET', KEYS[1], 'remaining')) <= 0 then
    return {'FULL', redis.call('HGET', KEYS[1], 'full_at') or '0'}
  end
  redis.call('HSET', KEYS[1], 'status', 'FAILED')
end
local out = redis.call('HVALS', KEYS[2])
table.insert(out, 1, 'FAILED')
return out
