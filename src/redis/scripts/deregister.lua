-- deregister: a clean exit (exited if draining, deregistered if active); claims are released.
-- ARGV: prefix, replica id, worker
-- Returns {'ok', reason, live, now} | {'unknown'} | {'dead', reason}
local id = ARGV[2]

local now = clock()
local w = redis.call('HMGET', wkey(id), 's', 'r', 't')
if not w[1] then return finish({ 'unknown' }) end
if w[1] == '2' then return finish({ 'dead', w[2] }) end
local reason = R_DEREGISTERED
if w[1] == '1' then reason = R_EXITED end
local k = prep_kill(id, w[3])
do_kill(k, reason, now)
return finish({ 'ok', reason, redis.call('ZCARD', K.live), now })
