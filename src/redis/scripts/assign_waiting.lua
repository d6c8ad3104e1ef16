-- assign_waiting: assign.lua with the waiting room on (called instead of it by such a handle): a
-- new worker is refused ('capacity') while the owner holds its cap, or while targets wait for
-- capacity (they come first); nothing is parked (there is no delivery to park).
-- ARGV: prefix, replica id, target, max_workers, timeout_ms, startup_grace_ms,
--       max_workers_per_owner, max_waiting
-- Returns assign.lua's outcomes
local target = ARGV[2]
local cfg = room_cfg({ ARGV[3], ARGV[4], ARGV[5], 0, 0, ARGV[6], ARGV[7], 0 })

local now = clock()
local plan = plan_place(target, cfg.mw, now)
if plan.kind == 'new' and (owner_full(cfg, owner_of(target))
    or (cfg.mx > 0 and (redis.call('HEXISTS', K.wt, target) == 1 or contenders()))) then
  plan.kind = 'full'
end
if plan.kind ~= 'sticky' and plan.kind ~= 'new' then
  return finish(refuse_place(plan, target))
end
local id, n, new = do_place(plan, target, now, now + cfg.to + cfg.gr)
if new == 1 then owner_count(cfg, target, id) end
local live = -1
if new == 1 then live = plan.live + 1 end
return finish(assigned(id, n, new, live, now))
