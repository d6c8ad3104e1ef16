-- snap_page: one page of the published worker lines (`snap`), for a replica rebuilding its
-- snapshot (see changes.lua).
-- ARGV: prefix, replica id, cursor ('0' to start), count
-- Returns {cursor ('0': done), {id, line, ...}}
return redis.call('HSCAN', K.snap, ARGV[2], 'COUNT', tonumber(ARGV[3]))
