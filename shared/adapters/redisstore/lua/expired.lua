-- expired.lua: the holds whose deadline passed, by Redis's clock. Prefixed with clock.lua.
--
-- KEYS[1] exp  sorted set: reservation id -> hold deadline (unix ms)
-- ARGV[1] grace (ms): a deadline counts as passed only this long after it
-- ARGV[2] limit  ARGV[3] now (unix ms; "" = Redis's clock)
--
-- Returns up to limit reservation ids, earliest deadline first.
local cutoff = clock_ms(ARGV[3]) - tonumber(ARGV[1])
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', cutoff, 'LIMIT', 0, tonumber(ARGV[2]))
