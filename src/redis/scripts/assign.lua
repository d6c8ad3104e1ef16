-- assign: place a target without claiming a delivery.
-- ARGV: prefix, replica id, target, max_workers, timeout_ms, startup_grace_ms
-- Returns outcome 'assigned' with worker, seq, new (0/1), live (-1: unchanged), now
--   | 'capacity' | 'draining' with worker (as admit.lua)
local target, max_workers = ARGV[2], tonumber(ARGV[3])
local timeout, grace = tonumber(ARGV[4]), tonumber(ARGV[5])

local now = clock()
local plan = plan_place(target, max_workers, now)
if plan.kind ~= 'sticky' and plan.kind ~= 'new' then
  return finish(refuse_place(plan, target))
end
local id, n, new = do_place(plan, target, now, now + timeout + grace)
local live = -1
if new == 1 then live = plan.live + 1 end
return finish(assigned(id, n, new, live, now))
