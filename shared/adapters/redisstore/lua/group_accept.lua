-- group_accept.lua: mark a join's hold accepted once its message is sent, so that its group can
-- tell the slots of accepted joins from those of joins whose send is still in flight (which may
-- yet fail and give their slot back). A join is answered 202 only once this has marked it.
--
-- KEYS[1] hold  KEYS[2] group hash
-- ARGV[1] token of the hold the message carries
--
-- Returns {marked, remaining}:
--   marked     1 if the hold of this token is accepted now: HELD (marked by this call or before)
--              or CONFIRMED (persist was first); 0 if Redis has no such hold of this token, or it
--              is decided CANCELLED (the join is not accepted)
--   remaining  the group's free slots, or -1 if Redis has no such group
-- Idempotent: marking twice is marking once.
local h = redis.call('HMGET', KEYS[1], 'state', 'token')
local marked = 0
if h[2] == ARGV[1] then
  if h[1] == 'HELD' then
    redis.call('HSET', KEYS[1], 'sent', 1)
    marked = 1
  elseif h[1] == 'CONFIRMED' then
    marked = 1
  end
end
local remaining = redis.call('HGET', KEYS[2], 'remaining')
if not remaining then return {marked, -1} end
return {marked, tonumber(remaining)}
