-- worker: one worker's state, read now.
-- ARGV: prefix, replica id, worker
-- Returns now, and line (the encoded worker) if it is known
local id = ARGV[2]
local now = clock()
local f = read_worker(id)
if not f[2] then return { 'now', now } end
return { 'now', now, 'line', encode_worker(id, f) }
