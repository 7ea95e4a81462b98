-- benchmarks/moe_step.lua: a training step of one sparse MoE block
-- (nn.MoE: width 512, 8 experts of 1792, top-2, Mixtral's routing) on the
-- CPU in f32: forward, loss = sum(y * r) + 0.02 * the load-balancing loss,
-- backward, AdamW, zero_grad. With --layers=N, a Mixtral-shaped causal LM
-- instead (models/families/mixtral.lua: N layers of that width and those
-- experts, 8 heads, 2 KV heads, a 32000-token vocabulary): its next-token
-- loss plus 0.02 times the load-balancing loss of every layer, as
-- transformers' MixtralForCausalLM computes it with output_router_logits.
-- The PyTorch counterpart is benchmarks/moe_torch.py (transformers'
-- MixtralSparseMoeBlock or MixtralForCausalLM, eager PyTorch); run them in
-- alternation for interleaved rounds:
--
--   for i in 1 2 3; do build/bin/fsdp-lua benchmarks/moe_step.lua; python3 benchmarks/moe_torch.py; done
--   for i in 1 2 3; do build/bin/fsdp-lua benchmarks/moe_step.lua --layers=2; python3 benchmarks/moe_torch.py --layers=2; done
--
-- Prints `RESULT {json}` with the median ms per step.
local fsdp = require 'fsdp'
local nn = require 'fsdp.nn'
local F = fsdp.F
local optim = require 'fsdp.optim'
local options = require 'fsdp.options'
local clock = require 'fsdp.clock'

local cfg = options.config({
  steps = { 10, 'measured steps' },
  warmup = { 3, 'unmeasured steps first' },
  batch = { 4, 'sequences' },
  seq = { 256, 'tokens per sequence' },
  dim = { 512, 'width' },
  ffn = { 1792, 'width of each expert' },
  experts = { 8, 'experts' },
  top_k = { 2, 'experts per token' },
  layers = { 0, '0: the MoE block alone; N: a Mixtral-shaped causal LM of N layers' },
}, arg, 'benchmarks/moe_step.lua')

local m, step_loss
if cfg.layers == 0 then
  m = nn.MoE(cfg.dim, cfg.ffn, cfg.experts, cfg.top_k, { norm_topk_prob = true }):init_weights({ seed = 1 })
  local x = fsdp.randn({ cfg.batch, cfg.seq, cfg.dim }, { seed = 2 })
  local r = fsdp.randn({ cfg.batch, cfg.seq, cfg.dim }, { seed = 3 })
  step_loss = function()
    local y, logits = m(x)
    return (y * r):sum() + F.load_balancing_loss({ logits }, cfg.experts, cfg.top_k) * 0.02
  end
else
  m = require('models.families.mixtral').build('tiny', { dim = cfg.dim, n_layers = cfg.layers, n_heads = 8,
    n_kv_heads = 2, ffn_dim = cfg.ffn, moe_ffn_dim = cfg.ffn, n_experts = cfg.experts, top_k = cfg.top_k,
    vocab_size = 32000, max_seq_len = cfg.seq, output_router_logits = true, router_aux_loss_coef = 0.02,
    device = 'cpu' }):init_weights({ seed = 1 })
  local ids = fsdp.randint(0, 32000, { cfg.batch, cfg.seq }, { seed = 2, dtype = 'i64' })
  local targets = fsdp.randint(0, 32000, { cfg.batch, cfg.seq }, { seed = 3, dtype = 'i64' })
  step_loss = function() return (m:loss(ids, targets)) end
end
local opt = optim.AdamW(m:named_parameters(), { lr = 1e-4 })
local times = {}
for step = 1, cfg.warmup + cfg.steps do
  local t0 = clock.now()
  local loss = step_loss()
  loss:backward()
  opt:step()
  opt:zero_grad()
  if step > cfg.warmup then times[#times + 1] = (clock.now() - t0) * 1e3 end
end
table.sort(times)
local ms = times[math.floor((#times + 1) / 2)]
print(('moe_step (fsdp-lua): %.1f ms/step median of %d (min %.1f)'):format(ms, #times, times[1]))
print(('RESULT {"impl": "fsdp-lua", "layers": %d, "ms": %.3f, "min_ms": %.3f}'):format(cfg.layers, ms, times[1]))
