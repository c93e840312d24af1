-- follow.lua: make a hold follow MySQL's decided row, exactly once. Redis never gives
-- stock back on its own authority: every give-back here is the effect of one MySQL
-- transition (a fence or a refund) or the return of a stray that MySQL never took.
--
-- KEYS[1] stock  KEYS[2] meta  KEYS[3] exp  KEYS[4] users  KEYS[5] hold
-- KEYS[6] group  KEYS[7] members   (as in reserve.lua; group keys are placeholders when no group)
-- KEYS[8] group  KEYS[9] members   of the group ARGV[16] names (placeholders when it names none)
-- KEYS[10] unpaid  hash: id -> qty of the CONFIRMED reservations unpaid within a pay window (units
--          that may return; meta.unpaid sums them)
-- ARGV[1] sku  ARGV[2] reservation id  ARGV[3] token of the hold MySQL decided ("" for a row
--   written before tokens existed: it matches any hold)
-- ARGV[4] qty  ARGV[5] user  ARGV[6] group id          (the row's)
-- ARGV[7] status: CONFIRMED or CANCELLED  ARGV[8] refunded "1"/"0"
-- ARGV[9] released "1"/"0" (0: the row's give-back is not acknowledged in MySQL yet)
-- ARGV[10] reason  ARGV[11] retention seconds for the finished hold
-- ARGV[12] the stock row's version after a CONFIRMED commit (0: unknown)
-- ARGV[13] the stock row's version right after a refund (0: none)
-- ARGV[14] now (unix ms; "" = Redis's clock): a group's slot reopens only before its deadline
-- ARGV[15] "1": the row's join never counted among its group's slots (its send or Redis call failed
--          at reserve, MySQL refused it as not joining the group): its slot reopens even after
--          the deadline, while the group is OPEN (reservation.Reason.CountsInGroup); so does the
--          slot of a join whose hold expired unsent (no field sent: group_accept.lua never ran)
-- ARGV[16] the group of a stray this call may find in another group than the row's ("": none
--          named; the caller names it after a reply {3, group})
-- ARGV[17] the row's pay_by (unix ms; 0: no pay window, or paid)  ARGV[18] paid "1"/"0"
-- Prefixed with clock.lua.
--
-- Returns 1 if this call returned stock, 0 otherwise, 2 if it cannot follow yet: a refund whose
-- stock must come back while Redis has no stock for the SKU (warm it first; nothing changed),
-- {3, group} if the hold is a HELD stray of another group than the row's and ARGV[16] does not
-- name it (nothing changed: call again naming that group, KEYS[8] and KEYS[9] its keys).
--   a hold of another token  -> a stray (Redis took the id again after forgetting the decided
--                               hold): returned if HELD, then replaced by the row's tombstone;
--                               a HELD stray of another group than the row's frees its slot and
--                               member entry there while that group is OPEN, deadline or not
--                               (MySQL never took it: its join never counted)
--   CONFIRMED: HELD          -> CONFIRMED, its units leave held; meta.cver = version
--   CONFIRMED, hold missing (Redis lost it), a commit newer than the level the stock was warmed
--   from (version > meta.wver)  -> the units are taken from stock now (Redis never took them);
--   with no stock figure at all  -> meta.cver = version, so a warm-up from a level before the
--                                   commit is refused as stale and reads MySQL again
--   CANCELLED: HELD          -> CANCELLED, stock, per-user units and group slot returned (the slot
--                               only to a group still OPEN, and before its deadline unless the join
--                               never counted: after formation or the deadline the group is decided
--                               as it stood at its deadline, and no slot of a counted join reopens)
--   CANCELLED refunded, hold CONFIRMED or missing, released "0", not yet applied for this token
--                            -> stock and per-user units returned (a formed group keeps its slot),
--                               unless the stock was warmed from a level at or past the refund
--                               (meta.wver >= ARGV[13]): that level has the units already
--   anything else            -> nothing moves; a missing hold becomes a tombstone of the row
-- A tombstone (written here for a missing hold, or in a returned stray's place) has deadline and
-- created 0: it is a copy of the row, not a hold this bucket took, and reserve.lua's REPLAY of it
-- tells the caller so (created 0), who asks MySQL: a later change of the row (a refund) is followed
-- in the row's own bucket, which need not be this one (a stray's or a twin's, after K was raised).
-- A transfer's row (user "") is followed in its giving bucket like a buy without a user: no
-- per-user units move, and its units leave meta.moving (takeout.lua) with held, unless they
-- left it already when the receiving bucket was credited (landed.lua: the hold's landed field).
-- Unpaid: a CONFIRMED row with a pay_by, unpaid, enters KEYS[10] when its hold leaves HELD (or is
-- missing, or is CONFIRMED and not marked paid: confirmed before Redis counted unpaid units); a
-- paid or CANCELLED row leaves it. Both once (HSETNX, HDEL), with meta.unpaid.
-- Idempotent: the hold's state and its rel field (the token whose release was applied)
-- make a repeat a no-op; MySQL's released flag ends the retries. A stray is replaced when
-- it is returned, so a repeat finds the row's tombstone and frees no slot again.
local sku, id, token = ARGV[1], ARGV[2], ARGV[3]
local qty, user, gid = tonumber(ARGV[4]), ARGV[5], ARGV[6]
local status, refunded, released = ARGV[7], ARGV[8] == '1', ARGV[9] == '1'
local reason, retention, version = ARGV[10], tonumber(ARGV[11]), tonumber(ARGV[12])
-- retain: a finished hold (or tombstone) stays the retention from now; meta.decided is when this
-- bucket first gave one its TTL (so none of them can be gone before decided + retention:
-- reserve.lua's whole).
local function retain()
  if redis.call('HEXISTS', KEYS[2], 'decided') == 0 then
    redis.call('HSET', KEYS[2], 'decided', clock_ms(ARGV[14])) -- read before the TTL is set
  end
  redis.call('EXPIRE', KEYS[5], retention)
end
local refund_version = tonumber(ARGV[13])

local never_counted = ARGV[15] == '1' -- set below for an expired hold never sent

-- unpaid_add and unpaid_remove keep KEYS[10] and meta.unpaid together, each change once.
local function unpaid_add()
  if redis.call('HSETNX', KEYS[10], id, qty) == 1 then redis.call('HINCRBY', KEYS[2], 'unpaid', qty) end
end
local function unpaid_remove()
  local n = redis.call('HGET', KEYS[10], id)
  if n then
    redis.call('HDEL', KEYS[10], id)
    redis.call('HINCRBY', KEYS[2], 'unpaid', -tonumber(n))
  end
end

-- reopen frees who's slot of the group whose hash is gkey (members mkey) if the member entry
-- names this id and the group is OPEN: before its deadline, or at any time when never.
local function reopen(gkey, mkey, who, never)
  if redis.call('HGET', mkey, who) ~= id then return end
  local g = redis.call('HMGET', gkey, 'status', 'deadline')
  if g[1] == 'OPEN' and (never or clock_ms(ARGV[14]) < tonumber(g[2])) then
    redis.call('HDEL', mkey, who)
    redis.call('HINCRBY', gkey, 'remaining', 1)
    redis.call('HDEL', gkey, 'full_at')
  end
end

local function give_back(n, who, group, counted)
  if not counted and redis.call('EXISTS', KEYS[1]) == 1 then redis.call('INCRBY', KEYS[1], n) end
  if who ~= '' and redis.call('HINCRBY', KEYS[4], who, -n) <= 0 then redis.call('HDEL', KEYS[4], who) end
  if group ~= '' and group == gid then reopen(KEYS[6], KEYS[7], who, never_counted) end
end

local in_transit = false -- the hold is a transfer's (field into) whose units have not landed: set below
local function unhold(n)
  redis.call('HINCRBY', KEYS[2], 'held', -n)
  if in_transit then redis.call('HINCRBY', KEYS[2], 'moving', -n) end
  redis.call('ZREM', KEYS[3], id)
end

local returned = 0
local h = redis.call('HMGET', KEYS[5], 'state', 'qty', 'user', 'group', 'token', 'rel', 'into', 'sent', 'landed', 'paid')
in_transit = h[7] ~= false and h[7] ~= nil and not h[9]
if reason == 'expired' and h[1] == 'HELD' and not h[8] then never_counted = true end
local state = h[1]
if state and token ~= '' and (h[5] or '') ~= token then
  if state == 'HELD' then
    local n, elsewhere = tonumber(h[2]), h[4] or ''
    if elsewhere == gid then elsewhere = '' end -- the stray's group is the row's (or none)
    if elsewhere ~= '' and elsewhere ~= ARGV[16] then return {3, elsewhere} end
    unhold(n)
    give_back(n, h[3], h[4] or '')
    if elsewhere ~= '' then reopen(KEYS[8], KEYS[9], h[3], true) end
    returned = 1
  end
  redis.call('DEL', KEYS[5])
  state = nil
end

if status == 'CANCELLED' and refunded and not released and (state == 'CONFIRMED' or not state)
    and not (state and h[6] == token) and redis.call('EXISTS', KEYS[1]) == 0 then
  return 2
end

if status == 'CANCELLED' or ARGV[18] == '1' then unpaid_remove() end
if status == 'CONFIRMED' and ARGV[18] ~= '1' and tonumber(ARGV[17]) > 0
    and (state == 'HELD' or not state or (state == 'CONFIRMED' and not h[10])) then
  unpaid_add()
end

if not state then
  redis.call('HSET', KEYS[5], 'sku', sku, 'qty', qty, 'user', user, 'group', gid, 'token', token,
    'state', status, 'deadline', 0, 'created', 0)
end

if status == 'CONFIRMED' then
  if not state and version > 0 and redis.call('EXISTS', KEYS[1]) == 1
      and version > tonumber(redis.call('HGET', KEYS[2], 'wver') or '0') then
    redis.call('DECRBY', KEYS[1], qty)
    if user ~= '' then redis.call('HINCRBY', KEYS[4], user, qty) end
  end
  if not state and version > 0 and redis.call('EXISTS', KEYS[1]) == 0
      and version > tonumber(redis.call('HGET', KEYS[2], 'cver') or '0') then
    -- Redis has no figure to take from: a warm-up may be reading MySQL right now, so it must
    -- not load a level from before this commit (warm.lua refuses a level older than cver)
    redis.call('HSET', KEYS[2], 'cver', version)
  end
  if state == 'HELD' then
    unhold(tonumber(h[2]))
    redis.call('HSET', KEYS[5], 'state', 'CONFIRMED')
    if version > tonumber(redis.call('HGET', KEYS[2], 'cver') or '0') then
      redis.call('HSET', KEYS[2], 'cver', version)
    end
  end
  if ARGV[18] == '1' then redis.call('HSET', KEYS[5], 'paid', '1') end -- warm.lua skips it in unpaid
  if state ~= 'CONFIRMED' then retain() end
  return returned
end

if state and h[6] == token then return returned end
if state == 'HELD' then
  local n = tonumber(h[2])
  unhold(n)
  give_back(n, h[3], h[4] or '')
  returned = 1
elseif refunded and not released and (state == 'CONFIRMED' or not state) then
  local counted = refund_version > 0 and tonumber(redis.call('HGET', KEYS[2], 'wver') or '0') >= refund_version
  give_back(qty, user, gid, counted)
  if not counted then returned = 1 end
end
redis.call('HSET', KEYS[5], 'state', 'CANCELLED', 'reason', reason, 'refunded', refunded and '1' or '0', 'rel', token)
retain()
return returned
