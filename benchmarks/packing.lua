-- benchmarks/packing.lua: training throughput of real (non-pad) tokens for
-- variable-length examples, padded against packed (fsdp.data.packing with
-- block-diagonal attention: [Note: packed sequences] in
-- core/ops/attention.c). Prints numbers; asserts nothing.
--
--   fsdp-lua benchmarks/packing.lua [--model=small] [--seq=512] [--batch=4] [--min_len=16] [--max_len=256]
--                                   [--steps=3] [--rounds=3] [--precision=f32|bf16]
--
-- Examples: lengths uniform in [min_len, max_len] (seeded), random ids.
-- Three ways to batch the same stream, each trained for `steps` steps
-- (forward, loss, backward, AdamW) per round, the ways alternating within
-- a round (the machine is shared: medians over rounds):
--   pad       one example per row, rows of seq tokens (a fixed shape)
--   pad_dyn   one example per row, rows as long as the batch's longest
--             example (dynamic padding, as Hugging Face's collator does)
--   packed    first-fit decreasing into rows of seq tokens, positions and
--             segments per example
-- Tokens/s counts real tokens only (the packer's `tokens`).
--
-- First (--attention_seq > 0), the attention op alone: forward and backward
-- of [batch, 8 heads, attention_seq, 64] in f32 and bf16, plain causal
-- against packed (documents of the same length distribution), best of 3:
-- the kernels skip other documents' keys, so the time should follow the
-- counted FLOPs. Ends with a line `RESULT {json}`.
local fsdp = require 'fsdp'
local llama = require 'models.llama'
local optim = require 'fsdp.optim'
local options = require 'fsdp.options'
local clock = require 'fsdp.clock'
local packing = require 'fsdp.data.packing'
local median = require('benchmarks.stats').median

local cfg = options.config({
  model = { 'small', "models/llama.lua's config" },
  seq = { 512, 'tokens per row', int = true, min = 1 },
  batch = { 4, 'rows per batch', int = true, min = 1 },
  min_len = { 16, 'shortest example', int = true, min = 1 },
  max_len = { 256, 'longest example', int = true, min = 1 },
  steps = { 3, 'measured steps per way and round', int = true, min = 1 },
  rounds = { 3, 'rounds (each runs every way once)', int = true, min = 1 },
  attention_seq = { 2048, 'row length of the attention-alone measurement (0: skip it)', int = true, min = 0 },
  precision = { 'f32', "f32, or bf16 (f32 master weights, bf16 compute, as benchmarks/train_step.lua)",
                one_of = { 'f32', 'bf16' } },
}, arg, 'benchmarks/packing.lua')

-- The attention op alone: seconds (best of 3) and counted FLOPs of a
-- forward and backward, with segments or plain causal.
local function attention_alone(dtype, segments)
  local B, T = cfg.batch, cfg.attention_seq
  local x = fsdp.randn({ B, 8, T, 64 }, { seed = 5 }):to(dtype)
  local best, flops = math.huge, 0
  for _ = 1, 3 do
    local q, k, v = x:clone():requires_grad_(), x:clone():requires_grad_(), x:clone():requires_grad_()
    fsdp.reset_flops()
    local t0 = clock.now()
    local y = fsdp.F.scaled_dot_product_attention(q, k, v, { causal = true, segments = segments })
    y:backward(y)
    best, flops = math.min(best, clock.now() - t0), fsdp.flops()
  end
  return best, flops
end

local result = {}
if cfg.attention_seq > 0 then
  -- documents of the benchmark's lengths, filling each row (the last one cut)
  local rows, k = {}, 0
  for r = 1, cfg.batch do
    local row, doc = {}, 0
    while #row < cfg.attention_seq do
      k = k + 1
      local n = cfg.min_len + (k * 7919) % (cfg.max_len - cfg.min_len + 1)
      for _ = 1, math.min(n, cfg.attention_seq - #row) do row[#row + 1] = doc end
      doc = doc + 1
    end
    rows[r] = row
  end
  local segments = fsdp.tensor(rows, { dtype = 'i64' })
  result.attention = {}
  for _, dtype in ipairs({ 'f32', 'bf16' }) do
    local tc, fc = attention_alone(dtype, nil)
    local tp, fp = attention_alone(dtype, segments)
    print(('attention alone %s [%d, 8, %d, 64] fwd+bwd: causal %.3f s, packed %.3f s (%.2fx faster; FLOPs %.2fx fewer)')
      :format(dtype, cfg.batch, cfg.attention_seq, tc, tp, tc / tp, fc / fp))
    result.attention[dtype] = { causal_s = tc, packed_s = tp, causal_flops = fc, packed_flops = fp }
  end
end

local c = llama.config(cfg.model)
local model
if cfg.precision == 'f32' then
  model = llama.build(cfg.model)
  model:init_weights({ seed = 0 })
else
  model = llama.build(cfg.model, { device = 'meta' })
  fsdp.shard(model, { strategy = 'NO_SHARD', mixed_precision = cfg.precision, seed = 0,
                      policy = fsdp.policy.transformer { llama.DecoderLayer } })
end
local opt = optim.AdamW(model:named_parameters(), { lr = 1e-5 })

-- An endless stream of examples (deterministic: seeded by its index).
local function stream(seed)
  local k = 0
  return function()
    k = k + 1
    local n = cfg.min_len + (k * 7919 + seed * 104729) % (cfg.max_len - cfg.min_len + 1)
    local ids = fsdp.randint(0, c.vocab_size, { n }, { seed = seed * 1000003 + k })
    return { ids = ids }
  end
end

local function packer(way, seed)
  return packing.new(stream(seed), { seq_len = cfg.seq, batch_size = cfg.batch,
                                     strategy = way == 'packed' and 'ffd' or 'pad' })
end

-- One training step on a batch; returns seconds and the token slots it
-- computed (batch * width).
local function step(way, b)
  local ids, targets, opts, width = b.ids, b.targets, nil, cfg.seq
  if way == 'pad_dyn' then
    -- as wide as the longest example of the batch (tokens are left-aligned)
    width = b.positions:max():item() + 1
    ids, targets = ids:narrow(1, 0, width):contiguous(), targets:narrow(1, 0, width):contiguous()
  elseif way == 'packed' then
    opts = { positions = b.positions, segments = b.segments }
  end
  local t0 = clock.now()
  local loss = model:loss(ids, targets, opts)
  loss:backward()
  opt:step()
  opt:zero_grad()
  return clock.now() - t0, cfg.batch * width
end

local WAYS = { 'pad', 'pad_dyn', 'packed' }
local packers, rates, real, slots = {}, {}, {}, {}
for _, way in ipairs(WAYS) do
  packers[way], rates[way] = packer(way, 1), {} -- the same examples each way
end
-- a warm-up step each
for _, way in ipairs(WAYS) do step(way, packers[way]:next()) end
for round = 1, cfg.rounds do
  for _, way in ipairs(WAYS) do
    local tokens, seconds = 0, 0
    for _ = 1, cfg.steps do
      local b = packers[way]:next()
      local dt, n = step(way, b)
      seconds, tokens = seconds + dt, tokens + b.tokens
      real[way], slots[way] = (real[way] or 0) + b.tokens, (slots[way] or 0) + n
    end
    rates[way][round] = tokens / seconds
    io.write(('round %d %-8s %8.1f real tokens/s\n'):format(round, way, tokens / seconds))
    io.flush()
  end
end

local out = { attention = result.attention, model = cfg.model, seq = cfg.seq, batch = cfg.batch, min_len = cfg.min_len, max_len = cfg.max_len,
              precision = cfg.precision, steps = cfg.steps, rounds = cfg.rounds }
for _, way in ipairs(WAYS) do
  -- fraction: real tokens over the slots the measured steps computed
  out[way] = { tokens_per_s = median(rates[way]), fraction = real[way] / slots[way] }
end
print(('padded (rows of %d): %.1f real tokens/s, %.1f%% real'):format(cfg.seq, out.pad.tokens_per_s,
  100 * out.pad.fraction))
print(('padded to the batch\'s longest: %.1f real tokens/s, %.1f%% real'):format(out.pad_dyn.tokens_per_s,
  100 * out.pad_dyn.fraction))
print(('packed: %.1f real tokens/s, %.1f%% real; %.2fx padded, %.2fx dynamic padding'):format(out.packed.tokens_per_s,
  100 * out.packed.fraction, out.packed.tokens_per_s / out.pad.tokens_per_s,
  out.packed.tokens_per_s / out.pad_dyn.tokens_per_s))
print('RESULT ' .. require('cjson').encode(out))
