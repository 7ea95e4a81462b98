-- models/t5_training.lua: what recipes/t5_3b.lua and recipes/t5_11b.lua
-- share: their options, the full-size dry run on meta, and training at
-- reduced size on CPU on a synthetic source -> target task (reverse, or
-- copy, a padded sequence of random tokens, then eos), ending with greedy
-- generation on held-out examples and their exact-match rate.
--
-- With --data=FILE.jsonl it fine-tunes on source/target text pairs
-- instead (models/t5_pairs.lua): validation loss every --validation_freq
-- steps, the data position in checkpoints, greedy outputs as text at the
-- end.
--
-- The seed's T5 experiments wrap and checkpoint T5Block; here
-- --activation_checkpointing recomputes each T5Block in backward and
-- --optimizer=anyprecision uses AnyPrecisionAdamW (bf16 states).
--
-- --init_from starts from a Hugging Face T5 directory (its config.json sets
-- the model; --dropout still applies), a sharded checkpoint's weights or a
-- full state dict; --export_hf writes the trained model as a Hugging Face
-- directory at the end (models/pretrained.lua).
local fsdp = require 'fsdp'
local options = require 'fsdp.options'
local shard_options = require 'fsdp.sharding.options'
local fit = require 'fsdp.sharding.fit'
local ckpt_options = require 'fsdp.checkpointing.options'
local nonfinite = require 'fsdp.nonfinite'
local accumulate = require 'fsdp.sharding.accumulate'
local t5 = require 'models.t5'
local pretrained = require 'models.pretrained'
local optim = require 'fsdp.optim'
local clock = require 'fsdp.clock'
local t5_pairs = require 'models.t5_pairs'
local lora = require 'fsdp.lora'
local metrics = require 'fsdp.observe.metrics'
local console = require 'fsdp.observe.console'
local profiler = require 'fsdp.observe.profiler'
local F = fsdp.F

local M = {}

-- Under a launcher every rank runs this; rank 0 speaks, "[rank 0] " first
-- with several ranks (fsdp.console).
local function print(line) console.print(line) end

-- The task. batch(step, B) -> input_ids [B, L+1] (content ids 2..V-1 of
-- a random length in [min_len, L], eos 1, pad 0), attention_mask, labels
-- [B, L+1] (the content reversed, or copied with opts.copy, then eos,
-- then -100) and decoder_attention_mask. Everything is made with tensor
-- ops: the reversal gathers each row through an embedding lookup of its
-- positions.
function M.reverse_task(opts)
  local V, L, min_len, seed = opts.vocab_size, opts.max_len, opts.min_len or 1, opts.seed or 0
  assert(min_len >= 1 and min_len <= L, 't5 recipe: need 1 <= min_len <= max_len')
  assert(V > 2, 't5 recipe: the vocabulary needs ids beyond pad 0 and eos 1')
  local task = {}
  -- stream selects the split: training batches and held-out ones never share draws.
  function task.batch(step, B, stream)
    stream = stream or 1
    local n = L + 1
    local content = fsdp.randint(2, V, { B, L }, { seed = seed, stream = 2 * stream, offset = step * B * L })
    local len = fsdp.randint(min_len, L + 1, { B, 1 }, { seed = seed, stream = 2 * stream + 1, offset = step * B })
    local pos = fsdp.arange(n, { dtype = 'i64' }):view(1, n)
    local src = F.cat({ content, fsdp.zeros({ B, 1 }, { dtype = 'i64' }) }, 1)
    src = F.where(F.lt(pos, len), src, 0)
    src = F.where(F.eq(pos, len), 1, src)
    -- Row b's target j is its source at len_b - 1 - j: a lookup in the
    -- flattened batch, rows offset by b * n.
    local rows = fsdp.arange(B, { dtype = 'i64' }):view(B, 1) * n
    local from = opts.copy and pos or (len - 1 - pos)
    local idx = F.clamp(from, 0, n - 1) + rows
    local reversed = F.embedding(idx, src:to('f32'):view(B * n, 1)):view(B, n):to('i64')
    local tail = F.where(F.eq(pos, len), fsdp.ones({ B, n }, { dtype = 'i64' }),
                         fsdp.full({ B, n }, -100, { dtype = 'i64' }))
    local labels = F.where(F.lt(pos, len), reversed, tail)
    return src, F.le(pos, len):to('i64'), labels, F.ne(labels, -100):to('i64')
  end
  return task
end

-- Greedy generation on a batch: the rows whose generated tokens match
-- their labels (models/t5_pairs.lua, which its report uses too).
M.exact_match = t5_pairs.exact_match

local function commas(n)
  local s = ('%d'):format(n)
  return (s:reverse():gsub('(%d%d%d)', '%1,'):reverse():gsub('^,', ''))
end

-- Run the recipe: default_model a models/t5.lua config name, script the
-- path for --help, argv the command line.
function M.run(default_model, script, argv)
  -- Each option carries its constraints; they and the model config they
  -- make are checked before anything is built (a full-size model takes
  -- minutes): a bad one is one line naming it, exit status 2.
  local c, src, pairs_run
  local cfg = options.config(metrics.options(lora.options(t5_pairs.options(pretrained.options(nonfinite.options(
    ckpt_options.options(shard_options.options(accumulate.options({
    model = { default_model, 'config (models/t5.lua): t5-small ... t5-11b, t5-v1_1-xl, t5-v1_1-xxl, tiny',
              one_of = function() return options.keys(t5.configs) end },
    num_layers = { 0, 'override encoder and decoder layers (0: keep)', int = true, min = 0 },
    d_model = { 0, 'override the width (0: keep)', int = true, min = 0 },
    d_ff = { 0, 'override the MLP width (0: keep)', int = true, min = 0 },
    d_kv = { 0, 'override the head size (0: keep)', int = true, min = 0 },
    num_heads = { 0, 'override the heads (0: keep)', int = true, min = 0 },
    vocab_size = { 0, 'override the vocabulary (0: keep)', int = true, min = 0, check = function(v)
      if v == 1 or v == 2 then return 'must be 0 (keep) or >= 3: ids 0 and 1 are pad and eos, got ' .. v end
    end },
    batch_size = { 16, 'sequence pairs per step and rank', int = true, min = 1 },
    min_len = { 2, 'synthetic task: shortest source (tokens before eos)', int = true, min = 1, at_most = 'max_len' },
    max_len = { 8, 'synthetic task: longest source; shorter ones are padded and masked', int = true, min = 1 },
    max_steps = { 200, 'optimizer steps', int = true, min = 1 },
    lr = { 3e-3, 'peak learning rate', positive = true },
    warmup_steps = { 20, 'linear warmup steps W, then cosine decay to lr/10: optimizer step s (1..max_steps) runs '
                         .. 'at lr*s/(W+1) while s <= W (the first at lr/(W+1), not 0), then lr/10 + 0.9*lr*(1 + '
                         .. 'cos(pi*(s-1-W)/(max_steps-W)))/2', int = true, min = 0, less_than = 'max_steps' },
    weight_decay = { 0.0, 'AdamW weight decay (not applied to norms)', min = 0 },
    beta1 = { 0.9, 'AdamW beta1 (torch: betas[0])', min = 0, below = 1 },
    beta2 = { 0.999, 'AdamW beta2 (torch: betas[1])', min = 0, below = 1 },
    eps = { 1e-8, 'AdamW epsilon, added to sqrt of the second moment (torch: eps)', min = 0, aliases = { 'adam_eps' } },
    grad_clip = { 1.0, 'clip the global gradient norm to this (0: off)', min = 0 },
    optimizer = { 'adamw', 'adamw or anyprecision (AnyPrecisionAdamW, bf16 states)', one_of = { 'adamw', 'anyprecision' } },
    task = { 'reverse', 'synthetic task (without --data): reverse or copy the source', one_of = { 'reverse', 'copy' } },
    -- (no f64: AdamW and AnyPrecisionAdamW update f32, bf16 and f16 parameters)
    dtype = { 'f32', 'parameter and compute dtype: f32, bf16 (slow on CPU)', one_of = { 'f32', 'bf16' } },
    dropout = { 0.0, 'dropout rate (T5 pre-training used 0.1)', min = 0, below = 1 },
    eval_examples = { 64, 'held-out examples for the final greedy generation (with --data: the first of the '
                          .. 'validation pairs)', int = true, min = 1 },
    seed = { 0, 'initialisation and data seed', int = true, min = 0 },
    log_every = { 10, 'steps between log lines (means since the previous one)', int = true, min = 1 },
    dry_run = { false, 'build at full size on meta, print it, and exit' },
  })))))))), argv, script, function(cfg, written)
    -- --data: the pairs are read and tokenized here, so a bad file is a
    -- usage error; the vocabulary and EOS come from the tokenizer.
    if not cfg.dry_run then pairs_run = t5_pairs.open(cfg) end
    local overrides = { dropout = cfg.dropout }
    t5_pairs.model_overrides(pairs_run, cfg, overrides)
    for _, k in ipairs({ 'num_layers', 'd_model', 'd_ff', 'd_kv', 'num_heads', 'vocab_size' }) do
      if cfg[k] > 0 then overrides[k] = cfg[k] end
    end
    if overrides.num_layers then overrides.num_decoder_layers = overrides.num_layers end
    local ok, err = pcall(t5.config, cfg.model, overrides)
    local size_options = { num_layers = 'num_layers', num_decoder_layers = 'num_layers', d_model = 'd_model', d_ff = 'd_ff',
                      d_kv = 'd_kv', num_heads = 'num_heads', vocab_size = 'vocab_size' }
    if not ok then error(options.explain(err, size_options), 0) end
    c = err
    -- --init_from: the weights' config (size options given too must agree).
    src = pretrained.from_options(cfg, written, {
      families = { 't5' }, who = script, overrides = { dropout = cfg.dropout }, t5_config = c,
      sizes = { { 'num_layers', 'num_layers' }, { 'num_decoder_layers', 'num_layers' }, { 'd_model', 'd_model' },
                { 'd_ff', 'd_ff' }, { 'd_kv', 'd_kv' }, { 'num_heads', 'num_heads' }, { 'vocab_size', 'vocab_size' } } })
    if src then c = src.config end
    -- The sizes against this machine before anything is built, even on
    -- meta ([Note: sizes are bounded before building] in fsdp.sharding.fit).
    pretrained.bound(cfg, 't5', c, src, {
      model = cfg.model, options = size_options, written = written, dtype = cfg.dtype, weights = not (cfg.dry_run or cfg.plan),
      rows = not cfg.dry_run and { cfg.batch_size * (pairs_run and math.max(cfg.source_len, cfg.target_len)
        or cfg.max_len + 1), '--batch_size ' .. cfg.batch_size .. ' x ' .. (pairs_run and 'the longest pair'
        or '(--max_len + 1)') } or nil,
      shards = fit.weight_shards(cfg),
      fix = (cfg.dtype == 'f32' and '--dtype=bf16 (half the bytes), ' or '')
        .. (src and 'a smaller model' or 'fewer layers (--num_layers)') .. ' or more ranks' })
    -- After --init_from: the tokenizer must fit the model the weights make.
    t5_pairs.check_model(pairs_run, c, cfg)
    lora.check_options(cfg, function() return t5.Model(c, { device = 'meta' }) end, 'q,v')
  end)

  if cfg.dry_run then
    local t0 = clock.now()
    local model = t5.Model(c, { device = 'meta' })
    print(model)
    local n = model:num_parameters()
    print(('parameters: %s'):format(commas(n)))
    print(('closed form: %d'):format(t5.closed_form_parameters(c)))
    print(('fp32 weights %.1f GiB, bf16 %.1f GiB; AdamW state %.1f GiB (fp32)'):format(
      n * 4 / 2^30, n * 2 / 2^30, n * 8 / 2^30))
    print(('built on meta in %.2f s; cpu memory in use: %d bytes'):format(clock.now() - t0,
      fsdp.memory_stats('cpu').in_use))
    return
  end

  print('config:\n' .. options.format(cfg))
  -- --checkpoint_dir is this job's alone from here on (fsdp.checkpointing.options.lock).
  ckpt_options.lock(cfg)
  -- On meta, then sharded (one unit per T5Block, the seed's wrap and
  -- checkpoint class): each rank initialises only its shards.
  -- --device: the shards, every batch and the loss live there (cpu or cuda:N).
  local dev = shard_options.device(cfg)
  if pairs_run then pairs_run.device = dev end
  local model = t5.Model(c, { device = 'meta', dtype = cfg.dtype })
  local n_params = model:num_parameters()
  lora.apply_options(model, cfg, 'q,v') -- --lora_rank: adapters (PEFT's default T5 targets), the rest frozen
  -- Refused here, with the planner's numbers, when it cannot fit this machine.
  fit.check(model, cfg, t5.Block,
    { batch = cfg.batch_size, seq = pairs_run and math.max(cfg.source_len, cfg.target_len) or cfg.max_len + 1 }, script,
    { layers = 'num_layers' }, { optimizer = cfg.optimizer == 'anyprecision' and 'anyprecision_adamw' or 'adamw' })
  shard_options.apply(model, cfg, t5.Block, script)
  print(('model: %d + %d layers, d_model %d, d_ff %d, %d heads x %d, vocab %d, %s: %d parameters, %s'):format(
    c.num_layers, c.num_decoder_layers, c.d_model, c.d_ff, c.num_heads, c.d_kv, c.vocab_size,
    c.gated and 'v1.1' or 'v1.0', n_params, cfg.dtype))

  local Opt = cfg.optimizer == 'anyprecision' and optim.AnyPrecisionAdamW or optim.AdamW
  local opt = Opt(lora.trainable(model), { lr = cfg.lr, weight_decay = cfg.weight_decay,
    betas = { cfg.beta1, cfg.beta2 }, eps = cfg.eps,
    groups = { { match = shard_options.no_decay, weight_decay = 0 } } })
  local sched = optim.lr_scheduler.WarmupCosine(opt, { warmup_steps = cfg.warmup_steps, total_steps = cfg.max_steps,
                                                       min_lr = cfg.lr / 10 })
  local task
  if pairs_run then
    t5_pairs.describe(pairs_run, cfg)
  else
    task = M.reverse_task({ vocab_size = c.vocab_size, max_len = cfg.max_len, min_len = cfg.min_len,
                            seed = cfg.seed, copy = cfg.task == 'copy' })
    print(('task: ' .. cfg.task .. ' %d..%d random tokens of %d, then eos; chance loss ln(%d) = %.3f'):format(
      cfg.min_len, cfg.max_len, c.vocab_size - 2, c.vocab_size, math.log(c.vocab_size)))
  end

  -- The synthetic batches are a function of the step, so a checkpoint
  -- needs no data position for them; the pairs' position (epoch, pairs
  -- consumed) is saved with each checkpoint. The RNG (dropout) and the
  -- rest come back with it.
  local state = { model = model, optimizer = opt, scheduler = sched, data = pairs_run and pairs_run.train }
  state.guard = nonfinite.guard(cfg, state, script)  -- the step, and --on_nonfinite
  -- The log (fsdp.metrics): step lines, --metrics_file, --tensorboard_dir, --plot.
  local log = metrics.Logger({ total_steps = cfg.max_steps, batch_size = cfg.batch_size * cfg.grad_accum_steps,
    metrics_file = cfg.metrics_file, log_every = cfg.log_every, device = dev, tensorboard_dir = cfg.tensorboard_dir,
    config = cfg, plot = cfg.plot, profile_steps = cfg.profile_steps, profile_dir = cfg.profile_dir, model = model,
    comm_joined = cfg.comm_joined })
  if pairs_run then pairs_run.log = log end
  local start_step, resumed = ckpt_options.resume(cfg, state)
  if cfg.resume_from_checkpoint then log:resume(start_step) end
  pretrained.start(cfg, model, src, start_step, resumed) -- --init_from's weights, unless a checkpoint was resumed
  for step = start_step + 1, cfg.max_steps do
    log:begin_step(step) -- --profile_steps
    local t0 = clock.now()
    -- Rank r of W draws rows r*B.. of global batch b (the same examples
    -- one rank with batch W*B would see); step s takes batches
    -- (s-1)*k+1 .. s*k, one per micro-batch (--grad_accum_steps=k),
    -- gradients reduced once at the last.
    local W, R, k = fsdp.dist.world_size(), fsdp.dist.rank(), cfg.grad_accum_steps
    local loss = accumulate.forward_backward(model, k, function(i)
      if pairs_run then return t5_pairs.loss(model, pairs_run, pairs_run.train:next()) end
      local src, mask, labels, dmask = task.batch(((step - 1) * k + i - 1) * W + R, cfg.batch_size)
      return model:loss(src:to(dev), labels:to(dev), { attention_mask = mask:to(dev), decoder_attention_mask = dmask:to(dev) })
    end)
    local r = profiler.call('optimizer', 'optim', state.guard.step, state.guard, step, loss)
    r.dt = clock.now() - t0
    log:step(step, r)
    if pairs_run then t5_pairs.maybe_validate(model, pairs_run, cfg, step) end
    ckpt_options.after_step(cfg, state, step, pretrained.extra(cfg.model, 't5', c, src))
  end
  log:close()
  ckpt_options.finish(cfg, model)
  pretrained.export(cfg, model, src)

  if pairs_run then
    -- A run resumed at its last step trained nothing: its validation loss still ends the log.
    if start_step >= cfg.max_steps then t5_pairs.validate(model, pairs_run, cfg, cfg.max_steps) end
    return t5_pairs.report(model, pairs_run, cfg, cfg.max_steps)
  end

  -- Held-out examples (another random stream), greedy decoding.
  model:eval()
  local src, mask, labels = task.batch(0, cfg.eval_examples, 1000)
  src, mask, labels = src:to(dev), mask:to(dev), labels:to(dev)
  -- Generation calls encode/decode, not the sharded root's forward: it runs
  -- on the whole parameters, gathered once.
  local right, got = fsdp.summon_full_params(model, function() return M.exact_match(model, src, mask, labels) end)
  local function tokens(row, stop)
    local out = {}
    for _, v in ipairs(row) do
      if v == stop or v == -100 then break end
      out[#out + 1] = tostring(v)
    end
    return table.concat(out, ' ')
  end
  local S, G, Lb = src:tolist(), got:tolist(), labels:tolist()
  for i = 1, math.min(4, cfg.eval_examples) do
    local want, have = tokens(Lb[i], 1), tokens(G[i], 1)
    print(('  source: %-24s target: %-24s generated: %-24s %s'):format(tokens(S[i], 1), want, have,
      want == have and 'ok' or 'WRONG'))
  end
  print(('held-out exact match: %d / %d'):format(right, cfg.eval_examples))
  return right, cfg.eval_examples
end

return M
