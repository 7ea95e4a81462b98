-- benchmarks/profiler.lua: what --profile_steps costs. One sharded Llama
-- (a unit per layer, as the recipes wrap it) trains in one process, the
-- steps alternating between blocks with the profiler off and on
-- (fsdp.profiler), so both see the same machine load; prints the median
-- step time of each, the spans recorded per step, and the cost of one
-- module call with the profiler off and on. Prints numbers; asserts
-- nothing.
--
--   fsdp-lua benchmarks/profiler.lua [--steps=40] [--block=5] [--model=tiny]
local fsdp = require 'fsdp'
local llama = require 'models.llama'
local nn = require 'fsdp.nn'
local optim = require 'fsdp.optim'
local options = require 'fsdp.options'
local clock = require 'fsdp.clock'
local profiler = require 'fsdp.observe.profiler'

local cfg = options.config({
  steps = { 40, 'measured steps in all (half off, half on)', int = true, min = 2 },
  block = { 5, 'steps in a row with the same setting', int = true, min = 1 },
  model = { 'tiny', 'Llama config (models/llama.lua)' },
  batch = { 4, 'sequences per step', int = true, min = 1 },
  seq = { 64, 'tokens per sequence', int = true, min = 1 },
}, arg, 'benchmarks/profiler.lua')

local median = require('benchmarks.stats').median

local c = llama.config(cfg.model)
local model = llama.build(c, { device = 'meta' })
fsdp.shard(model, { policy = fsdp.policy.transformer { llama.DecoderLayer }, seed = 0 })
local opt = optim.AdamW(model:named_parameters(), { lr = 1e-4 })
local ids = fsdp.randint(0, c.vocab_size, { cfg.batch, cfg.seq }, { seed = 1 })
local targets = fsdp.randint(0, c.vocab_size, { cfg.batch, cfg.seq }, { seed = 2 })
local function step()
  local t0 = clock.now()
  local loss = model:loss(ids, targets)
  loss:backward()
  opt:step()
  opt:zero_grad()
  return clock.now() - t0
end
for _ = 1, 3 do step() end -- warmup

local times, events = { off = {}, on = {} }, 0
local trace = os.tmpname()
for i = 0, cfg.steps - 1 do
  local on = math.floor(i / cfg.block) % 2 == 1
  if on then profiler.start({ model = model }) end
  table.insert(on and times.on or times.off, step())
  if on then events = events + profiler.stop(trace) - 3 end -- less the 3 metadata events
end
os.remove(trace)

-- one module call, the profiler off and on (best of 5 x 20000)
local lin, x = nn.Linear(4, 4), fsdp.randn({ 1, 4 })
local function per_call()
  local best = math.huge
  for _ = 1, 5 do
    local t0 = clock.now()
    for _ = 1, 20000 do lin(x) end
    best = math.min(best, (clock.now() - t0) / 20000)
  end
  return best * 1e6
end
local call_off = per_call()
profiler.start({ model = lin })
local call_on = per_call()
profiler.stop(trace)
os.remove(trace)

local off, on = median(times.off), median(times.on)
print(('Llama %s, batch %d x %d, %d units: %d steps off, %d on, alternating every %d'):format(cfg.model, cfg.batch,
  cfg.seq, #fsdp.sharding.units(model), #times.off, #times.on, cfg.block))
print(('step: %.2f ms off, %.2f ms on (%+.1f%%); %.0f trace events per step'):format(off * 1e3, on * 1e3,
  (on / off - 1) * 100, events / #times.on))
print(('module call: %.2f us off, %.2f us on'):format(call_off, call_on))
