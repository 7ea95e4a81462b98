-- tests/mpi/fsdp_memory.lua: what a rank holds, from the allocator's own
-- statistics (fsdp.memory_stats: every storage byte the core allocates).
--
-- 1. FULL_SHARD on N ranks keeps at most 1/N of the one-rank persistent
--    bytes (parameters, gradients, AdamW state) plus padding plus one
--    gathered unit, measured at rest after a training step.
-- 2. Activation checkpointing of an 8-block Llama cuts the peak activation
--    memory (peak during forward + backward above what was in use before)
--    by at least half.
local fsdp = require 'fsdp'
local dist = fsdp.dist
local llama = require 'models.llama'
local optim = require 'fsdp.optim'
local T = require 'tests.mpi.tap'

fsdp.set_collect_budget(0) -- free tensors as soon as they are unreachable
local R, W = T.rank, T.world
local CFG = { dim = 64, n_layers = 8, n_heads = 4, n_kv_heads = 4, ffn_dim = 192, vocab_size = 128,
              max_seq_len = 128 }
local B, SEQ = 4, 128
local ids = fsdp.randint(0, CFG.vocab_size, { B, SEQ }, { seed = 1 })
local tg = fsdp.randint(0, CFG.vocab_size, { B, SEQ }, { seed = 2 })
local is_block = function(m) return m:is_instance_of(llama.DecoderLayer) end

local function in_use()
  fsdp.collect() -- [Note: traces pin closures]
  return fsdp.memory_stats('cpu').in_use
end

local function mib(b) return ('%.2f MiB'):format(b / 2^20) end

-- Build, shard over `group` with `strategy`, train one step; returns the
-- bytes in use at rest above `base`, the peak above it, and the model.
local function one_step(opts, checkpoint)
  local base = in_use()
  local m = llama.CausalLM(llama.config('Llama-2-7b', CFG), { device = 'meta' })
  opts.policy, opts.seed = fsdp.policy.transformer { llama.DecoderLayer }, 3
  fsdp.shard(m, opts)
  if checkpoint then fsdp.checkpoint(m, is_block) end
  local opt = optim.AdamW(m:named_parameters(), { lr = 1e-3 })
  -- a first step creates the optimizer state
  local l = m:loss(ids, tg); l:backward(); opt:step()
  l = nil
  local before = in_use()
  fsdp.reset_memory_stats('cpu')
  l = m:loss(ids, tg); l:backward(); l = nil
  local peak = fsdp.memory_stats('cpu').peak
  opt:step()
  local rest = in_use()
  return { persistent = rest - base, activations = peak - before, model = m, opt = opt }
end

local one = dist.split(R, { name = 'one rank' })

T.test(('FULL_SHARD on %d ranks holds at most 1/%d of the one-rank bytes + padding + one unit'):format(W, W), function()
  local single = one_step({ group = one })
  local one_rank = single.persistent
  local numel = single.model:num_parameters()
  single = nil
  local sharded = one_step({ strategy = 'FULL_SHARD' })
  local units = fsdp.sharding.units(sharded.model)
  local padding, largest = 0, 0
  for _, u in ipairs(units) do
    padding = padding + (u.padded_numel - u.numel) * 4 * 4 / W -- params, grads, exp_avg, exp_avg_sq
    largest = math.max(largest, u.gathered_bytes)
  end
  local bound = one_rank / W + padding + largest
  local report = fsdp.sharding.memory(sharded.model, sharded.opt)
  if R == 0 then
    io.stdout:write(('# %d parameters; one rank %s; rank 0 of %d holds %s (params %s, grads %s, AdamW %s); bound %s\n'):format(
      numel, mib(one_rank), W, mib(sharded.persistent), mib(report.params), mib(report.grads),
      mib(report.optimizer), mib(bound)))
  end
  T.truthy(one_rank >= numel * 16, ('one-rank persistent bytes %d < 16 x %d'):format(one_rank, numel))
  T.truthy(sharded.persistent <= bound, ('rank %d holds %d bytes > bound %d'):format(R, sharded.persistent, bound))
  T.truthy(sharded.persistent >= one_rank / W * 0.9, 'suspiciously little memory held')
end)

T.test('activation checkpointing halves peak activation memory of an 8-block sharded Llama', function()
  local plain = one_step({ strategy = 'FULL_SHARD' }, false).activations
  local ckpt = one_step({ strategy = 'FULL_SHARD' }, true).activations
  if R == 0 then
    io.stdout:write(('# peak activation memory: %s plain, %s checkpointed (%.0f%%)\n'):format(
      mib(plain), mib(ckpt), 100 * ckpt / plain))
  end
  T.truthy(ckpt <= plain / 2, ('checkpointed %d bytes, plain %d'):format(ckpt, plain))
end)

T.done()
