-- changes: what a replica needs to bring its cached snapshot from version `have` to the latest
-- published one, at most `count` change-log entries per call (the caller calls again from the
-- last entry it got, `after`).
-- ARGV: prefix, replica id, have, after (entry id, '' to start at version have + 1), count
-- Returns {'kind', 'same'|'delta'|'behind', 'version', v, 'now', ms, 'head', header|'',
--          'entries', {id, {field, value...}...}}
-- 'behind': the log no longer reaches back to `have` (or `have` is 0): rebuild from `snap`
-- (snap_page.lua) at version v with header `head`, then ask for the changes after v.
local have, after, count = tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local now = clock()
local v = tonumber(redis.call('GET', K.snapshot_version) or '0') or 0
local function answer(kind, head, entries)
  return { 'kind', kind, 'version', v, 'now', now, 'head', head or '', 'entries', entries or {} }
end
if v <= have and after == '' then return answer('same') end
local start = after
if start == '' then start = I(have + 1) .. '-0' else start = '(' .. start end
local oldest = redis.call('XRANGE', K.changes, '-', '+', 'COUNT', 1)[1]
local function version_of(id) return tonumber(string.sub(id, 1, string.find(id, '-', 1, true) - 1)) end
if have == 0 or not oldest or version_of(oldest[1]) > have + 1 then
  return answer('behind', redis.call('GET', K.snap_head))
end
return answer('delta', nil, redis.call('XRANGE', K.changes, start, '(' .. I(v + 1) .. '-0', 'COUNT', count))
