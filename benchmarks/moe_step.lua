-- benchmarks/moe_step.lua: a training step of one sparse MoE block
-- (nn.MoE: width 512, 8 experts of 1792, top-2, Mixtral's routing) on the
-- CPU in f32: forward, loss = sum(y * r) + 0.02 * the load-balancing loss,
-- backward, AdamW, zero_grad. The PyTorch counterpart is
-- benchmarks/moe_torch.py (transformers' MixtralSparseMoeBlock, eager);
-- run them in alternation for interleaved rounds:
--
--   for i in 1 2 3; do build/bin/fsdp-lua benchmarks/moe_step.lua; python3 benchmarks/moe_torch.py; done
--
-- Prints `RESULT {json}` with the median ms per step.
local fsdp = require 'fsdp'
local nn = require 'fsdp.nn'
local F = fsdp.F
local optim = require 'fsdp.optim'
local recipe = require 'fsdp.recipe'
local clock = require 'fsdp.clock'

local cfg = recipe.config({
  steps = { 10, 'measured steps' },
  warmup = { 3, 'unmeasured steps first' },
  batch = { 4, 'sequences' },
  seq = { 256, 'tokens per sequence' },
  dim = { 512, 'width' },
  ffn = { 1792, 'width of each expert' },
  experts = { 8, 'experts' },
  top_k = { 2, 'experts per token' },
}, arg, 'benchmarks/moe_step.lua')

local m = nn.MoE(cfg.dim, cfg.ffn, cfg.experts, cfg.top_k, { norm_topk_prob = true }):init_weights({ seed = 1 })
local opt = optim.AdamW(m:named_parameters(), { lr = 1e-4 })
local x = fsdp.randn({ cfg.batch, cfg.seq, cfg.dim }, { seed = 2 })
local r = fsdp.randn({ cfg.batch, cfg.seq, cfg.dim }, { seed = 3 })
local times = {}
for step = 1, cfg.warmup + cfg.steps do
  local t0 = clock.now()
  local y, logits = m(x)
  local loss = (y * r):sum() + F.load_balancing_loss({ logits }, cfg.experts, cfg.top_k) * 0.02
  loss:backward()
  opt:step()
  opt:zero_grad()
  if step > cfg.warmup then times[#times + 1] = (clock.now() - t0) * 1e3 end
end
table.sort(times)
local ms = times[math.floor((#times + 1) / 2)]
print(('moe_step (fsdp-lua): %.1f ms/step median of %d (min %.1f)'):format(ms, #times, times[1]))
print(('RESULT {"impl": "fsdp-lua", "ms": %.3f, "min_ms": %.3f}'):format(ms, times[1]))
