-- worker-registry: claim helpers (after lib_base.lua).

-- Release reasons: 1-4 are the holder's dead reasons, 5 stuck, 6 unbound.
local RR_UNBOUND = 6

-- Where a claim stands. `c` is HMGET <claim> h ca dn rel. Returns one of 'none', 'in_flight',
-- 'completed', 'released' (with the release reason) or 'expired'.
local function standing(c, now, retention_ms, unbound_ms)
  if not c[2] then return 'none' end
  if c[3] then
    if now - tonumber(c[3]) > retention_ms then return 'expired' end
    return 'completed'
  end
  if c[4] then return 'released', tonumber(c[4]) end
  if not c[1] and now - tonumber(c[2]) > unbound_ms then return 'released', RR_UNBOUND end
  return 'in_flight'
end

-- Whether a claim (HMGET h ca dn rel) is in flight on a worker: `standing` answers 'in_flight'
-- for it at any time, so a decision may answer its duplicate without reading the clock.
local function in_flight_bound(c)
  return c[1] and c[2] and not c[3] and not c[4]
end

-- 1 if a duplicate's claim is in flight on a live worker that has never heartbeated (the reply
-- that told a router to start it may have been lost), else 0. `c[5]`, when the caller read it, is
-- the claim's `sb`: '1' if its worker had heartbeated when it was claimed. A worker's `bt` never
-- goes back to 0 and ids are not reused, so such a claim's answer is 0 without reading the worker
-- (a claim's holder is written only when the claim is made, after any earlier one is deleted).
local function unstarted(c, st)
  if st ~= 'in_flight' or not c[1] or c[5] == '1' then return 0 end
  local w = redis.call('HMGET', wkey(c[1]), 's', 'bt')
  if w[1] and w[1] ~= '2' and w[2] ~= '1' then return 1 end
  return 0
end

-- A duplicate's reply: the claim's holder ('' for none), since, state and unstarted.
local function duplicate(c, st)
  return 'outcome\tduplicate\tholder\t' .. (c[1] or '') .. '\tsince\t' .. c[2] .. '\tstate\t' .. st
    .. '\tunstarted\t' .. unstarted(c, st)
end

-- Release reason of a claim stuck in flight (its claim stays, as a tombstone, while its worker
-- lives: see sweep.lua).
local RR_STUCK = 5

-- Drops a claim that is about to be replaced or removed, and every index entry of it.
local function forget_claim(member, c)
  redis.call('DEL', ckey(member))
  redis.call('ZREM', K.unbound, member)
  redis.call('ZREM', K.done, member)
  redis.call('ZREM', K.released_due, member)
  if c[1] then
    redis.call('HDEL', wkey(c[1]), claim_field(member))
    redis.call('ZREM', K.flight, member)
    if c[4] == '5' then
      redis.call('SREM', wskey(c[1]), member)
      redis.call('ZREM', K.stuck_due, member)
    end
  end
end
