-- drain / drain_all: a busy active worker drains (until now + deadline, the earlier deadline
-- kept); an idle one exits at once; a draining one keeps draining.
-- ARGV: prefix, replica id, deadline_ms, worker ids... (drain_all_within walks `live` with
--   ZSCAN and passes each batch here)
-- Returns outcomes (per worker, in order: 'draining' | 'exited' (now) | 'unknown' |
--   'refused_dead'), reasons (per worker: the dead reason of a 'refused_dead', else ''), live, now
local deadline = tonumber(ARGV[2])

local now = clock()
local ids = {}
for i = 3, #ARGV do ids[#ids + 1] = ARGV[i] end

-- Read phase: every worker's state, and what an exit would change.
local plans = {}
for i, id in ipairs(ids) do
  local w = redis.call('HMGET', wkey(id), 's', 'b', 'r', 't', 'dd')
  local p = { id = id, w = w }
  if w[1] == '0' and w[2] ~= '1' then p.kill = prep_kill(id, w[4]) end
  if w[1] == '0' and not p.kill then p.beat = redis.call('ZSCORE', K.beat, id) end
  plans[i] = p
end

-- Write phase.
local out, reasons = {}, {}
local at = now + deadline
for i, p in ipairs(plans) do
  local w = p.w
  reasons[i] = ''
  if not w[1] then
    out[i] = 'unknown'
  elseif w[1] == '2' then
    out[i] = 'refused_dead'
    reasons[i] = dead_word(w[3])
  elseif p.kill then
    do_kill(p.kill, R_EXITED, now)
    out[i] = 'exited'
  else
    if w[1] == '0' then
      redis.call('HSET', wkey(p.id), 's', 1, 'dd', at, 'ds', now)
      unindex_beat(p.id, p.beat)
      redis.call('ZADD', K.drain, at, p.id)
      redis.call('ZADD', K.dirty, 0, p.id)
      emit({ 'D', p.id, w[4] or '' })
    elseif not w[5] or at < tonumber(w[5]) then
      redis.call('HSET', wkey(p.id), 'dd', at, 'ds', now)
      redis.call('ZADD', K.drain, at, p.id)
      redis.call('ZADD', K.dirty, 0, p.id)
    end
    out[i] = 'draining'
  end
end
return finish({ 'outcomes', out, 'reasons', reasons, 'live', redis.call('ZCARD', K.live), 'now', now })
