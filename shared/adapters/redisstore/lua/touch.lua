-- touch.lua: mark a SKU live until ttl after now; a later mark stands. Prefixed with clock.lua.
-- The sweeper visits every live SKU each sweep (docs/design.md, "The sweeper's reach").
--
-- KEYS[1] live  sorted set: sku -> the mark's end (unix ms); its own {hash tag}, one per ledger
-- ARGV[1] sku  ARGV[2] ttl (ms)  ARGV[3] now (unix ms; "" = Redis's clock)
--
-- Returns the mark's end (unix ms), the later of the one recorded and now + ttl.
local mark_end = clock_ms(ARGV[3]) + tonumber(ARGV[2])
local cur = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]) or '0')
if cur >= mark_end then return cur end
redis.call('ZADD', KEYS[1], mark_end, ARGV[1])
return mark_end
