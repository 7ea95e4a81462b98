-- fsdp.plan: what each rank would hold, compute and send for a model,
-- world size, sharding strategy, precision, batch and device, without
-- allocating it (the model is built on meta).
--
--   local m = require('models.llama').build('Llama-2-70b', {device = 'meta'})
--   local p = fsdp.plan(m, {world = 64, strategy = 'FULL_SHARD', mixed_precision = 'bf16',
--                           device = 'h100-80g', batch = 1, seq = 4096})
--   print(p)                      -- per-rank memory, communication, FLOPs, time, FITS / DOES NOT FIT
--   p.memory.peak, p.memory.persistent, p.fits, p.time.step, p.comm.all_gather.bytes
--   fsdp.plan.max_batch(m, {...})  -- the largest batch per rank that fits
--
-- Options (errors name the option at fault):
--   world (default: this job's size), nodes (default: world / ranks per
--   node; given without world, the world is nodes x ranks per node),
--   ranks_per_node (default: the device profile's, 8 for the GPUs; every
--   rank on one node for 'cpu'; [Note: plan node size]), strategy
--   (FULL_SHARD), policy (a function as fsdp.shard's, or
--   'transformer' / 'size' / 'none'; default: one unit per block, else
--   fsdp.policy.size{}), blocks (a predicate over modules: the repeated
--   layers that are wrapped, checkpointed and offloaded one by one;
--   default: the children of the model's ModuleLists), mixed_precision (as
--   fsdp.shard's: 'bf16' or {param=, reduce=, buffer=,
--   keep_low_precision_grads=}), checkpoint (true: the blocks),
--   offload_activations (true: the blocks' saved activations go to pinned
--   CPU memory, fsdp.offload_activations; composes with checkpoint, which
--   leaves only the blocks' inputs to move), offload (cpu_offload: shards,
--   gradients and optimizer state live in CPU memory), optimizer
--   ('adamw', 'anyprecision_adamw', 'sgd', 'adadelta', 'none', or {name=,
--   state_dtype=, momentum=, use_kahan_summation=, momentum_dtype=,
--   variance_dtype=}), batch (sequences per rank, 1), seq (tokens per
--   sequence; the model's default), device (a name in fsdp.devices or a
--   profile; 'cpu'), backward_prefetch ('pre'), forward_prefetch (false),
--   utilization (the device's), rank (0: whose shard; the last rank holds
--   the padding), grad_accum (1: micro-batches per step; above 1 the
--   unsharded accumulation buffers of fsdp.sharding.accumulate count at
--   the peak), example_batch (function(batch, seq) -> the arguments of the
--   loss as {n=, ...}, tokens, seq; default model:example_batch), loss
--   (function(model, ...) -> the loss; default model:loss), mesh (an
--   fsdp.mesh, or its sizes {dp_replicate=, dp_shard=, tp=} for the world
--   planned for: units shard over dp_shard and replicate over
--   dp_replicate, [Note: strategies on a mesh] in fsdp/sharding/layout.lua;
--   the model is what one TP rank holds), or the sizes themselves: tp,
--   dp_shard, dp_replicate (fsdp.mesh.resolve_sizes: dp_shard takes what
--   the others leave). With tp > 1 the model (built on meta, not yet
--   tensor-parallel) is planned as TP rank 0 runs it: a copy parallelized
--   by fsdp.tp with model:tp_plan() over a planning group that records its
--   collectives (fsdp.plan.tp); plan.tp_comm is their bytes and time, on
--   the critical path. sequence_parallel (false): the copy with fsdp.tp's
--   sequence parallelism, traced alike ([Note: sequence parallel in the
--   plan]; the sequence must divide by tp).
--   fsdp.plan.search(model, opts): every mesh for a cluster, ranked.
--
-- Units are fsdp.shard's own (fsdp.sharding.assign_units, the same padding).
-- What the model keeps and computes comes from tracing one training step
-- of it on meta tensors (fsdp.plan.trace: any model with a loss and an
-- example batch, nothing per family); the bytes of the sharded step from
-- replaying that trace with the units gathered, reduced and freed around
-- it (fsdp.plan.sim). Printing is fsdp.plan.report.
local core = require 'fsdp.core'
local validate = require 'fsdp.validate'
local sharding = require 'fsdp.sharding'
local devices = require 'fsdp.devices'
local trace = require 'fsdp.plan.trace'
local sim = require 'fsdp.plan.sim'
local suggest = require 'fsdp.suggest'
local dist = require 'fsdp.dist'
local cost = require 'fsdp.plan.cost'
local report = require 'fsdp.plan.report'
local tpplan = require 'fsdp.plan.tp'
local nn = require 'fsdp.nn'
local mesh = require 'fsdp.mesh'
local search = require 'fsdp.plan.search'
local C = core.C

local M = {}
local Plan = {}
Plan.__index = Plan
Plan.__name = 'Plan'
M.Plan = Plan

local WHO = 'fsdp.plan'
local function fail(fmt, ...) core.fail(WHO .. ': ' .. fmt:format(...)) end

local OPTIONS = {
  world = true, nodes = true, ranks_per_node = true, strategy = true, policy = true, mixed_precision = true,
  checkpoint = true,
  offload = true, offload_activations = true, optimizer = true, batch = true, seq = true, device = true,
  backward_prefetch = true, forward_prefetch = true, limit_all_gathers = true, utilization = true, rank = true,
  grad_accum = true, blocks = true, example_batch = true, loss = true, mesh = true,
  tp = true, dp_shard = true, dp_replicate = true, sequence_parallel = true,
}

local function size_of(dtype) return tonumber(C.fl_dtype_size(core.dtype(dtype))) end

local function positive_int(opts, key, default)
  local v = opts[key]
  if v == nil then return default end
  if validate.problem(v, validate.COUNT) then
    fail('%s must be a positive integer, got %s', key, validate.show(v))
  end
  return v
end

-- optimizers: bytes of state per parameter element, from their state
-- tensors (fsdp/optim/*.lua).
local OPTIMIZERS = {
  adamw = function(o, master) return 2 * size_of(o.state_dtype or master), 'AdamW' end,
  anyprecision_adamw = function(o)
    local b = size_of(o.momentum_dtype or 'bf16') + size_of(o.variance_dtype or 'bf16')
    if o.use_kahan_summation then b = b + size_of(o.compensation_buffer_dtype or 'bf16') end
    return b, 'AnyPrecisionAdamW'
  end,
  sgd = function(o, master) return (o.momentum or 0) ~= 0 and size_of(master) or 0, 'SGD' end,
  adadelta = function(_, master) return 2 * size_of(master), 'Adadelta' end,
  none = function() return 0, 'no optimizer' end,
}

local function optimizer_bytes(spec, master)
  local o = type(spec) == 'table' and spec or { name = spec or 'adamw' }
  local name = type(o.name) == 'string' and o.name:lower():gsub('[%s_]', '') or nil
  local canon = { adamw = 'adamw', anyprecisionadamw = 'anyprecision_adamw', sgd = 'sgd', adadelta = 'adadelta',
                  none = 'none' }
  local f = name and OPTIMIZERS[canon[name]]
  if not f then
    fail("optimizer: unknown optimizer '%s' (known: adamw, anyprecision_adamw, sgd, adadelta, none)", tostring(o.name))
  end
  return f(o, master)
end

-- The blocks in forward order: the modules matching opts.blocks, else
-- the children of every ModuleList (the outermost: a list
-- inside a block is the block's own business).
local function find_blocks(model, pred)
  if pred ~= nil and type(pred) ~= 'function' then
    fail('blocks must be a function(module) -> boolean, got %s', type(pred))
  end
  local ModuleList = nn.ModuleList
  local blocks = {}
  local function walk(m)
    for _, ch in ipairs(m:children()) do
      if pred then
        if pred(ch) then blocks[#blocks + 1] = ch else walk(ch) end
      elseif ch:is_instance_of(ModuleList) and #ch:children() >= 1 then
        for _, b in ipairs(ch:children()) do blocks[#blocks + 1] = b end
      else
        walk(ch)
      end
    end
  end
  walk(model)
  return blocks
end

local function policy_of(opts, block_set)
  local p = opts.policy
  if type(p) == 'function' then return p, 'custom' end
  if p == nil or p == 'transformer' then
    if next(block_set) then
      return function(m) return block_set[m] == true end, 'one unit per block'
    end
    if p == 'transformer' then fail("policy: 'transformer' needs blocks (the model has none; pass blocks=)") end
  end
  if p == nil or p == 'size' then return sharding.policy.size {}, 'size >= 1e8 parameters' end
  if p == 'none' or p == false then return nil, 'one unit (the root)' end
  fail("policy must be a function, 'transformer', 'size' or 'none', got %s", tostring(p))
end

-- The units fsdp.shard would make (sharding.resolve: the same function
-- decides them, [Note: one resolution of the units]), with this rank's
-- numbers: per wrapped module one for its trainable parameters and, before
-- it, one for its frozen ones (gathered and freed with it, never reduced;
-- its shard in the frozen parameters' dtype).
local function planned_units(model, r)
  local specs, resolved = sharding.resolve(model, { policy = r.policy, ignored = {}, strategy = r.strategy_value,
                                                    master = r.master, mp = r.mp, who = WHO })
  local units, of = {}, {}
  for _, ru in ipairs(resolved) do
    local spec, mp = ru.spec, ru.spec.mp
    local G, replicas, shard_index
    if r.mesh then
      G, replicas = spec.strategy:mesh_shard_size(r.mesh)
      shard_index = math.floor(r.rank / r.mesh.tp) % G -- [Note: the device mesh] in fsdp/mesh.lua
    else
      G = spec.strategy:shard_size(r.world, r.ranks_per_node)
      replicas, shard_index = r.world / G, r.rank % G
    end
    local numel = 0
    for _, t in ipairs(ru.tensors) do numel = numel + t:numel() end
    local master = ru.master_dtype
    local padded = math.ceil(numel / G) * G
    local shard = padded / G
    local ps = size_of(mp.param)
    local aliased = G == 1 and mp.param == master
    local gb = aliased and 0 or padded * ps
    if r.device.page and gb > 0 then gb = math.ceil(gb / r.device.page) * r.device.page end
    local u = {
      name = spec.name, label = (spec.name == '' and '<root>' or spec.name) .. (ru.frozen and ' (frozen)' or ''),
      module = spec.module, tensors = ru.tensors, strategy = spec.strategy.name, numel = numel, padded = padded,
      shard = shard, G = G, replicas = replicas, aliased = aliased, gb = gb, ps = ps, rs = size_of(mp.reduce),
      gs = size_of(mp.grad), reshard = spec.reshard_after_forward, root = spec.is_root, param_dtype = mp.param,
      reduce_dtype = mp.reduce, frozen = ru.frozen, master_dtype = master,
      -- real elements in this rank's shard (the last ranks hold the padding)
      real = math.max(0, math.min(shard, numel - shard_index * shard)),
    }
    of[ru] = u
    units[#units + 1] = u
  end
  for _, ru in ipairs(resolved) do
    if ru.partner then of[ru].partner = of[ru.partner] end
  end
  return units
end

-- Resolve the options into one table (checked).
local function resolve(model, opts)
  for k in pairs(opts) do
    if not OPTIONS[k] then
      local known = {}
      for o in pairs(OPTIONS) do known[#known + 1] = o end
      table.sort(known)
      local hint = type(k) == 'string' and suggest.hint(k, known) or ''
      if hint ~= '' then fail("unknown option '%s'%s", tostring(k), hint) end
      fail("unknown option '%s' (known: %s)", tostring(k), table.concat(known, ', '))
    end
  end
  local r = {}
  r.device = devices.get(opts.device or 'cpu', WHO .. ': device')
  -- [Note: plan node size] A node holds ranks_per_node ranks: the
  -- option, else the device profile's (8 GPUs; the cpu profile is this
  -- machine: every rank on it), else world / nodes when nodes is given.
  -- Given nodes and no world, the world is nodes x ranks per node.
  local per_node = positive_int(opts, 'ranks_per_node', nil)
  local dev_per_node = r.device.ranks_per_node
  if dev_per_node ~= nil and dev_per_node ~= 'all' and validate.problem(dev_per_node, validate.COUNT) then
    fail("device profile %s: ranks_per_node must be a positive integer or 'all', got %s", tostring(r.device.name),
      validate.show(dev_per_node))
  end
  if opts.world == nil and opts.nodes ~= nil then
    local n = positive_int(opts, 'nodes', 1)
    local k = per_node or (dev_per_node ~= 'all' and dev_per_node) or 8
    r.world = n * k
  else
    r.world = positive_int(opts, 'world', dist.world_size())
  end
  if opts.nodes ~= nil then
    r.nodes = positive_int(opts, 'nodes', 1)
    if r.world % r.nodes ~= 0 then fail('world %d is not a multiple of nodes %d', r.world, r.nodes) end
    r.ranks_per_node = r.world / r.nodes
    if per_node and per_node ~= r.ranks_per_node then
      fail('world %d on nodes %d is %d ranks per node, not ranks_per_node %d', r.world, r.nodes, r.ranks_per_node,
        per_node)
    end
  else
    local k = per_node or (dev_per_node == 'all' and r.world) or dev_per_node or 8
    k = math.min(k, r.world)
    if r.world % k ~= 0 then
      fail('world %d is not a multiple of %d ranks per node (%s): pass nodes= or ranks_per_node=', r.world, k,
        per_node and 'ranks_per_node' or ('device profile ' .. tostring(r.device.name)))
    end
    r.nodes, r.ranks_per_node = r.world / k, k
  end
  local mesh_opts = opts.tp ~= nil or opts.dp_shard ~= nil or opts.dp_replicate ~= nil
  if mesh_opts and opts.mesh ~= nil then fail('give mesh or tp / dp_shard / dp_replicate, not both') end
  if mesh_opts then
    r.mesh = mesh.resolve_sizes({ tp = opts.tp, dp_shard = opts.dp_shard,
                                  dp_replicate = opts.dp_replicate }, r.world, WHO)
  elseif opts.mesh ~= nil then
    local m = opts.mesh
    if mesh.is_mesh(m) then
      m = { dp_replicate = m:size('dp_replicate'), dp_shard = m:size('dp_shard'), tp = m:size('tp') }
    end
    r.mesh = mesh.resolve_sizes(m, r.world, WHO .. ': mesh')
  end
  r.tp = r.mesh and r.mesh.tp or 1
  if r.tp > 1 and r.ranks_per_node % r.tp ~= 0 then
    fail('tp %d does not divide the %d ranks per node: a tensor-parallel group must not straddle nodes', r.tp,
      r.ranks_per_node)
  end
  local sp = opts.sequence_parallel
  if sp ~= nil and type(sp) ~= 'boolean' then fail('sequence_parallel must be true or false, got %s', tostring(sp)) end
  r.sequence_parallel = (sp and r.tp > 1) or false
  r.strategy_value = sharding.strategy(opts.strategy or 'FULL_SHARD', '', WHO)
  r.strategy = r.strategy_value.name
  r.rank = opts.rank or 0
  if validate.problem(r.rank, { int = true, min = 0, below = r.world }) then
    fail('rank must be an integer in [0, %d), got %s', r.world, validate.show(opts.rank))
  end
  r.batch = positive_int(opts, 'batch', 1)
  r.grad_accum = positive_int(opts, 'grad_accum', 1)
  local first = sharding.master_param(model)
  if not first then fail('the model has no parameters') end
  r.master = first.dtype -- the trainable parameters' (frozen ones may differ)
  r.mp = sharding.mixed_precision(opts.mixed_precision, r.master, '', WHO)
  r.utilization = opts.utilization or r.device.utilization or 0.5
  if validate.problem(r.utilization, { positive = true, max = 1 }) then
    fail('utilization must be in (0, 1], got %s', validate.show(opts.utilization))
  end
  local bp = opts.backward_prefetch
  if bp == nil then bp = 'pre' end
  if bp ~= 'pre' and bp ~= 'post' and bp ~= false then
    fail("backward_prefetch must be 'pre', 'post' or false, got %s", tostring(bp))
  end
  r.backward_prefetch, r.forward_prefetch = bp, opts.forward_prefetch and true or false
  r.offload = opts.offload and true or false
  local ck = opts.checkpoint
  if ck ~= nil and type(ck) ~= 'boolean' then fail('checkpoint must be true or false, got %s', tostring(ck)) end
  r.checkpoint = ck or false
  local oa = opts.offload_activations
  if oa ~= nil and type(oa) ~= 'boolean' then
    fail('offload_activations must be true or false, got %s', tostring(oa))
  end
  r.offload_activations = oa or false
  -- fsdp.offload_activations leaves cpu tensors alone (nothing to gain):
  -- on the cpu device the option changes nothing. Any other device needs
  -- the CPU link's bandwidth to price the copies.
  if r.offload_activations and r.device.name ~= 'cpu' and not r.device.pinned_bw then
    fail('offload_activations: device profile %s has no pinned_bw (bytes/s to and from pinned CPU memory, '
      .. 'one way; fsdp.devices)', tostring(r.device.name))
  end
  r.opt_bytes, r.optimizer = optimizer_bytes(opts.optimizer, r.master)
  return r
end

-- One plan (see the top of this file).
function M.plan(model, opts)
  if type(model) ~= 'table' or type(model.named_modules) ~= 'function' then
    fail('expected an nn.Module (built on meta), got %s', type(model))
  end
  if rawget(model, '_fsdp') then fail('the model is already sharded: plan the unsharded model (built on meta)') end
  opts = opts or {}
  if type(opts) ~= 'table' then fail('expected an options table, got %s', type(opts)) end
  local r = resolve(model, opts)
  -- tp > 1: plan TP rank 0's copy of the model (fsdp.plan.tp)
  local plain, tp_group = model, nil
  if r.tp > 1 then
    local c = tpplan.parallelized(model, r.tp, r.sequence_parallel)
    model, tp_group = c.model, c.group
  end
  local blocks_in_order = find_blocks(model, opts.blocks)
  local block_set = {}
  for _, b in ipairs(blocks_in_order) do block_set[b] = true end
  r.policy, r.policy_name = policy_of(opts, block_set)
  if opts.seq ~= nil and validate.problem(opts.seq, validate.COUNT) then
    fail('seq must be a positive integer, got %s', validate.show(opts.seq))
  end
  if r.sequence_parallel and opts.seq ~= nil and opts.seq % r.tp ~= 0 then
    fail('sequence_parallel: seq %d is not divisible by tp %d (each TP rank holds seq / tp rows)', opts.seq, r.tp)
  end
  local example_batch = opts.example_batch
  if example_batch == nil and type(model.example_batch) == 'function' then
    example_batch = function(b, t) return model:example_batch(b, t) end
  end
  if type(example_batch) ~= 'function' then
    fail('%s has no example_batch(batch, seq) method: pass example_batch = function(batch, seq) '
      .. 'returning the arguments of its loss ({n=, ...}) and the tokens', model:class_name())
  end
  local loss = opts.loss
  if loss == nil and type(model.loss) == 'function' then loss = function(m, ...) return (m:loss(...)) end end
  if type(loss) ~= 'function' then
    fail('%s has no loss method: pass loss = function(model, ...) returning the loss', model:class_name())
  end
  local units = planned_units(model, r)
  local root = units[#units]

  -- persistent bytes of this rank
  local mem = { params = 0, grads = 0, optimizer = 0, buffers = 0, largest_unit = 0 }
  mem.params_trainable = 0
  for _, u in ipairs(units) do
    mem.params = mem.params + u.shard * size_of(u.master_dtype)
    if not u.frozen then
      mem.params_trainable = mem.params_trainable + u.shard * size_of(u.master_dtype)
      mem.grads = mem.grads + u.shard * u.gs
      mem.optimizer = mem.optimizer + u.real * r.opt_bytes
    end
    -- (a unit and its frozen partner are gathered together)
    mem.largest_unit = math.max(mem.largest_unit, u.gb + (u.partner and u.partner.gb or 0))
  end
  for _, b in ipairs(model:buffers()) do
    local d = (r.mp.buffer and b:is_floating_point()) and r.mp.buffer or b.dtype
    mem.buffers = mem.buffers + b:numel() * size_of(d)
  end
  mem.cpu_offloaded = 0
  if r.offload and r.device.name ~= 'cpu' then
    mem.cpu_offloaded = mem.params + mem.grads + mem.optimizer
  end
  mem.persistent = mem.params + mem.grads + mem.optimizer + mem.buffers - mem.cpu_offloaded
  -- [Note: gradient accumulation memory] (fsdp.sharding.accumulate): with
  -- k > 1 micro-batches every unit keeps its whole packed gradient in the
  -- reduce dtype between backwards, through the last micro-batch's
  -- forward and backward, on top of the step's usual bytes.
  mem.accumulation = 0
  if r.grad_accum > 1 then
    for _, u in ipairs(units) do
      if not u.frozen then mem.accumulation = mem.accumulation + u.padded * u.rs end
    end
  end
  local accumulation_extra = mem.accumulation

  -- the model's step, traced on meta (fsdp.plan.trace)
  local unit_of = {}
  for _, u in ipairs(units) do for _, t in ipairs(u.tensors) do unit_of[t] = u end end
  local in_block = {}
  for _, b in ipairs(blocks_in_order) do for _, t in ipairs(b:parameters()) do in_block[t] = true end end
  local root_params = {}
  for _, t in ipairs(model:parameters()) do
    if not in_block[t] then root_params[#root_params + 1] = t end
  end
  local tr = trace.run(model, {
    blocks = blocks_in_order, batch = r.batch, seq = opts.seq, example_batch = example_batch, loss = loss,
    param_dtype_of = function(t) local u = unit_of[t]; return u and u.param_dtype or r.mp.param end,
    buffer_dtype = r.mp.buffer, input_dtype = root.param_dtype, root_params = root_params,
    f32_gemm = r.device.f32_gemm, tp_log = tp_group and tp_group.log,
    example_batch_fn = opts.example_batch or model.example_batch, loss_fn = opts.loss or model.loss,
  })
  local block_profiles = tr.blocks
  r.seq = tr.seq
  mem.buffers = mem.buffers + tr.caches
  mem.persistent = mem.persistent + tr.caches

  -- blocks in forward order, each with its units
  local name_of = {}
  for _, nm in ipairs(model:named_modules()) do name_of[nm[2]] = nm[1] end
  local blocks, block_params = {}, 0
  for i, m in ipairs(blocks_in_order) do
    local us, seen = {}, {}
    for _, t in ipairs(m:parameters()) do
      local u = unit_of[t]
      if u and not seen[u] then seen[u] = true; us[#us + 1] = u end
      block_params = block_params + t:numel()
    end
    blocks[i] = { name = name_of[m] or ('block ' .. i), units = us, prof = block_profiles[i] }
  end
  local stem, head, inputs = tr.stem, tr.head, tr.inputs
  local offload_activations = r.offload_activations and r.device.name ~= 'cpu'
  local function replay(checkpoint)
    return sim.run(units, blocks, stem, head, {
      persistent = mem.persistent + accumulation_extra, inputs = inputs, checkpoint = checkpoint and #blocks > 0,
      offload_activations = offload_activations,
      forward_prefetch = r.forward_prefetch, backward_prefetch = r.backward_prefetch,
      f32_reduce = r.device.f32_reduce,
    })
  end
  local step = replay(r.checkpoint)
  local other = replay(not r.checkpoint)
  mem.inputs = inputs
  mem.activations = step.activations
  mem.activations_checkpointed = r.checkpoint and step.activations or other.activations
  mem.activations_full = r.checkpoint and other.activations or step.activations
  mem.gathered = step.gathered_peak
  mem.peak = step.peak
  mem.peak_at = step.peak_at
  mem.peak_other = other.peak
  mem.transient = step.peak - mem.persistent - accumulation_extra - step.gathered_peak - step.activations - inputs
  mem.residual = step.residual
  -- Pinned CPU memory the offloaded activations take at the end of
  -- forward; the same bytes cross the CPU link each way every step. Not
  -- part of mem.cpu_offloaded (the cpu_offload state, subtracted from persistent).
  mem.pinned_activations = step.pinned

  local n_frozen, frozen_dtype = 0, nil
  for _, u in ipairs(units) do
    if u.frozen then n_frozen, frozen_dtype = n_frozen + u.numel, frozen_dtype or u.master_dtype end
  end
  local plan = setmetatable({ units = units, memory = mem, options = r, model_class = model:class_name(),
                              n_params = model:num_parameters(), blocks = #blocks, block_params = block_params,
                              tokens = tr.tokens, n_frozen = n_frozen, frozen_dtype = frozen_dtype },
                            Plan)
  if r.tp > 1 then
    plan.n_params = plain:num_parameters()
    plan.tp_comm = tpplan.comm(tr, r.device.intra_bw, r.checkpoint)
  end
  cost.fill(plan, tr.flops)
  local usable = r.device.memory - (r.device.reserved or 0)
  plan.usable = usable
  plan.fits = mem.peak <= usable
  plan.headroom = usable - mem.peak
  return plan
end

-- The largest batch per rank whose plan fits (0 when even 1 does not),
-- over plans (no memory is allocated; a plan's peak grows with the batch);
-- opts as M.plan's (batch ignored), opts.max_batch caps the search
-- (65536). Each plan traces the model, so the search is short: the peaks
-- at batch 1 and 2 point at a batch (the line through them meets the
-- usable memory), which is then checked and corrected by doubling steps
-- away from it and bisection. Returns the batch and its plan.
function M.max_batch(model, opts)
  opts = opts or {}
  local cap = opts.max_batch or 65536
  local o = {}
  for k, v in pairs(opts) do if k ~= 'max_batch' then o[k] = v end end
  local tried = {}
  local function try(b)
    if not tried[b] then o.batch = b; tried[b] = M.plan(model, o) end
    return tried[b]
  end
  local p1 = try(1)
  if not p1.fits or cap == 1 then return p1.fits and 1 or 0, p1 end
  local p2 = try(2)
  if not p2.fits then return 1, p1 end
  -- lo fits, hi does not (or is past the cap)
  local lo, hi
  local slope = p2.memory.peak - p1.memory.peak
  local guess = slope > 0 and math.floor(2 + (p2.usable - p2.memory.peak) / slope) or cap
  guess = math.max(2, math.min(cap, guess))
  local step = 1
  if try(guess).fits then
    lo = guess
    while not hi do
      local b = math.min(lo + step, cap)
      if b == lo then return lo, try(lo) end
      if try(b).fits then lo = b else hi = b end
      step = step * 2
    end
  else
    hi = guess
    while not lo do
      local b = math.max(hi - step, 2)
      if try(b).fits then lo = b else hi = b end
      step = step * 2
    end
  end
  while hi - lo > 1 do
    local mid = math.floor((lo + hi) / 2)
    if try(mid).fits then lo = mid else hi = mid end
  end
  return lo, try(lo)
end

-- fsdp.plan.search(model, opts): every device mesh for a cluster, planned
-- and ranked (fsdp.plan.search).
function M.search(model, opts) return search.search(model, opts, M.plan) end

function Plan.is_plan(x) return getmetatable(x) == Plan end
Plan.__tostring = function(p) return report.format(p) end

-- fsdp.plan(model, opts) is M.plan.
setmetatable(M, { __call = function(_, ...) return M.plan(...) end })

-- The REPL prints a plan through its __tostring (fsdp.repl.pretty leaves a
-- table with its own __tostring to it), so this module names no REPL.

return M
