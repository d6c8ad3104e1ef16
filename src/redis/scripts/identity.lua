-- identity: the registry's incarnation (its epoch), its worker-id counter and its published
-- snapshot version: what a handle compares with what it saw, to find a data loss (loss.rs).
-- Run by every handle's every sweep, it also notes the handle as a live consumer of the released
-- stream and forgets up to 8 consumers (replicas) silent for longer than `forget_after_ms` that
-- hold no pending entry (XGROUP DELCONSUMER), so that the consumer group does not grow with every
-- replica that ever ran.
-- ARGV: prefix, replica id, a fresh epoch value, the epoch to move on from ('' for none),
--       forget_after_ms
-- The fresh value is set if there is no epoch (the data is gone), or if the epoch is still the
-- one to move on from (the caller found the data rewound: every other handle then finds the
-- loss by the new epoch).
-- Returns {epoch, last worker id, snapshot version}
local fresh, from, forget_after = ARGV[2], ARGV[3], tonumber(ARGV[4])
local now = clock()
local cur = redis.call('GET', K.epoch)
if not cur or (from ~= '' and cur == from) then
  redis.call('SET', K.epoch, fresh)
  cur = fresh
end
local last = tonumber(redis.call('GET', K.next_worker_id) or '0') or 0
local version = tonumber(redis.call('GET', K.snapshot_version) or '0') or 0

redis.call('ZADD', K.consumers, now, ME)
local gone = redis.call('ZRANGEBYSCORE', K.consumers, '-inf', now - forget_after, 'LIMIT', 0, 8)
local stream = redis.call('EXISTS', K.released) == 1
for _, c in ipairs(gone) do
  -- A consumer that still holds entries keeps them until another replica claims them (after
  -- release_ack_timeout), and is forgotten in a later sweep.
  local pending = {}
  if stream then pending = redis.call('XPENDING', K.released, 'dispatch', '-', '+', 1, c) end
  if #pending == 0 then
    if stream then redis.call('XGROUP', 'DELCONSUMER', K.released, 'dispatch', c) end
    redis.call('ZREM', K.consumers, c)
  end
end
return { cur, last, version }
