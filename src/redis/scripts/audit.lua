-- audit: what the registry holds unfinished, read now in one step (no writes). Each count is one
-- O(1) read (ZCARD, XLEN).
-- ARGV: prefix, replica id
-- Returns live (live workers), in_flight (claims bound to a worker, and bare ones), released
--   (released claims the next sweep hands out, and the outbox stream's entries until
--   acknowledged), waiting (parked deliveries)
return { 'live', redis.call('ZCARD', K.live),
  'in_flight', redis.call('ZCARD', K.flight) + redis.call('ZCARD', K.unbound),
  'released', redis.call('ZCARD', K.released_due) + redis.call('XLEN', K.released),
  'waiting', redis.call('ZCARD', K.worder) }
