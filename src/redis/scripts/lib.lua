-- worker-registry: the prelude every script starts with (src/redis/scripts.rs prepends it).
--
-- KEYS[1] is the registry's test time offset key, `{name}:test_offset_ms`; ARGV[1] is the key
-- prefix `{name}:`. Every other key is built from the prefix, so all of a registry's keys share
-- the hash tag `{name}` and live on one Cluster slot.
--
-- Discipline: every script reads (and validates) everything first and writes afterwards, so that
-- an error (a corrupted key of the wrong type, a bug) aborts it before its first write and leaves
-- no partial state. Time is the server's TIME plus the test offset, in integer milliseconds.

local P = ARGV[1]
local K = {
  offset = KEYS[1],
  live = P .. 'live',               -- zset: live worker id -> staleness deadline (ms)
  drain = P .. 'drain',             -- zset: draining worker id -> drain deadline (ms)
  dead = P .. 'dead',               -- zset: dead worker id -> time of death (ms)
  targets = P .. 'targets',         -- hash: target -> id of its live worker (sticky map)
  next_id = P .. 'next_worker_id',  -- string: last worker id handed out
  inflight = P .. 'inflight',       -- zset: held claim member -> claimed at (ms)
  unbound = P .. 'unbound',         -- zset: bare claim member -> claimed at (ms)
  done = P .. 'done',               -- zset: completed claim member -> completed at (ms)
  rel_pending = P .. 'rel_pending', -- set: released claim members the next sweep hands out
  released = P .. 'released',       -- stream: released deliveries (group `dispatch`)
  deliveries = P .. 'deliveries',   -- zset: stream entry id -> when it was handed out (ms)
  events = P .. 'events',           -- pub/sub channel of lifecycle events
  event_seq = P .. 'event_seq',     -- string: last event sequence number
  snapshot = P .. 'snapshot',       -- string: the published status snapshot
  snapshot_version = P .. 'snapshot_version',
  lease = P .. 'sweep_lease',       -- string: "<owner>\t<expires at, registry ms>", with PX
  epoch = P .. 'epoch',             -- string: set once; changes only if the server lost the data
}

local function wkey(id) return P .. 'w:' .. id end
local function wckey(id) return P .. 'wc:' .. id end
local function ckey(member) return P .. 'c:' .. member end

-- An integer as decimal text (tostring would switch to exponent form past 14 digits).
local function I(n) return string.format('%d', n) end

-- Release reasons: 1-4 are the holder's dead reasons (missed heartbeats, exited, deregistered,
-- drain timed out), 5 stuck, 6 unbound.
local R_MISSED, R_EXITED, R_DEREGISTERED, R_DRAIN_TIMED_OUT = 1, 2, 3, 4
local RR_UNBOUND = 6

-- The largest worker id (ids fill the high 44 bits of a fencing token).
local MAX_ID = 17592186044415

local function clock()
  local t = redis.call('TIME')
  local off = tonumber(redis.call('GET', K.offset) or '0') or 0
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + off
end

-- Publishes one lifecycle event: its fields, tab-separated, after a registry-wide sequence number
-- (a subscriber that sees a gap knows how many it missed).
local function emit(fields)
  local seq = redis.call('INCR', K.event_seq)
  redis.call('PUBLISH', K.events, I(seq) .. '\t' .. table.concat(fields, '\t'))
end

-- Where a claim stands. `c` is HMGET <claim> h ca dn rel. Returns one of 'none', 'in_flight',
-- 'completed', 'released' (with the release reason) or 'expired'.
local function standing(c, now, retention_ms, unbound_ms)
  if not c[2] then return 'none' end
  if c[3] then
    if now - tonumber(c[3]) > retention_ms then return 'expired' end
    return 'completed'
  end
  if c[4] then return 'released', tonumber(c[4]) end
  if not c[1] and now - tonumber(c[2]) > unbound_ms then return 'released', RR_UNBOUND end
  return 'in_flight'
end

-- Drops every index entry of a claim that is about to be replaced or removed (its key included).
local function forget_claim(member, c)
  redis.call('DEL', ckey(member))
  redis.call('ZREM', K.inflight, member)
  redis.call('ZREM', K.unbound, member)
  redis.call('ZREM', K.done, member)
  redis.call('SREM', K.rel_pending, member)
  if c[1] then redis.call('SREM', wckey(c[1]), member) end
end

-- Reads what a worker's death will change (read phase).
local function prep_kill(id, target)
  local k = { id = id, target = target or '' }
  if target and target ~= '' then
    k.mapped = redis.call('HGET', K.targets, target) == id
  end
  k.members = redis.call('SMEMBERS', wckey(id))
  return k
end

-- The bookkeeping of a death (write phase): status, indexes, the target's mapping, the release of
-- the worker's in-flight claims, the event. Missed heartbeats keep the activity as it was.
local function do_kill(k, reason, now)
  if reason == R_MISSED then
    redis.call('HSET', wkey(k.id), 's', 2, 'r', reason, 'da', now, 'x', 0)
  else
    redis.call('HSET', wkey(k.id), 's', 2, 'r', reason, 'da', now, 'x', 0, 'b', 0)
  end
  redis.call('ZREM', K.live, k.id)
  redis.call('ZREM', K.drain, k.id)
  redis.call('ZADD', K.dead, now, k.id)
  if k.mapped then redis.call('HDEL', K.targets, k.target) end
  for _, m in ipairs(k.members) do
    redis.call('HSET', ckey(m), 'rel', reason)
    redis.call('ZREM', K.inflight, m)
    redis.call('SADD', K.rel_pending, m)
  end
  if #k.members > 0 then redis.call('DEL', wckey(k.id)) end
  emit({ 'X', k.id, k.target, I(reason) })
end

-- Reads where a target would be placed (read phase): on its active worker ('sticky'), refused
-- because that worker drains ('draining'), on a new worker ('new'), or refused for capacity ('full').
local function plan_place(target, max_workers)
  local plan = {}
  local wid = redis.call('HGET', K.targets, target)
  if wid then
    local w = redis.call('HMGET', wkey(wid), 's', 'n')
    if w[1] == '0' then return { kind = 'sticky', id = wid, n = tonumber(w[2]) or 0 } end
    if w[1] == '1' then return { kind = 'draining', id = wid } end
    plan.stale_mapping = true -- mapped to a dead or missing worker: the slot is vacant
  end
  if redis.call('ZCARD', K.live) >= max_workers then
    plan.kind = 'full'
    return plan
  end
  local last = tonumber(redis.call('GET', K.next_id) or '0') or 0
  if last + 1 > MAX_ID then
    plan.kind = 'full' -- as in memory: an assignment that cannot create a worker is refused
    return plan
  end
  plan.kind = 'new'
  return plan
end

-- Carries a placement out (write phase). Returns the worker id (text), its assignment count and
-- 1 if the worker was created by it, else 0.
local function do_place(plan, target, now, first_deadline)
  if plan.kind == 'sticky' then
    local n = redis.call('HINCRBY', wkey(plan.id), 'n', 1)
    redis.call('HSET', wkey(plan.id), 'b', 1)
    return plan.id, n, 0
  end
  local id = I(redis.call('INCR', K.next_id))
  redis.call('HSET', wkey(id), 's', 0, 'b', 1, 'x', 0, 'bt', 0, 'hb', now, 'c', now, 'n', 1, 't', target)
  redis.call('ZADD', K.live, first_deadline, id)
  redis.call('HSET', K.targets, target, id)
  emit({ 'C', id, target })
  return id, 1, 1
end

-- A refused placement: drop a mapping to a dead worker (there is none normally: deaths unmap).
local function refuse_place(plan, target)
  if plan.stale_mapping then redis.call('HDEL', K.targets, target) end
  if plan.kind == 'draining' then return { 'rejected', 'draining', plan.id } end
  return { 'rejected', 'capacity', '' }
end

-- A worker's fields as one tab-separated line: id t s b x bt r hb c n dd da (see codec.rs).
local WORKER_FIELDS = { 't', 's', 'b', 'x', 'bt', 'r', 'hb', 'c', 'n', 'dd', 'da' }
local function read_worker(id)
  return redis.call('HMGET', wkey(id), unpack(WORKER_FIELDS))
end
local function encode_worker(id, f)
  local out = { id }
  for i = 1, #WORKER_FIELDS do out[i + 1] = f[i] or '' end
  return table.concat(out, '\t')
end
