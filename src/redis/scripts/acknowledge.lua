-- acknowledge: released events re-dispatched; they are not offered again, and an entry's
-- payload (r:<id>) goes with it.
-- ARGV: prefix, replica id, stream entry ids...
-- Returns the number of entries that were still pending.
if redis.call('EXISTS', K.released) == 0 then return 0 end
local acked = 0
for i = 2, #ARGV do
  acked = acked + redis.call('XACK', K.released, 'dispatch', ARGV[i])
  if redis.call('EXISTS', rkey(ARGV[i])) == 1 then
    local e = redis.call('XRANGE', K.released, ARGV[i], ARGV[i])
    local t, d = '', ''
    if e[1] then
      local f = e[1][2]
      for j = 1, #f - 1, 2 do
        if f[j] == 't' then t = f[j + 1] elseif f[j] == 'd' then d = f[j + 1] end
      end
    end
    payload_entry_gone(ARGV[i], t .. ':' .. d)
  end
  redis.call('XDEL', K.released, ARGV[i])
  redis.call('ZREM', K.deliveries, ARGV[i])
  redis.call('ZREM', K.released_seen, ARGV[i])
end
return acked
