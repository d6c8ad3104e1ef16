-- publish: one bounded step of publishing the snapshot (the lease holder, after its sweep's
-- maintenance steps). Takes up to `budget` ids from `dirty` (workers written since the last
-- publish), stores each one's line in `snap` (id -> line; gone: removed) and appends them to the
-- change log `changes` under the version being built (entry ids `<version>-<n>`). The step that
-- empties `dirty` appends the version's header (`h`), moves `snapshot_version` to it and trims
-- the log to its last `keep` versions. A replica applies a version once it has its header, so a
-- version is published atomically however many steps built it; entries of a publisher that died
-- mid-way stay valid (they hold real data) and the next publisher continues the same version.
-- Once `dirty` is empty, a step also takes the beats the heartbeat's fast path recorded in `beat`
-- alone (lib_workers.lua): those scored from `beat_from` up to now, by score, and moves
-- `beat_from` past what it took. A beat recorded later scores at least now, so it is past the
-- cursor; the cursor stops at a score, never between two members of one, and the last step
-- leaves it at now (a beat later in the same ms is taken again next time, harmlessly).
-- ARGV: prefix, replica id, at (the sweep's time), brake engaged (0/1), in-flight adjustment,
--       caller's version, budget, keep
-- Returns {'done', 0/1, 'version', version}
local at, engaged, adj = ARGV[2], ARGV[3], tonumber(ARGV[4])
local have, budget, keep = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])

local ids = redis.call('ZRANGE', K.dirty, 0, budget - 1)
local done = #ids < budget
local beats, beat_from = {}, nil
if done then
  local from = redis.call('GET', K.beat_from) or '0'
  local upto = clock_text()
  local room = budget - #ids
  local got = redis.call('ZRANGE', K.beat, from, upto, 'BYSCORE', 'WITHSCORES', 'LIMIT', 0, room)
  if #got < 2 * room then
    for i = 1, #got, 2 do beats[#beats + 1] = got[i] end
    beat_from = upto
  else
    -- A full page: its last score may go on past it, so the page stops before that score...
    local last = got[#got]
    for i = 1, #got, 2 do
      if got[i + 1] ~= last then beats[#beats + 1] = got[i] end
    end
    beat_from, done = last, false
    if #beats == 0 then
      -- ...unless the page is that one score: then all of it (at most what the server ran in one
      -- ms), and on past it (to now, and done, if it is now's).
      beats = redis.call('ZRANGE', K.beat, last, last, 'BYSCORE')
      if tonumber(last) < tonumber(upto) then
        beat_from = I(tonumber(last) + 1)
      else
        beat_from, done = upto, true
      end
    end
  end
  if tonumber(beat_from) <= tonumber(from) then beat_from = nil end
end
local ups, rems = {}, {}
local taken = {}
for _, id in ipairs(ids) do
  taken[id] = true
  local f = read_worker(id)
  if f[2] then ups[#ups + 1] = { id, encode_worker(id, f) } else rems[#rems + 1] = id end
end
for _, id in ipairs(beats) do
  if not taken[id] then
    local f = read_worker(id)
    if f[2] then ups[#ups + 1] = { id, encode_worker(id, f) } end
  end
end
-- A version never goes backwards: a replica that remembers a later one than the server (after
-- a data loss) carries it forward.
local version = (tonumber(redis.call('GET', K.snapshot_version) or '0') or 0) + 1
if version <= have then version = have + 1 end

local lines = {}
for i, u in ipairs(ups) do
  redis.call('HSET', K.snap, u[1], u[2])
  lines[i] = u[2]
end
for _, id in ipairs(rems) do redis.call('HDEL', K.snap, id) end
if #ids > 0 then redis.call('ZREM', K.dirty, unpack(ids)) end
if beat_from then redis.call('SET', K.beat_from, beat_from) end
if #lines > 0 or #rems > 0 then
  redis.call('XADD', K.changes, I(version) .. '-*', 'u', table.concat(lines, '\n'),
    'r', table.concat(rems, ','))
end
if done then
  local head = table.concat({ I(version), at, engaged,
    I(redis.call('ZCARD', K.unbound) + redis.call('ZCARD', K.flight) + adj),
    I(redis.call('ZCARD', K.done)) }, '\t')
  redis.call('XADD', K.changes, I(version) .. '-*', 'h', head)
  redis.call('SET', K.snapshot_version, I(version))
  redis.call('SET', K.snap_head, head)
  if version > keep then
    redis.call('XTRIM', K.changes, 'MINID', I(version - keep + 1) .. '-0')
  end
end
return { 'done', done and 1 or 0, 'version', version }
