#!lua name=wr_floor
-- The floor under a decision's server cost, for benches/tools/redis_instructions.sh: functions
-- that make exactly the commands a decision makes, on keys of the same shapes and sizes, with the
-- same arguments, and decide nothing (no standing, no plan, no text arithmetic, no events table,
-- no `finish`). What a decision costs above its floor is its Lua logic; the floor itself is what
-- its commands cost on this server, which no logic can go below without making fewer of them.
-- ARGV as the registry's admit: prefix, replica id, target, delivery, then the limits (unread).
-- Its keys live under the prefix the tool passes (`{fl}:`), apart from the registry's own.

-- An FCALL with the admit's arguments that makes no command: the price of the call itself.
redis.register_function('wr_floor_noop', function(keys, args)
  return 'outcome\tok'
end)

-- A sticky admit's eight commands (admit.lua: the claim's HMGET, TIME, the target's GET, the
-- worker's HMGET, its HSET with the claim, ZADD dirty, the claim's HSET, ZADD flight).
redis.register_function('wr_floor_sticky', function(keys, args)
  local P, target, delivery = args[1], args[3], args[4]
  local member = target .. ':' .. delivery
  local ck = P .. 'c:' .. member
  redis.call('HMGET', ck, 'h', 'ca', 'dn', 'rel', 'sb')
  local t = redis.call('TIME')
  local now = t[1] .. '000'
  local id = redis.call('GET', P .. 't:' .. target)
  local wk = P .. 'w:' .. id
  redis.call('HMGET', wk, 's', 'n', 'bt')
  redis.call('HSET', wk, 'b', '1', 'n', '5', '@' .. member, now)
  redis.call('ZADD', P .. 'dirty', '0', id)
  redis.call('HSET', ck, 'h', id, 'ca', now, 'sb', '1')
  redis.call('ZADD', P .. 'flight', now, member)
  return 'outcome\tassigned\tworker\t' .. id .. '\tseq\t5\tnew\t0\tlive\t-1\tnow\t' .. now
end)

-- An admit that creates a worker: its thirteen commands (the claim's HMGET, TIME, the target's
-- GET, ZCARD live, the counters' MGET, the worker's HSET with the claim, ZADD live, the target's
-- SET, ZADD dirty, PUBLISH of the creation, the counters' MSET, the claim's HSET, ZADD flight).
-- The worker's id is TIME's two parts (unique per call, 16 digits as a real id is 13-14).
redis.register_function('wr_floor_creating', function(keys, args)
  local P, target, delivery = args[1], args[3], args[4]
  local member = target .. ':' .. delivery
  local ck = P .. 'c:' .. member
  redis.call('HMGET', ck, 'h', 'ca', 'dn', 'rel', 'sb')
  local t = redis.call('TIME')
  local now = t[1] .. '000'
  local tk = P .. 't:' .. target
  redis.call('GET', tk)
  redis.call('ZCARD', P .. 'live')
  redis.call('MGET', P .. 'next_worker_id', P .. 'epoch', P .. 'event_seq')
  local id = t[1] .. t[2]
  local wk = P .. 'w:' .. id
  redis.call('HSET', wk, 's', '0', 'b', '1', 'x', '0', 'bt', '0', 'hb', now, 'c', now, 'n', '1',
    't', target, '@' .. member, now)
  redis.call('ZADD', P .. 'live', now, id)
  redis.call('SET', tk, id)
  redis.call('ZADD', P .. 'dirty', '0', id)
  redis.call('PUBLISH', P .. 'events', '7\t' .. args[2] .. '\tC\t' .. id .. '\t' .. target)
  redis.call('MSET', P .. 'next_worker_id', id, P .. 'event_seq', now)
  redis.call('HSET', ck, 'h', id, 'ca', now)
  redis.call('ZADD', P .. 'flight', now, member)
  return 'outcome\tassigned\tworker\t' .. id .. '\tseq\t1\tnew\t1\tlive\t1\tnow\t' .. now
end)
