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

-- Payloads (see docs::redis, "Payloads"). Keys, all in the registry's hash slot:
--   p:<member>  hash  s size (as Payload::size counts it), b the encoded payload: the payload of
--                     the pair's in-flight claim or of its parked delivery (a parked pair has no
--                     claim in flight), written by the same call that writes the claim or parks
--                     it
--   r:<id>      hash  the same, of released-stream entry <id>: a released claim's payload,
--                     moved there (RENAME, no copy) by the step that writes the entry
--   rpi         hash  member -> the entry id of its latest released copy (a re-admission's
--                     credit, the lookup); removed with that copy
--   pay         hash  n payloads held, b their bytes (the budget's counter)
local function pkey(member) return P .. 'p:' .. member end
local function rkey(id) return P .. 'r:' .. id end

-- Counts `n` payloads of `bytes` in (or out, negative).
local function pay_add(n, bytes)
  redis.call('HINCRBY', K.pay, 'n', n)
  redis.call('HINCRBY', K.pay, 'b', bytes)
end

-- Deletes payload key `k` if it exists, counted out; its size (0 if there was none).
local function drop_payload_key(k)
  local s = redis.call('HGET', k, 's')
  if not s then return 0 end
  redis.call('DEL', k)
  pay_add(-1, -tonumber(s))
  return tonumber(s)
end

-- The released copy of `member` not yet acknowledged: its entry id and size (nil, 0: none).
local function released_copy(member)
  local id = redis.call('HGET', K.rpi, member)
  if not id then return nil, 0 end
  return id, tonumber(redis.call('HGET', rkey(id), 's') or '0')
end

-- What admitting `member` again frees (its claim standing `st`): its released copy not yet
-- acknowledged, and the payload of its claim if that was released (at a death) and the sweep
-- has not yet moved it to the stream (`forget_claim` and `drop_payload_key` then delete it).
-- Returns the released copy's entry id (or nil) and the bytes freed.
local function readmission_credit(member, st)
  local rid, credit = released_copy(member)
  if st ~= 'none' then credit = credit + tonumber(redis.call('HGET', pkey(member), 's') or '0') end
  return rid, credit
end

-- Deletes the released copy `id` of `member` (its re-admission carries the payload now).
local function drop_released_copy(member, id)
  redis.call('HDEL', K.rpi, member)
  drop_payload_key(rkey(id))
end

-- The refusal of a payload of `size` if the bytes held, less `credit` (what the same call frees),
-- plus `size` would pass `limit`; nil if it fits.
local function over_budget(size, limit, credit)
  local held = tonumber(redis.call('HGET', K.pay, 'b') or '0')
  if held + size - credit <= limit then return nil end
  return pack({ 'outcome', 'payload_budget', 'held', I(held), 'needed', I(size), 'limit', I(limit) })
end

-- Stores the payload (`size`, encoded `blob`) of `member`'s claim or parked delivery.
local function store_payload(member, size, blob)
  redis.call('HSET', pkey(member), 's', size, 'b', blob)
  pay_add(1, size)
end

-- A claim of `member` was released through entry `id`: its payload, if it has one, moves to the
-- entry (RENAME: O(1), nothing copied) and stays counted until the entry is acknowledged or
-- expires, or the pair is admitted again with its payload. If the pair was parked meanwhile
-- (admitted again and refused), `p:<member>` is the parked delivery's and stays with it.
local function payload_released(member, id)
  local k = pkey(member)
  if redis.call('EXISTS', k) == 0 then return end
  if redis.call('ZSCORE', K.worder, member) then return end
  redis.call('RENAME', k, rkey(id))
  redis.call('HSET', K.rpi, member, id)
end

-- The entry `id` is gone (acknowledged or expired): its payload, if it has one, with it.
local function payload_entry_gone(id, member)
  if drop_payload_key(rkey(id)) > 0 and redis.call('HGET', K.rpi, member) == id then
    redis.call('HDEL', K.rpi, member)
  end
end
