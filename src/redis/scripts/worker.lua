-- worker: one worker's state, read now.
-- ARGV: prefix, replica id, worker
-- Returns {now, encoded worker} | {now}
local id = ARGV[2]
local now = clock()
local f = read_worker(id)
if not f[2] then return { now } end
return { now, encode_worker(id, f) }
