-- warm.lua: load a SKU's bucket Redis has no stock for from one consistent MySQL read, counting every unit
-- once: MySQL's available has the confirmed units out already, held has every HELD hold in.
-- Prefixed with clock.lua.
--
-- KEYS[1] stock  KEYS[2] meta (held, cver, unpaid)  KEYS[3..2+h] the h holds that were HELD before MySQL
-- was read  KEYS[3+h] unpaid (hash: id -> qty, follow.lua's)  KEYS[4+h..] the holds of MySQL's unpaid rows
-- ARGV[1] MySQL available  ARGV[2] MySQL version  ARGV[3] per-user limit  ARGV[4] MySQL admin delta
-- ARGV[5] per-user attempts per second  ARGV[6] burst (0: the service's defaults)
-- ARGV[7] the SKU's bucket count K (meta.k)
-- ARGV[8] ARGV[9] the sale window: opens, closes (unix ms; 0 = no such bound)
-- ARGV[10] the waiting room: buyers admitted per unit left, in thousandths (0 = no waiting room)
-- ARGV[11] h, how many HELD holds are listed
-- ARGV[12] now (unix ms; "" = Redis's clock)
-- ARGV[13] whole for (ms): this is the warm-up of the change that created the SKU (no hold of it can
--          exist yet), MySQL's read had no reservation of it and K is 1, so from now on this bucket
--          holds every reservation of the SKU; the holds' retention (whole seconds, as their TTL),
--          after which a finished one may be gone (0: not whole)
-- ARGV[12+2i] ARGV[13+2i]  for KEYS[2+i], i = 1..h: "1" and the token if MySQL's read had its row
--                         CONFIRMED, "0" and "" if MySQL had no decision for it
-- ARGV[12+2h+2j] ARGV[13+2h+2j]  for KEYS[3+h+j], j = 1..: the id and qty of a row MySQL's read had
--                         CONFIRMED, unpaid, within a pay window (it may return)
--
-- Returns
--   0  the stock exists: nothing changed
--   3  stale: a hold moved between MySQL's read and now (an undecided one was confirmed or
--      released, a confirmed one refunded), or a confirm of a newer version (meta.cver) already
--      left held: the level would miss or repeat it; nothing changed, read again
--   1  warmed: stock = available - held + the qty of the listed holds MySQL confirmed that are
--      still HELD with MySQL's token (their confirm not in Redis yet; a HELD hold of another token
--      is a stray and stays counted as held); meta.wver = version, so a refund MySQL made at or
--      before it is not given back again, and a confirm after it is taken (follow.lua); meta.ahead = 0
--      and meta.wn + 1: units credited ahead of a transfer's record are not in MySQL's level, so the
--      record's credit adds them again (credit.lua); unpaid = MySQL's unpaid rows, but those whose
--      hold Redis has paid or CANCELLED (settled after the read), meta.unpaid their units; meta.whole =
--      now and meta.wholefor = ARGV[13] when whole, and no meta.decided (reserve.lua: docs/design.md,
--      "A bucket that holds every id"), else meta.whole = 0
-- While the stock key is missing no reserve can take a hold (reserve.lua answers UNKNOWN_SKU), so
-- the listed holds are all the HELD ones.
local available, version, limit, delta = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
if tonumber(redis.call('HGET', KEYS[2], 'cver') or '0') > version then return 3 end
local held = tonumber(redis.call('HGET', KEYS[2], 'held') or '0')
local nh = tonumber(ARGV[11])
for i = 3, 2 + nh do
  local confirmed, token = ARGV[2 * i + 8] == '1', ARGV[2 * i + 9]
  local h = redis.call('HMGET', KEYS[i], 'state', 'qty', 'token')
  if confirmed then
    if h[1] == 'HELD' and (token == '' or h[3] == token) then
      held = held - tonumber(h[2])
    elseif h[1] == 'HELD' then
      -- a stray (another token): MySQL never took its units; counted as held, like an undecided one
    elseif h[1] ~= 'CONFIRMED' then
      return 3
    end
  elseif h[1] ~= 'HELD' then
    return 3
  end
end
local whole, wholefor = 0, tonumber(ARGV[13])
if wholefor > 0 then whole = clock_ms(ARGV[12]) end
redis.call('SET', KEYS[1], available - held)
redis.call('HSET', KEYS[2], 'ver', version, 'added', delta, 'limit', limit, 'wver', version, 'rate', ARGV[5], 'burst', ARGV[6], 'k', ARGV[7],
  'opens', ARGV[8], 'closes', ARGV[9], 'room', ARGV[10], 'ahead', 0, 'whole', whole, 'wholefor', wholefor)
if whole > 0 then redis.call('HDEL', KEYS[2], 'decided') end -- no finished hold of the SKU yet
redis.call('HINCRBY', KEYS[2], 'wn', 1)
local unpaid, units = KEYS[3 + nh], 0
redis.call('DEL', unpaid)
for j = 1, #KEYS - 3 - nh do
  local id, n = ARGV[12 + 2 * nh + 2 * j], tonumber(ARGV[13 + 2 * nh + 2 * j])
  local h = redis.call('HMGET', KEYS[3 + nh + j], 'state', 'paid')
  if h[1] ~= 'CANCELLED' and not h[2] then
    redis.call('HSET', unpaid, id, n)
    units = units + n
  end
end
redis.call('HSET', KEYS[2], 'unpaid', units)
return 1
