-- loop_started: the worker is busy.
-- ARGV: prefix, replica id, worker
-- Returns {'ok', status} | {'unknown'} | {'dead', reason}
local id = ARGV[2]

local w = redis.call('HMGET', wkey(id), 's', 'r')
if not w[1] then return { 'unknown' } end
if w[1] == '2' then return { 'dead', w[2] } end

redis.call('HSET', wkey(id), 'b', 1)
redis.call('ZADD', K.dirty, 0, id)
return { 'ok', tonumber(w[1]) }
