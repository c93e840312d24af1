-- group_accept.lua: mark a join's hold accepted once its message is sent (the buyer is told
-- 202), so that its group can tell the slots of accepted joins from those of joins whose send
-- is still in flight (which may yet fail and give their slot back).
--
-- KEYS[1] hold  KEYS[2] group hash
-- ARGV[1] token of the hold the message carries
--
-- Returns the group's free slots (remaining) after marking, or -1 if Redis has no such group.
-- Idempotent: a hold already marked, decided, or of another token is left as it is.
local h = redis.call('HMGET', KEYS[1], 'state', 'token')
if h[1] == 'HELD' and h[2] == ARGV[1] then
  redis.call('HSET', KEYS[1], 'sent', 1)
end
local remaining = redis.call('HGET', KEYS[2], 'remaining')
if not remaining then return -1 end
return tonumber(remaining)
