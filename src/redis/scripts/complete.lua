-- complete / complete_by: mark a claim completed (fenced when a worker is given).
-- ARGV: prefix, replica id, target, delivery, by (worker id or ''), timeout_ms, retention_ms,
--       max_retained_claims, key_ttl_ms
-- Returns outcome 'completed' with evicted, retained, now | 'already' (completed before)
--   | 'unknown' | 'not_holder' with holder ('' for none)
--   | 'released' with holder, reason ('worker_died'|'stuck'|'unbound'), dead_reason (or '')
local member = ARGV[2] .. ':' .. ARGV[3]
local by = ARGV[4]
local timeout, retention = tonumber(ARGV[5]), tonumber(ARGV[6])
local max_retained, ttl = tonumber(ARGV[7]), tonumber(ARGV[8])

local now = clock()
local c = redis.call('HMGET', ckey(member), 'h', 'ca', 'dn', 'rel')
if not c[2] then return UNKNOWN end
local holder = c[1] or ''
if by ~= '' and holder ~= by then return pack({ 'outcome', 'not_holder', 'holder', holder }) end
local st, reason = standing(c, now, retention, timeout)
if st == 'completed' then return 'outcome\talready' end
if st == 'released' then
  local word, dead = release_words(reason)
  return pack({ 'outcome', 'released', 'holder', holder, 'reason', word, 'dead_reason', dead })
end
if st == 'expired' then return UNKNOWN end

-- In flight. Far over the limit (a burst between sweeps), the oldest are evicted now, at most
-- MAX_EVICT per completion (the sweep's bounded steps do the rest): read which before the first
-- write. A stale index entry (its key expired by the server and the pair claimed again since) is
-- dropped from the index but not counted.
local MAX_EVICT = 4
local retained = redis.call('ZCARD', K.done) + 1
local victims, stale = {}, {}
if retained > max_retained + math.floor(max_retained / 16) then
  local n = math.min(retained - max_retained, MAX_EVICT)
  for _, m in ipairs(redis.call('ZRANGE', K.done, 0, n - 1)) do
    if m ~= member then
      if redis.call('HEXISTS', ckey(m), 'dn') == 1 then
        victims[#victims + 1] = m
      else
        stale[#stale + 1] = m
      end
    end
  end
end

-- Complete it, retained for `retention` (the key's expiry is the backstop); its payload goes (a
-- retained claim keeps only ids).
drop_payload_key(pkey(member))
redis.call('HSET', ckey(member), 'dn', now)
redis.call('PEXPIRE', ckey(member), ttl)
redis.call('ZADD', K.done, now, member)
redis.call('ZREM', K.unbound, member)
if c[1] then
  redis.call('HDEL', wkey(c[1]), claim_field(member))
  redis.call('ZREM', K.flight, member)
end
for _, m in ipairs(victims) do
  redis.call('DEL', ckey(m))
  redis.call('ZREM', K.done, m)
end
for _, m in ipairs(stale) do redis.call('ZREM', K.done, m) end
return pack({ 'outcome', 'completed', 'evicted', #victims, 'retained', retained - #victims - #stale,
  'now', now })
