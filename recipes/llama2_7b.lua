-- recipes/llama2_7b.lua: train Llama 2 7B, the seed recipe (AdamW, linear
-- warmup then cosine decay, gradient clipping at 1.0).
--
--   fsdp-lua recipes/llama2_7b.lua --dry-run          full size on meta: tree, parameters, memory
--   fsdp-lua recipes/llama2_7b.lua --plan --plan_device=h100-80g --mixed_precision=bf16
--                                                    what each rank would hold, send and compute
--   fsdp-lua recipes/llama2_7b.lua --num_layers=2 --hidden_width=256 --num_heads=4 \
--            --vocab_size=512 --max_steps=200       a reduced model that trains on CPU
--
-- Every key below is an option (--key=value); --help lists them. By default
-- the data are synthetic tokens with learnable structure
-- (fsdp.data.synthetic) so the loss has somewhere to go: it falls toward
-- the data's entropy, far below ln(vocab_size). --data=DIR trains on token
-- shards written by tools/tokenize.lua (the vocabulary then comes from the
-- data), validating on their val split every --validation_freq steps.
-- --data=PATH_OR_GLOB of raw files (.txt, .jsonl, .json, .gz, .zst: C4's
-- shards as downloaded) streams them with --tokenizer (default byte; a
-- tokenizer.json, a SentencePiece .model or an HF directory),
-- tokenized ahead in C threads, the position saved in every checkpoint
-- (fsdp.data.corpus_options).
--
-- The seed's options (its llama2_7b-training.sbatch TRAINING_ARGS) are
-- aliases of these ([Note: option aliases] in fsdp.options; README has the
-- table): --max_context_width is --seq_len, --num_key_value_heads
-- --num_kv_heads, --intermediate_size --ffn_dim, --train_batch_size
-- --batch_size, --model_type=llama_v2 the Llama 2 family (--model), --bf16
-- bf16 mixed precision, --dataset=DIR --data, --resume_from_checkpoint=DIR
-- resuming from DIR. --tokenizer names the tokenizer the shards were made
-- with (checked against them). --dataset=c4 --dataset_config_name=en read
-- C4's shards from $FSDP_DATA/c4/en and --tokenizer=OWNER/NAME the local
-- Hugging Face cache (fsdp.data.hub); other hub datasets are refused,
-- naming the ones known.
--
-- GPT-2 trains here too: --model=gpt2 (gpt2-medium, ..., gpt2-tiny) or
-- --init_from a GPT-2 directory picks the family (models/decoders.lua);
-- the loop is the same. --init_from=PATH starts from a Hugging Face
-- directory (its config.json sets the model; a size option that
-- contradicts it is an error), a sharded checkpoint's weights or a full
-- state dict, loaded straight into each rank's shards; --export_hf=DIR
-- writes the trained model as a Hugging Face directory at the end
-- (models/pretrained.lua).
local fsdp = require 'fsdp'
local options = require 'fsdp.options'
local pretrained = require 'models.pretrained'
local decoder_training = require 'models.decoder_training'
local synthetic_tokens = require 'fsdp.data.synthetic_tokens'
local tokens = require 'fsdp.data.tokens'
local corpus_options = require 'fsdp.data.corpus_options'
local hub = require 'fsdp.data.hub'
local metrics = require 'fsdp.observe.metrics'
local console = require 'fsdp.observe.console'
local profiler = require 'fsdp.observe.profiler'

local shard_options = require 'fsdp.sharding.options'
local ckpt_options = require 'fsdp.checkpointing.options'
local nonfinite = require 'fsdp.nonfinite'
local accumulate = require 'fsdp.sharding.accumulate'
local lora = require 'fsdp.lora'

-- Each option carries its constraints (fsdp.options checks them, and the
-- model config they make, before anything is built: a bad one is one line
-- naming it, exit status 2). The model, optimizer and loop options are the
-- decoder recipes' (models/decoder_training.lua).
local R, c, train_data, fam, src
-- --dataset (the seed's): a path or glob is --data; a Hugging Face dataset
-- this build knows (c4) stands for its local shards (fsdp.data.hub), the
-- training glob of the default config until --dataset_config_name is seen
-- in the config check.
local hub_requested
-- the name --data was given under (--data or --dataset), for messages
local written_data = 'data'
local function hub_dataset_alias(text)
  if require('lfs').attributes(text, 'mode') or text:find('[%*%?%[]') then return text end
  if not hub.known(text) then
    return nil, ('%s: no such file or directory, nor a Hugging Face dataset this build knows (%s); --dataset takes '
      .. 'token shards (a directory from tools/tokenize.lua, or one shard), corpus files or a known dataset name')
      :format(text, table.concat(hub.names(), ', '))
  end
  hub_requested = { name = text, train = hub.train_glob(text) }
  return hub_requested.train
end
local cfg = options.config(decoder_training.options(corpus_options.options({
  seq_len = { 128, 'tokens per sequence', int = true, min = 1, aliases = { 'max_context_width' } },
  data_noise = { 0.1, 'synthetic data: probability of a random next token', min = 0, max = 1 },
  data = { '', 'token shards (a directory from tools/tokenize.lua, or one shard), or raw text streamed: a '
                .. '.txt/.jsonl/.json(.gz/.zst) file, directory or glob; empty: synthetic', input = 'glob',
           aliases = { dataset = hub_dataset_alias } },
  tokenizer = { '', "with --data: the tokenizer the shards were made with ('byte', a SentencePiece .model, a "
                    .. "tokenizer.json, a local HF model directory, or a hub name OWNER/NAME found in the local "
                    .. 'Hugging Face cache), checked against them; for raw text, the one it streams through '
                    .. '(default byte)', needs = 'data' },
  dataset_config_name = { '', 'with --dataset=c4 (the seed\'s): the config, a directory of $FSDP_DATA/c4 (en, '
                              .. 'realnewslike, ...; default en)' },
  val_data = { '', 'validation shards or raw text (default: the val split of --data)', input = 'glob' },
  dry_run = { false, 'build at full size on the meta device, print it, and exit' },
  summary = { false, 'end with a line SUMMARY {json}: samples/s, TFLOPS, peak memory (recipes/sweep.lua)' },
})), arg, 'recipes/llama2_7b.lua', function(cfg, written)
  -- The family, --init_from (the family and shapes are the weights': a
  -- size option given too must agree, found from headers and JSON before
  -- anything is built) and the size overrides.
  R = decoder_training.resolve(cfg, written, 'recipes/llama2_7b.lua')
  src, fam = R.src, R.fam
  local overrides = R.overrides
  written_data = written.data or 'data'
  -- --dataset=c4 [--dataset_config_name=en]: its local shards, or an error
  -- saying where they were looked for and how to get them.
  if hub_requested and cfg.data == hub_requested.train then
    local ok, d = pcall(hub.dataset, hub_requested.name, cfg.dataset_config_name)
    if not ok then error(('--%s %s: %s'):format(written.data or 'dataset', hub_requested.name, d), 0) end
    cfg.data = d.train
    local val_note = ('%d validation shards'):format(d.nval)
    if cfg.val_data == '' and d.val then
      cfg.val_data = d.val
    elseif cfg.val_data == '' then
      val_note = ('no %s shards: validating on --val_fraction %g of the training files\' documents'):format(
        hub.known(hub_requested.name).val, cfg.val_fraction)
    end
    console.print(('data: --dataset %s (config %s): %d training shards in %s, %s'):format(hub_requested.name, d.config,
      d.ntrain, d.dir, val_note))
  elseif cfg.dataset_config_name ~= '' then
    error(('--dataset_config_name (%s) names a config of a Hugging Face dataset given as --dataset (%s); --data '
      .. 'here is %s'):format(cfg.dataset_config_name, table.concat(hub.names(), ', '),
      cfg.data ~= '' and cfg.data or 'not given'), 0)
  end
  -- Token shards decide the vocabulary (a larger --vocab_size is allowed):
  -- opened here, so a directory without shards is a mistake in --data.
  local raw = false
  if cfg.data ~= '' and not cfg.dry_run then
    local ok, is = pcall(corpus_options.is_raw, cfg.data) -- (a FIFO among the files: refused)
    if not ok then error(('--%s: '):format(written.data or 'data') .. options.bare(is), 0) end
    raw = is
  end
  if raw then
    train_data = corpus_options.open(cfg, written)
  elseif cfg.data ~= '' and not cfg.dry_run then
    local opened, data = pcall(tokens.open, cfg.data, { split = 'train', seq_len = cfg.seq_len,
                                                        batch_size = cfg.batch_size, seed = cfg.seed,
                                                        data_changed = cfg.data_changed })
    if not opened then error(('--%s: '):format(written.data or 'data') .. options.bare(data), 0) end
    train_data = data
    -- --tokenizer (the seed's): what the shards say they were made with.
    if cfg.tokenizer ~= '' then
      local ok, tok = pcall(require('fsdp.data.tokenizer').load, cfg.tokenizer)
      if not ok then
        error(('--tokenizer %s: %s (expected \'byte\', a SentencePiece .model, a tokenizer.json or a local HF '
          .. 'model directory; Hugging Face hub names are not fetched)'):format(cfg.tokenizer, options.bare(tok)), 0)
      end
      if tok.vocab_size ~= data.vocab_size or tok.eos_id ~= data.eos_id then
        error(('--tokenizer %s (vocab %d, eos %s) is not the tokenizer of --%s %s (%s: vocab %d, eos %d)'):format(
          cfg.tokenizer, tok.vocab_size, tostring(tok.eos_id), written.data or 'data', cfg.data, tostring(data.tokenizer),
          data.vocab_size, data.eos_id), 0)
      end
    end
  end
  if train_data then
    if src then
      if src.config.vocab_size < train_data.vocab_size then
        error(('--init_from %s has a vocabulary of %d, smaller than the one of --%s %s (%d)'):format(src.where,
          src.config.vocab_size, written.data or 'data', cfg.data, train_data.vocab_size), 0)
      end
    elseif cfg.vocab_size == 0 then
      overrides.vocab_size = train_data.vocab_size
    elseif cfg.vocab_size < train_data.vocab_size then
      error(('--vocab_size (%d) is smaller than the vocabulary of --data %s (%d)'):format(
        cfg.vocab_size, cfg.data, train_data.vocab_size), 0)
    end
  end
  -- The model config, bounded against this machine before anything is
  -- built (even on meta), within the model's positions, LoRA targets found.
  c = decoder_training.check(R, cfg, written, {
    weights = not (cfg.dry_run or cfg.plan), seq = cfg.seq_len,
    seq_what = ('--%s (%d)'):format(written.seq_len or 'seq_len', cfg.seq_len),
    rows = not cfg.dry_run and { cfg.batch_size * cfg.seq_len, ('--%s %d x --%s %d'):format(
      written.batch_size or 'batch_size', cfg.batch_size, written.seq_len or 'seq_len', cfg.seq_len) } or nil })
end)
local model_module = fam.module

-- rank 0 alone (fsdp.console: "[rank 0] " first with several ranks)
console.print('config:\n' .. options.format(cfg))

-- --memory_limit_mb (and --summary's peak): live tensors only
decoder_training.memory_limit(cfg)

-- 6738415616 -> "6,738,415,616"
local function commas(n)
  local s = ('%d'):format(n)
  return (s:reverse():gsub('(%d%d%d)', '%1,'):reverse():gsub('^,', ''))
end

local clock = require 'fsdp.clock'

if cfg.dry_run then
  local t0 = clock.now()
  local model = model_module.build(c, { device = 'meta' })
  lora.apply_options(model, cfg, fam.lora_targets)
  print(model)
  local n = model:num_parameters()
  print(('parameters: %s'):format(commas(n)))
  print(('closed form: %d'):format(model_module.closed_form_parameters(c)))
  print(('fp32 weights %.1f GiB, bf16 %.1f GiB; AdamW state %.1f GiB (fp32)'):format(
    n * 4 / 2^30, n * 2 / 2^30, n * 8 / 2^30))
  print(('training FLOPs per token at seq %d: %.3e'):format(cfg.seq_len, model_module.flops_per_token(c, cfg.seq_len, n)))
  print(('built on meta in %.2f s; cpu memory in use: %d bytes'):format(clock.now() - t0,
    fsdp.memory_stats('cpu').in_use))
  options.expose({ model = model, config = c, cfg = cfg })
  return
end

-- --plan: what each rank would hold for this config (nothing allocated).
if cfg.plan then
  local model = model_module.build(c, { device = 'meta', dtype = cfg.dtype })
  decoder_training.loss_options(model, cfg)
  lora.apply_options(model, cfg, fam.lora_targets)
  shard_options.plan(model, cfg, fam.block, { batch = cfg.batch_size, seq = cfg.seq_len }, 'recipes/llama2_7b.lua')
  options.expose({ model = model, config = c, cfg = cfg })
  return
end

-- --checkpoint_dir is this job's alone from here on; a second job on it
-- stops now, naming this one (fsdp.checkpointing.options.lock).
ckpt_options.lock(cfg)

-- Built on meta, then sharded: each rank materialises only its shards,
-- with the values of a one-process init (fsdp.nn.parameter). On one rank
-- this is plain training (the one unit holds everything).
local dist = fsdp.dist
-- --device: the shards, every batch and the loss live there (cpu or cuda:N).
local dev = shard_options.device(cfg)
-- (--lora_rank: adapters on the --lora_targets Linears, the rest frozen;
-- refused here, with the planner's numbers, when it cannot fit this
-- machine.)
local model, n_params = decoder_training.build(R, cfg, 'recipes/llama2_7b.lua', { batch = cfg.batch_size,
                                                                               seq = cfg.seq_len })
local opt, sched = decoder_training.optimizer(model, cfg)
-- data: `data` and `val_data` share one interface (next, batches, state,
-- load_state); data:state() is the position a checkpoint stores.
local data, val_data
local val_batch = cfg.val_batch_size > 0 and cfg.val_batch_size or cfg.batch_size
if train_data and getmetatable(train_data) == require('fsdp.data.corpus').Stream then
  data = train_data
  val_data = corpus_options.open_val(cfg, data, val_batch)
  console.print(('data: %s streamed%s'):format(tostring(data),
    val_data and (', validation on ' .. tostring(val_data)) or ', no validation split'))
elseif train_data then
  data = train_data
  local val_path = cfg.val_data ~= '' and cfg.val_data or cfg.data
  local has_val = cfg.val_data ~= '' or #tokens.shard_paths(cfg.data, 'val') > 0
  if has_val and cfg.validation_freq > 0 then
    local ok, opened = pcall(tokens.open, val_path, { split = 'val', seq_len = cfg.seq_len, batch_size = val_batch,
                                                      shuffle = false })
    local where = cfg.val_data ~= '' and 'val_data' or written_data
    if not ok and tostring(opened):find('fewer than one global batch', 1, true) then
      -- as with raw text (fsdp.data.corpus_options): a warning, and no validation
      console.print(('warning: --%s: %s; training without validation (give --val_data, or tokenize with a larger '
        .. '--val_fraction)'):format(where, options.bare(opened)))
    elseif not ok then
      error(('--%s: %s'):format(where, options.bare(opened)), 0)
    else
      val_data = opened
    end
    -- a split smaller than --val_batches is said, not found later
    if val_data and val_data:steps_per_epoch() < cfg.val_batches then
      console.print(('warning: the val split of %s holds only %d of the %d --val_batches asked (%d tokens); '
        .. 'validating on those'):format(val_path, val_data:steps_per_epoch(), cfg.val_batches, val_data.num_tokens))
    end
  elseif cfg.validation_freq > 0 then
    console.print(('warning: --%s %s holds no val-NNNNN.safetensors shards (tools/tokenize.lua --val_fraction put '
      .. 'no document there); training without validation (give --val_data, or tokenize with a larger '
      .. '--val_fraction)'):format(written_data, cfg.data))
  end
  console.print(('data: %s, %d steps per epoch%s'):format(tostring(data), data:steps_per_epoch(),
    val_data and (', validation on ' .. tostring(val_data)) or ', no validation split'))
else
  local opts = { seed = cfg.seed, noise = cfg.data_noise, batch_size = cfg.batch_size, seq_len = cfg.seq_len }
  data = synthetic_tokens.new(c.vocab_size, opts)
  val_data = data
  if val_batch ~= cfg.batch_size then
    opts.batch_size = val_batch
    val_data = synthetic_tokens.new(c.vocab_size, opts)
  end
  console.print(('data: synthetic Markov chain, entropy %.3f nats/token; uniform guessing: ln(%d) = %.3f'):format(
    data:entropy(), c.vocab_size, math.log(c.vocab_size)))
end

-- An optimizer step sees --grad_accum_steps micro-batches of --batch_size.
local step_batch = cfg.batch_size * cfg.grad_accum_steps
local log = metrics.Logger({
  total_steps = cfg.max_steps, batch_size = step_batch, tokens_per_sample = cfg.seq_len,
  -- (a rank of a TP group computes 1/--tp of its batch's FLOPs)
  flops_per_sample = model_module.flops_per_token(c, cfg.seq_len, n_params) * cfg.seq_len / cfg.tp,
  peak_tflops = cfg.peak_tflops, metrics_file = cfg.metrics_file, log_every = cfg.log_every, device = dev,
  tensorboard_dir = cfg.tensorboard_dir, config = cfg, plot = cfg.plot,
  profile_steps = cfg.profile_steps, profile_dir = cfg.profile_dir, model = model, comm_joined = cfg.comm_joined,
})
local function validate(step)
  local loss = profiler.call('validation', 'eval', metrics.evaluate,
    function(ids, targets) return model:loss(ids:to(dev), targets:to(dev)) end, val_data:batches(cfg.val_batches))
  log:validation(step, loss)
end

-- --resume_from_checkpoint: parameters, optimizer, schedule, data position
-- and RNG come back from the newest complete checkpoint, so the losses from
-- here on are the uninterrupted run's (fsdp.checkpointing.options).
-- The step itself (clipping, the optimizer and schedule, and what a NaN or
-- infinite loss or gradient does: --on_nonfinite) is fsdp.nonfinite's.
local state = { model = model, optimizer = opt, scheduler = sched, data = data }
state.guard = nonfinite.guard(cfg, state, 'recipes/llama2_7b.lua')
local start_step, resumed = ckpt_options.resume(cfg, state)
-- what a killed run logged past the resumed step goes (its steps come again)
if cfg.resume_from_checkpoint then log:resume(start_step) end
-- --init_from: its weights into each rank's shards (a fresh optimizer,
-- step 0), unless a checkpoint of this run was resumed just now.
pretrained.start(cfg, model, src, start_step, resumed)

local flops_per_step = model_module.flops_per_token(c, cfg.seq_len, n_params) * step_batch * cfg.seq_len / cfg.tp
local step_times = {}
for step = start_step + 1, cfg.max_steps do
  log:begin_step(step) -- --profile_steps
  local t0 = clock.now()
  -- --grad_accum_steps micro-batches, gradients reduced once at the last
  -- (fsdp.sharding.accumulate); the data position advances by each, so a
  -- checkpoint after the step resumes at the next step's first. The loss
  -- is the mean over the step's target tokens on all ranks, as one
  -- process's ([Note: the loss of a step over its tokens]): the same bits
  -- as a mean of means when every micro-batch holds as many.
  local loss = accumulate.token_mean(model, cfg.grad_accum_steps, function()
    return profiler.call('data', 'data', data.next, data)
  end, function(ids, targets) return model:loss(ids:to(dev), targets:to(dev)) end)
  -- gradient norm, clipping, the optimizer's update and the schedule
  local r = profiler.call('optimizer', 'optim', state.guard.step, state.guard, step, loss)
  r.dt = clock.now() - t0
  step_times[step] = r.dt
  log:step(step, r)
  if val_data and cfg.validation_freq > 0 and (step % cfg.validation_freq == 0 or step == cfg.max_steps) then
    validate(step)
  end
  ckpt_options.after_step(cfg, state, step, pretrained.extra(cfg.model, fam.name, c, src))
end
log:close()
ckpt_options.finish(cfg, model)
pretrained.export(cfg, model, src)

-- For the REPL after `fsdp-lua -i recipes/llama2_7b.lua ...`, and for
-- recipes/sweep.lua: one machine-readable line. The first step is warmup
-- (first-touch allocations) and is left out of the rates when there are
-- more.
options.expose({ model = model, config = c, cfg = cfg, opt = opt, sched = sched, data = data })
if cfg.summary and cfg.max_steps > start_step then
  local first = cfg.max_steps > start_step + 1 and start_step + 2 or start_step + 1
  local seconds = 0
  for step = first, cfg.max_steps do seconds = seconds + step_times[step] end
  local steps = cfg.max_steps - first + 1
  print('SUMMARY ' .. require('cjson').encode({
    samples_per_s = step_batch * require('fsdp.mesh').data_parallel_size() * steps / seconds,
    tflops = flops_per_step * steps / seconds / 1e12,
    peak_bytes = fsdp.memory_stats(dev).peak,
    step_seconds = seconds / steps, steps = steps, parameters = n_params,
  }))
end
