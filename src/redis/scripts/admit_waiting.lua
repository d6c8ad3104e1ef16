-- admit_waiting: admit.lua with the waiting room on (max_waiting > 0, or a per-owner cap), called
-- instead of it by such a handle, so the room-off path (admit.lua) is not touched: dedupe (a
-- waiting pair is a duplicate, 'waiting'), sticky lookup, capacity, the owner's cap, and an
-- arrival that would create a worker while targets wait for capacity is queued behind them; a
-- refused admission is parked while the room (and the owner's share) allows.
-- ARGV: prefix, replica id, target, delivery, max_workers, timeout_ms, startup_grace_ms,
--       retention_ms, max_in_flight_ms, max_workers_per_owner, max_waiting, max_waiting_per_owner
--       [, payload size, payload_budget, encoded payload] (as admit.lua's; a parked delivery
--       holds its payload too, counted without the credit, and a refusal for the budget is
--       never parked)
-- Returns admit.lua's outcomes (a waiting duplicate: state 'waiting', since the parking) and
--   'waiting' with position and the refusal it stands for: reason ('capacity'|'draining'),
--   worker (draining: the worker; else '')
local target, delivery = ARGV[2], ARGV[3]
local cfg = room_cfg({ ARGV[4], ARGV[5], ARGV[6], ARGV[8], ARGV[7], ARGV[9], ARGV[10], ARGV[11] })
local member = target .. ':' .. delivery

-- Read phase.
local now = clock()
local c = redis.call('HMGET', ckey(member), 'h', 'ca', 'dn', 'rel')
local st = standing(c, now, cfg.re, cfg.to)
if st == 'in_flight' or st == 'completed' then
  return finish(duplicate(c, st))
end
if cfg.mx > 0 then
  local since = redis.call('ZSCORE', K.worder, member)
  if since then
    return finish(pack({ 'outcome', 'duplicate', 'holder', '', 'since', since, 'state', 'waiting',
      'unstarted', 0 }))
  end
end
local size, rid, credit = ARGV[12], nil, 0
if size then
  size = tonumber(size)
  rid, credit = readmission_credit(member, st)
  local refused = over_budget(size, tonumber(ARGV[13]), credit)
  if refused then return finish(refused) end
end
local plan = plan_place(target, cfg.mw, now)
-- Refused only because others wait for capacity (placed after all if the room is full).
local deferred = false
if plan.kind == 'new' then
  if owner_full(cfg, owner_of(target)) then
    plan.kind = 'full'
  elseif cfg.mx > 0 and (redis.call('HEXISTS', K.wt, target) == 1 or contenders()) then
    plan.kind, deferred = 'full', true
  end
end
if plan.kind ~= 'sticky' and plan.kind ~= 'new' then
  local parked, pos = 'full', nil
  if cfg.mx > 0 then
    -- Parked, it holds its payload beside the released copy (no credit for that; the payload
    -- of a released claim not yet in the stream is freed: see below).
    local own = 0
    if st ~= 'none' then own = tonumber(redis.call('HGET', pkey(member), 's') or '0') end
    local refused = size and credit > own and over_budget(size, tonumber(ARGV[13]), own)
    if refused then return finish(refused) end
    local blocker = nil
    if plan.kind == 'draining' then blocker = plan.id end
    parked, pos = park(cfg, target, delivery, blocker, now)
  end
  if parked == 'at' then
    if size then
      -- A released claim's payload not yet moved to the stream gives way to the parked one (the
      -- same delivery's; the sweep then releases that claim without one: `payload_released`
      -- leaves a parked pair's `p:<member>` alone).
      if st ~= 'none' then drop_payload_key(pkey(member)) end
      store_payload(member, size, ARGV[14])
    end
    store_cfg(cfg) -- a death reads them to promote
    if plan.stale_mapping then redis.call('DEL', tkey(target)) end
    local reason, worker = 'capacity', ''
    if plan.kind == 'draining' then reason, worker = 'draining', plan.id end
    return finish(pack({ 'outcome', 'waiting', 'position', pos, 'reason', reason, 'worker', worker }))
  end
  if not deferred then return finish(refuse_place(plan, target)) end
  plan.kind = 'new'
end

-- Write phase.
if st ~= 'none' then
  forget_claim(member, c)
  drop_payload_key(pkey(member)) -- a released claim's, not yet moved to the stream
end
local id, n, new = do_place(plan, target, now, now + cfg.to + cfg.gr, member)
if new == 1 then owner_count(cfg, target, id) end
redis.call('HSET', ckey(member), 'h', id, 'ca', now)
redis.call('ZADD', K.flight, now, member)
if size then
  if rid then drop_released_copy(member, rid) end
  store_payload(member, size, ARGV[14])
end
local live = -1
if new == 1 then live = plan.live + 1 end
return finish(assigned(id, n, new, live, now))
