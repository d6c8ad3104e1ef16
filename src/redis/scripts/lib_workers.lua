-- worker-registry: worker helpers (after lib_base.lua).
--
-- A worker's hash: s status (0 active, 1 draining, 2 dead), b busy, x suspect, bt has beaten,
-- r dead reason, hb last heartbeat (creation before the first), c created, n assignments (the
-- fencing token's low bits), t target (none for a registered worker), dd drain deadline, ds when
-- dd was last set (the stall walk in sweep.lua leaves a drain set after the stall alone), da died
-- at, ss suspect since. Its entry in `live` is a lower bound of its staleness deadline: a
-- heartbeat only writes the hash, and the sweep re-scores a worker it finds beaten since.
--
-- The beat index `beat` (zset id -> last beat, ms) holds exactly the workers that are active,
-- have beaten and are not suspect: their heartbeat is one ZADD there (heartbeat.lua), so that
-- their last beat is the later of `hb` and their score (the score is never below `hb`: every
-- write of `hb` to an indexed worker also raises its score). `read_worker` folds the score in;
-- a worker that stops being all three (a drain, a suspicion, a death) leaves the index with its
-- score written to `hb` (`unindex_beat`), in the decision that changes it. The publisher reads
-- the index by score past a cursor (publish.lua), as beats are not in `dirty`.

-- Dead reasons (as in worker_registry::DeadReason).
local R_MISSED, R_EXITED, R_DEREGISTERED, R_DRAIN_TIMED_OUT = 1, 2, 3, 4

-- A worker's in-flight claims (the '@<member>' fields of its hash, see lib_base.lua), oldest
-- first (ties by member: the order a sorted set by claim time gave).
local function claims_of(id)
  local all = redis.call('HGETALL', wkey(id))
  local found = {}
  for i = 1, #all, 2 do
    if string.byte(all[i], 1) == 64 then -- '@'
      found[#found + 1] = { string.sub(all[i], 2), all[i + 1] }
    end
  end
  table.sort(found, function(a, b)
    if a[2] ~= b[2] then return later_text(a[2], b[2]) == b[2] end
    return a[1] < b[1]
  end)
  local members = {}
  for i, f in ipairs(found) do members[i] = f[1] end
  return members
end

-- Deletes fields of a hash, a bounded number per command (`unpack` has a limit).
local function hdel_all(key, fields)
  for i = 1, #fields, 256 do
    redis.call('HDEL', key, unpack(fields, i, math.min(i + 255, #fields)))
  end
end

-- Reads what a worker's death will change (read phase).
local function prep_kill(id, target)
  local k = { id = id, target = target or '' }
  if target and target ~= '' then
    k.mapped = redis.call('GET', tkey(target)) == id
  end
  k.members = claims_of(id)
  k.stuck = redis.call('SMEMBERS', wskey(id))
  k.beat = redis.call('ZSCORE', K.beat, id)
  return k
end

-- Takes a worker out of the beat index (write phase), keeping its last beat (`beat`, its score
-- as read in the read phase; false or nil: not indexed, nothing to do) in its hash.
local function unindex_beat(id, beat)
  if beat then
    redis.call('HSET', wkey(id), 'hb', beat)
    redis.call('ZREM', K.beat, id)
  end
end

-- The bookkeeping of a death (write phase): status, indexes, the target's mapping, the release of
-- the worker's in-flight claims, the event. Missed heartbeats keep the activity as it was. Its
-- stuck tombstones (released already) are left for the next sweep to delete.
local function do_kill(k, reason, now)
  if reason == R_MISSED then
    redis.call('HSET', wkey(k.id), 's', 2, 'r', reason, 'da', now, 'x', 0)
  else
    redis.call('HSET', wkey(k.id), 's', 2, 'r', reason, 'da', now, 'x', 0, 'b', 0)
  end
  unindex_beat(k.id, k.beat)
  redis.call('ZREM', K.live, k.id)
  redis.call('ZREM', K.drain, k.id)
  redis.call('ZADD', K.dead, now, k.id)
  redis.call('ZADD', K.dirty, 0, k.id)
  if k.mapped then redis.call('DEL', tkey(k.target)) end
  local fields = {}
  for i, m in ipairs(k.members) do
    redis.call('HSET', ckey(m), 'rel', reason)
    redis.call('ZADD', K.released_due, 0, m)
    redis.call('ZREM', K.flight, m)
    fields[i] = claim_field(m)
  end
  hdel_all(wkey(k.id), fields)
  for _, m in ipairs(k.stuck) do redis.call('ZADD', K.stuck_due, 0, m) end
  if #k.stuck > 0 then redis.call('DEL', wskey(k.id)) end
  emit({ 'X', k.id, k.target, I(reason) })
  waiting_on_kill(k, now)
end

-- Reads where a target would be placed (read phase): on its active worker ('sticky'), refused
-- because that worker drains ('draining'), on a new worker ('new'), or refused for capacity ('full').
-- `max_workers` and `now` may be numbers or decimal text: the sticky plan, the hot one, reads
-- neither (its assignment count `n` stays text; see `clock_text`).
local function plan_place(target, max_workers, now)
  local plan = {}
  local wid = redis.call('GET', tkey(target))
  if wid then
    local w = redis.call('HMGET', wkey(wid), 's', 'n', 'bt')
    if w[1] == '0' then
      return { kind = 'sticky', id = wid, n = w[2], started = w[3] == '1' }
    end
    if w[1] == '1' then return { kind = 'draining', id = wid } end
    plan.stale_mapping = true -- mapped to a dead or missing worker: the slot is vacant
  end
  -- The live count, read once: a new worker makes it plan.live + 1 (its id is fresh).
  plan.live = redis.call('ZCARD', K.live)
  if plan.live >= tonumber(max_workers) then
    plan.kind = 'full'
    return plan
  end
  plan.id = next_id(tonumber(now))
  if plan.id > MAX_ID then
    plan.kind = 'full' -- as in memory: an assignment that cannot create a worker is refused
    return plan
  end
  plan.kind = 'new'
  return plan
end

-- Carries a placement out (write phase). Returns the worker id (text), its assignment count
-- (text for a sticky placement, a number for a new worker) and 1 if the worker was created by
-- it, else 0. The stored values are text (see `clock_text`); `now` may be a number or text.
-- With `member`, the placement claims it: the worker's write records the claim among its own
-- (`claim_field`; the caller writes the claim's hash and its `flight` entry).
-- The two branches spell each `HSET` out with and without the claim rather than build an argument
-- table to `unpack`, which would cost the hot sticky admit more than the call it saves.
local function do_place(plan, target, now, first_deadline, member)
  if type(now) == 'number' and (member or plan.kind ~= 'sticky') then now = I(now) end
  if plan.kind == 'sticky' then
    local n = succ_text(plan.n)
    if member then
      redis.call('HSET', wkey(plan.id), 'b', '1', 'n', n, claim_field(member), now)
    else
      redis.call('HSET', wkey(plan.id), 'b', '1', 'n', n)
    end
    redis.call('ZADD', K.dirty, '0', plan.id)
    return plan.id, n, 0
  end
  local id = I(plan.id)
  if member then
    redis.call('HSET', wkey(id), 's', '0', 'b', '1', 'x', '0', 'bt', '0', 'hb', now, 'c', now,
      'n', '1', 't', target, claim_field(member), now)
  else
    redis.call('HSET', wkey(id), 's', '0', 'b', '1', 'x', '0', 'bt', '0', 'hb', now, 'c', now,
      'n', '1', 't', target)
  end
  redis.call('ZADD', K.live, I(first_deadline), id)
  redis.call('SET', tkey(target), id)
  redis.call('ZADD', K.dirty, '0', id)
  created(id, target)
  return id, 1, 1
end

-- A placement's packed reply (see lib_base.lua).
-- Every value may be text or a number; the numbers are formatted as integers (`I`) rather than
-- by Lua's `%.14g`, and the sticky placement's are text already (`new` 0, `live` -1 are literals).
local function assigned(id, n, new, live, now)
  if type(n) == 'number' then n = I(n) end
  if type(now) == 'number' then now = I(now) end
  if new == 1 then new = '1' else new = '0' end
  if live == -1 then live = '-1' else live = I(live) end
  return 'outcome\tassigned\tworker\t' .. id .. '\tseq\t' .. n .. '\tnew\t' .. new .. '\tlive\t' .. live
    .. '\tnow\t' .. now
end

-- A refused placement: drop a mapping to a dead worker (there is none normally: deaths unmap).
local function refuse_place(plan, target)
  if plan.stale_mapping then redis.call('DEL', tkey(target)) end
  if plan.kind == 'draining' then return pack({ 'outcome', 'draining', 'worker', plan.id }) end
  return 'outcome\tcapacity'
end

-- A worker's fields as one tab-separated line: id t s b x bt r hb c n dd da (see codec.rs).
-- `read_worker` folds an indexed worker's beat into `hb` (f[7]) and keeps its score in `f.beat`
-- (for `unindex_beat`).
local WORKER_FIELDS = { 't', 's', 'b', 'x', 'bt', 'r', 'hb', 'c', 'n', 'dd', 'da' }
local function read_worker(id)
  local f = redis.call('HMGET', wkey(id), unpack(WORKER_FIELDS))
  if f[2] == '0' and f[5] == '1' and f[4] == '0' then
    local beat = redis.call('ZSCORE', K.beat, id)
    if beat then
      f[7] = later_text(beat, f[7] or '0')
      f.beat = beat
    end
  end
  return f
end
local function encode_worker(id, f)
  local out = { id }
  for i = 1, #WORKER_FIELDS do out[i + 1] = f[i] or '' end
  return table.concat(out, '\t')
end
