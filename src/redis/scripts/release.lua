-- release: remove an in-flight (or released) claim so that a redelivery is admitted again.
-- ARGV: prefix, replica id, target, delivery
-- Returns {'ok'} | {'unknown'} | {'completed'}
local member = ARGV[2] .. ':' .. ARGV[3]

local c = redis.call('HMGET', ckey(member), 'h', 'ca', 'dn', 'rel')
if not c[2] then return { 'unknown' } end
if c[3] then return { 'completed' } end

forget_claim(member, c)
return { 'ok' }
