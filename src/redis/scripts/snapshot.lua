-- snapshot: the published snapshot, if newer than the caller's.
-- ARGV: prefix, replica id, the caller's version
-- Returns {now, version, snapshot|''}
local now = clock()
local v = tonumber(redis.call('GET', K.snapshot_version) or '0') or 0
if v <= tonumber(ARGV[2]) then return { now, v, '' } end
return { now, v, redis.call('GET', K.snapshot) or '' }
