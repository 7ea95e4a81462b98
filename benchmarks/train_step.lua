-- benchmarks/train_step.lua: speed of a full training step (forward, loss,
-- backward, AdamW) on CPU, against this machine's own sgemm rate measured
-- in the same run, and against the step's GEMM floor: its products at the
-- GEMM rate of its precision plus AdamW's pass at the memory's rate, both
-- measured in the same run. Prints numbers; asserts nothing (machines are
-- noisy: compare the ratios).
--
--   fsdp-lua benchmarks/train_step.lua [--steps=5] [--warmup=2] [--only=gpt2|llama] [--ops=12]
--                                      [--precision=f32|bf16]
--
-- --precision=bf16 trains in bf16 mixed precision (f32 master weights and
-- AdamW, bf16 compute), the counterpart of torch_cpu.py --precision=bf16.
--
-- Then, per model, one more step traced by fsdp.observe.profiler: the ops
-- that took the most time of their own (forward: fsdp.functional calls,
-- backward: autograd nodes), with their GFLOP/s against the sgemm rate
-- (the floor a product could reach), and the step split into products
-- (linear, matmul, attention) and everything else (--ops=0: none).
--
-- Each step is also timed in the process's CPU time (cpu ms/step: all
-- threads together, so about threads x ms/step on an idle machine): on a
-- machine shared with other work it moves far less than the wall time,
-- and compares two runs of one thread count.
--
-- Ends with a line `RESULT {json}` per model (benchmarks/cpu_compare.sh
-- puts them beside PyTorch's, benchmarks/torch_cpu.py).
--
-- Models (issue 3's benchmark): (a) GPT-2 124M (models/gpt2.lua's 'gpt2':
-- 12 layers, width 768, 12 heads, MLP 3072, vocab 50257, learned
-- positions, tied head; dropout 0), batch 4 x seq 64; (b) a small Llama
-- (width 512, 8 layers, 8 heads, MLP 1376, vocab 32000), batch 4 x seq
-- 256. FLOPs per step are each model's 6N + 12LHT per token (PaLM appendix
-- B), the convention MFU uses (GPT-2's N leaves out the position table, as
-- nanoGPT's estimate does).
local fsdp = require 'fsdp'
local F = require 'fsdp.functional'
local llama = require 'models.llama'
local gpt2 = require 'models.gpt2'
local optim = require 'fsdp.optim'
local options = require 'fsdp.options'
local clock = require 'fsdp.clock'
-- The process's CPU time in seconds, all threads together (clock(3)).
local cpu_now = os.clock

local cfg = options.config({
  steps = { 5, 'measured steps per model' },
  warmup = { 2, 'unmeasured steps first' },
  only = { '', 'run one model: gpt2 or llama' },
  ops = { 12, 'ops listed from one traced step per model (0: no trace)', int = true, min = 0 },
  precision = { 'f32', 'f32, or bf16: f32 master weights, bf16 compute (fsdp.shard on this one process with '
                       .. "mixed_precision='bf16', as PyTorch's CPU autocast keeps f32 weights)",
                one_of = { 'f32', 'bf16' } },
}, arg, 'benchmarks/train_step.lua')

-- Best-of rate of an [m, k] @ [k, n] product (f32, or dtype), in GFLOP/s.
local function gemm_rate(m, n, k, reps, dtype)
  local a = fsdp.randn({ m, k }, { seed = 1 }):to(dtype or 'f32')
  local b = fsdp.randn({ k, n }, { seed = 2 }):to(dtype or 'f32')
  local best = math.huge
  for _ = 1, reps do
    local t0 = clock.now()
    local c = F.matmul(a, b)
    best = math.min(best, clock.now() - t0)
    c:free()
  end
  return 2 * m * n * k / best / 1e9
end

-- Best-of rate of the memory, in GB/s: an in-place add over 2 x 128 MiB
-- (reads both, writes one back: AdamW's pattern, which updates its
-- tensors in place, so no write allocates a line it does not read).
local function memory_rate(reps)
  local n = 32 * 2 ^ 20
  local a, b = fsdp.ones({ n }), fsdp.ones({ n })
  local best = math.huge
  for _ = 1, reps do
    local t0 = clock.now()
    a:add_(b)
    best = math.min(best, clock.now() - t0)
  end
  a:free()
  b:free()
  return 12 * n / best / 1e9
end

local median = require('benchmarks.stats').median

-- family: the model's module (build, flops_per_token); c its config;
-- layer the class of its blocks (bf16: one unit per block, as a recipe
-- wraps it, so each block's bf16 copy of its weights lives only while it
-- runs).
local function bench(name, family, c, B, T, layer)
  local model
  if cfg.precision == 'f32' then
    model = family.build(c)
    model:init_weights({ seed = 0 })
  else
    model = family.build(c, { device = 'meta' })
    fsdp.shard(model, { strategy = 'NO_SHARD', mixed_precision = cfg.precision, seed = 0,
                        policy = fsdp.policy.transformer { layer } })
  end
  local n = model:num_parameters()
  local opt = optim.AdamW(model:named_parameters(), { lr = 1e-4 })
  local ids = fsdp.randint(0, c.vocab_size, { B, T }, { seed = 1 })
  local targets = fsdp.randint(0, c.vocab_size, { B, T }, { seed = 2 })
  -- the step and its phases (CPU work is synchronous: each phase ends
  -- when its call returns)
  local times, cpu, fwd, bwd, upd, op_flops = {}, {}, {}, {}, {}, 0
  for step = 1, cfg.warmup + cfg.steps do
    fsdp.reset_flops()
    local c0, t0 = cpu_now(), clock.now()
    local loss = model:loss(ids, targets)
    local t1 = clock.now()
    loss:backward()
    local t2 = clock.now()
    opt:step()
    opt:zero_grad()
    local t3, c3 = clock.now(), cpu_now()
    if step > cfg.warmup then
      cpu[#cpu + 1] = c3 - c0
      times[#times + 1], fwd[#fwd + 1], bwd[#bwd + 1], upd[#upd + 1] = t3 - t0, t1 - t0, t2 - t1, t3 - t2
      op_flops = fsdp.flops()
    end
  end
  local dt = median(times)
  local flops = family.flops_per_token(c, T, n) * B * T
  local ops
  if cfg.ops > 0 then
    -- one more step, traced: the op spans with their own time
    local profiler = require 'fsdp.observe.profiler'
    local path = os.tmpname()
    profiler.start({})
    local t0 = clock.now()
    local loss = model:loss(ids, targets)
    loss:backward()
    opt:step()
    opt:zero_grad()
    local traced = clock.now() - t0
    profiler.stop(path)
    local f = assert(io.open(path))
    local events = require('cjson').decode(f:read('*a')).traceEvents
    f:close()
    os.remove(path)
    ops = { traced_ms = traced * 1e3, by_name = {} }
    local spans = {}
    for _, e in ipairs(events) do if e.ph == 'X' and e.cat == 'op' then spans[#spans + 1] = e end end
    table.sort(spans, function(a, b) return a.ts < b.ts or (a.ts == b.ts and a.dur > b.dur) end)
    -- own time: a span's duration less its direct children's (F calls nest)
    local own, stack = {}, {}
    for i, e in ipairs(spans) do
      while #stack > 0 and spans[stack[#stack]].ts + spans[stack[#stack]].dur <= e.ts do stack[#stack] = nil end
      own[i] = e.dur
      if #stack > 0 then own[stack[#stack]] = own[stack[#stack]] - e.dur end
      stack[#stack + 1] = i
    end
    for i, e in ipairs(spans) do
      local g = ops.by_name[e.name] or { name = e.name, n = 0, us = 0, flops = 0 }
      ops.by_name[e.name] = g
      g.n, g.us, g.flops = g.n + 1, g.us + own[i], g.flops + (e.args.flops or 0)
    end
  end
  return { name = name, params = n, batch = B, seq = T, ms = dt * 1e3, cpu_ms = median(cpu) * 1e3,
           fwd_ms = median(fwd) * 1e3,
           bwd_ms = median(bwd) * 1e3, opt_ms = median(upd) * 1e3, tokens = B * T / dt, gflops = flops / dt / 1e9,
           model_gflop = flops / 1e9, op_gflop = op_flops / 1e9, op_gflops = op_flops / dt / 1e9, ops = ops }
end

-- Products: the ops whose time the GEMM floor bounds.
local function is_product(name)
  local l = name:lower()
  return l:find('linear') or l:find('matmul') or l:find('attention') or l:find('embedding') ~= nil
end

local function print_ops(r, peak)
  local list = {}
  for _, g in pairs(r.ops.by_name) do list[#list + 1] = g end
  table.sort(list, function(a, b) return a.us > b.us end)
  local prod, rest = 0, 0
  for _, g in ipairs(list) do
    if is_product(g.name) then prod = prod + g.us else rest = rest + g.us end
  end
  local step_us = r.ops.traced_ms * 1e3
  print(('%s: one traced step %.0f ms: products %.0f ms (%.0f%%), other ops %.0f ms (%.0f%%), outside ops %.0f ms')
    :format(r.name, r.ops.traced_ms, prod / 1e3, 100 * prod / step_us, rest / 1e3, 100 * rest / step_us,
            (step_us - prod - rest) / 1e3))
  print(('  %-36s %6s %9s %7s %9s %9s'):format('op (own time)', 'calls', 'ms', 'share', 'GFLOP/s', 'of sgemm'))
  for i = 1, math.min(cfg.ops, #list) do
    local g = list[i]
    local rate = g.us > 0 and g.flops / (g.us * 1e-6) / 1e9 or 0
    print(('  %-36s %6d %9.1f %6.1f%% %9.1f %8.0f%%'):format(g.name, g.n, g.us / 1e3, 100 * g.us / step_us, rate,
      100 * rate / peak))
  end
end

print(('fsdp-lua %s; %s; OMP_NUM_THREADS=%s'):format(fsdp.version, fsdp.build_info,
  os.getenv('OMP_NUM_THREADS') or 'unset'))
local peak = math.max(gemm_rate(1024, 1024, 1024, 5), gemm_rate(256, 3072, 768, 10))
print(('sgemm (best of 1024^3 and 256x3072x768): %.1f GFLOP/s'):format(peak))
-- [The GEMM floor] (issue 21): the step's products at this machine's GEMM
-- rate in the step's precision plus AdamW's pass at the memory's rate,
-- both measured here: 28 bytes per parameter (reads the f32 weight,
-- gradient and both moments, writes back the weight and moments). The
-- model's FLOPs (6N + 12LHT per token, below) stand for the products'.
-- Each model's rates are the means of those measured just before and
-- just after its steps: this machine's speed moves by a tenth within a
-- run, and rates measured once at the start set a later model's steps
-- against another moment's machine.
local function product_rate_now(sgemm)
  if sgemm and cfg.precision == 'f32' then return sgemm end
  local dtype = cfg.precision
  return math.max(gemm_rate(1024, 1024, 1024, 5, dtype), gemm_rate(256, 3072, 768, 10, dtype))
end
local rates = { product = product_rate_now(peak), memory = memory_rate(5) }
if cfg.precision ~= 'f32' then
  print(('%s products (the same shapes): %.1f GFLOP/s'):format(cfg.precision, rates.product))
end
print(('memory (in-place add over 2 x 128 MiB): %.1f GB/s'):format(rates.memory))
local ADAMW_BYTES = 28

local runs = {}
local function run(...)
  local before = rates
  local r = bench(...)
  rates = { product = product_rate_now(), memory = memory_rate(5) }
  r.product_rate = (before.product + rates.product) / 2
  r.memory_rate = (before.memory + rates.memory) / 2
  runs[#runs + 1] = r
end
if cfg.only == '' or cfg.only == 'gpt2' then
  run('GPT-2 124M, batch 4 x 64', gpt2, gpt2.config('gpt2'), 4, 64, gpt2.Block)
end
if cfg.only == '' or cfg.only == 'llama' then
  run('small Llama, batch 4 x 256', llama, llama.config('small'), 4, 256, llama.DecoderLayer)
end

-- Two FLOP counts: the model's 6N + 12LHT (what MFU uses; it counts the
-- embedding as if it were a product) and what the ops executed (their own
-- FLOP counters: products, attention, elementwise work).
print(('%-34s %11s %8s %8s %8s %8s %6s %9s %9s %9s %9s %9s'):format('model', 'params', 'ms/step', 'cpu ms', 'forward',
  'backward', 'optim', 'tokens/s', 'model GF', 'GFLOP/s', 'exec GF/s', 'of sgemm'))
for _, r in ipairs(runs) do
  print(('%-34s %11d %8.0f %8.0f %8.0f %8.0f %6.0f %9.0f %9.1f %9.1f %9.1f %8.0f%%'):format(r.name, r.params,
    r.ms, r.cpu_ms, r.fwd_ms, r.bwd_ms, r.opt_ms, r.tokens, r.model_gflop, r.gflops, r.op_gflops, 100 * r.gflops / peak))
end
print('(of sgemm: model GFLOP/s over the sgemm rate above; exec GF/s: FLOPs the ops counted)')
for _, r in ipairs(runs) do
  local products_ms = r.model_gflop / r.product_rate * 1e3
  local adamw_ms = ADAMW_BYTES * r.params / (r.memory_rate * 1e9) * 1e3
  r.floor_ms, r.floor_products_ms, r.floor_adamw_ms = products_ms + adamw_ms, products_ms, adamw_ms
  print(('%s: GEMM floor %.0f ms (%.1f GFLOP at %.0f GFLOP/s: %.0f ms; AdamW, %d B x %d parameters at %.1f GB/s: '
         .. '%.0f ms); the step runs at %.0f%% of it'):format(r.name, r.floor_ms, r.model_gflop, r.product_rate,
    products_ms, ADAMW_BYTES, r.params, r.memory_rate, adamw_ms, 100 * r.floor_ms / r.ms))
end
for _, r in ipairs(runs) do if r.ops then print_ops(r, peak) end end
-- One machine-readable line per model, the keys of benchmarks/torch_cpu.py
-- (benchmarks/cpu_compare.sh reads both).
local cjson = require 'cjson'
for _, r in ipairs(runs) do
  print('RESULT ' .. cjson.encode({ impl = 'fsdp-lua', model = r.name, params = r.params, batch = r.batch,
    seq = r.seq, precision = cfg.precision, ms = r.ms, cpu_ms = r.cpu_ms, fwd_ms = r.fwd_ms, bwd_ms = r.bwd_ms, opt_ms = r.opt_ms, tokens_per_s = r.tokens,
    gflops = r.gflops, sgemm_gflops = peak, product_gflops = r.product_rate, memory_gbs = r.memory_rate,
    model_gflop = r.model_gflop, floor_ms = r.floor_ms, floor_products_ms = r.floor_products_ms,
    floor_adamw_ms = r.floor_adamw_ms }))
end
