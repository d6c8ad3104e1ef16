-- admit: dedupe + sticky lookup + capacity + claim, in one step.
-- ARGV: prefix, replica id, target, delivery, max_workers, timeout_ms, startup_grace_ms, retention_ms,
--       max_in_flight_ms
-- Returns (name, value pairs, see docs::redis) outcome 'duplicate' with holder ('' for none),
--   since (claimed at), state ('in_flight'|'completed'), unstarted (0/1)
-- | 'assigned' with worker, seq (its assignments), new (0/1), live (-1: unchanged), now
-- | 'capacity' | 'draining' with worker
local target, delivery = ARGV[2], ARGV[3]
local member = target .. ':' .. delivery

-- Read phase. A claim in flight on a worker is a duplicate whatever the time: answered before the
-- clock is read (one HMGET for a claim made on a started worker, `sb`; two for one made before
-- its worker's first beat) and before the limits are parsed (each `tonumber` is a `strtod`).
local c = redis.call('HMGET', ckey(member), 'h', 'ca', 'dn', 'rel', 'sb')
if in_flight_bound(c) then return finish(duplicate(c, 'in_flight')) end
local max_workers, timeout = tonumber(ARGV[4]), tonumber(ARGV[5])
local grace, retention = tonumber(ARGV[6]), tonumber(ARGV[7])
local max_in_flight = tonumber(ARGV[8])
local now = clock()
local st = standing(c, now, retention, timeout)
if st == 'in_flight' or st == 'completed' then
  return finish(duplicate(c, st))
end
local plan = plan_place(target, max_workers, now)
if plan.kind ~= 'sticky' and plan.kind ~= 'new' then
  -- A released or expired claim stays as it was (the sweep still reports it).
  return finish(refuse_place(plan, target))
end

-- Write phase.
if st ~= 'none' then forget_claim(member, c) end
local id, n, new = do_place(plan, target, now, now + timeout + grace)
-- `sb`: the worker had heartbeated already, so a duplicate of this claim needs no worker read.
if plan.started then
  redis.call('HSET', ckey(member), 'h', id, 'ca', now, 'sb', '1')
else
  redis.call('HSET', ckey(member), 'h', id, 'ca', now)
end
redis.call('ZADD', wckey(id), now, member)
redis.call('ZADD', K.flight, now + max_in_flight, member)
local live = -1
if new == 1 then live = plan.live + 1 end
return finish(assigned(id, n, new, live, now))
