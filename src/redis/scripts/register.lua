-- register: a self-started worker with no target, under the capacity limit.
-- ARGV: prefix, replica id, max_workers, timeout_ms, startup_grace_ms
-- Returns outcome 'registered' with worker, live, now | 'capacity' | 'exhausted'
local max_workers, timeout, grace = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])

local now = clock()
-- The live count, read once: the new worker makes it live + 1 (its id is fresh).
local live = redis.call('ZCARD', K.live)
if live >= max_workers then return finish('outcome\tcapacity') end
local nid = next_id(now)
if nid > MAX_ID then return finish('outcome\texhausted') end

local id = I(nid)
redis.call('HSET', wkey(id), 's', 0, 'b', 0, 'x', 0, 'bt', 0, 'hb', now, 'c', now, 'n', 0)
redis.call('ZADD', K.live, now + timeout + grace, id)
redis.call('ZADD', K.dirty, 0, id)
created(id, '')
return finish(pack({ 'outcome', 'registered', 'worker', id, 'live', live + 1, 'now', now }))
