-- group_create.lua: open a group-buy with all its slots free.
--
-- KEYS[1] group hash  KEYS[2] meta of the SKU's bucket 0 (the group's): groups = 1 marks a SKU
-- with group-buys (a keyed buy held in another bucket then checks bucket 0 for its id)
-- ARGV[1] capacity  ARGV[2] deadline (unix ms)  ARGV[3] expire at (unix ms; deadline + retention)
--
-- Returns 1 if created, 0 if the group already existed (a repeat).
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'capacity', ARGV[1], 'remaining', ARGV[1], 'status', 'OPEN', 'deadline', ARGV[2])
redis.call('PEXPIREAT', KEYS[1], ARGV[3])
redis.call('HSET', KEYS[2], 'groups', 1)
return 1
