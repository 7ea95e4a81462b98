-- fsdp.sharding: fully sharded data parallel over a model, FSDP's ideas
-- with flat parameters per unit (DESIGN.md, decisions 4-8).
--
--   local model = llama.build('Llama-2-7b', {device = 'meta'})
--   fsdp.shard(model, {
--     policy = fsdp.policy.transformer{llama.DecoderLayer},
--     strategy = 'FULL_SHARD',                 -- SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD, HYBRID_SHARD_ZERO2
--     mixed_precision = {param = 'bf16', reduce = 'f32', buffer = 'bf16',
--                        keep_low_precision_grads = false},
--     backward_prefetch = 'pre',               -- 'post', false
--     forward_prefetch = true, limit_all_gathers = true,
--     init = false,                            -- meta parameters left zero: every value will be loaded
--                                              -- (or a predicate on the name: draw only those)
--   })
--   fsdp.checkpoint(model, is_block)           -- shard-aware: after sharding
--   local opt = optim.AdamW(model:named_parameters(), {...})  -- original names
--   loss = model:loss(ids, targets); loss:backward()
--   fsdp.clip_grad_norm(model, 1.0); opt:step(); opt:zero_grad()
--
-- Each unit's pre-forward hook gathers it (and prefetches the next in the
-- recorded forward order); its post-forward hook frees it again
-- (FULL_SHARD, HYBRID_SHARD; never the root) and puts a pre-backward node
-- on its outputs that gathers it before its backward (prefetching the next
-- in the recorded backward order with 'pre'); the unit's post-backward node
-- reduce-scatters its gradient and frees it ('post' prefetches there). A
-- callback queued for the end of backward waits for the last reductions.
-- See [Note: what a parameter slot holds] in fsdp/sharding/unit.lua.
-- Parameters that do not require grad (a LoRA base: fsdp.lora) get a
-- flat parameter of their own per unit, with no gradient ([Note: frozen
-- parameters] there).
local core = require 'fsdp.core'
local validate = require 'fsdp.validate'
local factories = require 'fsdp.factories'
local random = require 'fsdp.random'
local dist = require 'fsdp.dist'
local autograd = require 'fsdp.autograd'
local Tensor = require 'fsdp.tensor'
local Module = require 'fsdp.nn.module'
local repr = require 'fsdp.nn.repr'
local parameter = require 'fsdp.nn.parameter'
local Unit = require 'fsdp.sharding.unit'
local layout = require 'fsdp.sharding.layout'
local State = require 'fsdp.sharding.hooks'
local clip = require 'fsdp.optim.clip'
local mesh_mod = require 'fsdp.mesh'
local ffi, C = core.ffi, core.C

local M = {}

-- A module whose call failed while a parameter of its own is at rest (this
-- rank's 1-d segment, [Note: what a parameter slot holds] in unit.lua):
-- its unit was not gathered, which happens when forward() is called
-- directly (self:forward(x)), past the hooks a module call runs. The
-- op's own error ("linear: weight must be 2-d, got shape [960]") says
-- what failed; this says why.
table.insert(Module.error_hints, function(m)
  for name, t in pairs(rawget(m, '_parameters') or {}) do
    local unit = type(t) == 'table' and rawget(t, 'fsdp_unit')
    local shape = unit and rawget(t, 'fsdp_shape')
    if unit and shape then
      return ("its parameter %s [%s] is not gathered: it holds this rank's 1-d shard of sharded unit %s, which is "
        .. 'gathered when a module is called, as model(x) or self.block(x); calling forward() directly '
        .. '(self:forward(x)) skips that'):format(name, table.concat(shape, ', '), unit:label())
    end
  end
end)
M.policy = require 'fsdp.sharding.policy'

-- What fsdp.shard decides up front lives in layout.lua (shared with the
-- planner: [Note: one resolution of the units]); the step's hooks in
-- hooks.lua.
local mixed_precision = layout.mixed_precision
M.strategies, M.strategy, M.is_strategy = layout.strategies, layout.strategy, layout.is_strategy
M.check_strategy, M.mixed_precision, M.assign_units = layout.check_strategy, mixed_precision, layout.assign_units
M.resolve, M.master_param = layout.resolve, layout.master_param

local OPTIONS = {
  policy = true, strategy = true, mixed_precision = true, cpu_offload = true,
  backward_prefetch = true, forward_prefetch = true, limit_all_gathers = true,
  sync_module_states = true, ignored = true, group = true, seed = true, device = true, init = true, mesh = true,
}

-- the API ----------------------------------------------------------------------------------

local function state_of(model, what)
  local s = Module.is_module(model) and rawget(model, '_fsdp')
  if not s then core.fail(('%s: the model is not sharded (call fsdp.shard first)'):format(what)) end
  return s
end
M.state_of = state_of

local function fmt_int(n)
  local s = ('%d'):format(n)
  return (s:reverse():gsub('(%d%d%d)', '%1,'):reverse():gsub('^,', ''))
end

-- print(model) shows each unit as FSDP's repr does: the wrapper, then the
-- module it wraps.
local function set_repr(u)
  local m = u.module
  local cls_repr = getmetatable(m).__repr
  rawset(m, '__repr', function(self)
    local head = ('FullyShardedDataParallel(%s, %d params, numel %s, shard %s x %d, %s%s)'):format(
      u.strategy, #u.params, fmt_int(u.numel), fmt_int(u.shard_numel), u.shard_size,
      u.param_dtype, u.param_dtype ~= u.master_dtype and ('/' .. u.master_dtype) or '')
    return head .. '(\n  (_fsdp_wrapped_module): ' .. repr.addindent(cls_repr(self), 2) .. '\n)'
  end)
end

-- Buffers: materialised when on meta (from their init rules), cast to the
-- buffer dtype, and broadcast from rank 0 with sync_module_states.
local function prepare_buffers(model, device, mp_buffer, seed, sync)
  autograd.no_grad(function()
    for _, nm in ipairs(model:named_modules()) do
      local m, prefix = nm[2], nm[1]
      local bs = rawget(m, '_buffers')
      for _, key in ipairs(rawget(m, '_buffer_names')) do
        local b = bs[key]
        if b ~= nil then
          local name = prefix == '' and key or prefix .. '.' .. key
          local r = b
          if b:is_meta() and device ~= 'meta' then
            r = factories.empty(b.shape, { dtype = b.dtype, device = device })
            local rule = rawget(b, 'init')
            if rule == nil then
              core.fail(('fsdp.shard: buffer %s is on the meta device and has no init rule'):format(name))
            end
            parameter.fill(r, rule, { seed = seed, name = name }, 'buffer ' .. name)
          end
          if mp_buffer and r:is_floating_point() and r.dtype ~= mp_buffer then r = r:to({ dtype = mp_buffer }) end
          if sync and r:has_storage() then dist.broadcast(r, 0) end
          if r ~= b then
            for k, v in pairs(b) do if type(k) == 'string' and k:sub(1, 1) ~= '_' then rawset(r, k, v) end end
            bs[key] = r
          end
        end
      end
    end
  end)
end

-- sync_module_states: every rank takes rank 0's values of its parameters.
local function broadcast_params(spec_params, device)
  autograd.no_grad(function()
    for _, p in ipairs(spec_params) do
      local t = p.tensor
      local full
      if dist.rank() == 0 then
        if not t:has_storage() then
          core.fail(('fsdp.shard: sync_module_states needs rank 0 to hold the values of %s'):format(p.name))
        end
        full = t:contiguous()
      else
        full = factories.empty(t.shape, { dtype = t.dtype, device = device })
      end
      dist.broadcast(full, 0)
      p.values = full
    end
  end)
end

-- Shard `model` in place (see the top of this file); returns it.
-- Rank agreement on what every collective of sharding depends on (the
-- units, their parameters' names, shapes and dtypes, the strategy and
-- precision), before the first one: ranks that built different models
-- (--num_layers differing per rank) would otherwise gather buffers of
-- different sizes (MPI_ERR_TRUNCATE) or wait for collectives the others
-- never start.
local function agree_structure(plan, fqn, strategy, opts, seed, device)
  -- Over the group sharding runs on (its members call fsdp.shard), else
  -- the world.
  local group = opts.group
  if dist.world_size() == 1 or (group and not group:is_member()) then return end
  local units = {}
  for i, spec in ipairs(plan) do
    local params = {}
    for j, t in ipairs(spec.tensors) do
      params[j] = ('%s %s %s%s'):format(fqn[t], t.dtype, table.concat(t.shape, 'x'),
                                        t.requires_grad and '' or ' frozen')
    end
    units[i] = { name = spec.name, params = table.concat(params, ', '), overrides = spec.overrides }
  end
  local mp = opts.mixed_precision
  local mesh = opts.mesh and { dp_replicate = opts.mesh:size('dp_replicate'), dp_shard = opts.mesh:size('dp_shard'),
                               tp = opts.mesh:size('tp') } or 'none'
  dist.agree('the sharded model (fsdp.shard)', {
    mesh = mesh,
    strategy = strategy, units = units, n_units = #plan, seed = seed, device = device:match('^cuda') and 'cuda' or device,
    mixed_precision = type(mp) == 'table' and mp or tostring(mp),
    backward_prefetch = tostring(opts.backward_prefetch), forward_prefetch = opts.forward_prefetch and true or false,
    limit_all_gathers = opts.limit_all_gathers and true or false, cpu_offload = opts.cpu_offload and true or false,
    sync_module_states = opts.sync_module_states and true or false,
  }, { group = group })
end

-- fsdp.shard(model, opts): turn `model` (built on meta, or real) into fully
-- sharded units in place; every rank of the group calls it. Each unit's
-- parameters become one flat parameter of which this rank holds an equal
-- slice; the model keeps its parameter names. opts:
--   policy (default: the root is the only unit): function(module, name,
--     unwrapped_numel) -> true or a table of per-unit overrides, e.g.
--     fsdp.policy.transformer{llama.DecoderLayer} or fsdp.policy.size{};
--   strategy ('FULL_SHARD'; 'SHARD_GRAD_OP', 'NO_SHARD', 'HYBRID_SHARD',
--     'HYBRID_SHARD_ZERO2');
--   mixed_precision (none: all in the model's dtype): 'bf16' or
--     {param =, reduce =, buffer =, keep_low_precision_grads =};
--   backward_prefetch ('pre'; 'post', false), forward_prefetch (false),
--     limit_all_gathers (false);
--   cpu_offload (false: true keeps master shards, gradients and optimizer
--     state in CPU memory);
--   sync_module_states (false: true takes rank 0's values instead of the
--     init rules), seed (fsdp.initial_seed(): each rank materialises only
--     its shards from it);
--   ignored ({}: modules left replicated and not reduced), group (the
--     world: the process group to shard over), device (the parameters'
--     device, 'cpu' for a meta model; 'meta' plans without allocating);
--   mesh (none: an fsdp.mesh; its groups replace `group` and the nodes:
--     [Note: strategies on a mesh] in layout.lua; parameters a TP layer
--     split carry p.tp and count once per TP group in the gradient norm).
--     The model's data-parallel ranks are then the mesh's 'dp'.
-- Returns the model.
function M.shard(model, opts)
  opts = opts or {}
  if not Module.is_module(model) then core.fail('fsdp.shard expects a module') end
  if rawget(model, '_fsdp') then core.fail('fsdp.shard: the model is already sharded') end
  for k in pairs(opts) do
    if not OPTIONS[k] then
      local known = {}
      for o in pairs(OPTIONS) do known[#known + 1] = o end
      table.sort(known)
      core.fail(("fsdp.shard: unknown option '%s' (known: %s)"):format(tostring(k), table.concat(known, ', ')))
    end
  end
  local strategy = layout.strategy(opts.strategy or 'FULL_SHARD')
  local bp = opts.backward_prefetch
  if bp == nil then bp = 'pre' end
  if bp ~= 'pre' and bp ~= 'post' and bp ~= false then
    core.fail(("fsdp.shard: backward_prefetch must be 'pre', 'post' or false, got %s"):format(tostring(bp)))
  end
  if opts.policy ~= nil and type(opts.policy) ~= 'function' then
    core.fail('fsdp.shard: policy must be a function (module, name, unwrapped_numel), e.g. fsdp.policy.transformer{...}')
  end
  local group = opts.group
  if group ~= nil and getmetatable(group) ~= dist.Group then core.fail('fsdp.shard: group must be a Group from fsdp.dist') end
  local mesh = opts.mesh
  if mesh ~= nil and not mesh_mod.is_mesh(mesh) then
    core.fail(('fsdp.shard: mesh must be a mesh from fsdp.mesh.new, got %s'):format(type(mesh)))
  end
  if mesh and group then core.fail('fsdp.shard: give group or mesh, not both (a mesh brings its own groups)') end
  local ignored = opts.ignored or {}
  local seed = opts.seed or random.initial_seed()

  local first = layout.master_param(model)
  if not first then core.fail('fsdp.shard: the model has no parameters') end
  -- The master dtype is the trainable parameters' (frozen ones may be kept
  -- in another: [Note: frozen parameters] in fsdp/sharding/unit.lua).
  local master = first.dtype
  local device = opts.device or (first:is_meta() and 'cpu' or first.device)
  if device ~= 'cpu' and device ~= 'meta' and not device:match('^cuda') then
    core.fail(("fsdp.shard: device '%s' is not one of cpu, cuda:N, meta"):format(device))
  end
  local base_mp = mixed_precision(opts.mixed_precision, master)

  local plan, _, fqn = layout.resolve(model, { policy = opts.policy, ignored = ignored, strategy = strategy,
                                                master = master, mp = base_mp, who = 'fsdp.shard' })
  agree_structure(plan, fqn, strategy.name, opts, seed, device)
  local S = setmetatable({
    units = {}, inflight = {}, pending = {}, sync = true, iteration = 0,
    recording_forward = true, recording_backward = true, fwd_order = {}, bwd_order = {},
    backward_prefetch = bp, forward_prefetch = opts.forward_prefetch and true or false,
    limit_all_gathers = opts.limit_all_gathers and true or false,
    cpu_offload = opts.cpu_offload and true or false, strategy = strategy.name, model = model,
    ignored = ignored, device = device, master = master,
    group = mesh and mesh:group('dp') or group, -- the data-parallel ranks (nil: all)
    mesh = mesh, tp = mesh and mesh:size('tp') or 1,
  }, State)

  for _, spec in ipairs(plan) do
    local mp = spec.mp
    local shard_group, replicate_group
    if mesh then shard_group, replicate_group = spec.strategy:mesh_groups(mesh)
    else shard_group, replicate_group = spec.strategy:groups(group) end
    -- One C unit per resolved unit (layout.resolve: the frozen one first).
    local function make(r)
      local list = r.params
      if opts.sync_module_states then broadcast_params(list, device) end
      local u = Unit.new({
        name = spec.name, module = spec.module, params = list, strategy = spec.strategy.name,
        shard_group = shard_group, replicate_group = replicate_group,
        master_dtype = r.master_dtype, param_dtype = mp.param, reduce_dtype = mp.reduce,
        grad_dtype = mp.grad, device = device, cpu_offload = opts.cpu_offload, is_root = spec.is_root,
        reshard_after_forward = spec.reshard_after_forward, frozen = r.frozen,
      })
      u.shard_size = shard_group and shard_group:size() or dist.world_size()
      -- (with a mesh, TP ranks are not replicas: they hold other parameters)
      u.replicas = (mesh and mesh:size('dp') or dist.world_size()) / u.shard_size
      if opts.sync_module_states then
        for _, p in ipairs(list) do p.tensor = p.values; p.values = nil end
      end
      -- init = false (the caller loads every parameter next: --init_from):
      -- meta parameters stay zero instead of drawing their init rules' values,
      -- which would take longer than the load; a predicate on the name
      -- draws only the parameters it names (the load brings the rest).
      u:init_shard(seed, opts.init == nil and true or opts.init)
      for _, p in ipairs(list) do p.tensor = nil end -- the whole parameter is not kept
      u:bind_segments()
      return u
    end
    local fu = spec.frozen and make(spec.frozen) or nil
    local u = fu
    if spec.trainable then
      u = make(spec.trainable)
      u.partner = fu
    end
    -- The frozen unit before its partner, so the root stays last.
    if fu and fu ~= u then S.units[#S.units + 1] = fu end
    S.units[#S.units + 1] = u
    spec.module:register_forward_pre_hook(function(_, ...) return S:pre_forward(u, ...) end, { prepend = true })
    spec.module:register_forward_hook(function(_, _, out) return S:post_forward(u, out) end,
                                      { all_outputs = true })
    set_repr(u)
  end
  S.root = S.units[#S.units]
  prepare_buffers(model, device, base_mp.buffer, seed, opts.sync_module_states)
  rawset(model, '_fsdp', S)
  rawset(model, 'no_sync', function(self, fn) return M.no_sync(self, fn) end)
  return model
end

-- Run fn() with gradient synchronisation off: backward passes inside
-- accumulate unsharded gradients locally; the first backward after it
-- reduces their sum. Returns fn's results.
function M.no_sync(model, fn)
  local S = state_of(model, 'no_sync')
  local was = S.sync
  S.sync = false
  local r = autograd.pack(pcall(fn))
  S.sync = was
  if not r[1] then error(r[2], 0) end
  return unpack(r, 2, r.n)
end

local sq = ffi.new('double[1]')

local function ignored_params(S)
  local out = {}
  for _, m in ipairs(S.ignored) do
    for _, p in ipairs(m:parameters()) do out[#out + 1] = p end
  end
  return out
end

-- The squares of a gradient's elements, summed in double.
local function sq_norm(g)
  core.check(C.fl_grad_sq_norm(Tensor.cptr(g), sq))
  return sq[0]
end

-- Whether a TP layer split this parameter (its segment keeps the field).
local function is_tp_split(t) return rawget(t, 'tp') ~= nil end

-- The global L2 norm of the gradients of a sharded model, over every
-- rank's shards (collective: every rank calls it and gets the same bits).
-- Each rank adds the squares of its shards, divided by the number of
-- replicas holding the same shard (NO_SHARD and hybrid units), so one
-- all-reduce over the world gives the norm of the whole gradient. A NaN or
-- infinite gradient element anywhere makes the norm NaN or infinite on
-- every rank (fsdp.nonfinite decides from it).
--
-- [Note: the gradient norm under tensor parallelism]
-- On a mesh with tp = T > 1 the ranks of one TP group hold different
-- parameters where a TP layer split them (the parameter carries p.tp) and
-- copies of the others (norms, say). So, per parameter segment of a unit's
-- gradient shard: a split one counts its squares once per TP rank (the
-- world sum adds the T parts of the whole), a copied one 1/T of them per
-- TP rank (counted once in all). Both divided by the unit's data-parallel
-- replicas, as without TP. Without TP the whole shard is one sum, as ever.
-- A TP model sharded over a plain group (fsdp.tp.parallelize, then
-- fsdp.shard{group = dp_group}) has T from its TP state, and its units'
-- replicas (world / shard size) count the T TP ranks too: per_tp takes
-- them out. (tp.grad_norm and tp.clip_grad_norm are this function's.)
function M.grad_norm(model)
  local S = state_of(model, 'grad_norm')
  local T, per_tp = S.tp or 1, 1
  local tp_state = rawget(model, '_tp')
  if T == 1 and tp_state and tp_state.size > 1 then T, per_tp = tp_state.size, tp_state.size end
  local local_sq = 0
  for _, u in ipairs(S.units) do
    u:sync_zero_grad()
    if u.grad ~= nil and u.grad:has_storage() then
      if T == 1 then
        local_sq = local_sq + sq_norm(u.grad) / u.replicas
      else
        for _, p in ipairs(u.params) do
          if p.len > 0 then
            local part = sq_norm(u.grad:narrow(0, p.shard_start, p.len))
            local_sq = local_sq + part / (u.replicas / per_tp * (is_tp_split(p.segment) and 1 or T))
          end
        end
      end
    end
  end
  local world = dist.world_size()
  if T == 1 then
    local_sq = local_sq + clip.grad_sq_norm(ignored_params(S)) / world
  else
    for _, p in ipairs(ignored_params(S)) do
      local_sq = local_sq + clip.grad_sq_norm({ p }) / (is_tp_split(p) and world / T or world)
    end
  end
  local t = factories.tensor({ local_sq }, { dtype = 'f64' })
  dist.all_reduce(t)
  return math.sqrt(t:item())
end

-- Clip the gradients of a sharded model to a global L2 norm of at most
-- max_norm (M.grad_norm, collective); returns the norm before clipping.
-- A non-finite norm scales nothing (a factor of 0 would turn an infinite
-- element into NaN and erase the finite ones that show where it came
-- from).
function M.clip_grad_norm(model, max_norm)
  state_of(model, 'clip_grad_norm')
  local why = validate.problem(max_norm, validate.NONNEGATIVE)
  if why then core.fail('clip_grad_norm: max_norm ' .. why) end
  local total = M.grad_norm(model)
  local coef = max_norm / (total + 1e-6)
  if coef < 1 and total == total and total ~= math.huge then M.scale_grads(model, coef) end
  return total
end

-- Multiply this rank's gradient shards (and the ignored modules'
-- gradients) by coef in place: the clipping step after M.grad_norm.
function M.scale_grads(model, coef)
  local S = state_of(model, 'scale_grads')
  for _, u in ipairs(S.units) do
    if u.grad ~= nil and u.grad:has_storage() then core.check(C.fl_grad_scale_(Tensor.cptr(u.grad), coef)) end
  end
  clip.scale_grads(ignored_params(S), coef)
end

-- Run fn() with every parameter slot holding the whole parameter in the
-- master dtype (gathered from the shards; collective). Forward passes
-- inside use them as they are (no gathering, no communication), so any
-- method of the model works, not only its forward: generation calling
-- encode/decode, say. With {writeback = true} changes made to them are
-- written back to the shards (not to frozen parameters, which a base
-- kept in another dtype gives as converted copies). Not inside forward
-- or backward.
function M.summon_full_params(model, fn, opts)
  local S = state_of(model, 'summon_full_params')
  opts = opts or {}
  local gathered = {}
  autograd.no_grad(function()
    for _, u in ipairs(S.units) do
      if u:state() ~= 'SHARDED' and u:state() ~= 'UNSHARDED' then
        core.fail('summon_full_params: a unit is being gathered (inside forward or backward?)')
      end
      local by, full = u:gather_full()
      gathered[u] = full
      for _, p in ipairs(u.params) do
        -- A frozen base kept in its own dtype (bf16) is summoned in the
        -- model's, as every other parameter is.
        local v = by[p]
        if u.frozen and v.dtype ~= S.master then v = v:to({ dtype = S.master }) end
        for _, slot in ipairs(p.slots) do slot[1][slot[2]] = v end
      end
    end
  end)
  S.summoned = true
  local r = autograd.pack(pcall(fn))
  S.summoned = false
  autograd.no_grad(function()
    for _, u in ipairs(S.units) do
      if r[1] and opts.writeback and not u.frozen then u:scatter_full(gathered[u]) end
      u:bind_segments()
    end
  end)
  if not r[1] then error(r[2], 0) end
  return unpack(r, 2, r.n)
end

-- Gather the units one at a time (collective, every rank): fn(unit, by)
-- with by = {[param] = whole parameter in the master dtype}. The gathered
-- buffer and its views are freed as soon as fn returns, not left to the
-- collector, so at most one unit is ever whole on any rank (fn keeps
-- what it clones).
-- In a tensor-parallel model (fsdp.tp) `by` holds the LOGICAL tensors:
-- each TP-split parameter is gathered over the TP group too (M.logical),
-- so full state dicts and exports are those of the model without TP.
function M.each_full_unit(model, fn)
  local S = state_of(model, 'each_full_unit')
  local tps = rawget(model, '_tp')
  autograd.no_grad(function()
    for _, u in ipairs(S.units) do
      local by, full = u:gather_full()
      if tps and tps.size > 1 then
        for _, p in ipairs(u.params) do
          local tp = p.segment and rawget(p.segment, 'tp')
          if tp then
            local whole = M.logical(by[p], tp, tps.group)
            by[p]:free()
            by[p] = whole
          end
        end
      end
      local ok, err = pcall(fn, u, by)
      for _, t in pairs(by) do t:free() end
      full:free()
      if not ok then error(err, 0) end
    end
  end)
end

-- The logical tensor of which t is this rank's TP slice (tp = p.tp:
-- {dim, size, rank, global_shape}), gathered over the TP group `group`
-- (collective over it): the slices concatenated along tp.dim in rank order.
function M.logical(t, tp, group)
  if tp.size == 1 then return t:clone() end
  if tp.dim == 0 then return dist.all_gather(t:contiguous(), { group = group }) end
  local front = t:transpose(0, tp.dim):contiguous()
  local all = dist.all_gather(front, { group = group })
  local out = all:transpose(0, tp.dim):contiguous()
  front:free()
  all:free()
  return out
end

-- The shape a unit parameter (u.params[i]) has in a full state dict: the
-- logical one of a TP slice (as each_full_unit gives it), else its own.
function M.full_shape(p)
  local tp = p.segment and rawget(p.segment, 'tp')
  return tp and tp.global_shape or p.shape
end

-- The whole parameters by name (master dtype), gathered unit by unit
-- (collective). {rank0_only = true}: other ranks get an empty table.
-- To write them to a file without holding them all, see
-- fsdp.checkpointing.save_full_state_dict.
function M.full_state_dict(model, opts)
  state_of(model, 'full_state_dict')
  opts = opts or {}
  local out = {}
  local keep = not opts.rank0_only or dist.rank() == 0
  M.each_full_unit(model, function(u, by)
    if keep then
      for _, p in ipairs(u.params) do out[p.name] = by[p]:clone() end
    end
  end)
  if keep then
    for _, nb in ipairs(model:named_buffers()) do out[nb[1]] = nb[2] end
  end
  return out
end

-- This rank's bytes: sharded parameters, their gradients, the optimizer's
-- state (when given), buffers, the largest gathered unit, and the sum of
-- what persists across steps.
function M.memory(model, opt)
  local S = state_of(model, 'memory')
  local r = { params = 0, grads = 0, optimizer = 0, buffers = 0, largest_unit = 0 }
  for _, u in ipairs(S.units) do
    r.params = r.params + u:shard_bytes()
    r.grads = r.grads + u:grad_bytes()
    r.largest_unit = math.max(r.largest_unit, u.gathered_bytes)
  end
  for _, b in ipairs(model:buffers()) do r.buffers = r.buffers + b:storage_bytes() end
  if opt then
    for _, st in pairs(opt.state) do
      for _, v in pairs(st) do
        if Tensor.is_tensor(v) then r.optimizer = r.optimizer + v:numel() * v:element_size() end
      end
    end
  end
  r.persistent = r.params + r.grads + r.optimizer + r.buffers
  return r
end

-- The units, root last: {name=, strategy=, numel=, shard_numel=, ...}.
function M.units(model)
  return state_of(model, 'units').units
end

return M
