-- expire_released: released entries nobody acknowledged within claim_retention of their release
-- are XACKed, XDELed and dropped from `deliveries`, at most `batch` a call (the next sweep
-- continues). Only the replica holding the sweep lease (or finding it free or lapsed) does it (the Rust sweep calls this
-- before its steps, so an entry expired is not handed out by them). An entry's release time is
-- when this function first saw it (`released_seen`, registry ms): the lease holder calls it at
-- the start of every sweep, so that is at most one sweep after the XADD (an entry expires up to
-- one sweep interval late); `released_cursor` is the last entry id it has seen (each call reads
-- at most `batch` new ones). `acknowledge` removes an entry from `released_seen`.
-- ARGV: prefix, replica id, retention_ms, batch
-- Returns {target, delivery, ...} of the entries expired.
local retention, batch = tonumber(ARGV[2]), tonumber(ARGV[3])
if redis.call('EXISTS', K.released) == 0 then return {} end
local now = clock()
local lease = redis.call('GET', K.sweep_lease)
local tab = lease and string.find(lease, '\t', 1, true)
-- Another replica's lease that has not lapsed: not ours to do (free, ours or lapsed: ours, as
-- for the sweep; two replicas racing on a lapsed lease each remove, and count, different entries).
if tab and string.sub(lease, 1, tab - 1) ~= ME and now < (tonumber(string.sub(lease, tab + 1)) or 0) then
  return {}
end
local cursor = redis.call('GET', K.released_cursor) or '0-0'
local fresh = redis.call('XRANGE', K.released, '(' .. cursor, '+', 'COUNT', batch)
for _, e in ipairs(fresh) do
  redis.call('ZADD', K.released_seen, 'NX', now, e[1])
  cursor = e[1]
end
if #fresh > 0 then redis.call('SET', K.released_cursor, cursor) end
local out = {}
local due = redis.call('ZRANGEBYSCORE', K.released_seen, '-inf', I(now - retention), 'LIMIT', 0, batch)
for _, id in ipairs(due) do
  local e = redis.call('XRANGE', K.released, id, id)
  redis.call('ZREM', K.released_seen, id)
  if e[1] then
    local f, t, d = e[1][2], '', ''
    for i = 1, #f - 1, 2 do
      if f[i] == 't' then t = f[i + 1] elseif f[i] == 'd' then d = f[i + 1] end
    end
    redis.call('XACK', K.released, 'dispatch', id)
    redis.call('XDEL', K.released, id)
    redis.call('ZREM', K.deliveries, id)
    payload_entry_gone(id, t .. ':' .. d)
    out[#out + 1] = t
    out[#out + 1] = d
  end
end
return out
