-- group_form.lua: mark a group FORMED once MySQL has recorded it (final).
--
-- KEYS[1] group hash
-- ARGV[1] formed_at (unix ms)
--
-- Returns 1 if the group is FORMED now (or was), 0 if Redis has no such group or it FAILED.
-- No slot is left to take: remaining = 0 (a member who left after MySQL formed it does not
-- reopen one).
local st = redis.call('HGET', KEYS[1], 'status')
if not st or st == 'FAILED' then return 0 end
if st == 'OPEN' then
  redis.call('HSET', KEYS[1], 'status', 'FORMED', 'formed_at', ARGV[1], 'remaining', 0)
end
return 1
