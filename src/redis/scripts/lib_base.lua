-- worker-registry: the library's shared part (src/redis/scripts.rs assembles the Function
-- library: this file, lib_claims.lua and lib_workers.lua once, at `FUNCTION LOAD`, then one
-- `redis.register_function` per decision file, whose body runs as the function's callback). The
-- helpers are library-level locals, defined once per load; a call pays only for `begin` and its
-- own work.
--
-- Every function is called with one key and its arguments (FCALL <name> 1 <key> <args>): KEYS[1]
-- is the registry's test time offset key, `{name}:test_offset_ms`, from a build that can set it
-- (feature `testkit`), or the bare prefix `{name}:` (no key: nothing is read) from one that
-- cannot, so that a production call pays no `GET` for a test offset; ARGV[1] is the key prefix
-- `{name}:`, ARGV[2] the calling replica's id (removed from ARGV by `begin`, so that a decision's
-- own arguments start at ARGV[2]). Every other key is built from the prefix, so all of a
-- registry's keys share the hash tag `{name}` and live on one Cluster slot.
--
-- Discipline: every decision reads (and so validates) everything first and writes afterwards, so
-- that an error (a corrupted key of the wrong type, a bug) aborts it before its first write and
-- leaves no partial state. Time is the server's TIME plus the test offset, in integer ms, read only
-- where a decision needs it (a duplicate of a claim in flight answers without it).
--
-- Replies are name/value lists read by name (codec.rs `Fields`). One with nested values is a
-- table ({'outcome', word, 'field', value, ...}); one without is *packed*: its names and values
-- joined by tabs in one string ('outcome\tassigned\tworker\t7...', `pack`), because the server
-- converts a table reply to RESP at several times a string's cost (a 12-element table costs about
-- as much as a write; docs::redis, "Replies"). A packed value is a word, an id or an integer:
-- never a tab. The outcome words are PostgreSQL's (src/remote/vocab.rs).
--
-- Keys (K.<suffix> is `{name}:<suffix>`, built on first use):
--   live              zset  live worker id -> lower bound of its staleness deadline (ms)
--   drain             zset  draining worker id -> drain deadline (ms)
--   dead              zset  dead worker id -> time of death (ms)
--   t:<target>        string  the id of the target's live worker (the sticky map: one key per
--                           target, so that its lookup is O(1) at any size; one hash of them
--                           stays a listpack up to `hash-max-listpack-entries` targets, and an
--                           `HGET` scans it)
--   next_worker_id    string  last worker id handed out (see next_id)
--   w:<id>            hash  a worker (see lib_workers.lua), with its in-flight claims as fields
--                           '@<member>' -> claimed at (ms): a claim on it is written with the
--                           worker's own write (`claim_field`)
--   ws:<id>           set   a worker's stuck claims, kept (as tombstones) to refuse its late completion
--   flight            zset  every in-flight claim bound to a worker -> its claim time (ms), + the
--                           stall credit once re-scored: a lower bound of when it is stuck, less
--                           max_in_flight (the sweep adds it to its bound, an admit adds nothing)
--   stuck_due         zset  stuck tombstones whose worker died (score 0): the next sweep deletes them
--   c:<target>:<delivery>  hash  a claim: h holder, ca claimed at, dn completed at, rel reason
--                          sb '1' if its holder had heartbeated when admit.lua made it
--   unbound           zset  bare claim member -> claimed at (ms)
--   done              zset  completed claim member -> completed at (ms)
--   released_due      zset  released claim members the next sweep hands out (score 0)
--   released          stream  released deliveries (consumer group `dispatch`)
--   rel_acc           hash  target -> its deliveries released by this sweep so far (tab-joined;
--                           '' for none): its TargetReleased, published by the sweep's last step
--   rel_order         list  the targets in `rel_acc`, in the order the sweep first released them
--   deliveries        zset  stream entry id -> when it was handed out (ms)
--   released_seen     zset  stream entry id -> when expire_released first saw it (ms)
--   released_cursor   string  the last stream entry id expire_released has seen
--   events            channel  lifecycle events; event_seq their sequence number
--   dirty             zset  workers written since the last publish (score 0; publish.lua drains it)
--   beat              zset  active, started, unsuspected workers -> last beat (ms): the
--                           heartbeat's fast path (lib_workers.lua)
--   beat_from         string  the publisher's cursor in `beat` (a score; publish.lua)
--   snap              hash  worker id -> its line as last published (a rebuild pages it)
--   changes           stream  the change log: per version, entries `<version>-<n>` of upserted
--                           lines (u) and removed ids (r), the last one the header (h)
--   snap_head, snapshot_version  strings  the latest published header and version
--   sweep_lease       string  "<owner>\t<expires at, registry ms>", with PX
--   last_sweep        string  when the latest sweep of any replica ran (registry ms)
--   stalls            list  "<start>:<end>" stall spans the stall rule still credits, oldest first
--   drain_ext         list  stalls whose drain-deadline extension is still being walked, oldest
--                     first: "<from>:<to>:<len>:<cursor>:<skip>" (sweep.lua `extend_drains`)
--   rescan            string  "<live cursor>\t<flight cursor>": where the rescan walk after a
--                     dropped stall stands (scores, `-inf` at the start, `done` past the end)
--   epoch             string  the incarnation: set when there is none; moved on by the handle that
--                           finds the data rewound (identity.lua)
--   config            string  the deciding settings, stored by the first handle
--   consumers         zset  replica id -> its last sweep (ms): gone replicas' stream consumers are
--                           deleted (identity.lua)

-- The calling registry's prefix, its key table, this call's replica id and its test offset key
-- (false: the caller cannot set one): set by `begin` at the start of every call (a function runs
-- alone, to completion, so library-level state set at its start is its own).
local P, K, ME, OFFSET
-- This call's own events (nil until it emits one).
local EMITTED
-- The event sequence (`event_seq`) as this call last read or wrote it, as text; nil until
-- `next_id` read it. While it is known, `emit` counts from it instead of an INCR, so that a
-- creation writes the event's sequence and the id counter in one MSET (`created`).
local SEQ
-- The registry's epoch if this call read it already (nil: not read; false: there is none).
local EPOCH
-- One key table per prefix (a registry), cached across calls: K.<suffix> is built once.
local KS, NKS = {}, 0
local function begin(keys, args)
  P = args[1]
  ME = table.remove(args, 2)
  K = KS[P]
  if not K then
    -- A server holds few registries; a cache past 256 (many short-lived test registries) restarts.
    if NKS >= 256 then KS, NKS = {}, 0 end
    local prefix = P
    K = setmetatable({}, {
      __index = function(t, suffix)
        local key = prefix .. suffix
        rawset(t, suffix, key)
        return key
      end,
    })
    KS[P], NKS = K, NKS + 1
  end
  -- Lua 5.1 interns every string: this is a pointer comparison.
  OFFSET = keys[1] ~= P and keys[1]
  EMITTED, EPOCH, SEQ = nil, nil, nil
end

local function wkey(id) return P .. 'w:' .. id end
-- The field of a worker's hash that holds one of its in-flight claims (value: claimed at, ms).
local function claim_field(member) return '@' .. member end
local function ckey(member) return P .. 'c:' .. member end
local function tkey(target) return P .. 't:' .. target end
local function wskey(id) return P .. 'ws:' .. id end

-- The largest worker id (ids fill the high 44 bits of a fencing token).
local MAX_ID = 17592186044415

-- An integer as decimal text (tostring would switch to exponent form past 14 digits).
local function I(n) return string.format('%d', n) end

-- Worker ids count milliseconds from 2026-01-01 (as the in-memory backend's do): the next id is
-- past both the last one handed out and the registry's clock, so an id handed out before the
-- server lost or rewound the registry's data (a restart without persistence, a failover to a
-- lagging replica) is not handed out again, as long as ids were not handed out faster than one
-- per millisecond on average and the server's clock did not step back.
local ID_EPOCH_MS = 1767225600000
-- A new worker always emits its creation, so the epoch `finish` answers and the event sequence
-- are read here too (one MGET; `SEQ`, see `emit`).
local function next_id(now)
  local v = redis.call('MGET', K.next_worker_id, K.epoch, K.event_seq)
  EPOCH, SEQ = v[2], v[3] or '0'
  local last = tonumber(v[1] or '0') or 0
  return math.max(last + 1, now - ID_EPOCH_MS)
end

-- The words of the replies (src/remote/vocab.rs; PostgreSQL's). Dead reasons are stored as codes
-- 1-4 (a worker's `r`, a claim's `rel`; 5 stuck, 6 unbound) and answered as words.
local DEAD_WORD = { 'missed_heartbeats', 'exited', 'deregistered', 'drain_timed_out' }
local function dead_word(code)
  -- An unknown code is answered as it is: the decoder's error then shows it.
  return DEAD_WORD[tonumber(code)] or ('code ' .. tostring(code))
end
-- A packed reply (see the header): a flat name/value list joined by tabs. Numbers in it are
-- integers below 1e14 (ids, ms, counts), which Lua formats exactly.
local function pack(t) return table.concat(t, '\t') end
-- A refusal of a call on a dead worker.
local function refused_dead(code) return 'outcome\trefused_dead\treason\t' .. dead_word(code) end
local UNKNOWN = 'outcome\tunknown'
local ACTIVE, DRAINING = 'outcome\tactive', 'outcome\tdraining'
-- A release reason code as the words `reason` (and `dead_reason` for a death).
local function release_words(code)
  local n = tonumber(code)
  if n == 5 then return 'stuck', '' end
  if n == 6 then return 'unbound', '' end
  return 'worker_died', dead_word(code)
end

local function clock()
  local t = redis.call('TIME')
  local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if OFFSET then ms = ms + (tonumber(redis.call('GET', OFFSET) or '0') or 0) end
  return ms
end

-- The clock as decimal text (what `I(clock())` gives), built from TIME's text without a number:
-- a Lua number passed to `redis.call` is formatted with `%.17g` (about 2,600 instructions on
-- Redis 7.0) and `tonumber` runs `strtod` (about 1,200), so a hot decision that only stores and
-- compares the time keeps it as text (docs::redis, "Per-decision cost").
-- Milliseconds as text from TIME's seconds and microseconds (text, the latter unpadded).
local function ms_text(secs, us)
  local n = #us
  if n <= 3 then return secs .. '000' end
  return secs .. string.rep('0', 6 - n) .. string.sub(us, 1, n - 3)
end
local function clock_text()
  if OFFSET then return I(clock()) end
  local t = redis.call('TIME')
  return ms_text(t[1], t[2])
end

-- The later of two times given as decimal text (non-negative integers without leading zeros, as
-- the scripts write them), compared without converting either to a number.
local function later_text(a, b)
  if #a ~= #b then
    if #a > #b then return a end
    return b
  end
  if a >= b then return a end
  return b
end

-- The successor of a count given as decimal text (a non-negative integer without leading zeros;
-- nil or '' for 0), computed without converting it to a number.
local function succ_text(s)
  if not s or s == '' then return '1' end
  local i = #s
  while i > 0 and string.byte(s, i) == 57 do i = i - 1 end -- trailing '9's
  if i == 0 then return '1' .. string.rep('0', #s) end
  return string.sub(s, 1, i - 1) .. string.char(string.byte(s, i) + 1) .. string.rep('0', #s - i)
end

-- Publishes one lifecycle event: a registry-wide sequence number (a listener that sees a gap knows
-- how many it missed), the replica that caused it, its fields, tab-separated. The caller gets its
-- own events in the reply too (see `finish`), and waits until its listener has passed them.
-- With `unwritten`, the sequence number is not stored: the caller stores it (`created`). Returns
-- the event's sequence number (text).
local function emit(fields, unwritten)
  local seq
  if SEQ then
    seq = succ_text(SEQ)
    SEQ = seq
    if not unwritten then redis.call('SET', K.event_seq, seq) end
  else
    seq = I(redis.call('INCR', K.event_seq))
  end
  local body = table.concat(fields, '\t')
  redis.call('PUBLISH', K.events, seq .. '\t' .. ME .. '\t' .. body)
  if not EMITTED then EMITTED = {} end
  EMITTED[#EMITTED + 1] = seq .. '\t' .. body
  return seq
end

-- A new worker `id` (text; from `next_id`, which read the counters) of `target` ('' for none):
-- its creation event, then the id counter and the event sequence stored in one MSET.
local function created(id, target)
  local seq = emit({ 'C', id, target }, true)
  redis.call('MSET', K.next_worker_id, id, K.event_seq, seq)
end

-- The reply of a decision that may emit events: {events, reply, epoch}; the epoch (read only when
-- there are events, nil if no listener has set one since the data was lost) tells the caller
-- which numbering its events belong to. A call that emitted nothing answers its reply bare: a
-- packed string, or a name/value table whose first element is a name, where the wrapped form's is
-- the events array (contract.rs `invoke_sweeping` tells them apart so): the two tables around it
-- cost a third of a duplicate admit's reply (docs::redis, "Per-decision cost").
local NONE = {}
-- The waiting room's hooks (defined in lib_waiting.lua): a death's bookkeeping, and the promotion
-- into the slots this call freed, run by `finish` after the decision's own writes.
local waiting_on_kill, waiting_settle
local function finish(reply)
  waiting_settle()
  if not EMITTED then
    if type(reply) == 'string' or type(reply[1]) == 'string' then return reply end
    return { NONE, reply, false }
  end
  if EPOCH == nil then EPOCH = redis.call('GET', K.epoch) end
  return { EMITTED, reply, EPOCH }
end
