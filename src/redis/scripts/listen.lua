-- listen: where the event sequence stands, and the registry's epoch (a value set once, so that a
-- listener that sees it change knows the server lost the registry's data and numbering restarted).
-- ARGV: prefix, replica id, a fresh epoch value (kept only if there is none)
-- Returns {epoch, last event sequence number}
redis.call('SET', K.epoch, ARGV[2], 'NX')
return { redis.call('GET', K.epoch), tonumber(redis.call('GET', K.event_seq) or '0') or 0 }
