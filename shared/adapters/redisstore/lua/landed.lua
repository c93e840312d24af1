-- landed.lua: the giving side of a transfer hears that its units reached the receiving bucket
-- (credit.lua credited them there): they leave meta.moving, once, so that a refill no longer counts
-- them as on their way. The hold stays HELD (its units in meta.held) until MySQL records the
-- transfer and follow.lua confirms it. All keys share the giving bucket's {hash tag}.
--
-- KEYS[1] meta (moving)  KEYS[2] hold (of the transfer id)
-- ARGV[1] the transfer hold's token
--
-- Returns 1 if the units left meta.moving now; 0 if nothing moved: no HELD transfer hold of that
-- token, or it landed already (a repeat). follow.lua takes from meta.moving only the units of a
-- hold that has not landed.
local h = redis.call('HMGET', KEYS[2], 'state', 'token', 'qty', 'into', 'landed')
if h[1] ~= 'HELD' or h[2] ~= ARGV[1] or not h[4] or h[5] then return 0 end
redis.call('HINCRBY', KEYS[1], 'moving', -tonumber(h[3]))
redis.call('HSET', KEYS[2], 'landed', '1')
return 1
