-- admit: dedupe + sticky lookup + capacity + claim, in one step.
-- ARGV: prefix, replica id, target, delivery, max_workers, timeout_ms, startup_grace_ms,
--       retention_ms[, payload size, payload_budget, encoded payload] (admit_with: the payload
--       is checked against the budget after the duplicate check, crediting the pair's released
--       copy, and stored with the claim; see lib_claims.lua)
-- Returns (packed, see docs::redis) outcome 'duplicate' with holder ('' for none),
--   since (claimed at), state ('in_flight'|'completed'), unstarted (0/1)
-- | 'assigned' with worker, seq (its assignments), new (0/1), live (-1: unchanged), now
-- | 'capacity' | 'draining' with worker | 'payload_budget' with held, needed, limit
local target, delivery = ARGV[2], ARGV[3]
local member = target .. ':' .. delivery

-- Read phase. A claim in flight on a worker is a duplicate whatever the time: answered before the
-- clock is read (one HMGET for a claim made on a started worker, `sb`; two for one made before
-- its worker's first beat).
local c = redis.call('HMGET', ckey(member), 'h', 'ca', 'dn', 'rel', 'sb')
if in_flight_bound(c) then return finish(duplicate(c, 'in_flight')) end
-- The sticky placement of a new delivery, the hot path, keeps numbers out of it (see
-- `clock_text`): the time stays text, and a limit is parsed only where it is used (each
-- `tonumber` is a `strtod`; each number passed to `redis.call` a `%.17g`).
local now = clock_text()
local st = 'none'
if c[2] then
  st = standing(c, tonumber(now), tonumber(ARGV[7]), tonumber(ARGV[5]))
  if st == 'in_flight' or st == 'completed' then
    return finish(duplicate(c, st))
  end
end
local size, rid, credit = ARGV[8], nil, 0
if size then
  size = tonumber(size)
  rid, credit = readmission_credit(member, st)
  local refused = over_budget(size, tonumber(ARGV[9]), credit)
  if refused then return finish(refused) end
end
local plan = plan_place(target, ARGV[4], now)
if plan.kind ~= 'sticky' and plan.kind ~= 'new' then
  -- A released or expired claim stays as it was (the sweep still reports it).
  return finish(refuse_place(plan, target))
end

-- Write phase.
if st ~= 'none' then
  forget_claim(member, c)
  drop_payload_key(pkey(member)) -- a released claim's, not yet moved to the stream
end
local first = nil
if plan.kind == 'new' then first = tonumber(now) + tonumber(ARGV[5]) + tonumber(ARGV[6]) end
local id, n, new = do_place(plan, target, now, first, member)
-- `sb`: the worker had heartbeated already, so a duplicate of this claim needs no worker read.
if plan.started then
  redis.call('HSET', ckey(member), 'h', id, 'ca', now, 'sb', '1')
else
  redis.call('HSET', ckey(member), 'h', id, 'ca', now)
end
-- The stuck index scores the claim time (sweep.lua adds max_in_flight to its bound): no sum here.
redis.call('ZADD', K.flight, now, member)
if size then
  if rid then drop_released_copy(member, rid) end
  store_payload(member, size, ARGV[10])
end
local live = -1
if new == 1 then live = plan.live + 1 end
return finish(assigned(id, n, new, live, now))
