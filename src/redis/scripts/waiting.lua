-- waiting: the sweep's waiting-room step (run by every sweeping handle with the room on, before
-- the maintenance steps, repeated while it answers `more`): stores the room's settings (for the
-- promotion at a death), drops up to `budget` deliveries parked `max_wait` ago or earlier (oldest
-- first), then promotes the oldest waiting targets that fit (up to `budget` targets: ready ones
-- first, then one per owner in turn; see lib_waiting.lua).
-- ARGV: prefix, replica id, max_workers, timeout_ms, startup_grace_ms, retention_ms,
--       max_in_flight_ms, max_workers_per_owner, max_waiting, max_waiting_per_owner, max_wait_ms,
--       budget
-- Returns (inside `finish`) expired {target, delivery, waited ms...}, promoted (targets placed),
--   more (0/1), waiting (deliveries waiting after the step), now
local cfg = room_cfg({ ARGV[2], ARGV[3], ARGV[4], ARGV[6], ARGV[5], ARGV[7], ARGV[8], ARGV[9] })
local max_wait, budget = tonumber(ARGV[10]), tonumber(ARGV[11])

local now = clock()
store_cfg(cfg)
local expired, more = {}, false
if cfg.mx > 0 then
  local old = redis.call('ZRANGEBYSCORE', K.worder, '-inf', I(now - max_wait), 'WITHSCORES',
    'LIMIT', 0, budget)
  if #old == 2 * budget then more = true end
  for i = 1, #old, 2 do
    local m, at = old[i], tonumber(old[i + 1])
    local p = string.find(m, ':', 1, true)
    local t, d = string.sub(m, 1, p - 1), string.sub(m, p + 1)
    room_drop(t, d)
    drop_payload_key(pkey(m))
    if redis.call('EXISTS', wdkey(t)) == 0 then
      leave_line(t, redis.call('HGET', K.wt, t), false)
      redis.call('HDEL', K.wt, t)
    end
    expired[#expired + 1] = t
    expired[#expired + 1] = d
    expired[#expired + 1] = I(now - at)
    emit({ 'E', t, d, I(max_wait) })
  end
end
local placed = 0
if cfg.mx > 0 and contenders() then
  local again
  placed, again = fill(cfg, now, budget)
  more = more or again
end
return finish({ 'expired', expired, 'promoted', placed, 'more', more and 1 or 0,
  'waiting', redis.call('ZCARD', K.worder), 'now', now })
