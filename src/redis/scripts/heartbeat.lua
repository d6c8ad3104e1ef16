-- heartbeat: record a beat now; refused for a dead or unknown worker.
-- ARGV: prefix, worker, timeout_ms
-- Returns {'ok', status(0 active | 1 draining)} | {'unknown'} | {'dead', reason}
local id, timeout = ARGV[2], tonumber(ARGV[3])

local now = clock()
local w = redis.call('HMGET', wkey(id), 's', 'hb', 'r')
if not w[1] then return { 'unknown' } end
if w[1] == '2' then return { 'dead', w[3] } end

local hb = math.max(now, tonumber(w[2]))
redis.call('HSET', wkey(id), 'hb', hb, 'bt', 1, 'x', 0)
redis.call('ZADD', K.live, hb + timeout, id)
return { 'ok', tonumber(w[1]) }
