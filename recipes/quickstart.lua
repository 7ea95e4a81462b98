-- recipes/quickstart.lua: the main job of the quick start, run on CPU.
--
-- Shows what the core does today, end to end:
--   1. builds the weight shapes of Llama-2-70B on the meta device (no
--      memory) and sums their bytes, as a planner would;
--   2. initialises one weight matrix whole, and again as N row shards each
--      generated on its own (as N ranks would), and checks the shards equal
--      the whole: the property sharded init relies on;
--   3. reports the allocator's statistics.
-- Options: --ranks=N (default 4), --dim=D (default 1024), --seed=S.
-- Later issues turn this into a CPU training run.
local fsdp = require 'fsdp'

-- The options, checked before anything runs (fsdp.options).
local opts = require('fsdp.options').config({
  ranks = { 4, 'shards the weight is initialised as', int = true, min = 1 },
  dim = { 1024, 'rows and columns of the weight', int = true, min = 1, multiple_of = 'ranks' },
  seed = { 0, 'initialisation seed', int = true, min = 0 },
}, arg, 'recipes/quickstart.lua', function(o)
  -- The weight, a shard and their comparison in f32 must fit this
  -- machine ([Note: sizes are bounded before building] in fsdp.sharding.fit).
  local fit = require 'fsdp.sharding.fit'
  local budget, source = fit.budget({})
  local need = 4 * o.dim * o.dim * (1 + 3 / o.ranks)
  if budget and need > budget then
    error(('--dim %d: the %d x %d f32 weight and a shard take %s, more than the %s available (%s)'):format(o.dim,
      o.dim, o.dim, fit.bytes_text(need), fit.bytes_text(budget), source), 0)
  end
end)

print(('fsdp-lua %s (%s)'):format(fsdp.version, fsdp.build_info))

-- 1. Llama-2-70B on meta: dim 8192, 80 layers, 64 heads / 8 kv heads of 128,
-- ffn 28672, vocab 32000 (../shared/MODELS.md).
local d, L, hd, H, KV, ffn, V = 8192, 80, 128, 64, 8, 28672, 32000
local shapes = {
  { 'model.embed_tokens.weight', { V, d }, 1 },
  { 'self_attn.q_proj.weight', { H * hd, d }, L },
  { 'self_attn.k_proj.weight', { KV * hd, d }, L },
  { 'self_attn.v_proj.weight', { KV * hd, d }, L },
  { 'self_attn.o_proj.weight', { d, H * hd }, L },
  { 'mlp.gate_proj.weight', { ffn, d }, L },
  { 'mlp.up_proj.weight', { ffn, d }, L },
  { 'mlp.down_proj.weight', { d, ffn }, L },
  { 'input_layernorm.weight', { d }, L },
  { 'post_attention_layernorm.weight', { d }, L },
  { 'model.norm.weight', { d }, 1 },
  { 'lm_head.weight', { V, d }, 1 },
}
local params, bytes = 0, 0
for _, s in ipairs(shapes) do
  local w = fsdp.empty(s[2], { device = 'meta', dtype = 'bf16' })
  params = params + w:numel() * s[3]
  bytes = bytes + w:numel() * w:element_size() * s[3]
end
print(('Llama-2-70B on meta: %d parameters, %.1f GiB in bf16, %d bytes allocated'):format(
  params, bytes / 2^30, fsdp.memory_stats('cpu').in_use))
assert(params == 68976648192, 'Llama-2-70B parameter count does not match MODELS.md')

-- 2. Sharded init equals whole init.
fsdp.reset_memory_stats('cpu')
local dim, ranks = opts.dim, opts.ranks
local key = { seed = opts.seed, stream = 7 }
local t0 = os.clock()
local whole = fsdp.randn({ dim, dim }, { seed = key.seed, stream = key.stream, std = 0.02 })
local rows = dim / ranks
local mismatches = 0
for r = 0, ranks - 1 do
  local shard = fsdp.randn({ rows, dim },
    { seed = key.seed, stream = key.stream, std = 0.02, offset = r * rows * dim })
  local expect = whole:narrow(0, r * rows, rows):contiguous()
  local a, b = shard:view(-1), expect:view(-1)
  for i = 0, a:numel() - 1, 997 do
    if a:get(i) ~= b:get(i) then mismatches = mismatches + 1 end
  end
end
print(('%dx%d weight initialised whole and as %d shards: %s (%.3f s)'):format(
  dim, dim, ranks, mismatches == 0 and 'identical' or (mismatches .. ' mismatches'), os.clock() - t0))
assert(mismatches == 0, 'sharded init differs from whole init')

-- 3. Allocator statistics.
local s = fsdp.memory_stats('cpu')
print(('cpu memory: %.1f MiB in use, peak %.1f MiB, %d allocations'):format(
  s.in_use / 2^20, s.peak / 2^20, s.allocations))
print('sample: ' .. tostring(whole:narrow(0, 0, 2):narrow(1, 0, 4)))
