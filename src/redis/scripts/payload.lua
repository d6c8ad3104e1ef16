-- payload: the payload stored for a pair, in one read: with an entry id (a released entry being
-- handed out), that entry's copy if it still has one; else the pair's in-flight claim's, else its
-- parked delivery's (both `p:<member>`), else its released copy not yet acknowledged (`rpi`). A
-- completed claim, or one in flight without a payload, has none.
-- ARGV: prefix, replica id, target, delivery, entry id ('' for none), timeout_ms, retention_ms
-- Returns the encoded payload, or false for none.
local member = ARGV[2] .. ':' .. ARGV[3]
local id = ARGV[4]
if id ~= '' then
  local b = redis.call('HGET', rkey(id), 'b')
  if b then return b end
end
local b = redis.call('HGET', pkey(member), 'b')
if b then return b end
local c = redis.call('HMGET', ckey(member), 'h', 'ca', 'dn', 'rel')
local st = standing(c, clock(), tonumber(ARGV[6]), tonumber(ARGV[5]))
if st == 'in_flight' or st == 'completed' then return false end
local rid = redis.call('HGET', K.rpi, member)
if not rid then return false end
return redis.call('HGET', rkey(rid), 'b') or false
