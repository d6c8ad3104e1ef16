-- loop_finished: an active worker becomes idle; a draining one exits (dead, exited).
-- ARGV: prefix, replica id, worker
-- Returns {'ok', status, live (-1: unchanged), now} (status 2 = died, exited) | {'unknown'} | {'dead', reason}
local id = ARGV[2]

local now = clock()
local w = redis.call('HMGET', wkey(id), 's', 'r', 't')
if not w[1] then return finish({ 'unknown' }) end
if w[1] == '2' then return finish({ 'dead', w[2] }) end
if w[1] == '0' then
  redis.call('HSET', wkey(id), 'b', 0)
  redis.call('ZADD', K.dirty, 0, id)
  return finish({ 'ok', 0, -1, now })
end
local k = prep_kill(id, w[3])
do_kill(k, R_EXITED, now)
return finish({ 'ok', 2, redis.call('ZCARD', K.live), now })
