-- benchmarks/plan_time.lua: what fsdp.plan costs now that it traces the
-- model's step on meta tensors (lua/fsdp/plan/trace.lua): one plan and
-- one max_batch search for Llama-2-70B on 64 H100s (8 nodes, bf16,
-- seq 4096), the medians of --runs (default 5) in this fresh process,
-- each traced afresh (cold) and, for the plan, again with the trace
-- remembered (warm: another world, strategy or device); then a cold plan
-- of DeepViT-8B (952 blocks: the Lua heap a full collection walks is ten
-- times Llama-2-70B's). Prints numbers; asserts nothing.
--
--   fsdp-lua benchmarks/plan_time.lua [--runs=5]
local fsdp = require 'fsdp'
local clock = require 'fsdp.clock'

local runs = 5
for _, a in ipairs(arg or {}) do
  local v = a:match('^%-%-runs=(%d+)$')
  if v then runs = tonumber(v) else error('plan_time.lua: unknown argument ' .. a .. ' (known: --runs=N)', 0) end
end

local median = require('benchmarks.stats').median

local function time(fn)
  local xs = {}
  for i = 1, runs do
    local t0 = clock.now()
    fn()
    xs[i] = clock.now() - t0
  end
  return median(xs)
end

local H100 = { world = 64, nodes = 8, strategy = 'FULL_SHARD', mixed_precision = 'bf16', device = 'h100-80g',
               batch = 1, seq = 4096 }
local trace = require 'fsdp.plan.trace'
local llama = require('models.llama').build('Llama-2-70b', { device = 'meta' })
fsdp.plan(llama, H100) -- the first trace also makes the RoPE tables
local plan_s = time(function() trace.forget(llama); fsdp.plan(llama, H100) end)
local warm_s = time(function() fsdp.plan(llama, H100) end)
local batch
local search_s = time(function()
  trace.forget(llama)
  batch = fsdp.plan.max_batch(llama, { world = 64, nodes = 8, mixed_precision = 'bf16', device = 'h100-80g',
                                      seq = 4096, checkpoint = true })
end)
print(('Llama-2-70B, 64 x h100-80g: plan %.3f s (%.3f s with its trace remembered), max_batch %.3f s '
  .. '(batch %d, checkpointed), Lua heap %.1f MiB'):format(plan_s, warm_s, search_s, batch,
  collectgarbage('count') / 1024))
llama = nil -- luacheck: ignore
collectgarbage()

local vit = require('models.deepvit').build('8B', { device = 'meta' })
local vit_s = time(function() trace.forget(vit); fsdp.plan(vit, { world = 16, device = 'a100-80g', batch = 8 }) end)
print(('DeepViT-8B, 16 x a100-80g: plan %.3f s, Lua heap %.1f MiB'):format(vit_s, collectgarbage('count') / 1024))
