-- fsdp.sharding.fit: the check a training recipe makes after building its
-- model on meta and before allocating any of it: does the planner
-- (fsdp.plan) say this configuration fits this machine's memory?
--
--   local fit = require 'fsdp.sharding.fit'
--   local model = llama.CausalLM(c, {device = 'meta', dtype = cfg.dtype})
--   fit.check(model, cfg, llama.DecoderLayer, {batch = cfg.batch_size, seq = cfg.seq_len}, script,
--             {layers = 'num_layers'})
--   shard_options.apply(model, cfg, llama.DecoderLayer, script)   -- allocates
--
-- Without it, a configuration far past the machine (the 7B recipe's
-- defaults in f32 on a 24 GB CPU machine: ~100 GiB) starts allocating and
-- grows until the system kills the process. The budget is what this
-- process may use: --memory_limit_mb when the recipe has it and it is set,
-- else the machine's MemAvailable (/proc/meminfo) shared by this job's
-- ranks on the node; on a GPU (--device) the limit, else the detected
-- GPU's memory (fsdp.devices). A refusal is one line with the planned peak, its
-- parts, the budget, and what would make it fit; exit status 2.
-- --skip_fit_check trains anyway (the plan is an estimate).
local fsdp = require 'fsdp'
local layout = require 'fsdp.sharding.layout'
local core = require 'fsdp.core'
local options = require 'fsdp.options'
local sharding_device = require 'fsdp.sharding.device'
local shard_options = require 'fsdp.sharding.options'

local M = {}

local GiB, MiB = 2^30, 2^20

-- Bytes the kernel says can be allocated without swapping, or nil.
function M.mem_available()
  local f = io.open('/proc/meminfo')
  if not f then return nil end
  local text = f:read('*a')
  f:close()
  local kb = text:match('MemAvailable:%s*(%d+)')
  return kb and tonumber(kb) * 1024 or nil
end

local function size(bytes)
  if bytes >= GiB then return ('%.1f GiB'):format(bytes / GiB) end
  return ('%.1f MiB'):format(bytes / MiB)
end

-- The budget of one rank in bytes and where it comes from, or nil when
-- this machine does not say.
function M.budget(cfg)
  if (cfg.memory_limit_mb or 0) > 0 then
    return cfg.memory_limit_mb * MiB, ('--memory_limit_mb=%g'):format(cfg.memory_limit_mb)
  end
  local avail = M.mem_available()
  if not avail then return nil end
  local world, nodes = fsdp.dist.world_size(), math.max(1, fsdp.dist.nodes())
  local local_ranks = math.max(1, math.ceil(world / nodes))
  if local_ranks == 1 then return avail, 'MemAvailable of this machine' end
  return avail / local_ranks, ('MemAvailable of this machine / %d ranks on it'):format(local_ranks)
end

-- The budget of one rank on the device a config runs on: --memory_limit_mb,
-- else this machine's (M.budget) on the CPU, or on a GPU its profile's
-- memory less what the runtime keeps; with the profile the planner uses.
-- nil when nothing says (a GPU without a profile and no limit: cudasim).
function M.device_budget(cfg)
  local budget, source = M.budget(cfg)
  local base = fsdp.devices.cpu
  if cfg.device and sharding_device.resolve(cfg) ~= 'cpu' then
    -- On a GPU: --memory_limit_mb, else its profile's memory less what
    -- the runtime keeps; planned by a GPU profile's rules (no f32 copies
    -- of bf16 GEMM operands, no page rounding). A GPU without a profile
    -- (cudasim) and no limit is not checked.
    local gpu = sharding_device.profile(cfg)
    if (cfg.memory_limit_mb or 0) == 0 then
      if not gpu then return nil end
      budget, source = gpu.memory - (gpu.reserved or 0), gpu.name .. ' memory less its reserve'
    end
    base = gpu or fsdp.devices['h100-80g']
  end
  return budget, source, base
end

-- [Note: sizes are bounded before building]
-- A size is an integer long before it is a size this machine can hold: a
-- config.json with num_hidden_layers 1e12 (or Infinity) passes every
-- integer check, and building it on meta, or planning it, runs for hours
-- while memory grows. So before anything is built the sizes are held to
-- what the machine can hold, from the config alone (closed forms, no
-- module made):
--   * the blocks built on meta cost CPU memory (their modules, the Lua
--     and C objects of their parameters: a Llama layer takes 16 KiB):
--     checked always, --dry_run and --plan included (they build it too);
--   * a step's tokens are the rows of its products, which take fewer
--     than 2^31 (core/ops/matmul.c): checked whenever a step is run or
--     planned (the planner's trace would stop at that limit);
--   * a run that allocates holds its weights at least (each rank its
--     shard of them: the planner, run after the meta build, adds
--     gradients, optimizer state and activations), and generation also
--     its KV cache: checked against this rank's budget unless the run
--     says --skip_fit_check.
-- Both are lower bounds of what the run needs, so nothing the planner
-- would accept is refused; what they refuse could never have run.
M.CPU_BYTES_PER_BLOCK = 16 * 1024

local function count(n)
  if n < 1e6 then return ('%d'):format(n) end
  return ('%.3g'):format(n)
end

local function bytes_text(b)
  if b >= 2^50 then return ('%.3g PiB'):format(b / 2^50) end
  if b >= 2^40 then return ('%.1f TiB'):format(b / 2^40) end
  return size(b)
end
M.bytes_text = bytes_text

-- The ranks sharing a run's weights in the cheap bound below: 1 when its
-- strategy (cfg.sharding_strategy, default FULL_SHARD) keeps every
-- parameter whole on each rank, else the world (the hybrids shard over a
-- node's ranks only, so the world gives a lower bound, as the bound must).
function M.weight_shards(cfg)
  local st = layout.strategy(cfg.sharding_strategy or 'FULL_SHARD')
  return st.shards_across == 'none' and 1 or fsdp.dist.world_size()
end

-- The cheap bound (see the Note above); raises one line (a usage error
-- when called from a recipe's option checks) naming what set the sizes.
-- b: params (the closed form's count), blocks (built on meta), dtype (of
-- the weights), what (the sizes as the user gave them: "--init_from
-- X/config.json: num_hidden_layers 1e+12, hidden_size 32"), shards (ranks
-- sharing the weights: 1 unless sharded), weights (false: build on meta
-- only, --dry_run and --plan), extra ({bytes, 'KV cache ...'}: more that
-- the run holds beside the weights), fix (what would make it fit, a
-- phrase), rows ({tokens per micro-batch, 'what makes them'}: a run or
-- plan of a step). cfg: the recipe's (memory_limit_mb, device,
-- skip_fit_check).
function M.bound(cfg, b)
  if b.rows and b.rows[1] >= 2^31 then
    error(('%s: %s tokens per micro-batch, past the 2^31 rows a matrix product takes'):format(b.rows[2],
      count(b.rows[1])), 0)
  end
  local cpu_budget, cpu_source = M.budget(cfg)
  local blocks = b.blocks or 0
  if cpu_budget and blocks * M.CPU_BYTES_PER_BLOCK > cpu_budget then
    error(('%s: %s blocks to build, %s of CPU memory at %d KiB each on meta, more than the %s available (%s)')
      :format(b.what, count(blocks), bytes_text(blocks * M.CPU_BYTES_PER_BLOCK), M.CPU_BYTES_PER_BLOCK / 1024,
        bytes_text(cpu_budget), cpu_source), 0)
  end
  if b.weights == false or cfg.skip_fit_check then return end
  local budget, source = M.device_budget(cfg)
  if not budget then return end
  local per_param = tonumber(core.C.fl_dtype_size(core.dtype(b.dtype or 'f32')))
  local weights = b.params * per_param / (b.shards or 1)
  local need, parts = weights, {}
  parts[1] = ('%s of %s weights%s'):format(bytes_text(weights), b.dtype or 'f32',
    (b.shards or 1) > 1 and (' per rank (1/%d)'):format(b.shards) or '')
  for _, e in ipairs(b.extra or {}) do
    need = need + e[1]
    parts[#parts + 1] = ('%s of %s'):format(bytes_text(e[1]), e[2])
  end
  if need > budget then
    error(('%s: %s parameters, %s: more than the %s available (%s)%s'):format(b.what, count(b.params),
      table.concat(parts, ' + '), bytes_text(budget), source, b.fix and ('; try ' .. b.fix) or ''), 0)
  end
end

-- The size fields of a config `c` as "name value, ..." (fields: our names
-- in order; name_of(field): the name the user knows it by, the HF key or
-- the option).
function M.sizes_text(c, fields, name_of)
  local out, seen = {}, {}
  for _, f in ipairs(fields) do
    local name = name_of and name_of(f) or f
    -- (two fields one option sets: T5's encoder and decoder layers)
    if c[f] ~= nil and seen[name] ~= c[f] then out[#out + 1] = ('%s %s'):format(name, count(c[f])) end
    seen[name] = c[f]
  end
  return table.concat(out, ', ')
end

-- What would make a plan fit, in the recipe's option names (names.layers:
-- the option that sets the number of blocks; names.dtype, default 'dtype').
local function suggestions(p, cfg, names, world, largest_batch)
  local m, out = p.memory, {}
  local activations = m.activations + m.inputs + math.max(0, m.transient)
  if activations > 0.2 * m.peak then
    local b = largest_batch()
    out[#out + 1] = ('a smaller --batch_size (now %d; %s)'):format(cfg.batch_size or p.options.batch,
      b > 0 and ('%d fits'):format(b) or 'even 1 does not fit')
    if not cfg.activation_checkpointing and m.peak_other < m.peak then
      out[#out + 1] = ('--activation_checkpointing (peak %s)'):format(size(m.peak_other))
    end
  end
  local dtype_opt = names.dtype or 'dtype'
  if cfg[dtype_opt] == 'f32' or cfg[dtype_opt] == 'f64' then
    out[#out + 1] = ('--%s=bf16 (about half the bytes)'):format(dtype_opt)
  end
  -- Ranks on this machine share its memory; sharding over more machines
  -- divides the persistent state (parameters, gradients and optimizer
  -- state) among all ranks when the strategy shards across them all
  -- (FULL_SHARD, SHARD_GRAD_OP; not the hybrids or NO_SHARD).
  local per_rank = m.peak - m.persistent
  local st = cfg.sharding_strategy and layout.strategy(cfg.sharding_strategy)
  if st and st.shards_across == 'group' and per_rank < p.usable then
    local total = m.persistent * world
    out[#out + 1] = ('sharding over more machines (%s: about %d ranks of this budget)'):format(st.name,
      math.max(world + 1, math.ceil(total / (p.usable - per_rank))))
  end
  if names.layers then out[#out + 1] = ('fewer layers (--%s)'):format(names.layers) end
  return table.concat(out, ', ')
end

-- Refuse (exit 2, one line) when the plan of `model` (on meta, unsharded)
-- for this job does not fit the budget. shape: {batch=, seq=} per rank as
-- shard_options.plan's; names: option names for the suggestions
-- ({layers = 'num_layers'}; try: a phrase appended, what to run instead
-- to try the recipe here); extra: more fsdp.plan options (optimizer).
-- Returns the plan, or nil when skipped (--skip_fit_check, no budget known).
function M.check(model, cfg, block_class, shape, script, names, extra)
  if cfg.skip_fit_check then return nil end
  local budget, source, base = M.device_budget(cfg)
  if not budget then return nil end
  local device = {}
  for k, v in pairs(base) do device[k] = v end
  -- The step time is not asked for: a declared rate instead of measuring
  -- this machine (which would allocate).
  device.flops = { f32 = 20e9, bf16 = 20e9, f16 = 20e9 }
  device.name, device.memory, device.reserved, device.measured = base.name, budget, 0, true
  local opts = shard_options.plan_options(cfg, block_class, shape, script, device)
  for k, v in pairs(extra or {}) do opts[k] = v end
  local p = fsdp.plan(model, opts)
  if p.fits then return p end
  local m = p.memory
  local msg = ('%s: does not fit: planned peak %s per rank (parameters %s, gradients %s, optimizer %s, '
    .. 'activations %s) > %s available (%s); try %s; or --skip_fit_check%s'):format(
    script or 'recipe', size(m.peak), size(m.params), size(m.grads), size(m.optimizer),
    size(m.activations + m.inputs), size(budget), source,
    suggestions(p, cfg, names or {}, opts.world, function() return (fsdp.plan.max_batch(model, opts)) end),
    names and names.try and ('; ' .. names.try) or '')
  options.usage_error(msg)
end

return M
