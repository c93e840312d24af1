-- group_close.lua: fail a group so nobody can join it, and list who holds its slots.
--
-- KEYS[1] group hash  KEYS[2] members hash (user -> reservation id)
--
-- Returns the reservation ids of the members (empty when the group is unknown).
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HSET', KEYS[1], 'status', 'FAILED')
end
return redis.call('HVALS', KEYS[2])
