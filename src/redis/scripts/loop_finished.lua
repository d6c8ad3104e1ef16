-- loop_finished: an active worker becomes idle; a draining one exits (dead, exited).
-- ARGV: prefix, replica id, worker
-- Returns outcome 'active' (now idle) | 'exited' (died, exited), with live (-1: unchanged) and
--   now | 'unknown' | 'refused_dead' with reason
local id = ARGV[2]

local now = clock()
local w = redis.call('HMGET', wkey(id), 's', 'r', 't')
if not w[1] then return finish(UNKNOWN) end
if w[1] == '2' then return finish(refused_dead(w[2])) end
if w[1] == '0' then
  redis.call('HSET', wkey(id), 'b', 0)
  redis.call('ZADD', K.dirty, 0, id)
  return finish(pack({ 'outcome', 'active', 'live', -1, 'now', now }))
end
local k = prep_kill(id, w[3])
do_kill(k, R_EXITED, now)
return finish(pack({ 'outcome', 'exited', 'live', redis.call('ZCARD', K.live), 'now', now }))
