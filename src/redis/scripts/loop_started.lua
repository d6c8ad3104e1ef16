-- loop_started: the worker is busy.
-- ARGV: prefix, replica id, worker
-- Returns outcome 'active' | 'draining' | 'unknown' | 'refused_dead' with reason
local id = ARGV[2]

local w = redis.call('HMGET', wkey(id), 's', 'r')
if not w[1] then return UNKNOWN end
if w[1] == '2' then return refused_dead(w[2]) end

redis.call('HSET', wkey(id), 'b', 1)
redis.call('ZADD', K.dirty, 0, id)
if w[1] == '1' then return DRAINING end
return ACTIVE
