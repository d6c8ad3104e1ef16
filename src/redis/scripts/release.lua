-- release: remove an in-flight (or released) claim so that a redelivery is admitted again.
-- ARGV: prefix, replica id, target, delivery, timeout_ms, retention_ms
-- Returns outcome 'ok' | 'unknown' | 'completed'
local member = ARGV[2] .. ':' .. ARGV[3]
local timeout, retention = tonumber(ARGV[4]), tonumber(ARGV[5])

local c = redis.call('HMGET', ckey(member), 'h', 'ca', 'dn', 'rel')
local st = standing(c, clock(), retention, timeout)
if st == 'none' then return UNKNOWN end
-- A completed claim whose retention ended is forgotten, as for claim and complete; the sweep
-- removes and counts it.
if st == 'expired' then return UNKNOWN end
if st == 'completed' then return 'outcome\tcompleted' end

forget_claim(member, c)
-- Its payload goes with it (an in-flight claim's, or a released one's not yet moved to the
-- stream).
drop_payload_key(pkey(member))
return 'outcome\tok'
