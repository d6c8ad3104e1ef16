-- claim: record a bare claim (bound to no worker) unless the pair is in flight, retained or
-- waiting (parked: admit_waiting.lua's duplicate, and it stays parked; with the room off, one
-- ZSCORE of a missing key).
-- ARGV: prefix, replica id, target, delivery, timeout_ms, retention_ms
-- Returns outcome 'duplicate' (fields as admit.lua's; state 'waiting' for a parked pair) |
--   'claimed'
local member = ARGV[2] .. ':' .. ARGV[3]
local timeout, retention = tonumber(ARGV[4]), tonumber(ARGV[5])

local c = redis.call('HMGET', ckey(member), 'h', 'ca', 'dn', 'rel')
if in_flight_bound(c) then return duplicate(c, 'in_flight') end
local now = clock()
local st = standing(c, now, retention, timeout)
if st == 'in_flight' or st == 'completed' then return duplicate(c, st) end
local since = redis.call('ZSCORE', K.worder, member)
if since then
  return pack({ 'outcome', 'duplicate', 'holder', '', 'since', since, 'state', 'waiting',
    'unstarted', 0 })
end

if st ~= 'none' then
  forget_claim(member, c)
  drop_payload_key(pkey(member)) -- a released claim's, not yet moved to the stream
end
redis.call('HSET', ckey(member), 'ca', now)
redis.call('ZADD', K.unbound, now, member)
return 'outcome\tclaimed'
