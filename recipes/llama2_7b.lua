-- recipes/llama2_7b.lua: train Llama 2 7B, the seed recipe (AdamW, linear
-- warmup then cosine decay, gradient clipping at 1.0).
--
--   fsdp-lua recipes/llama2_7b.lua --dry-run          full size on meta: tree, parameters, memory
--   fsdp-lua recipes/llama2_7b.lua --num_layers=2 --hidden_width=256 --num_heads=4 \
--            --vocab_size=512 --max_steps=200       a reduced model that trains on CPU
--
-- Every key below is an option (--key=value); --help lists them. Data are
-- synthetic tokens with learnable structure (fsdp.data.synthetic) so the
-- loss has somewhere to go: it falls toward the data's entropy, far below
-- ln(vocab_size).
local fsdp = require 'fsdp'
local recipe = require 'fsdp.recipe'
local llama = require 'models.llama'
local optim = require 'fsdp.optim'
local synthetic = require 'fsdp.data.synthetic'

local cfg = recipe.config({
  model = { 'Llama-2-7b', 'model config (models/llama.lua)' },
  num_layers = { 0, 'override the number of layers (0: keep the config)' },
  hidden_width = { 0, 'override the model width (0: keep)' },
  num_heads = { 0, 'override the attention heads (0: keep)' },
  num_kv_heads = { 0, 'override the key/value heads (0: same as heads)' },
  ffn_dim = { 0, 'override the MLP width (0: keep, or 8/3 width rounded up to 32 when the width changes)' },
  vocab_size = { 0, 'override the vocabulary (0: keep)' },
  batch_size = { 4, 'sequences per step' },
  seq_len = { 128, 'tokens per sequence' },
  max_steps = { 100, 'optimizer steps' },
  lr = { 3e-4, 'peak learning rate' },
  min_lr = { 3e-5, 'final learning rate of the cosine decay' },
  warmup_steps = { 10, 'linear warmup steps' },
  weight_decay = { 0.1, 'AdamW weight decay (not applied to norms)' },
  beta1 = { 0.9, 'AdamW beta1' },
  beta2 = { 0.95, 'AdamW beta2' },
  grad_clip = { 1.0, 'clip the global gradient norm to this (0: off)' },
  seed = { 0, 'initialisation and data seed' },
  dtype = { 'f32', 'parameter and compute dtype: f32, bf16 (slow on CPU: converted per op), f64' },
  activation_checkpointing = { false, 'recompute each decoder layer in backward instead of keeping activations' },
  data_noise = { 0.1, 'synthetic data: probability of a random next token' },
  log_every = { 1, 'print a log line every N steps' },
  dry_run = { false, 'build at full size on the meta device, print it, and exit' },
  memory_limit_mb = { 0, 'fail CPU allocations past this many MiB of live tensors (0: no limit)' },
  summary = { false, 'end with a line SUMMARY {json}: samples/s, TFLOPS, peak memory (recipes/sweep.lua)' },
}, arg, 'recipes/llama2_7b.lua')

print('config:\n' .. recipe.format(cfg))

-- A limit, and the peak a summary reports, are about live tensors: collect
-- dead ones before every allocation so uncollected garbage never counts.
if cfg.memory_limit_mb > 0 or cfg.summary then fsdp.set_collect_budget(0) end
if cfg.memory_limit_mb > 0 then fsdp.set_memory_limit('cpu', cfg.memory_limit_mb * 2^20) end

local overrides = {}
if cfg.num_layers > 0 then overrides.n_layers = cfg.num_layers end
if cfg.hidden_width > 0 then
  overrides.dim = cfg.hidden_width
  if cfg.ffn_dim == 0 then overrides.ffn_dim = math.ceil(cfg.hidden_width * 8 / 3 / 32) * 32 end
end
if cfg.num_heads > 0 then overrides.n_heads = cfg.num_heads end
if cfg.num_kv_heads > 0 then overrides.n_kv_heads = cfg.num_kv_heads end
if cfg.ffn_dim > 0 then overrides.ffn_dim = cfg.ffn_dim end
if cfg.vocab_size > 0 then overrides.vocab_size = cfg.vocab_size end
if overrides.n_heads and not overrides.n_kv_heads then overrides.n_kv_heads = overrides.n_heads end

local c = llama.config(cfg.model, overrides)

-- 6738415616 -> "6,738,415,616"
local function commas(n)
  local s = ('%d'):format(n)
  return (s:reverse():gsub('(%d%d%d)', '%1,'):reverse():gsub('^,', ''))
end

local clock = require 'fsdp.clock'

if cfg.dry_run then
  local t0 = clock.now()
  local model = llama.CausalLM(c, { device = 'meta' })
  print(model)
  local n = model:num_parameters()
  print(('parameters: %s'):format(commas(n)))
  print(('closed form: %d'):format(llama.closed_form_parameters(c)))
  print(('fp32 weights %.1f GiB, bf16 %.1f GiB; AdamW state %.1f GiB (fp32)'):format(
    n * 4 / 2^30, n * 2 / 2^30, n * 8 / 2^30))
  print(('training FLOPs per token at seq %d: %.3e'):format(cfg.seq_len, llama.flops_per_token(c, cfg.seq_len, n)))
  print(('built on meta in %.2f s; cpu memory in use: %d bytes'):format(clock.now() - t0,
    fsdp.memory_stats('cpu').in_use))
  recipe.expose({ model = model, config = c, cfg = cfg })
  return
end

local model = llama.CausalLM(c, { device = 'cpu', dtype = cfg.dtype })
model:init_weights({ seed = cfg.seed })
if cfg.activation_checkpointing then
  fsdp.checkpoint(model, function(m) return m:is_instance_of(llama.DecoderLayer) end)
end
local n_params = model:num_parameters()
print(('model: %d layers, width %d, %d heads (%d kv), ffn %d, vocab %d: %d parameters, %s'):format(
  c.n_layers, c.dim, c.n_heads, c.n_kv_heads, c.ffn_dim, c.vocab_size, n_params, cfg.dtype))

local opt = optim.AdamW(model:named_parameters(), {
  lr = cfg.lr, betas = { cfg.beta1, cfg.beta2 }, weight_decay = cfg.weight_decay,
  -- no decay for norm weights (and any 1-d parameter)
  groups = { { match = function(_, p) return p:dim() < 2 end, weight_decay = 0 } },
})
local sched = optim.lr_scheduler.WarmupCosine(opt, {
  warmup_steps = cfg.warmup_steps, total_steps = cfg.max_steps, min_lr = cfg.min_lr })
local data = synthetic.Markov(c.vocab_size, { seed = cfg.seed, noise = cfg.data_noise })
print(('data: synthetic Markov chain, entropy %.3f nats/token; uniform guessing: ln(%d) = %.3f'):format(
  data:entropy(), c.vocab_size, math.log(c.vocab_size)))

local flops_per_step = llama.flops_per_token(c, cfg.seq_len, n_params) * cfg.batch_size * cfg.seq_len
local params = model:parameters()
local step_times = {}
for step = 1, cfg.max_steps do
  local t0 = clock.now()
  local ids, targets = data:batch(step - 1, cfg.batch_size, cfg.seq_len)
  local loss = model:loss(ids, targets)
  loss:backward()
  local norm = cfg.grad_clip > 0 and optim.clip_grad_norm_(params, cfg.grad_clip) or 0
  local lr = opt.param_groups[1].lr
  opt:step()
  sched:step()
  opt:zero_grad()
  local dt = clock.now() - t0
  step_times[step] = dt
  if step % cfg.log_every == 0 or step == cfg.max_steps then
    print(('Batch %d Loss: %.4f, Speed: %.2f samples/sec, lr: %.3e, tokens/s: %.0f, GFLOP/s: %.1f, grad norm: %.3f'):format(
      step, loss:item(), cfg.batch_size / dt, lr, cfg.batch_size * cfg.seq_len / dt, flops_per_step / dt / 1e9, norm))
  end
end

-- For the REPL after `fsdp-lua -i recipes/llama2_7b.lua ...`, and for
-- recipes/sweep.lua: one machine-readable line. The first step is warmup
-- (first-touch allocations) and is left out of the rates when there are
-- more.
recipe.expose({ model = model, config = c, cfg = cfg, opt = opt, sched = sched, data = data })
if cfg.summary then
  local first = cfg.max_steps > 1 and 2 or 1
  local seconds = 0
  for step = first, cfg.max_steps do seconds = seconds + step_times[step] end
  local steps = cfg.max_steps - first + 1
  print('SUMMARY ' .. require('cjson').encode({
    samples_per_s = cfg.batch_size * steps / seconds,
    tflops = flops_per_step * steps / seconds / 1e12,
    peak_bytes = fsdp.memory_stats('cpu').peak,
    step_seconds = seconds / steps, steps = steps, parameters = n_params,
  }))
end
