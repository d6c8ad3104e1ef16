-- deregister: a clean exit (exited if draining, deregistered if active); claims are released.
-- ARGV: prefix, replica id, worker
-- Returns outcome 'dead' with reason ('deregistered'|'exited'), live, now | 'unknown'
--   | 'refused_dead' with reason
local id = ARGV[2]

local now = clock()
local w = redis.call('HMGET', wkey(id), 's', 'r', 't')
if not w[1] then return finish(UNKNOWN) end
if w[1] == '2' then return finish(refused_dead(w[2])) end
local reason = R_DEREGISTERED
if w[1] == '1' then reason = R_EXITED end
local k = prep_kill(id, w[3])
do_kill(k, reason, now)
return finish(pack({ 'outcome', 'dead', 'reason', dead_word(reason), 'live', redis.call('ZCARD', K.live),
  'now', now }))
