-- heartbeat: record a beat now; refused for a dead or unknown worker.
-- ARGV: prefix, replica id, worker, timeout_ms
-- Returns outcome 'active' | 'draining' | 'unknown' | 'refused_dead' with reason
local id = ARGV[2]

-- The hot path keeps numbers out of it: the time stays text and the stored values are string
-- literals (see `clock_text`).
local now = clock_text()
-- The fast path: an active worker that has beaten before and is not suspect is in `beat` (see
-- lib_workers.lua), and its beat is one write there, with nothing to read (XX: members only; GT:
-- the score only moves forward; CH: 1 if it moved). A 0 is a worker not indexed or one whose
-- score is at or past now (a second beat in the same ms): the score tells them apart. A worker not
-- indexed takes the path below, which writes nothing before it has read.
if redis.call('ZADD', K.beat, 'XX', 'GT', 'CH', now, id) == 1 then return ACTIVE end
if redis.call('ZSCORE', K.beat, id) then return ACTIVE end
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
-- Active, started and (now) not suspect: indexed, so that its next beat takes the fast path.
redis.call('ZADD', K.beat, 'GT', hb, id)
return ACTIVE
