-- sweep: one bounded step of the maintenance pass (for the lease holder), then a bounded share of
-- released events for this replica. The caller (contract.rs) repeats steps until one answers
-- `more` = 0, carrying `at`, `mode`, `skip` and `brake` from each answer to the next call, so that
-- other commands run between steps and no step's work grows with the registry.
--
-- A sweep judges at one instant: the first step (`at` = 0) reads the clock and applies the stall
-- rule; later steps judge at its `at`. Live workers whose score in `live` is below `at` are the
-- candidates, taken `budget / 2` at a time from offset `skip` (the candidates this sweep already
-- judged and left in place: stale ones while the brake is undecided, held and newly suspect ones
-- after). With more candidates than one step takes, mode `judge` first counts the stale ones
-- (re-scoring the rest out of the range), so that the brake is decided on all of them, as in
-- memory; mode `act` then kills or suspects them a chunk per step. Once no candidate is left, a
-- step works on the other queues (overdue drains, stuck deliveries, releases, stuck tombstones,
-- expiry, eviction, purge), each from a sorted set by time or a set with a LIMIT taken from what
-- is left of the step's budget; `more` = 1 if any of them may hold more.
--
-- ARGV: prefix, replica id, then name, value pairs (sweep.rs `step_call` sends them; `arg` and
--   `num` below read them, and a missing or malformed one is an error naming it): at (0: first
--   step), mode ('judge'|'act'), skip, cursor and ties (the walk of the candidates), brake (act:
--   0/1), timeout_ms, startup_grace_ms, retention_ms, dead_retention_ms, suspect_grace_ms,
--   brake_fraction, brake_min_workers, max_retained_claims, lease_ttl_ms,
--   release_ack_timeout_ms, handout (entries this step may hand out), budget,
--   sweep_interval_ms, max_in_flight_ms, drain_deadline_ms, stall_horizon_ms
-- Returns (inside `finish`) a flat list of name, value pairs (see SweepStep in contract.rs):
--   swept, now, mode, skip, cursor, ties, brake, engaged, more, died {id, reason...},
--   suspected {ids},
--   released_targets {targets}, expired, evicted, purged, released, collected {entry id, target,
--   delivery, holder, reason...}, live, stall_ms, stuck, drained_stuck {ids}, in_flight_adj
local me = ME
local named = {}
for i = 2, #ARGV - 1, 2 do named[ARGV[i]] = ARGV[i + 1] end
local function arg(name)
  return named[name] or error('worker-registry: sweep argument ' .. name .. ' missing')
end
local function num(name)
  return tonumber(arg(name)) or error('worker-registry: sweep argument ' .. name .. ' is not a number')
end
local at, mode, skip, brake_in = num('at'), arg('mode'), num('skip'), arg('brake') == '1'
-- Where this mode's walk of the candidates stands: the last score read (inclusive; `-inf` at the
-- start) and how many candidates at exactly that score it left in place (read past by offset).
local cur_score, ties = arg('cursor'), num('ties')
local timeout, grace, retention = num('timeout_ms'), num('startup_grace_ms'), num('retention_ms')
local dead_retention, suspect_grace = num('dead_retention_ms'), num('suspect_grace_ms')
local brake_fraction, brake_min = num('brake_fraction'), num('brake_min_workers')
local max_retained, lease_ttl = num('max_retained_claims'), num('lease_ttl_ms')
local ack_timeout, handout, budget = num('release_ack_timeout_ms'), num('handout'), num('budget')
local interval, max_in_flight = num('sweep_interval_ms'), num('max_in_flight_ms')
local drain_deadline, horizon = num('drain_deadline_ms'), num('stall_horizon_ms')

local first = at == 0
local now = at
if first then now = clock() end

-------------------------------------------------------------------------------- the stall rule
-- As src/memory/stall.rs: a sweep (of any replica) more than two intervals after the previous one
-- measures a stall of the registry, [previous + interval, now]; every duration judged from then on
-- leaves out the stalled time it overlaps. The spans live in `stalls` (at most MAX_STALLS, oldest
-- dropped first), forgotten once nothing still judged can be based before them.
local MAX_STALLS = 64
local prev = redis.call('GET', K.last_sweep)
if prev then prev = tonumber(prev) or error('worker-registry: bad last_sweep ' .. prev) end
local spans, stalls_changed = {}, false
for _, e in ipairs(redis.call('LRANGE', K.stalls, 0, -1)) do
  local p = string.find(e, ':', 1, true)
  local a, b = p and tonumber(string.sub(e, 1, p - 1)), p and tonumber(string.sub(e, p + 1))
  if not (a and b) then error('worker-registry: bad stall span ' .. e) end
  spans[#spans + 1] = { a, b }
end
-- suffix[i]: the total length of spans[i..].
local suffix = {}
local function reindex()
  suffix = {}
  local acc = 0
  for i = #spans, 1, -1 do
    acc = acc + (spans[i][2] - spans[i][1])
    suffix[i] = acc
  end
end
local stall, rescan = nil, false
if prev then
  if now - prev > 2 * interval then
    stall = { prev + interval, now }
    if #spans >= MAX_STALLS then
      -- Dropping the oldest stall can only take credit away, which may bring a deadline below
      -- its score in `live` or `flight`: the rescan walk (below) starts again from the lowest
      -- scores and re-scores, a bounded chunk per step, every live worker and in-flight claim.
      table.remove(spans, 1)
      rescan = true
    end
    spans[#spans + 1] = stall
    stalls_changed = true
  end
  reindex()
  local keep_from = #spans + 1
  for i = 1, #spans do
    local ago = math.max(0, now - spans[i][2])
    if math.max(0, ago - (suffix[i + 1] or 0)) <= horizon then
      keep_from = i
      break
    end
  end
  if keep_from > 1 then
    local kept = {}
    for i = keep_from, #spans do kept[#kept + 1] = spans[i] end
    spans = kept
    reindex()
    stalls_changed = true
  end
end
local last_sweep = math.max(now, prev or 0)

-- Stalled time after `from` (up to now).
local function since(from)
  for i = 1, #spans do
    if spans[i][2] > from then
      return spans[i][2] - math.max(from, spans[i][1]) + (suffix[i + 1] or 0)
    end
  end
  return 0
end
-- How long the registry ran between `from` and now.
local function ran(from)
  if #spans == 0 then return math.max(0, now - from) end
  local judged = math.max(math.max(0, now - since(from)), math.min(from, now))
  return math.max(0, judged - from)
end

-- A drain deadline that had not passed when the stall began moves out by the stall's length (its
-- loop could not report its end meanwhile). Any number of workers may drain, so this is a walk:
-- the stall is queued in `drain_ext` and the lease holder's steps move a bounded chunk of
-- deadlines each (`extend_drains`, below) before they judge anything else, so that a sweep judges
-- every deadline after its extension, as in memory.
local new_ext = stall and table.concat({ I(stall[1]), I(stall[2]), I(stall[2] - stall[1]), '+inf', '0' }, ':')
local function write_stalls()
  redis.call('SET', K.last_sweep, I(last_sweep))
  -- A dropped stall (re)starts the rescan walk: score cursors in `live` and `flight`.
  if rescan then redis.call('SET', K.rescan, '-inf\t-inf') end
  if stalls_changed then
    redis.call('DEL', K.stalls)
    for _, sp in ipairs(spans) do redis.call('RPUSH', K.stalls, I(sp[1]) .. ':' .. I(sp[2])) end
  end
  if new_ext then redis.call('RPUSH', K.drain_ext, new_ext) end
end

-- One chunk of the drain-deadline walk of the oldest queued stall, `head`:
-- "<from>:<to>:<len>:<cursor>:<skip>". It walks `drain` down from `cursor` (inclusive; `+inf` at
-- the start) to `from` (exclusive), `limit` entries past the first `skip` (those at `cursor` it
-- left in place), and moves each deadline out by `len`, which lifts it above the rest of the walk,
-- unless the worker's drain was (re)set after the stall was measured (its `ds` is past `to`): that
-- one stays, and is counted in the next `skip` if it is at the next cursor. Reads only; returns
-- the moves (deadline, id) and the head's next state (nil: the walk is done).
local function extend_drains(head, limit)
  local e = {}
  for x in string.gmatch(head, '[^:]+') do e[#e + 1] = x end
  if #e ~= 5 then error('worker-registry: bad drain_ext entry ' .. head) end
  local to, len, cursor, skip = tonumber(e[2]), tonumber(e[3]), e[4], tonumber(e[5])
  local got = redis.call('ZREVRANGEBYSCORE', K.drain, cursor, '(' .. e[1], 'WITHSCORES', 'LIMIT', skip, limit)
  local moves, low, stay_low = {}, nil, 0
  for i = 1, #got, 2 do
    local id, score = got[i], got[i + 1]
    local ds = tonumber(redis.call('HGET', wkey(id), 'ds') or '')
    if score ~= low then low, stay_low = score, 0 end
    if ds and ds > to then
      stay_low = stay_low + 1
    else
      moves[#moves + 1] = { tonumber(score) + len, id }
    end
  end
  if #got < 2 * limit then return moves, nil end
  if low == cursor then stay_low = stay_low + skip end
  return moves, table.concat({ e[1], e[2], e[3], low, I(stay_low) }, ':')
end

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

-- The budget: about one unit per redis.call; each phase takes what is left.
local function room(cost) return math.max(0, math.floor(budget / cost)) end
local function spend(units) budget = budget - units end

local swept = lease_is_ours()
local need_group = redis.call('EXISTS', K.released) == 0
local brake_out, engaged, more, next_mode, next_skip = brake_in, false, false, mode, skip
local next_cursor, next_ties = cur_score, ties
local died, suspected, released_targets, drained_stuck = {}, {}, {}, {}
local n_expired, n_evicted, n_purged, n_released, n_stuck, adj = 0, 0, 0, 0, 0, 0

if swept then
  -- The drain-deadline walk after a stall comes first; a step of it does nothing else.
  local ext = redis.call('LINDEX', K.drain_ext, 0) or new_ext
  if ext then
    local moves, next_ext = extend_drains(ext, math.max(1, room(4)))
    write_stalls()
    for _, m in ipairs(moves) do
      redis.call('HSET', wkey(m[2]), 'dd', I(m[1]))
      redis.call('ZADD', K.drain, m[1], m[2])
      redis.call('ZADD', K.dirty, 0, m[2])
    end
    if next_ext then redis.call('LSET', K.drain_ext, 0, next_ext) else redis.call('LPOP', K.drain_ext) end
    redis.call('SET', K.sweep_lease, me .. '\t' .. I(now + lease_ttl), 'PX', lease_ttl)
    return finish({ 'swept', 1, 'now', now, 'mode', mode, 'skip', skip, 'cursor', cur_score,
      'ties', ties, 'brake', brake_in and 1 or 0,
      'engaged', 0, 'more', 1, 'died', {}, 'suspected', {}, 'released_targets', {}, 'expired', 0,
      'evicted', 0, 'purged', 0, 'released', 0, 'collected', {}, 'handed', 0,
      'live', redis.call('ZCARD', K.live), 'stall_ms', (first and stall) and (stall[2] - stall[1]) or 0,
      'stuck', 0, 'drained_stuck', {}, 'in_flight_adj', 0 })
  end

  ---------------------------------------------------------------------------- read phase
  local W = {}
  local function worker_of(id)
    local f = W[id]
    if f == nil then
      f = read_worker(id)
      W[id] = f
    end
    return f
  end
  local function overdue_drain(id, f)
    return f[2] == '1' and f[10] and f[10] ~= '' and tonumber(f[10]) < now
  end

  -- Live candidates: below `now` in `live` (a lower bound of each one's deadline: heartbeats do
  -- not touch the index, stall credit only moves deadlines out). One that beat since, or was
  -- credited a stall, is re-scored to its deadline as judged now (out of the range).
  -- Judging costs about 2 commands a candidate; killing about 20 (suspecting 5).
  local function act_cost(brake) if brake then return 5 end return 20 end
  local chunk = room(2)
  if mode == 'act' then chunk = room(act_cost(brake_in)) end
  -- Read from the cursor, not by an offset of every candidate left in place so far (an offset
  -- walks them all again: a mass death's later steps would each pass thousands).
  local got = redis.call('ZRANGEBYSCORE', K.live, cur_score, '(' .. I(now), 'WITHSCORES', 'LIMIT', ties, chunk)
  local cands, cand_score = {}, {}
  for i = 1, #got, 2 do
    cands[#cands + 1] = got[i]
    cand_score[got[i]] = got[i + 1]
  end
  local exhausted = #cands < chunk
  local stale, rescore, ghosts, overdue_c = {}, {}, {}, {}
  for _, id in ipairs(cands) do
    local f = worker_of(id)
    if not f[2] then
      ghosts[#ghosts + 1] = id
    elseif overdue_drain(id, f) then
      overdue_c[#overdue_c + 1] = id
    else
      local hb = tonumber(f[7])
      local allowed = timeout
      if f[5] ~= '1' then allowed = allowed + grace end
      if ran(hb) > allowed then
        stale[#stale + 1] = id
      else
        rescore[#rescore + 1] = { hb + allowed + since(hb), id }
      end
    end
  end
  spend(#cands * 2)

  local act = mode == 'act'
  if mode == 'judge' then
    if exhausted then
      local live = redis.call('ZCARD', K.live) - #ghosts
      brake_out = live >= brake_min and skip + #stale > brake_fraction * live
      if skip == 0 and (#stale + #overdue_c) * act_cost(brake_out) <= budget then
        act = true -- every candidate is in this chunk and the budget covers acting on it
        next_mode = 'act'
      else
        next_mode, next_skip, more = 'act', 0, true
      end
    else
      next_skip = skip + #stale + #overdue_c
      more = true
    end
  end

  local kills, suspects, held = {}, {}, false
  local killed = {}
  local rest = false -- whether this step also works on the other queues
  if act then
    for _, id in ipairs(stale) do
      local f = W[id]
      if f[4] == '1' then
        -- Already suspect: judged by its own grace only.
        local ss = tonumber(redis.call('HGET', wkey(id), 'ss') or '')
        if ss and ran(ss) < suspect_grace then
          held = true
        else
          kills[#kills + 1] = { id, R_MISSED }
        end
      elseif brake_out then
        suspects[#suspects + 1] = id
      else
        kills[#kills + 1] = { id, R_MISSED }
      end
    end
    for _, id in ipairs(overdue_c) do kills[#kills + 1] = { id, R_DRAIN_TIMED_OUT } end
    next_skip = next_skip + #stale - (#kills - #overdue_c)
    if mode == 'judge' then next_skip = #stale - (#kills - #overdue_c) end
    if not exhausted then more = true end
    rest = exhausted
  end
  for _, kl in ipairs(kills) do killed[kl[1]] = true end

  -- The cursor after this chunk: its last score, and the candidates at that score it leaves in
  -- place (stale ones while the brake is undecided; suspects and held ones once acting); the rest
  -- leave the range (re-scored past now, killed, removed).
  if act or next_mode == mode then
    local stays = {}
    for _, id in ipairs(stale) do if not killed[id] then stays[id] = true end end
    if not act then for _, id in ipairs(overdue_c) do stays[id] = true end end
    if #cands > 0 then
      local last = cand_score[cands[#cands]]
      local n = 0
      if last == cur_score then n = ties end
      for _, id in ipairs(cands) do
        if stays[id] and cand_score[id] == last then n = n + 1 end
      end
      next_cursor, next_ties = last, n
    end
  else
    next_cursor, next_ties = '-inf', 0 -- judged: the act steps start again from the lowest
  end

  -- Draining workers past their deadline die whatever the brake says (those among the
  -- candidates are above). (A deadline this sweep's stall moved out is not overdue: the walk
  -- above moved it past now before this step.)
  local drain_ghosts = {}
  if rest then
    local lim = room(20) - #kills
    if lim > 0 then
      local due = redis.call('ZRANGEBYSCORE', K.drain, '-inf', '(' .. I(now), 'LIMIT', 0, lim)
      if #due == lim then more = true end
      for _, id in ipairs(due) do
        if not killed[id] then
          local f = worker_of(id)
          if f[2] == '1' then
            kills[#kills + 1] = { id, R_DRAIN_TIMED_OUT }
            killed[id] = true
          else
            -- Not draining (a death removes its entry; this one is stale): drop it, or it
            -- would head the range forever.
            drain_ghosts[#drain_ghosts + 1] = id
          end
        end
      end
    elseif lim <= 0 then
      more = true
    end
  end
  local preps = {}
  for i, kl in ipairs(kills) do
    preps[i] = prep_kill(kl[1], W[kl[1]][1])
    spend(16 + 4 * #preps[i].members)
  end

  -- Deliveries stuck in flight: bound claims whose worker lives (and is not killed here: its
  -- claims are released with it) and that ran longer than max_in_flight of registry running
  -- time. Their score in `flight` is a lower bound of that moment less max_in_flight (the claim
  -- time, + the stall credit once re-scored), so the candidates are those scored below now less
  -- max_in_flight; a candidate credited a stall is re-scored. Entries of claims no longer in
  -- flight are dropped.
  local stuck, stuck_of, stuck_ids, flight_rescore, flight_ghosts = {}, {}, {}, {}, {}
  local stuck_exits = {}
  if rest then
    local lim = room(4)
    local flight_c = {}
    if lim > 0 then
      flight_c = redis.call('ZRANGEBYSCORE', K.flight, '-inf', '(' .. I(now - max_in_flight),
        'LIMIT', 0, lim)
    end
    if #flight_c == lim then more = true end
    spend(2 * #flight_c)
    for _, m in ipairs(flight_c) do
      local c = redis.call('HMGET', ckey(m), 'h', 'ca', 'dn', 'rel')
      local h = c[1]
      local f = h and worker_of(h)
      if not (f and f[2] and c[2]) or c[3] or c[4] or f[2] == '2' then
        flight_ghosts[#flight_ghosts + 1] = m
      elseif not killed[h] then
        local ca = tonumber(c[2])
        if ran(ca) > max_in_flight then
          stuck[#stuck + 1] = { m, h }
          if not stuck_of[h] then
            stuck_of[h] = {}
            stuck_ids[#stuck_ids + 1] = h
          end
          stuck_of[h][m] = true
        else
          flight_rescore[#flight_rescore + 1] = { ca + since(ca), m }
        end
      end
    end
    -- A worker holding a stuck delivery is drained; an idle one exits at once (read its exit now).
    table.sort(stuck_ids, function(a, b) return tonumber(a) < tonumber(b) end)
    for _, h in ipairs(stuck_ids) do
      local f = W[h]
      if f[2] == '0' and f[3] ~= '1' then
        local k = prep_kill(h, f[1])
        local members = {}
        for _, m in ipairs(k.members) do
          if stuck_of[h][m] then k.stuck[#k.stuck + 1] = m else members[#members + 1] = m end
        end
        k.members = members
        stuck_exits[h] = k
        spend(16 + 4 * #members)
      end
    end
  end

  -- Stuck tombstones whose worker died (since the last sweep, or here) are no longer needed:
  -- they only refused that worker's late completion.
  local tombs, drop_tombs = {}, {}
  if rest then
    local lim = room(3)
    if lim > 0 then
      tombs = redis.call('ZRANGE', K.stuck_due, 0, lim - 1)
      if #tombs == lim then more = true end
    else
      more = true
    end
  end
  for _, k in ipairs(preps) do
    for _, m in ipairs(k.stuck) do tombs[#tombs + 1] = m end
  end
  for _, m in ipairs(tombs) do
    local c = redis.call('HMGET', ckey(m), 'h', 'rel', 'dn')
    local f = c[1] and worker_of(c[1])
    if c[2] == I(RR_STUCK) and not c[3] and (killed[c[1]] or not f or not f[2] or f[2] == '2') then
      drop_tombs[#drop_tombs + 1] = m
    end
  end
  spend(3 * #tombs)

  -- Claims to release: the killed workers', those released since the last sweep, and bare
  -- claims nobody completed within the heartbeat timeout.
  local releases, stale_pending, stale_unbound = {}, {}, {}
  for i, kl in ipairs(kills) do
    for _, m in ipairs(preps[i].members) do releases[#releases + 1] = { m, kl[1], kl[2] } end
  end
  if rest then
    local lim = room(6)
    local pend = {}
    if lim > 0 then pend = redis.call('ZRANGE', K.released_due, 0, lim - 1) end
    if #pend == lim then more = true end
    for _, m in ipairs(pend) do
      local c = redis.call('HMGET', ckey(m), 'h', 'rel')
      if c[2] then
        releases[#releases + 1] = { m, c[1] or '', tonumber(c[2]) }
      else
        stale_pending[#stale_pending + 1] = m
      end
    end
    spend(6 * #pend)
    lim = room(6)
    local unb = {}
    if lim > 0 then
      unb = redis.call('ZRANGEBYSCORE', K.unbound, '-inf', '(' .. I(now - timeout), 'LIMIT', 0, lim)
    end
    if #unb == lim then more = true end
    for _, m in ipairs(unb) do
      local c = redis.call('HMGET', ckey(m), 'h', 'ca', 'dn', 'rel')
      if c[2] and not c[1] and not c[3] and not c[4] then
        releases[#releases + 1] = { m, '', RR_UNBOUND }
      else
        stale_unbound[#stale_unbound + 1] = m
      end
    end
    spend(6 * #unb)
  end

  -- Completed claims past retention (a key the server already expired counts too), then the
  -- oldest beyond max_retained_claims. Index entries whose pair was claimed again are dropped.
  local expired, stale_done, victims = {}, {}, {}
  local purge = {}
  if rest then
    local lim = room(3)
    local old = {}
    if lim > 0 then
      old = redis.call('ZRANGEBYSCORE', K.done, '-inf', '(' .. I(now - retention), 'LIMIT', 0, lim)
    end
    local all_old = #old < lim
    if not all_old then more = true end
    for _, m in ipairs(old) do
      local c = redis.call('HMGET', ckey(m), 'ca', 'dn')
      if c[1] and not c[2] then stale_done[#stale_done + 1] = m else expired[#expired + 1] = m end
    end
    spend(3 * #old)
    local excess = redis.call('ZCARD', K.done) - #old - max_retained
    if excess > 0 and all_old then
      lim = room(3)
      local n = math.min(excess, lim)
      if n < excess then more = true end
      if n > 0 then
        for _, m in ipairs(redis.call('ZRANGE', K.done, #old, #old + n - 1)) do
          if redis.call('HEXISTS', ckey(m), 'dn') == 1 then
            victims[#victims + 1] = m
          else
            stale_done[#stale_done + 1] = m
          end
        end
        spend(3 * n)
      end
    end

    -- Dead records past retention.
    lim = room(5)
    if lim > 0 then
      purge = redis.call('ZRANGEBYSCORE', K.dead, '-inf', '(' .. I(now - dead_retention), 'LIMIT', 0, lim)
    end
    if #purge == lim then more = true end
  end

  -- The rescan walk after a dropped stall: the next chunk of `live`, then of `flight`, above the
  -- cursors in `rescan`, each entry re-scored down to its deadline as judged now if the lost
  -- credit brought it below its score (one now below `now` is a candidate of the next step).
  -- Re-scoring by sweeps only moves scores up, so a score cursor misses nothing but the ties
  -- of a chunk's last score when the whole chunk is one score; judging an entry twice is
  -- harmless. About 3 commands an entry; the cursors are written below, `rescan` deleted at the end.
  local rescan_cursor, rescan_fix, flight_fix = nil, {}, {}
  local rc = redis.call('GET', K.rescan)
  if rescan then rc = '-inf\t-inf' end
  if rest and rc then
    local tab = string.find(rc, '\t', 1, true)
    local cur = { string.sub(rc, 1, tab - 1), string.sub(rc, tab + 1) }
    for which = 1, 2 do
      local key = which == 1 and K.live or K.flight
      local lim = room(3)
      if cur[which] ~= 'done' then
        if lim <= 0 then
          more = true
        else
          local lo = cur[which] == '-inf' and '-inf' or '(' .. cur[which]
          local got = redis.call('ZRANGEBYSCORE', key, lo, '+inf', 'WITHSCORES', 'LIMIT', 0, lim)
          local n = #got / 2
          local upto = n
          if n == lim then
            -- Leave the chunk's trailing ties to the next step (unless the chunk is all one score).
            local last = got[2 * n]
            while upto > 0 and got[2 * upto] == last do upto = upto - 1 end
            if upto == 0 then upto = n end
            cur[which] = got[2 * upto]
            more = true
          else
            cur[which] = 'done'
          end
          for i = 1, upto do
            local m, score = got[2 * i - 1], tonumber(got[2 * i])
            local due
            if which == 1 then
              local f = worker_of(m)
              if f[2] and not overdue_drain(m, f) then
                local hb = tonumber(f[7])
                local allowed = timeout
                if f[5] ~= '1' then allowed = allowed + grace end
                due = hb + allowed + since(hb)
              end
            else
              local c = redis.call('HMGET', ckey(m), 'ca', 'dn', 'rel')
              if c[1] and not c[2] and not c[3] then
                due = tonumber(c[1]) + since(tonumber(c[1]))
              end
            end
            if due and due < score then
              local fix = which == 1 and rescan_fix or flight_fix
              fix[#fix + 1] = { due, m }
              -- A candidate of the next step: a worker past its deadline, a claim past its own
              -- (its score in `flight` is its claim time, max_in_flight before its deadline).
              if due < now - (which == 2 and max_in_flight or 0) then more = true end
            end
          end
          spend(3 * upto)
        end
      end
    end
    rescan_cursor = cur[1] .. '\t' .. cur[2]
    if cur[1] == 'done' and cur[2] == 'done' then rescan_cursor = false end
  end

  ---------------------------------------------------------------------------- write phase
  if need_group then
    redis.call('XGROUP', 'CREATE', K.released, 'dispatch', '0', 'MKSTREAM')
    need_group = false
  end
  write_stalls()
  if rescan_cursor then
    redis.call('SET', K.rescan, rescan_cursor)
  elseif rescan_cursor == false then
    redis.call('DEL', K.rescan)
  end
  for _, r in ipairs(rescan_fix) do redis.call('ZADD', K.live, r[1], r[2]) end
  for _, r in ipairs(flight_fix) do redis.call('ZADD', K.flight, r[1], r[2]) end
  for _, r in ipairs(rescore) do redis.call('ZADD', K.live, r[1], r[2]) end
  for _, r in ipairs(flight_rescore) do redis.call('ZADD', K.flight, r[1], r[2]) end
  for _, m in ipairs(flight_ghosts) do redis.call('ZREM', K.flight, m) end
  for _, id in ipairs(ghosts) do
    redis.call('ZREM', K.live, id)
    redis.call('ZREM', K.beat, id)
  end
  for _, id in ipairs(drain_ghosts) do redis.call('ZREM', K.drain, id) end
  for _, id in ipairs(suspects) do
    redis.call('HSET', wkey(id), 'x', 1, 'ss', now)
    unindex_beat(id, W[id].beat)
    redis.call('ZADD', K.dirty, 0, id)
    suspected[#suspected + 1] = id
    emit({ 'S', id, W[id][1] or '' })
  end
  for i, kl in ipairs(kills) do
    local id, reason = kl[1], kl[2]
    do_kill(preps[i], reason, now)
    died[#died + 1] = id
    died[#died + 1] = reason
    local t = W[id][1]
    if t and t ~= '' then released_targets[#released_targets + 1] = t end
  end
  local released_pairs = {}
  for _, r in ipairs(releases) do
    local m = r[1]
    local t, d = split_member(m)
    local id = redis.call('XADD', K.released, '*', 't', t, 'd', d, 'h', r[2], 'r', r[3])
    payload_released(m, id)
    redis.call('DEL', ckey(m))
    redis.call('ZREM', K.unbound, m)
    redis.call('ZREM', K.released_due, m)
    released_pairs[#released_pairs + 1] = { t, d }
  end
  n_released = #releases
  for _, m in ipairs(tombs) do redis.call('ZREM', K.stuck_due, m) end
  for _, m in ipairs(drop_tombs) do redis.call('DEL', ckey(m)) end

  -- Stuck: released through the stream like the rest, but the claim stays as a tombstone (in
  -- `ws:<id>`, out of the worker's in-flight set and of `flight`) so that the worker's late
  -- completion is refused as released, until the worker dies.
  for _, s in ipairs(stuck) do
    local m, h = s[1], s[2]
    local t, d = split_member(m)
    redis.call('HSET', ckey(m), 'rel', RR_STUCK)
    redis.call('HDEL', wkey(h), claim_field(m))
    redis.call('ZREM', K.flight, m)
    redis.call('SADD', wskey(h), m)
    payload_released(m, redis.call('XADD', K.released, '*', 't', t, 'd', d, 'h', h, 'r', RR_STUCK))
    emit({ 'K', h, t, d })
    released_pairs[#released_pairs + 1] = { t, d }
  end
  n_stuck = #stuck
  for _, h in ipairs(stuck_ids) do
    local f = W[h]
    local target = f[1]
    local until_ = now + drain_deadline
    if stuck_exits[h] then
      -- Idle: no loop to wait for. Its other claims are released by the next sweep (as for any
      -- death between sweeps) and still count as in flight in this snapshot.
      adj = adj + #stuck_exits[h].members
      do_kill(stuck_exits[h], R_EXITED, now)
      died[#died + 1] = h
      died[#died + 1] = R_EXITED
      if target and target ~= '' then released_targets[#released_targets + 1] = target end
    elseif f[2] == '0' then
      redis.call('HSET', wkey(h), 's', 1, 'dd', until_, 'ds', now)
      unindex_beat(h, f.beat)
      redis.call('ZADD', K.drain, until_, h)
      redis.call('ZADD', K.dirty, 0, h)
      emit({ 'D', h, target or '' })
      drained_stuck[#drained_stuck + 1] = h
    elseif not f[10] or f[10] == '' or until_ < tonumber(f[10]) then
      -- Draining already: the earlier deadline is kept.
      redis.call('HSET', wkey(h), 'dd', until_, 'ds', now)
      redis.call('ZADD', K.drain, until_, h)
      redis.call('ZADD', K.dirty, 0, h)
    end
  end

  local by_target, targets = {}, {}
  for _, t in ipairs(released_targets) do
    if not by_target[t] then by_target[t] = {}; targets[#targets + 1] = t end
  end
  for _, p in ipairs(released_pairs) do
    local t, d = p[1], p[2]
    if not by_target[t] then by_target[t] = {}; targets[#targets + 1] = t end
    local list = by_target[t]
    list[#list + 1] = d
  end
  for _, m in ipairs(stale_pending) do redis.call('ZREM', K.released_due, m) end
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
    redis.call('DEL', wskey(id))
    redis.call('ZREM', K.dead, id)
    redis.call('ZADD', K.dirty, 0, id)
  end
  n_purged = #purge
  engaged = held or #suspects > 0

  -- One TargetReleased per sweep and target that lost its worker or had deliveries released,
  -- as in memory: a step only adds its targets and deliveries to `rel_acc` (and a new target to
  -- `rel_order`); the sweep's last step publishes them, a bounded number a step (`more` until
  -- all are out; a sweep cut short leaves them to the next one).
  for _, t in ipairs(targets) do
    local had = redis.call('HGET', K.rel_acc, t)
    if not had then redis.call('RPUSH', K.rel_order, t) end
    local ds = table.concat(by_target[t], '\t')
    if had and had ~= '' then ds = (ds == '' and had) or (had .. '\t' .. ds) end
    redis.call('HSET', K.rel_acc, t, ds)
  end
  if not more then
    local out = redis.call('LPOP', K.rel_order, math.max(1, room(3))) or {}
    table.sort(out, target_less)
    for _, t in ipairs(out) do
      local ds = redis.call('HGET', K.rel_acc, t) or ''
      redis.call('HDEL', K.rel_acc, t)
      if ds == '' then emit({ 'R', t }) else emit({ 'R', t, ds }) end
    end
    more = redis.call('LLEN', K.rel_order) > 0
  end

  redis.call('SET', K.sweep_lease, me .. '\t' .. I(now + lease_ttl), 'PX', lease_ttl)
else
  -- The stall is the registry's, whichever replica's sweep measured it.
  write_stalls()
end

-------------------------------------------------------------------------------- hand-out
-- Entries handed out longer than release_ack_timeout ago (registry time) and not acknowledged
-- are offered again, to whoever sweeps first; then entries never handed out.
if need_group then redis.call('XGROUP', 'CREATE', K.released, 'dispatch', '0', 'MKSTREAM') end
local collected, n_collected = {}, 0
local function take(entry)
  local f, map = entry[2], {}
  for i = 1, #f, 2 do map[f[i]] = f[i + 1] end
  collected[#collected + 1] = entry[1]
  collected[#collected + 1] = map.t or ''
  collected[#collected + 1] = map.d or ''
  collected[#collected + 1] = map.h or ''
  collected[#collected + 1] = map.r or ''
  n_collected = n_collected + 1
  redis.call('ZADD', K.deliveries, now, entry[1])
end
if handout > 0 then
  local overdue_ids = redis.call('ZRANGEBYSCORE', K.deliveries, '-inf', '(' .. I(now - ack_timeout), 'LIMIT', 0, handout)
  for _, id in ipairs(overdue_ids) do
    local got = redis.call('XCLAIM', K.released, 'dispatch', me, 0, id)
    if got[1] and got[1][2] then take(got[1]) else redis.call('ZREM', K.deliveries, id) end
  end
  if handout - n_collected > 0 then
    local fresh = redis.call('XREADGROUP', 'GROUP', 'dispatch', me, 'COUNT', handout - n_collected, 'STREAMS', K.released, '>')
    if fresh and fresh[1] then
      for _, entry in ipairs(fresh[1][2]) do take(entry) end
    end
  end
end

return finish({ 'swept', swept and 1 or 0, 'now', now, 'mode', next_mode, 'skip', next_skip,
  'cursor', next_cursor, 'ties', next_ties,
  'brake', brake_out and 1 or 0, 'engaged', engaged and 1 or 0, 'more', more and 1 or 0,
  'died', died, 'suspected', suspected, 'released_targets', released_targets,
  'expired', n_expired, 'evicted', n_evicted, 'purged', n_purged, 'released', n_released,
  'collected', collected, 'handed', n_collected, 'live', redis.call('ZCARD', K.live),
  'stall_ms', (first and stall) and (stall[2] - stall[1]) or 0, 'stuck', n_stuck,
  'drained_stuck', drained_stuck, 'in_flight_adj', adj })
