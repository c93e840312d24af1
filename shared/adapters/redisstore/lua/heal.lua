-- heal.lua: correct a SKU's Redis stock to MySQL's figure once a drift has
-- persisted, and only if Redis did not move since it was measured. Prefixed with clock.lua.
--
-- KEYS[1] stock  KEYS[2] meta (fields drift, drift_at: the last sighting)
-- ARGV[1] Redis available as measured  ARGV[2] held as measured
-- ARGV[3] drift (MySQL available - (available + held)); 0 clears the sighting
-- ARGV[4] how long the same drift must persist (ms)  ARGV[5] now (unix ms; "" = Redis's clock)
--
-- Returns 1 if the stock was moved by drift, 0 otherwise:
--   Redis moved since the measurement (a reserve, a release) -> forget the sighting; the next sweep re-measures
--   drift 0                                                  -> forget the sighting
--   a new drift value                                        -> record the sighting
--   the same drift, seen at least ARGV[4] ago                -> INCRBY stock drift, forget the sighting
local seen_avail, seen_held, drift = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local after, now = tonumber(ARGV[4]), clock_ms(ARGV[5])
local avail = tonumber(redis.call('GET', KEYS[1]) or 'nil')
local held = tonumber(redis.call('HGET', KEYS[2], 'held') or '0')
if avail ~= seen_avail or held ~= seen_held or drift == 0 then
  redis.call('HDEL', KEYS[2], 'drift', 'drift_at')
  return 0
end
local prev = tonumber(redis.call('HGET', KEYS[2], 'drift') or 'nil')
local prev_at = tonumber(redis.call('HGET', KEYS[2], 'drift_at') or 'nil')
if prev ~= drift or prev_at == nil then
  redis.call('HSET', KEYS[2], 'drift', drift, 'drift_at', now)
  return 0
end
if now - prev_at < after then return 0 end
redis.call('INCRBY', KEYS[1], drift)
redis.call('HDEL', KEYS[2], 'drift', 'drift_at')
return 1
