-- identity: the registry's incarnation (its epoch), its worker-id counter and its published
-- snapshot version: what a handle compares with what it saw, to find a data loss (loss.rs).
-- ARGV: prefix, replica id, a fresh epoch value, the epoch to move on from ('' for none)
-- The fresh value is set if there is no epoch (the data is gone), or if the epoch is still the
-- one to move on from (the caller found the data rewound: every other handle then finds the
-- loss by the new epoch).
-- Returns {epoch, last worker id, snapshot version}
local fresh, from = ARGV[2], ARGV[3]
local cur = redis.call('GET', K.epoch)
if not cur or (from ~= '' and cur == from) then
  redis.call('SET', K.epoch, fresh)
  cur = fresh
end
return { cur, tonumber(redis.call('GET', K.next_worker_id) or '0') or 0,
  tonumber(redis.call('GET', K.snapshot_version) or '0') or 0 }
