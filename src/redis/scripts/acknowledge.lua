-- acknowledge: released events re-dispatched; they are not offered again.
-- ARGV: prefix, replica id, stream entry ids...
-- Returns the number of entries that were still pending.
if redis.call('EXISTS', K.released) == 0 then return 0 end
local acked = 0
for i = 2, #ARGV do
  acked = acked + redis.call('XACK', K.released, 'dispatch', ARGV[i])
  redis.call('XDEL', K.released, ARGV[i])
  redis.call('ZREM', K.deliveries, ARGV[i])
  redis.call('ZREM', K.released_seen, ARGV[i])
end
return acked
