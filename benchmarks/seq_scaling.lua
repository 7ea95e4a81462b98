-- benchmarks/seq_scaling.lua: how a training step of the small Llama
-- (benchmarks/train_step.lua's: width 512, 8 layers, 8 heads, MLP 1376,
-- vocab 32000) scales with the sequence length on the CPU: step time,
-- achieved GFLOP/s (6N + 12LHT per token, attention's T^2 included), and
-- the step's peak memory (all of it: parameters, gradients, AdamW state,
-- activations) beside fsdp.plan's prediction of the same step, and what
-- each token more costs at the peak between one length and the next
-- (constant when activations grow linearly with T: flash-style attention
-- keeps no [T, T] matrix). Batch 1, f32 (--precision=bf16: bf16 mixed
-- precision, whose attention runs on the bf16 kernels where the CPU has
-- AMX tiles or AVX512-BF16),
-- one process, the model sharded (world 1) as the recipes shard it, dead
-- tensors collected before every allocation (exact accounting; the steps
-- are a little slower for it). Prints a table; asserts nothing.
--
--   fsdp-lua benchmarks/seq_scaling.lua [--seqs=256,512,1024,2048,4096] [--steps=2] [--width=512]
--                                       [--precision=f32|bf16]
local fsdp = require 'fsdp'
local llama = require 'models.llama'
local optim = require 'fsdp.optim'
local options = require 'fsdp.options'
local clock = require 'fsdp.clock'

local cfg = options.config({
  seqs = { '256,512,1024,2048,4096', 'sequence lengths, comma-separated' },
  steps = { 2, 'measured steps per length (after one unmeasured)', int = true, min = 1 },
  width = { 512, 'model width (heads of 64)', int = true, min = 64 },
  precision = { 'f32', "f32, or bf16: f32 master weights, bf16 compute (mixed_precision='bf16')",
                one_of = { 'f32', 'bf16' } },
}, arg, 'benchmarks/seq_scaling.lua')
local mp = cfg.precision == 'bf16' and 'bf16' or nil

local seqs = {}
for s in cfg.seqs:gmatch('[^,]+') do
  local n = tonumber(s)
  if not n or n < 1 or n ~= math.floor(n) then options.usage_error('--seqs: not a length: ' .. s) end
  seqs[#seqs + 1] = n
end

local function config(T)
  local heads = math.floor(cfg.width / 64)
  return llama.config('tiny', { dim = cfg.width, n_layers = 8, n_heads = heads, n_kv_heads = heads,
                                ffn_dim = math.floor(1376 * cfg.width / 512), vocab_size = 32000, max_seq_len = T })
end

local median = require('benchmarks.stats').median

local function mib(b) return b / 2^20 end

print(('small Llama, width %d, 8 layers, vocab 32000, batch 1, %s, %d thread(s)'):format(cfg.width,
  cfg.precision, tonumber(os.getenv('OMP_NUM_THREADS') or '0') or 0))
print(('%6s %9s %9s %9s %11s %11s %10s %14s'):format('seq', 'step s', 'tok/s', 'GFLOP/s', 'peak MiB',
  'plan MiB', 'plan/meas', 'KiB/token more'))
local last_T, last_peak
-- Exact memory accounting (a collection before every allocation), as the
-- planner assumes: otherwise dead tensors Lua has not collected yet count.
fsdp.set_collect_budget(0)
for _, T in ipairs(seqs) do
  local c = config(T)
  collectgarbage(); collectgarbage()
  local base = fsdp.memory_stats('cpu').in_use
  -- sharded as the recipes do (one process: world 1), the step fsdp.plan
  -- predicts
  local m = llama.CausalLM(c, { device = 'meta' })
  local n = m:num_parameters()
  fsdp.shard(m, { policy = fsdp.policy.transformer { llama.DecoderLayer }, seed = 1, mixed_precision = mp })
  local opt = optim.AdamW(m:parameters(), { lr = 1e-4 })
  local times, peak = {}, 0
  for step = 0, cfg.steps do
    local ids = fsdp.randint(0, c.vocab_size, { 1, T }, { seed = step })
    local targets = fsdp.randint(0, c.vocab_size, { 1, T }, { seed = 100 + step })
    collectgarbage(); collectgarbage()
    fsdp.reset_memory_stats('cpu')
    local t0 = clock.now()
    local loss = m:loss(ids, targets)
    loss:backward()
    opt:step()
    opt:zero_grad()
    local dt = clock.now() - t0
    if step > 0 then
      times[#times + 1] = dt
      peak = math.max(peak, fsdp.memory_stats('cpu').peak - base)
    end
    loss, ids, targets = nil, nil, nil -- luacheck: ignore
  end
  local s = median(times)
  local per_token = 6 * n + 12 * c.n_layers * c.n_heads * c.head_dim * T
  local p = fsdp.plan(llama.CausalLM(c, { device = 'meta' }), { world = 1, batch = 1, seq = T, device = 'cpu',
                                                                mixed_precision = mp })
  local more = last_T and ('%14.1f'):format((peak - last_peak) / (T - last_T) / 1024) or ('%14s'):format('-')
  print(('%6d %9.3f %9.0f %9.1f %11.1f %11.1f %10.3f %s'):format(T, s, T / s, per_token * T / s / 1e9,
    mib(peak), mib(p.memory.peak), p.memory.peak / peak, more))
  last_T, last_peak = T, peak
  m, opt = nil, nil -- luacheck: ignore
  collectgarbage(); collectgarbage()
end
