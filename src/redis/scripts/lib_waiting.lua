-- worker-registry: the waiting room's helpers (after lib_workers.lua; see docs::redis, "The
-- waiting room"). Only the room-on decisions (admit_waiting.lua, waiting.lua) and a death
-- (`waiting_on_kill`, called by do_kill) reach them; with the room off a death pays one HMGET of
-- a missing key and nothing else.
--
-- Keys (all in the registry's hash slot):
--   room        hash  the room's settings, written by every room-on handle (connect, each sweep):
--                     mw max_workers, to timeout, gr grace, mf max_in_flight, re retention,
--                     cap max_workers_per_owner, mx max_waiting (a death reads them to promote)
--   wseq        string  arrival counter: orders deliveries, targets and owners' turns
--   worder      zset  "<target>:<delivery>" -> parked at (ms): every waiting delivery (ZCARD is
--                     the room's size, ZSCORE a redelivery's check, the lowest scores expire)
--   wd:<target> zset  a waiting target's deliveries -> arrival number (its queue, in order)
--   wt          hash  waiting target -> where it waits: 'q' its owner's queue, 'r' ready (its
--                     draining worker died: first in line), 'b:<id>' behind draining worker <id>
--   wo:<owner>  zset  the owner's targets waiting for capacity -> arrival number
--   wring       zset  owners with a target in wo:<owner> -> their turn (round-robin: the lowest
--                     is next; a served owner gets a fresh turn, at the back)
--   wready      zset  ready targets -> the order their draining worker died in
--   wb:<id>     set   targets waiting behind draining worker <id> (its death makes them ready)
--   wpo         hash  owner -> its waiting deliveries (max_waiting_per_owner)
--   olive       hash  owner -> its live workers counted against max_workers_per_owner; a counted
--                     worker's hash holds its owner in `o`

-- The repository owner of a target (`owner/repo#n`): the part before the first '/'.
local function owner_of(t) return string.match(t, '^([^/]*)/') or t end
local function wdkey(t) return P .. 'wd:' .. t end
local function wokey(o) return P .. 'wo:' .. o end
local function wbkey(id) return P .. 'wb:' .. id end

-- Release reason code of a promoted delivery in the released stream: the entry's `r` is
-- '7:<assignments>:<new>' (the assignment the promotion made; codec.rs decodes it).
local RR_PROMOTED = 7

-- The room's settings as a table, from the decision's arguments (waiting.lua, admit_waiting.lua)
-- or from `room` (a death); nil if no room-on handle ever wrote them.
local function room_cfg(a)
  if not a then
    a = redis.call('HMGET', K.room, 'mw', 'to', 'gr', 'mf', 're', 'cap', 'mx', 'po')
    if not a[1] then return nil end
  end
  return { mw = tonumber(a[1]), to = tonumber(a[2]), gr = tonumber(a[3]), mf = tonumber(a[4]),
    re = tonumber(a[5]), cap = tonumber(a[6]), mx = tonumber(a[7]), po = tonumber(a[8]) }
end
local function store_cfg(cfg)
  redis.call('HSET', K.room, 'mw', cfg.mw, 'to', cfg.to, 'gr', cfg.gr, 'mf', cfg.mf, 're', cfg.re,
    'cap', cfg.cap, 'mx', cfg.mx, 'po', cfg.po)
end

-- Whether the owner holds its cap of live workers (cap 0: no cap).
local function owner_full(cfg, o)
  return cfg.cap > 0 and (tonumber(redis.call('HGET', K.olive, o) or '0') or 0) >= cfg.cap
end
-- Counts a new worker `id` of target `t` against its owner (when capped).
local function owner_count(cfg, t, id)
  if cfg.cap == 0 then return end
  local o = owner_of(t)
  redis.call('HINCRBY', K.olive, o, 1)
  redis.call('HSET', wkey(id), 'o', o)
  store_cfg(cfg) -- its death reads them to give the slot back
end

-- Whether targets wait for capacity (arrivals that would create a worker queue behind them).
local function contenders() return redis.call('EXISTS', K.wring, K.wready) > 0 end

-- Parks `d` of target `t` (behind draining worker `blocker`, or for capacity): 'at', position |
-- 'full' (the room, or the owner's share of it). The caller checked that the pair is not waiting.
local function park(cfg, t, d, blocker, now)
  local o = owner_of(t)
  local total = redis.call('ZCARD', K.worder)
  local mine = tonumber(redis.call('HGET', K.wpo, o) or '0') or 0
  if total >= cfg.mx or mine >= cfg.po then return 'full' end
  local place = redis.call('HGET', K.wt, t)
  local seq = redis.call('INCR', K.wseq)
  redis.call('ZADD', K.worder, now, t .. ':' .. d)
  redis.call('ZADD', wdkey(t), seq, d)
  redis.call('HINCRBY', K.wpo, o, 1)
  if not place then
    -- A new waiting target (one that waits already keeps its place: the delivery joins its queue).
    if blocker then
      redis.call('HSET', K.wt, t, 'b:' .. blocker)
      redis.call('SADD', wbkey(blocker), t)
    else
      redis.call('HSET', K.wt, t, 'q')
      redis.call('ZADD', wokey(o), seq, t)
      redis.call('ZADD', K.wring, 'NX', seq, o)
    end
  end
  return 'at', total + 1
end

-- One waiting delivery leaves the room (promoted, expired, or claimed meanwhile).
local function room_drop(t, d)
  redis.call('ZREM', K.worder, t .. ':' .. d)
  redis.call('ZREM', wdkey(t), d)
  local o = owner_of(t)
  if redis.call('HINCRBY', K.wpo, o, -1) <= 0 then redis.call('HDEL', K.wpo, o) end
end

-- Target `t` leaves its line (`place`, as in `wt`); with `served`, its owner's turn moves to the
-- back of the ring (a target left only because its last delivery expired keeps the turn).
local function leave_line(t, place, served)
  if place == 'r' then
    redis.call('ZREM', K.wready, t)
  elseif place == 'q' then
    local o = owner_of(t)
    redis.call('ZREM', wokey(o), t)
    if redis.call('EXISTS', wokey(o)) == 0 then
      redis.call('ZREM', K.wring, o)
    elseif served then
      redis.call('ZADD', K.wring, redis.call('INCR', K.wseq), o)
    end
  elseif place and string.sub(place, 1, 2) == 'b:' then
    redis.call('SREM', wbkey(string.sub(place, 3)), t)
  end
end

-- The next target to promote, skipping the first `sr` ready ones and `sq` owners (set aside: their
-- owner is at its cap): a ready target, else the oldest target of the owner whose turn is next.
local function candidate(sr, sq)
  local r = redis.call('ZRANGE', K.wready, sr, sr)
  if r[1] then return r[1], 'r' end
  local o = redis.call('ZRANGE', K.wring, sq, sq)
  if not o[1] then return nil end
  local t = redis.call('ZRANGE', wokey(o[1]), 0, 0)
  if t[1] then return t[1], 'q' end
  redis.call('ZREM', K.wring, o[1]) -- not reached: an owner leaves the ring with its last target
  return candidate(sr, sq)
end

-- Makes sure the released stream has its consumer group before an entry is added.
local function ensure_group()
  if redis.call('EXISTS', K.released) == 0 then
    redis.call('XGROUP', 'CREATE', K.released, 'dispatch', '0', 'MKSTREAM')
  end
end

-- Promotes waiting target `t` (at `place`): each of its deliveries, in order, placed on one worker
-- and handed over through the released stream. 'done' | 'skip' (its owner is at its cap and it
-- has no live worker) | 'blocked' (its worker drains: it waits behind it now) | 'full'.
local function promote_target(cfg, t, place, now)
  local ds = redis.call('ZRANGE', wdkey(t), 0, -1) -- at most max_waiting_per_owner
  for _, d in ipairs(ds) do repeat -- (`break` below: on to the next delivery)
    local member = t .. ':' .. d
    -- A pair claimed meanwhile (a bare claim) is that claim's now: it leaves the room, as a
    -- redelivery placed meanwhile does in memory, whether or not there is room.
    local c = redis.call('HMGET', ckey(member), 'h', 'ca', 'dn', 'rel')
    local st = standing(c, now, cfg.re, cfg.to)
    if st == 'in_flight' or st == 'completed' then
      room_drop(t, d)
      break
    end
    local plan = plan_place(t, cfg.mw, now)
    if plan.kind == 'new' and owner_full(cfg, owner_of(t)) then return 'skip' end
    if plan.kind == 'draining' then
      leave_line(t, place, true)
      redis.call('HSET', K.wt, t, 'b:' .. plan.id)
      redis.call('SADD', wbkey(plan.id), t)
      return 'blocked'
    end
    if plan.kind ~= 'sticky' and plan.kind ~= 'new' then
      if plan.stale_mapping then redis.call('DEL', tkey(t)) end
      return 'full'
    end
    if st ~= 'none' then forget_claim(member, c) end
    local id, n, new = do_place(plan, t, now, now + cfg.to + cfg.gr, member)
    if new == 1 then owner_count(cfg, t, id) end
    redis.call('HSET', ckey(member), 'h', id, 'ca', now)
    redis.call('ZADD', K.flight, now, member)
    ensure_group()
    redis.call('XADD', K.released, '*', 't', t, 'd', d, 'h', id,
      'r', RR_PROMOTED .. ':' .. I(n) .. ':' .. new)
    emit({ 'P', id, t, d, new })
    room_drop(t, d)
  until true end
  leave_line(t, place, true)
  redis.call('HDEL', K.wt, t)
  return 'done'
end

-- The most targets one promotion sets aside (their owner at its cap) before it stops.
local MAX_SKIPS = 32

-- Promotes the oldest waiting targets that fit, ready ones first, then one per owner in turn, up
-- to `max` targets placed (and MAX_SKIPS set aside). Returns how many were placed and whether
-- more may fit (a bound was reached).
local function fill(cfg, now, max)
  local sr, sq, placed, skipped = 0, 0, 0, 0
  while true do
    if placed >= max or skipped >= MAX_SKIPS then return placed, true end
    local t, place = candidate(sr, sq)
    if not t then return placed, false end
    local r = promote_target(cfg, t, place, now)
    if r == 'full' then return placed, false end
    if r == 'skip' then
      skipped = skipped + 1
      if place == 'r' then sr = sr + 1 else sq = sq + 1 end
    elseif r == 'done' then
      placed = placed + 1
    end
  end
end

-- The death of worker k.id (do_kill's hook): its owner's live count goes down, the targets waiting
-- behind it are ready (first in line, in the order of the deaths), and the decision's `finish`
-- promotes into the freed slots (`waiting_settle`), after the decision's own writes (a sweep
-- step or a drain kills several workers from what it read first: nothing is placed on a worker
-- before its death is written). WAIT_PENDING is the prefix of the call whose deaths freed
-- WAIT_FREED slots.
local WAIT_PENDING, WAIT_FREED = nil, 0
waiting_on_kill = function(k, now)
  local cfg = room_cfg()
  if not cfg then return end
  if k.target ~= '' then
    local o = redis.call('HGET', wkey(k.id), 'o')
    if o and redis.call('HINCRBY', K.olive, o, -1) <= 0 then redis.call('HDEL', K.olive, o) end
  end
  local behind = redis.call('SMEMBERS', wbkey(k.id))
  for _, t in ipairs(behind) do
    if redis.call('HGET', K.wt, t) == 'b:' .. k.id then
      redis.call('HSET', K.wt, t, 'r')
      redis.call('ZADD', K.wready, redis.call('INCR', K.wseq), t)
    end
  end
  if #behind > 0 then redis.call('DEL', wbkey(k.id)) end
  if WAIT_PENDING ~= P then WAIT_PENDING, WAIT_FREED = P, 0 end
  WAIT_FREED = WAIT_FREED + 1
end

-- Called by `finish`: the deaths of this call freed slots; one target is promoted into each (with
-- its deliveries: max_waiting_per_owner bounds them). A sweep's catch-up step promotes the rest.
waiting_settle = function()
  if not WAIT_PENDING then return end
  local mine, freed = WAIT_PENDING == P, WAIT_FREED
  WAIT_PENDING, WAIT_FREED = nil, 0
  if not mine then return end -- left by a call that failed before its finish
  local cfg = room_cfg()
  if cfg and cfg.mx > 0 and contenders() then fill(cfg, clock(), freed) end
end
