-- fsdp.sharding.options: the sharding options every training recipe shares,
-- and the step from a recipe's config to a sharded, checkpointed model.
--
--   local shard_options = require 'fsdp.sharding.options'
--   local cfg = options.config(shard_options.options({ lr = {...}, ... }), arg, 'recipes/x.lua')
--   local model = Model(c, {device = 'meta'})
--   shard_options.apply(model, cfg, Block)   -- wrap and checkpoint by the block class
--
-- The seed's recipes wrap the transformer block class, checkpoint the same
-- class and train in bf16 mixed precision; these options expose each choice.
local fsdp = require 'fsdp'
local device = require 'fsdp.sharding.device'
local dist = require 'fsdp.dist'
local suggest = require 'fsdp.suggest'
local lora = require 'fsdp.lora'
local devices = require 'fsdp.devices'
local console = require 'fsdp.observe.console'
local options = require 'fsdp.options'
local layout = require 'fsdp.sharding.layout'
local mesh_mod = require 'fsdp.mesh'

local M = {}

-- Each entry carries its constraints (fsdp.options checks them before a
-- recipe builds anything).
local DTYPES = { '', 'bf16', 'f16', 'f32' }
M.OPTIONS = {
  -- The seed's lower-case names (and ours in lower case) are accepted too.
  sharding_strategy = { 'FULL_SHARD', 'FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD or HYBRID_SHARD_ZERO2',
                        one_of = require('fsdp.sharding.layout').strategies,
                        values = { full = 'FULL_SHARD', full_shard = 'FULL_SHARD', shard_grad_op = 'SHARD_GRAD_OP',
                                   grad_op = 'SHARD_GRAD_OP', no_shard = 'NO_SHARD', hybrid = 'HYBRID_SHARD',
                                   hybrid_shard = 'HYBRID_SHARD', hybrid_zero2 = 'HYBRID_SHARD_ZERO2',
                                   hybrid_shard_zero2 = 'HYBRID_SHARD_ZERO2' },
                        -- FSDP2's fully_shard(reshard_after_forward=): True is FULL_SHARD,
                        -- False SHARD_GRAD_OP (--no-reshard_after_forward)
                        aliases = { reshard_after_forward = {
                          ['true'] = 'FULL_SHARD', ['1'] = 'FULL_SHARD', ['false'] = 'SHARD_GRAD_OP',
                          ['0'] = 'SHARD_GRAD_OP' } } },
  -- --bf16 (the seed's flag): bf16 mixed precision, parameters kept in
  -- their dtype (FSDP's MixedPrecision(param_dtype=bfloat16, ...)).
  mixed_precision = { '', 'compute dtype of the sharded units (bf16, f16); empty: the parameter dtype (on cuda, '
                          .. 'when not given: bf16)', one_of = DTYPES,
                      default_from = function(cfg) return device.default_mixed_precision(cfg) end,
                      -- param_dtype: FSDP2's MixedPrecisionPolicy(param_dtype=), reduce_dtype below its reduce_dtype
                      aliases = { 'param_dtype',
                                  bf16 = { ['true'] = 'bf16', ['1'] = 'bf16', ['false'] = '', ['0'] = '' } } },
  reduce_dtype = { '', 'dtype of gradient reduction (default: the compute dtype; FSDP2: '
                       .. 'MixedPrecisionPolicy(reduce_dtype=))', one_of = DTYPES },
  cpu_offload = { false, 'keep master shards, gradients and optimizer state in CPU memory, the optimizer step on the '
                         .. 'CPU (FSDP2: offload_policy=CPUOffloadPolicy(); on --device=cpu they are there already)' },
  wrap = { 'transformer', 'wrap policy: transformer (one unit per block), size, none',
           one_of = { 'transformer', 'size', 'none' } },
  wrap_min_params = { 1e8, 'with --wrap=size: the parameters that make a unit', int = true, min = 1 },
  backward_prefetch = { 'pre', 'gather the next unit in backward: pre, post, none', one_of = { 'pre', 'post', 'none' } },
  forward_prefetch = { false, 'gather the next unit in forward ahead of time' },
  limit_all_gathers = { true, 'at most two all-gathers in flight' },
  activation_checkpointing = { false, 'recompute each block in backward instead of keeping activations' },
  offload_activations = { false, 'move what each block saves for backward to pinned CPU memory (cuda; a no-op on the cpu)' },
  plan = { false, 'print what each rank would hold, send and compute (fsdp.plan) for this config, and exit' },
  plan_world = { 0, 'with --plan: the number of ranks to plan for (0: this job\'s)', int = true, min = 0 },
  plan_nodes = { 0, 'with --plan: the number of nodes to plan for (0: this job\'s, or 1 with --plan_world; must divide it)',
                 int = true, min = 0, check = function(v, cfg)
                   local world = cfg.plan_world > 0 and cfg.plan_world or dist.world_size()
                   if v > 0 and world % v ~= 0 then
                     return ('(%d) must divide the world planned for (%d ranks)'):format(v, world)
                   end
                 end },
  plan_search = { false, 'with --plan: plan every device mesh (tp x FSDP or HSDP, with and without sequence '
                  .. 'parallel) for the world planned for, at --batch_size x that world sequences per step, and '
                  .. 'print them ranked with a recommendation (fsdp.plan.search)' },
  plan_device = { 'cpu', 'device profile for --plan (fsdp.devices: cpu, a100-80g, h100-80g, ...; or a JSON file '
                        .. 'describing one, see fsdp.devices.load; on cuda, when not given: the detected GPU\'s)',
                  check = function(v)
                    if v:match('%.json$') then
                      local ok, why = pcall(devices.load, v, 'profile')
                      return not ok and tostring(why):gsub('^.-profile: ', '') or nil
                    end
                    local names = devices.names()
                    for _, name in ipairs(names) do if name == v then return nil end end
                    return ("must be one of %s, or a device profile's .json file; got '%s'%s"):format(
                      table.concat(names, ', '), v, suggest.hint(v, names))
                  end,
                  default_from = function(cfg) return device.default_plan_device(cfg) end },
  skip_fit_check = { false, 'train even when the planner says the config does not fit this machine\'s memory' },
}

-- A recipe's own options plus these and --device (fsdp.sharding.device;
-- its own win on a clash).
function M.options(own) return options.merge(device.OPTIONS, M.OPTIONS, own) end

-- The device the config trains on: 'cpu' or 'cuda:N'.
M.device = device.resolve

local function bad(script, fmt, ...)
  error(script .. ': ' .. fmt:format(...), 0)
end

-- [Note: the recipe's mesh]
-- A recipe with mesh options (--tp, --dp_shard, --dp_replicate: the
-- decoder recipes) trains on a device mesh (fsdp.mesh) when any is given,
-- and as before (no mesh: the strategy's own groups) when none is. What the
-- options leave open comes from --sharding_strategy: the hybrids shard
-- inside a node and replicate across (dp_shard = ranks per node / tp,
-- dp_replicate = nodes; or the ranks --dp_shard leaves), NO_SHARD replicates over every data-parallel rank
-- (dp_shard 1), the others shard over them all (dp_replicate 1).
-- mesh_sizes(cfg, {world=, nodes=}) gives {dp_replicate=, dp_shard=, tp=}
-- or nil (no mesh option given), for this job (default) or the world
-- --plan plans for; a contradiction raises one usage line.
function M.mesh_sizes(cfg, where)
  local T, S, Rr = cfg.tp or 1, cfg.dp_shard or 0, cfg.dp_replicate or 0
  if T == 1 and S == 0 and Rr == 0 then return nil end
  where = where or {}
  local world = where.world or dist.world_size()
  local nodes = where.nodes or math.max(1, dist.nodes())
  local per_node = world / nodes
  local st = layout.strategy(cfg.sharding_strategy or 'FULL_SHARD')
  local function bad(fmt, ...) error(fmt:format(...), 0) end
  if st.shards_across == 'none' then
    if S > 1 then
      bad('--dp_shard=%d contradicts --sharding_strategy=%s, which shards nothing (it replicates over the '
        .. 'data-parallel ranks): leave --dp_shard out or choose a sharding strategy', S, st.name)
    end
    S = 1
    if Rr == 0 and world % T == 0 then Rr = world / T end
  elseif st.shards_across == 'node' and S == 0 then
    if per_node % T ~= 0 then
      bad('--tp=%d does not divide the %d ranks per node: a tensor-parallel group must not straddle nodes', T,
        per_node)
    end
    S = per_node / T
    if Rr == 0 then Rr = nodes end
  elseif st.shards_across == 'node' and Rr == 0 and world % (S * T) == 0 then
    Rr = world / (S * T) -- (the hybrids replicate over what the shards leave)
  end
  local spec = { tp = T, dp_shard = S > 0 and S or nil, dp_replicate = Rr > 0 and Rr or nil }
  local ok, sizes = pcall(mesh_mod.resolve_sizes, spec, world, 'mesh')
  if not ok then
    bad('--tp=%d --dp_shard=%s --dp_replicate=%s: %s', T, S > 0 and S or '(the rest)', Rr > 0 and Rr or 1,
      (options.bare(sizes):gsub('^mesh: ', '')))
  end
  if T > 1 and nodes > 1 and per_node % T ~= 0 then
    bad('--tp=%d does not divide the %d ranks per node: a tensor-parallel group must not straddle nodes', T, per_node)
  end
  if st.shards_across == 'node' and per_node % (sizes.dp_shard * T) ~= 0 then
    bad('--sharding_strategy=%s shards inside a node, but --dp_shard=%d x --tp=%d is %d ranks, which does not divide '
      .. 'the %d ranks per node (FULL_SHARD with --dp_replicate shards across nodes)', st.name, sizes.dp_shard, T,
      sizes.dp_shard * T, per_node)
  end
  return sizes
end

-- The wrap policy and mixed precision a config asks for (checked).
function M.policy_and_precision(cfg, block_class, script)
  local policies = {
    transformer = fsdp.policy.transformer { block_class },
    size = fsdp.policy.size { min_params = cfg.wrap_min_params },
    none = fsdp.policy.none,
  }
  if not policies[cfg.wrap] then bad(script, "--wrap must be transformer, size or none, got '%s'", cfg.wrap) end
  local bp = cfg.backward_prefetch
  if bp ~= 'pre' and bp ~= 'post' and bp ~= 'none' then
    bad(script, "--backward_prefetch must be pre, post or none, got '%s'", bp)
  end
  local mp
  if cfg.mixed_precision ~= '' or cfg.reduce_dtype ~= '' then
    local param = cfg.mixed_precision ~= '' and cfg.mixed_precision or nil
    mp = { param = param, reduce = cfg.reduce_dtype ~= '' and cfg.reduce_dtype or param, buffer = param }
  end
  return policies[cfg.wrap], mp
end

-- What fsdp.shard draws from the init rules: everything, unless
-- --init_from loads the values next (models/pretrained.lua); then
-- nothing, or only the new LoRA adapters, which the pretrained weights
-- do not have.
function M.init_rule(cfg)
  if (cfg.init_from or '') == '' then return true end
  if (cfg.lora_rank or 0) > 0 then return lora.is_adapter end
  return false
end

-- Shard `model` (built on meta) as cfg says, units and checkpoints on
-- instances of block_class; each rank initialises its shards from the init
-- rules with cfg.seed; `mesh` (an fsdp.mesh, or nil) gives the groups.
-- Returns the model and its units.
function M.apply(model, cfg, block_class, script, mesh)
  script = script or 'recipe'
  -- Every rank must train with the same options: compared before the
  -- model is sharded (its first collective), naming the keys that differ.
  fsdp.dist.agree(script .. ' options', cfg)
  local bp = cfg.backward_prefetch
  local policy, mp = M.policy_and_precision(cfg, block_class, script)
  fsdp.shard(model, {
    policy = policy, strategy = cfg.sharding_strategy, mixed_precision = mp,
    backward_prefetch = bp ~= 'none' and bp or false, forward_prefetch = cfg.forward_prefetch,
    limit_all_gathers = cfg.limit_all_gathers, seed = cfg.seed, device = device.resolve(cfg),
    init = M.init_rule(cfg), cpu_offload = cfg.cpu_offload, mesh = mesh,
  })
  local offload = cfg.offload_activations or false
  if type(offload) ~= 'boolean' then
    bad(script, '--offload_activations must be true or false, got %s', tostring(offload))
  end
  local is_block = function(m) return m:is_instance_of(block_class) end
  if cfg.activation_checkpointing then fsdp.checkpoint(model, is_block) end
  -- After checkpointing: a checkpointed block then offloads the inputs it keeps.
  if offload then fsdp.offload_activations(model, is_block) end
  local units = fsdp.sharding.units(model)
  local W = fsdp.dist.world_size()
  local where = device.describe(cfg)
  if where then console.print('device: ' .. where) end
  -- A frozen base (LoRA) has units of its own: their share of this rank's
  -- shards is what it costs (no gradient or optimizer state comes with it).
  local frozen, frozen_bytes, train_bytes, frozen_dtype = 0, 0, 0, nil
  for _, u in ipairs(units) do
    if u.frozen then
      frozen, frozen_bytes, frozen_dtype = frozen + 1, frozen_bytes + u:shard_bytes(), u.master_dtype
    else
      train_bytes = train_bytes + u:shard_bytes()
    end
  end
  console.print(('sharding: %s over %s, %d units%s, compute %s, reduce %s%s%s%s'):format(
    cfg.sharding_strategy, mesh and ('the %s'):format((tostring(mesh):gsub(' %(rank.*', '')))
      or ('%d rank%s'):format(W, W == 1 and '' or 's'), #units, frozen > 0 and (' (%d frozen)'):format(frozen) or '',
    units[#units].param_dtype, units[#units].reduce_dtype,
    cfg.activation_checkpointing and ', checkpointed blocks' or '',
    offload and ', activations offloaded to pinned CPU memory' or '',
    frozen > 0 and ('; rank 0 holds %.3f MiB of trainable shards, %.3f MiB frozen (%s)'):format(train_bytes / 2^20,
      frozen_bytes / 2^20, frozen_dtype) or ''))
  return model, units
end

-- The fsdp.plan options of a config (its sharding options, this job's
-- world, batch and seq from shape) on `device` (a name or profile).
function M.plan_options(cfg, block_class, shape, script, device)
  local policy, mp = M.policy_and_precision(cfg, block_class, script or 'recipe')
  local world = cfg.plan_world and cfg.plan_world > 0 and cfg.plan_world or fsdp.dist.world_size()
  -- --plan_world alone: the device profile's node size ([Note: plan node size])
  local nodes = cfg.plan_nodes and cfg.plan_nodes > 0 and cfg.plan_nodes
                or not (cfg.plan_world and cfg.plan_world > 0) and fsdp.dist.nodes() or nil
  return {
    world = world, nodes = nodes,
    -- the mesh options' sizes for that world ([Note: the recipe's mesh])
    mesh = M.mesh_sizes(cfg, { world = world, nodes = nodes or 1 }),
    sequence_parallel = cfg.sequence_parallel and true or nil, -- (the decoders' --sequence_parallel)
    strategy = cfg.sharding_strategy, policy = policy,
    mixed_precision = mp, checkpoint = cfg.activation_checkpointing, device = device,
    offload_activations = cfg.offload_activations or false, offload = cfg.cpu_offload or false,
    backward_prefetch = cfg.backward_prefetch ~= 'none' and cfg.backward_prefetch or false,
    forward_prefetch = cfg.forward_prefetch, batch = shape.batch, seq = shape.seq,
    grad_accum = cfg.grad_accum_steps,
  }
end

-- --plan: the plan of `model` (built on meta, not sharded) for this job's
-- world and the config's sharding options, batch and seq (what the
-- recipe feeds one rank). With cfg.memory_limit_mb the device is this
-- machine's CPU limited to it, and the plan also searches the largest
-- batch that fits. Prints the plan and one line `PLAN {json}` (batch,
-- peak_bytes, persistent_bytes, fits, max_batch, step_seconds, and comm:
-- per collective kind its calls, bytes, wire bytes, link and seconds, the
-- numbers fsdp.dist.collective_stats measures) for recipes/sweep.lua and
-- benchmarks/cluster_link.sh.
function M.plan(model, cfg, block_class, shape, script)
  script = script or 'recipe'
  local device = cfg.plan_device
  local limit = (cfg.memory_limit_mb or 0) > 0 and cfg.memory_limit_mb * 2^20 or nil
  if limit then
    local base = fsdp.devices.get(device, script .. ': --plan_device')
    device = {}
    for k, v in pairs(base) do device[k] = v end
    device.name = ('%s limited to %g MiB'):format(base.name, cfg.memory_limit_mb)
    device.memory, device.reserved = limit, 0
  end
  local opts = M.plan_options(cfg, block_class, shape, script, device)
  if cfg.plan_search then
    -- every mesh at the global batch of plain FSDP with --batch_size per rank
    local o = {}
    for k, v in pairs(opts) do o[k] = v end
    o.mesh, o.strategy, o.global_batch, o.batch = nil, nil, shape.batch * opts.world, nil
    local s = fsdp.plan.search(model, o)
    if fsdp.dist.rank() == 0 then print(s) end
    return s
  end
  local p = fsdp.plan(model, opts)
  local max_batch = limit and fsdp.plan.max_batch(model, opts) or nil
  if fsdp.dist.rank() == 0 then
    print(p)
    if limit then
      print(('largest batch_size that fits in %g MiB (planned): %d'):format(cfg.memory_limit_mb, max_batch))
    end
    print('PLAN ' .. require('cjson').encode({
      batch = shape.batch, peak_bytes = p.memory.peak, persistent_bytes = p.memory.persistent, fits = p.fits,
      max_batch = max_batch, step_seconds = p.time.step, comm = p.comm,
    }))
  end
  return p
end

-- Weight decay off for norm weights and biases (any parameter whose whole
-- shape is 1-d): parameters are shard segments, their shape is fsdp_shape.
function M.no_decay(_, p)
  return #(rawget(p, 'fsdp_shape') or p.shape) < 2
end

return M
