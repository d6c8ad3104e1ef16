-- heartbeat: record a beat now; refused for a dead or unknown worker.
-- ARGV: prefix, replica id, worker, timeout_ms
-- Returns outcome 'active' | 'draining' | 'unknown' | 'refused_dead' with reason
local id = ARGV[2]

-- The hot path keeps numbers out of it: the time stays text and the stored values are string
-- literals (see `clock_text`).
local now = clock_text()
local w = redis.call('HMGET', wkey(id), 's', 'hb', 'r', 'bt')
if not w[1] then return UNKNOWN end
if w[1] == '2' then return refused_dead(w[3]) end

local hb = later_text(now, w[2])
redis.call('HSET', wkey(id), 'hb', hb, 'bt', '1', 'x', '0')
redis.call('ZADD', K.dirty, '0', id)
-- The score in `live` is a lower bound of the deadline, which later beats only move forward: it
-- needs writing only on the first beat, which ends the start-up grace (the sweep re-scores the
-- rest lazily).
if w[4] ~= '1' then redis.call('ZADD', K.live, hb + tonumber(ARGV[3]), id) end
if w[1] == '1' then return DRAINING end
return ACTIVE
