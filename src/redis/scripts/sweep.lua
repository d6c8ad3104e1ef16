-- sweep: the maintenance pass (for the lease holder), then this replica's share of released
-- events and, if newer than the caller's, the published snapshot.
-- ARGV: prefix, replica id, caller's snapshot version, timeout_ms, startup_grace_ms, retention_ms,
--       dead_retention_ms, suspect_grace_ms, brake_fraction, brake_min_workers,
--       max_retained_claims, lease_ttl_ms, release_ack_timeout_ms, handout_batch, expiry_batch
-- Returns (inside `finish`) {swept, now, version, brake, snapshot|'', died{id, reason...}, suspected{ids},
--          released_targets{targets}, expired, evicted, purged, released, collected{entry id,
--          target, delivery, holder, reason...}, live, retained}
local me, have = ME, tonumber(ARGV[2])
local timeout, grace, retention = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local dead_retention, suspect_grace = tonumber(ARGV[6]), tonumber(ARGV[7])
local brake_fraction, brake_min = tonumber(ARGV[8]), tonumber(ARGV[9])
local max_retained, lease_ttl = tonumber(ARGV[10]), tonumber(ARGV[11])
local ack_timeout, handout, expiry_batch = tonumber(ARGV[12]), tonumber(ARGV[13]), tonumber(ARGV[14])

local now = clock()

-- The lease: free, ours, or lapsed (on the registry's time, or by the key's own expiry).
local function lease_is_ours()
  local l = redis.call('GET', K.sweep_lease)
  if not l then return true end
  local tab = string.find(l, '\t', 1, true)
  if not tab then return true end
  local exp = tonumber(string.sub(l, tab + 1))
  return string.sub(l, 1, tab - 1) == me or not exp or now >= exp
end

-- target, delivery of a claim member (targets contain no ':').
local function split_member(m)
  local p = string.find(m, ':', 1, true)
  return string.sub(m, 1, p - 1), string.sub(m, p + 1)
end

-- Targets in the order of worker_registry::Target's Ord: repository, then number.
local function target_less(a, b)
  local ha, hb = string.find(a, '#[^#]*$'), string.find(b, '#[^#]*$')
  local ra, rb = string.sub(a, 1, ha - 1), string.sub(b, 1, hb - 1)
  if ra ~= rb then return ra < rb end
  return tonumber(string.sub(a, ha + 1)) < tonumber(string.sub(b, hb + 1))
end

local swept = lease_is_ours()
local need_group = redis.call('EXISTS', K.released) == 0
local version = tonumber(redis.call('GET', K.snapshot_version) or '0') or 0
local brake_engaged, snapshot = false, ''
local died, suspected, released_targets = {}, {}, {}
local n_expired, n_evicted, n_purged, n_released = 0, 0, 0, 0

if swept then
  ---------------------------------------------------------------------------- read phase
  local live_ids = redis.call('ZRANGE', K.live, 0, -1)
  local dead_ids = redis.call('ZRANGE', K.dead, 0, -1)
  local W, order, claims_of = {}, {}, {}
  for _, id in ipairs(live_ids) do
    W[id] = read_worker(id)
    order[#order + 1] = id
    claims_of[id] = redis.call('ZCARD', wckey(id))
  end
  for _, id in ipairs(dead_ids) do W[id] = read_worker(id); order[#order + 1] = id end

  -- Draining workers past their deadline die whatever the brake says; the rest of the silent
  -- ones are judged by the brake.
  local overdue = redis.call('ZRANGEBYSCORE', K.drain, '-inf', '(' .. I(now))
  local is_overdue = {}
  for _, id in ipairs(overdue) do is_overdue[id] = true end
  -- A worker's score in `live` is a lower bound of its deadline (heartbeats do not touch the
  -- index): a candidate that beat since is re-scored, not stale.
  local stale, rescore, ghosts = {}, {}, {}
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', K.live, '-inf', '(' .. I(now))) do
    local f = W[id]
    if not f[2] then
      ghosts[#ghosts + 1] = id
    elseif not is_overdue[id] then
      local deadline = tonumber(f[7]) + timeout
      if f[5] ~= '1' then deadline = deadline + grace end
      if deadline < now then
        stale[#stale + 1] = id
      else
        rescore[#rescore + 1] = { deadline, id }
      end
    end
  end
  local live = #live_ids - #ghosts
  local brake = live >= brake_min and #stale > brake_fraction * live

  local kills, suspects, held = {}, {}, false
  for _, id in ipairs(stale) do
    if W[id][4] == '1' then
      -- Already suspect: judged by its own grace only.
      local since = tonumber(redis.call('HGET', wkey(id), 'ss') or '')
      if since and now - since < suspect_grace then
        held = true
      else
        kills[#kills + 1] = { id, R_MISSED }
      end
    elseif brake then
      suspects[#suspects + 1] = id
    else
      kills[#kills + 1] = { id, R_MISSED }
    end
  end
  for _, id in ipairs(overdue) do
    if W[id] and W[id][2] == '1' then kills[#kills + 1] = { id, R_DRAIN_TIMED_OUT } end
  end
  local preps = {}
  for i, kl in ipairs(kills) do preps[i] = prep_kill(kl[1], W[kl[1]][1]) end

  -- Claims to release: the killed workers', those released since the last sweep, and bare
  -- claims nobody completed within the heartbeat timeout.
  local releases, stale_pending, stale_unbound = {}, {}, {}
  for i, kl in ipairs(kills) do
    for _, m in ipairs(preps[i].members) do releases[#releases + 1] = { m, kl[1], kl[2] } end
  end
  for _, m in ipairs(redis.call('SMEMBERS', K.rel_pending)) do
    local c = redis.call('HMGET', ckey(m), 'h', 'rel')
    if c[2] then
      releases[#releases + 1] = { m, c[1] or '', tonumber(c[2]) }
    else
      stale_pending[#stale_pending + 1] = m
    end
  end
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', K.unbound, '-inf', '(' .. I(now - timeout))) do
    local c = redis.call('HMGET', ckey(m), 'h', 'ca', 'dn', 'rel')
    if c[2] and not c[1] and not c[3] and not c[4] then
      releases[#releases + 1] = { m, '', RR_UNBOUND }
    else
      stale_unbound[#stale_unbound + 1] = m
    end
  end

  -- Completed claims past retention (a key the server already expired counts too), then the
  -- oldest beyond max_retained_claims. Index entries whose pair was claimed again are dropped.
  local expired, stale_done, victims = {}, {}, {}
  local old = redis.call('ZRANGEBYSCORE', K.done, '-inf', '(' .. I(now - retention), 'LIMIT', 0, expiry_batch)
  for _, m in ipairs(old) do
    local c = redis.call('HMGET', ckey(m), 'ca', 'dn')
    if c[1] and not c[2] then stale_done[#stale_done + 1] = m else expired[#expired + 1] = m end
  end
  local remaining = redis.call('ZCARD', K.done) - #old
  if remaining > max_retained then
    local cand = redis.call('ZRANGE', K.done, #old, #old + remaining - max_retained - 1)
    for _, m in ipairs(cand) do
      if redis.call('HEXISTS', ckey(m), 'dn') == 1 then
        victims[#victims + 1] = m
      else
        stale_done[#stale_done + 1] = m
      end
    end
  end

  -- Dead records past retention.
  local purge = redis.call('ZRANGEBYSCORE', K.dead, '-inf', '(' .. I(now - dead_retention))
  local purged = {}
  for _, id in ipairs(purge) do purged[id] = true end

  ---------------------------------------------------------------------------- write phase
  if need_group then
    redis.call('XGROUP', 'CREATE', K.released, 'dispatch', '0', 'MKSTREAM')
    need_group = false
  end
  for _, r in ipairs(rescore) do redis.call('ZADD', K.live, r[1], r[2]) end
  for _, id in ipairs(ghosts) do redis.call('ZREM', K.live, id) end
  for _, id in ipairs(suspects) do
    redis.call('HSET', wkey(id), 'x', 1, 'ss', now)
    W[id][4] = '1'
    suspected[#suspected + 1] = id
    emit({ 'S', id, W[id][1] or '' })
  end
  for i, kl in ipairs(kills) do
    local id, reason = kl[1], kl[2]
    do_kill(preps[i], reason, now)
    local f = W[id]
    f[2], f[4], f[6], f[11] = '2', '0', I(reason), I(now)
    if reason ~= R_MISSED then f[3] = '0' end
    claims_of[id] = 0
    died[#died + 1] = id
    died[#died + 1] = reason
    if f[1] then released_targets[#released_targets + 1] = f[1] end
  end
  local by_target, targets = {}, {}
  for _, t in ipairs(released_targets) do
    if not by_target[t] then by_target[t] = {}; targets[#targets + 1] = t end
  end
  for _, r in ipairs(releases) do
    local m = r[1]
    local t, d = split_member(m)
    redis.call('XADD', K.released, '*', 't', t, 'd', d, 'h', r[2], 'r', r[3])
    redis.call('DEL', ckey(m))
    redis.call('ZREM', K.unbound, m)
    redis.call('SREM', K.rel_pending, m)
    if not by_target[t] then by_target[t] = {}; targets[#targets + 1] = t end
    local list = by_target[t]
    list[#list + 1] = d
  end
  n_released = #releases
  for _, m in ipairs(stale_pending) do redis.call('SREM', K.rel_pending, m) end
  for _, m in ipairs(stale_unbound) do redis.call('ZREM', K.unbound, m) end
  for _, m in ipairs(expired) do
    redis.call('DEL', ckey(m))
    redis.call('ZREM', K.done, m)
  end
  for _, m in ipairs(victims) do
    redis.call('DEL', ckey(m))
    redis.call('ZREM', K.done, m)
  end
  for _, m in ipairs(stale_done) do redis.call('ZREM', K.done, m) end
  n_expired, n_evicted = #expired, #victims
  for _, id in ipairs(purge) do
    redis.call('DEL', wkey(id))
    redis.call('DEL', wckey(id))
    redis.call('ZREM', K.dead, id)
  end
  n_purged = #purge
  brake_engaged = held or #suspects > 0

  -- Publish the snapshot: one value, one version that never goes backwards (a replica that
  -- remembers a later version than the server, after a data loss, carries it forward).
  version = redis.call('INCR', K.snapshot_version)
  if version <= have then
    version = have + 1
    redis.call('SET', K.snapshot_version, version)
  end
  local in_flight = redis.call('ZCARD', K.unbound)
  for _, id in ipairs(live_ids) do in_flight = in_flight + (claims_of[id] or 0) end
  local lines = { table.concat({ I(version), I(now), brake_engaged and '1' or '0', I(in_flight),
    I(redis.call('ZCARD', K.done)) }, '\t') }
  for _, id in ipairs(order) do
    if not purged[id] then lines[#lines + 1] = encode_worker(id, W[id]) end
  end
  snapshot = table.concat(lines, '\n')
  redis.call('SET', K.snapshot, snapshot)

  -- One TargetReleased per target that lost its worker or had deliveries released, in order.
  table.sort(targets, target_less)
  for _, t in ipairs(targets) do
    local fields = { 'R', t }
    for _, d in ipairs(by_target[t]) do fields[#fields + 1] = d end
    emit(fields)
  end

  redis.call('SET', K.sweep_lease, me .. '\t' .. I(now + lease_ttl), 'PX', lease_ttl)
elseif version > have then
  snapshot = redis.call('GET', K.snapshot) or ''
end

-------------------------------------------------------------------------------- hand-out
-- Entries handed out longer than release_ack_timeout ago (registry time) and not acknowledged
-- are offered again, to whoever sweeps first; then entries never handed out.
if need_group then redis.call('XGROUP', 'CREATE', K.released, 'dispatch', '0', 'MKSTREAM') end
local collected = {}
local function take(entry)
  local f, map = entry[2], {}
  for i = 1, #f, 2 do map[f[i]] = f[i + 1] end
  collected[#collected + 1] = entry[1]
  collected[#collected + 1] = map.t or ''
  collected[#collected + 1] = map.d or ''
  collected[#collected + 1] = map.h or ''
  collected[#collected + 1] = map.r or ''
  redis.call('ZADD', K.deliveries, now, entry[1])
end
local overdue_ids = redis.call('ZRANGEBYSCORE', K.deliveries, '-inf', '(' .. I(now - ack_timeout), 'LIMIT', 0, handout)
for _, id in ipairs(overdue_ids) do
  local got = redis.call('XCLAIM', K.released, 'dispatch', me, 0, id)
  if got[1] and got[1][2] then take(got[1]) else redis.call('ZREM', K.deliveries, id) end
end
local fresh = redis.call('XREADGROUP', 'GROUP', 'dispatch', me, 'COUNT', handout, 'STREAMS', K.released, '>')
if fresh and fresh[1] then
  for _, entry in ipairs(fresh[1][2]) do take(entry) end
end

return finish({ swept and 1 or 0, now, version, brake_engaged and 1 or 0, snapshot, died,
  suspected, released_targets, n_expired, n_evicted, n_purged, n_released, collected,
  redis.call('ZCARD', K.live), redis.call('ZCARD', K.done) })
