-- fsdp.sharding.layout: what fsdp.shard decides before any memory moves,
-- and what the planner (fsdp.plan) must decide the same way: the
-- strategies (whether a unit reshards after forward, which group holds its
-- shards), the process groups behind them, mixed-precision dtypes, and
-- which parameters go to which unit (the policy applied bottom-up).
local core = require 'fsdp.core'
local dist = require 'fsdp.dist'
local C = core.C

local M = {}

-- strategies ---------------------------------------------------------------------------

-- reshard_after_forward and where shards live: 'group' (the shard group
-- option, default the world), 'node' (hybrid), 'self' (no sharding).
local STRATEGIES = {
  FULL_SHARD = { reshard = true, shard = 'group' },
  SHARD_GRAD_OP = { reshard = false, shard = 'group' },
  NO_SHARD = { reshard = false, shard = 'self' },
  HYBRID_SHARD = { reshard = true, shard = 'node' },
  HYBRID_SHARD_ZERO2 = { reshard = false, shard = 'node' },
}
M.strategies = { 'FULL_SHARD', 'SHARD_GRAD_OP', 'NO_SHARD', 'HYBRID_SHARD', 'HYBRID_SHARD_ZERO2' }
-- Read by the planner (fsdp.plan), which must make the same choices.
M.strategy_info = STRATEGIES

-- Groups are created collectively, once per process, in the order first
-- needed (the same on every rank: policies are deterministic).
local groups = {}
local function self_group()
  if not groups.self then groups.self = dist.split(dist.rank(), { name = 'self' }) end
  return groups.self
end
local function hybrid_groups()
  if not groups.shard then groups.shard, groups.replicate = dist.hybrid_groups() end
  return groups.shard, groups.replicate
end

local function strategy_groups(name, group)
  local s = STRATEGIES[name].shard
  if s == 'group' then return group, nil end
  if s == 'self' then return self_group(), group or dist.world() end
  return hybrid_groups()
end

-- `who` names the caller in errors ('fsdp.shard', or 'fsdp.plan').
local function check_strategy(s, where, who)
  if not STRATEGIES[s] then
    core.fail(("%s: %sunknown strategy '%s' (known: %s)"):format(who or 'fsdp.shard', where or '', tostring(s),
      table.concat(M.strategies, ', ')))
  end
end
M.check_strategy = check_strategy

-- {param=, reduce=, buffer=} dtype names; nil fields keep the model's.
local function mixed_precision(mp, master, where, who)
  who = who or 'fsdp.shard'
  if mp == nil or mp == false then return { param = master, reduce = master, grad = master } end
  if type(mp) == 'string' then mp = { param = mp, reduce = mp, buffer = mp } end
  if type(mp) ~= 'table' then
    core.fail(('%s: %smixed_precision must be a table {param=, reduce=, buffer=} or a dtype name'):format(who, where or ''))
  end
  for k in pairs(mp) do
    if k ~= 'param' and k ~= 'reduce' and k ~= 'buffer' and k ~= 'keep_low_precision_grads' then
      core.fail(("%s: %smixed_precision has unknown key '%s' (known: param, reduce, buffer)"):format(who, where or '', tostring(k)))
    end
  end
  local function name(d)
    if d == nil then return nil end
    local code = type(d) == 'string' and C.fl_dtype_parse(d) or -1
    if code < 0 or not C.fl_dtype_is_float(code) then
      C.fl_clear_error()
      core.fail(("%s: %smixed_precision: '%s' is not a floating-point dtype"):format(who, where or '', tostring(d)))
    end
    return core.dtype_name(code)
  end
  local param = name(mp.param) or master
  local reduce = name(mp.reduce) or param
  -- keep_low_precision_grads: the sharded gradient stays in the reduce
  -- dtype instead of being cast up to the master dtype (half the bytes).
  return { param = param, reduce = reduce, buffer = name(mp.buffer),
           grad = mp.keep_low_precision_grads and reduce or master }
end
M.mixed_precision = mixed_precision

-- which parameters go where ------------------------------------------------------------

-- Every slot holding each parameter tensor: {tensor = {{params_table, key,
-- module, module name}...}}.
local function slots_of(model)
  local slots = {}
  for _, nm in ipairs(model:named_modules()) do
    local ps = rawget(nm[2], '_parameters')
    for _, key in ipairs(rawget(nm[2], '_param_names')) do
      local t = ps[key]
      if t ~= nil then
        slots[t] = slots[t] or {}
        table.insert(slots[t], { ps, key, nm[2], nm[1] })
      end
    end
  end
  return slots
end

-- A unit other than the root is freed while modules outside it run, so a
-- parameter it owns must not be used from outside it (tied weights belong
-- in one unit, or to the root).
local function check_shared(spec, params)
  local inside = {}
  for _, m in ipairs(spec.module:modules()) do inside[m] = true end
  for _, p in ipairs(params) do
    for _, slot in ipairs(p.slots) do
      if not inside[slot[3]] then
        core.fail(('fsdp.shard: parameter %s of unit %s is also used by %s, outside that unit; '
          .. 'wrap the modules sharing it in one unit or leave them to the root'):format(
          p.name, spec.name, slot[4] == '' and 'the root' or slot[4]))
      end
    end
  end
end

-- Apply the policy bottom-up. Returns {{module=, name=, overrides=,
-- tensors={...}}...} children before parents, the root last.
local function plan_units(model, policy, ignored)
  local claimed = {}
  for _, m in ipairs(ignored) do
    for _, p in ipairs(m:parameters()) do claimed[p] = true end
  end
  local fqn = {}
  for _, np in ipairs(model:named_parameters()) do fqn[np[2]] = np[1] end
  local units = {}
  local function unclaimed_in(m)
    local list = {}
    for _, p in ipairs(m:parameters()) do
      if not claimed[p] then list[#list + 1] = p end
    end
    return list
  end
  local function visit(m, name, is_root)
    for _, nc in ipairs(m:named_children()) do
      visit(nc[2], name == '' and nc[1] or name .. '.' .. nc[1], false)
    end
    local list = unclaimed_in(m)
    local numel = 0
    for _, p in ipairs(list) do numel = numel + p:numel() end
    local r = false
    if not is_root and #list > 0 and policy then r = policy(m, name, numel) end
    if r and m.is_holder then
      core.fail(('fsdp.shard: the policy chose %s, a %s; nothing calls its forward, so its parameters '
        .. 'would never be gathered: wrap its elements instead'):format(name, m:class_name()))
    end
    if is_root or r then
      for _, p in ipairs(list) do claimed[p] = true end
      units[#units + 1] = { module = m, name = name, tensors = list,
                            overrides = type(r) == 'table' and r or {} }
    end
  end
  visit(model, '', true)
  return units, fqn
end
-- The planner (fsdp.plan) asks the same question of a meta model, so its
-- units are exactly the ones fsdp.shard would make.
M.plan_units = plan_units
M.slots_of = slots_of
M.check_shared = check_shared
M.strategy_groups = strategy_groups

return M
