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

-- [Note: strategies are values]
-- A strategy is one of the five values below, named by the strings users
-- pass ('FULL_SHARD', ...; M.strategy turns a name into its value). What
-- the sharding and the planner need to know of it are its properties, read
-- here and nowhere compared by name:
--   reshard_after_forward  whether a unit frees its gathered parameters
--                          after forward (and gathers them again for
--                          backward);
--   shards_across          which ranks split one unit's parameters:
--                          'group' (the shard group option, default the
--                          world), 'node' (the ranks of one node), 'none'
--                          (every rank holds them whole);
--   replicates_across      which ranks hold copies of the same shard and
--                          sum their gradients: 'none', 'nodes' (one copy
--                          per node), 'group' (every rank of the group).
local Strategy = {}
Strategy.__index = Strategy
Strategy.__name = 'Strategy'
Strategy.__tostring = function(s) return s.name end

local function strategy(name, reshard, shards_across, replicates_across)
  return setmetatable({ name = name, reshard_after_forward = reshard, shards_across = shards_across,
                        replicates_across = replicates_across }, Strategy)
end
M.FULL_SHARD = strategy('FULL_SHARD', true, 'group', 'none')
M.SHARD_GRAD_OP = strategy('SHARD_GRAD_OP', false, 'group', 'none')
M.NO_SHARD = strategy('NO_SHARD', false, 'none', 'group')
M.HYBRID_SHARD = strategy('HYBRID_SHARD', true, 'node', 'nodes')
M.HYBRID_SHARD_ZERO2 = strategy('HYBRID_SHARD_ZERO2', false, 'node', 'nodes')
-- The names, in the order help and errors list them.
M.strategies = { 'FULL_SHARD', 'SHARD_GRAD_OP', 'NO_SHARD', 'HYBRID_SHARD', 'HYBRID_SHARD_ZERO2' }
local by_name = {}
for _, n in ipairs(M.strategies) do by_name[n] = M[n] end

function M.is_strategy(x) return getmetatable(x) == Strategy end

-- How many ranks share one unit's shards (the planner's arithmetic: a
-- world of `world` ranks, `ranks_per_node` on a node).
function Strategy:shard_size(world, ranks_per_node)
  if self.shards_across == 'none' then return 1 end
  if self.shards_across == 'node' then return ranks_per_node end
  return world
end

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

-- The process groups a unit of this strategy shards and replicates over
-- (collective on first use: it may create them), given the shard group
-- option (nil: the world). Returns shard_group, replicate_group (nil: the
-- option's group, none).
function Strategy:groups(group)
  if self.shards_across == 'group' then return group, nil end
  if self.shards_across == 'none' then return self_group(), group or dist.world() end
  return hybrid_groups()
end

-- [Note: strategies on a mesh]
-- With a device mesh (fsdp.shard's `mesh` option; [Note: the device mesh]
-- in fsdp/mesh.lua) the groups come from the mesh, not from the shard
-- group option or node boundaries: the sharding strategies (FULL_SHARD,
-- SHARD_GRAD_OP, and the hybrids alike) shard over 'dp_shard' and, when
-- dp_replicate > 1, sum their gradients over 'dp_replicate' (HSDP whose
-- groups are the mesh's); NO_SHARD replicates over 'dp'. TP ranks are
-- neither shards nor replicas of one another: they hold different
-- parameters. `sizes` is a Mesh or a plain {dp_replicate=, dp_shard=, tp=}
-- (the planner's, for a world it does not run in).
local function mesh_sizes(sizes)
  if type(sizes.size) == 'function' then
    return { dp_replicate = sizes:size('dp_replicate'), dp_shard = sizes:size('dp_shard'), tp = sizes:size('tp') }
  end
  return sizes
end

-- The ranks sharing one unit's shards, and the ranks holding copies of
-- each shard (whose gradients are summed), on a mesh of these sizes.
function Strategy:mesh_shard_size(sizes)
  local s = mesh_sizes(sizes)
  local G = self.shards_across == 'none' and 1 or s.dp_shard
  return G, s.dp_replicate * s.dp_shard / G
end

-- The process groups of a unit of this strategy on a mesh (fsdp.mesh; its
-- groups exist already): shard_group, replicate_group (nil: none).
function Strategy:mesh_groups(mesh)
  if self.shards_across == 'none' then return self_group(), mesh:group('dp') end
  return mesh:group('dp_shard'), mesh:size('dp_replicate') > 1 and mesh:group('dp_replicate') or nil
end

-- The strategy a name (or a strategy) stands for; an unknown one fails.
-- `who` names the caller in errors ('fsdp.shard', or 'fsdp.plan').
function M.strategy(s, where, who)
  if M.is_strategy(s) then return s end
  local st = type(s) == 'string' and by_name[s]
  if not st then
    core.fail(("%s: %sunknown strategy '%s' (known: %s)"):format(who or 'fsdp.shard', where or '', tostring(s),
      table.concat(M.strategies, ', ')))
  end
  return st
end
function M.check_strategy(s, where, who) M.strategy(s, where, who) end

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
local function check_shared(spec, params, who)
  local inside = {}
  for _, m in ipairs(spec.module:modules()) do inside[m] = true end
  for _, p in ipairs(params) do
    for _, slot in ipairs(p.slots) do
      if not inside[slot[3]] then
        core.fail(('%s: parameter %s of unit %s is also used by %s, outside that unit; '
          .. 'wrap the modules sharing it in one unit or leave them to the root'):format(
          who or 'fsdp.shard', p.name, spec.name, slot[4] == '' and 'the root' or slot[4]))
      end
    end
  end
end

-- Apply the policy bottom-up. Returns {{module=, name=, overrides=,
-- tensors={...}}...} children before parents, the root last.
local function assign_units(model, policy, ignored)
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
-- The planner (fsdp.plan) asks the same question of a meta model through
-- M.resolve, so its units are exactly the ones fsdp.shard would make.
M.assign_units = assign_units
M.slots_of = slots_of

-- The parameter whose dtype is the model's master dtype: the first that
-- requires grad (frozen ones may be kept in another: [Note: frozen
-- parameters] in fsdp/sharding/unit.lua), else the first; nil when the
-- model has none.
function M.master_param(model)
  local all = model:parameters()
  for _, p in ipairs(all) do
    if p.requires_grad then return p end
  end
  return all[1]
end

-- [Note: one resolution of the units]
-- What every unit of a sharded model is, decided once, on any device
-- (meta included) and before any memory moves or any collective runs:
-- fsdp.shard builds its units from it and fsdp.plan prices the same
-- structure, so the two cannot drift. resolve(model, o) with
--   o.policy, o.ignored (fsdp.shard's options), o.strategy (the default
--   strategy, a value: M.strategy), o.master (the master dtype: the dtype
--   of M.master_param), o.mp (the resolved base mixed precision:
--   M.mixed_precision), o.who (the caller named in errors)
-- applies the policy (assign_units) and returns the wrapped modules, children
-- before parents and the root last, each the spec of assign_units ({module=,
-- name=, overrides=, tensors=}) plus:
--   is_root, strategy (a value: the unit's override, else o.strategy), mp
--   (its dtypes: override or o.mp), reshard_after_forward (the strategy's
--   unless overridden), frozen and trainable (the unit of its frozen
--   parameters and of the others, nil when it has none: [Note: frozen
--   parameters] in unit.lua), lead (the unit the hooks drive: trainable,
--   else frozen);
-- each unit {spec=, frozen=, params = {{name=, tensor=, slots=}...},
-- tensors = {...}, master_dtype=, partner= (the trainable unit's frozen
-- one)}. A second return value lists the units in the order fsdp.shard
-- keeps them (a frozen unit just before its partner; the root last), the
-- third maps each tensor to its name. Fails, naming o.who, on what
-- fsdp.shard cannot shard: an unknown strategy or precision, a trainable
-- parameter not in the master dtype, frozen parameters of two dtypes in
-- one unit, a parameter used outside its (non-root) unit.
function M.resolve(model, o)
  local who, master = o.who or 'fsdp.shard', o.master
  local specs, fqn = assign_units(model, o.policy, o.ignored or {})
  local slots = slots_of(model)
  local units = {}
  for i, spec in ipairs(specs) do
    local ov = spec.overrides
    local where = spec.name == '' and 'root unit: ' or ('unit %s: '):format(spec.name)
    spec.is_root = i == #specs
    spec.strategy = ov.strategy ~= nil and M.strategy(ov.strategy, where, who) or o.strategy
    spec.mp = ov.mixed_precision ~= nil and mixed_precision(ov.mixed_precision, master, where, who) or o.mp
    spec.reshard_after_forward = spec.strategy.reshard_after_forward
    if ov.reshard_after_forward ~= nil then spec.reshard_after_forward = ov.reshard_after_forward end
    -- Trainable and frozen parameters go to separate flat parameters.
    local params, frozen, frozen_dtype = {}, {}, nil
    for _, t in ipairs(spec.tensors) do
      local p = { name = fqn[t], tensor = t, slots = slots[t] }
      if t.requires_grad or not t:is_floating_point() then
        if t.dtype ~= master then
          core.fail(('%s: parameter %s is %s but the model\'s trainable parameters are %s: one master '
            .. 'dtype per model (frozen parameters may differ)'):format(who, fqn[t], t.dtype, master))
        end
        params[#params + 1] = p
      else
        frozen_dtype = frozen_dtype or t.dtype
        if t.dtype ~= frozen_dtype then
          core.fail(('%s: frozen parameter %s is %s but %s of the same unit is %s: one dtype per unit\'s '
            .. 'frozen parameters'):format(who, fqn[t], t.dtype, frozen[1].name, frozen_dtype))
        end
        frozen[#frozen + 1] = p
      end
    end
    local function unit(list, is_frozen)
      if not spec.is_root then check_shared(spec, list, who) end
      local tensors = {}
      for j, p in ipairs(list) do tensors[j] = p.tensor end
      return { spec = spec, frozen = is_frozen, params = list, tensors = tensors,
               master_dtype = is_frozen and frozen_dtype or master }
    end
    spec.frozen = #frozen > 0 and unit(frozen, true) or nil
    spec.trainable = #params > 0 and unit(params, false) or nil
    spec.lead = spec.trainable or spec.frozen
    if spec.trainable then spec.trainable.partner = spec.frozen end
    -- The frozen unit before its partner, so the root stays last.
    if spec.frozen and spec.frozen ~= spec.lead then units[#units + 1] = spec.frozen end
    units[#units + 1] = spec.lead
  end
  return specs, units, fqn
end

return M
