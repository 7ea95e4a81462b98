-- recipes/sft.lua: supervised fine-tuning of a decoder on conversations,
-- through the model's own chat template, the loss on the answers.
--
--   fsdp-lua recipes/sft.lua --init_from=HF_DIR --data=chats.jsonl --max_steps=500
--   mpirun -np 2 fsdp-lua recipes/sft.lua --init_from=HF_DIR --data='data/*.jsonl.gz' --lora_rank=16 \
--            --val_data=val.jsonl --export_hf=out
--   fsdp-lua recipes/sft.lua --init_from=out --val_data=test.jsonl --eval   exact-match accuracy only
--
-- --init_from is any decoder the project loads (models/pretrained.lua: a
-- Hugging Face directory, an export, a sharded checkpoint, a state dict
-- with --model); its directory gives the tokenizer and the chat template
-- (or --tokenizer, --chat_template). --data is chat JSONL in the shapes of
-- fsdp.data.chat (messages, ShareGPT, Alpaca, prompt/completion; the
-- --chat_fields, --bad_records options), rendered and tokenized once
-- (fsdp.data.chat_batches) and batched padded to each batch's longest
-- example, or packed several to a row of --seq_len with --packing ([Note:
-- SFT batches, padded or packed]). --train_on=
-- assistant trains the assistant messages' tokens only (fsdp.data.
-- chat_tokens); the loss of a step is the mean over its trained tokens on
-- every rank and micro-batch, as one process computes it ([Note: the loss
-- of a step over its tokens] in fsdp.sharding.accumulate).
-- Every --validation_freq steps: the loss on the answers of --val_data (or
-- of --val_fraction of --data held out), and --num_samples answers
-- generated greedily with the template for the held-out conversations'
-- prompts (the messages before their last answer), shown against the
-- reference. --eval measures instead of training: the validation loss and
-- the exact-match accuracy of greedy answers over the whole validation set.
-- Model, optimizer, sharding, LoRA, checkpoint, metrics and export options
-- are the decoder recipes' (models/decoder_training.lua), as in
-- recipes/llama2_7b.lua.
local fsdp = require 'fsdp'
local options = require 'fsdp.options'
local decoder_training = require 'models.decoder_training'
local pretrained = require 'models.pretrained'
local chat = require 'fsdp.data.chat'
local chat_batches = require 'fsdp.data.chat_batches'
local assistant = require 'fsdp.chat.assistant'
local accumulate = require 'fsdp.sharding.accumulate'
local metrics = require 'fsdp.observe.metrics'
local console = require 'fsdp.observe.console'
local ckpt_options = require 'fsdp.checkpointing.options'
local nonfinite = require 'fsdp.nonfinite'
local clock = require 'fsdp.clock'

local SCRIPT = 'recipes/sft.lua'
local R, chat_model, train_set, val_set

local cfg = options.config(decoder_training.options(options.merge(chat.OPTIONS, {
  data = { '', 'chat records to train on: JSON lines (.jsonl/.json, .gz/.zst), a file, directory or glob '
                .. '(fsdp.data.chat)', input = 'glob' },
  val_data = { '', 'chat records to validate on (default: --val_fraction of --data held out)', input = 'glob' },
  val_fraction = { 0.05, 'without --val_data: the fraction of --data held out for validation', min = 0, below = 1 },
  tokenizer = { '', 'the tokenizer (default: the --init_from directory\'s, or the one its checkpoint started from)' },
  chat_template = { '', 'the chat template: a model directory or a .jinja file (default: --init_from\'s)' },
  seq_len = { 1024, 'tokens per example at most (a longer one is cut; one left with no answer token is dropped)',
              int = true, min = 2 },
  packing = { false, 'pack several examples into each row of --seq_len tokens (positions restart, attention stays '
                     .. 'inside each example), instead of padding each batch to its longest example' },
  num_samples = { 3, 'answers generated and shown at each validation', int = true, min = 0 },
  sample_max_new_tokens = { 64, 'tokens per generated answer at most', int = true, min = 1 },
  eval = { false, 'no training: the validation loss and the exact-match accuracy of greedy answers on the whole '
                  .. 'validation set' },
  val_batches = { 0, 'batches per validation (0: the whole validation set)', int = true, min = 0 },
  lr = { 2e-5, 'peak learning rate', positive = true },
  min_lr = { 0, 'final learning rate of the cosine decay', min = 0, at_most = 'lr' },
  warmup_steps = { 0, 'linear warmup steps W, then cosine decay to --min_lr: ' .. decoder_training.SCHEDULE_HELP,
                   int = true, min = 0, less_than = 'max_steps' },
  weight_decay = { 0, 'AdamW weight decay (not applied to norms)', min = 0 },
})), arg, SCRIPT, function(cfg, written)
  if cfg.init_from == '' then
    error('--init_from is needed: the model to fine-tune (a Hugging Face directory, an export, a checkpoint or a '
      .. 'state dict)', 0)
  end
  if cfg.data == '' and not cfg.eval then error('--data is needed: the chat records to train on', 0) end
  if cfg.eval and cfg.val_data == '' and cfg.data == '' then error('--eval needs --val_data (or --data)', 0) end
  R = decoder_training.resolve(cfg, written, SCRIPT)
  local ok, a = pcall(assistant.open, R.src, { tokenizer = cfg.tokenizer, chat_template = cfg.chat_template })
  if not ok then error(options.bare(a), 0) end
  chat_model = a
  local c = decoder_training.check(R, cfg, written, {
    seq = cfg.seq_len + cfg.sample_max_new_tokens,
    seq_what = ('--%s (%d) plus --sample_max_new_tokens (%d)'):format(written.seq_len or 'seq_len', cfg.seq_len,
      cfg.sample_max_new_tokens),
    rows = { cfg.batch_size * cfg.seq_len, ('--batch_size %d x --seq_len %d'):format(cfg.batch_size, cfg.seq_len) } })
  if a.tok.vocab_size > c.vocab_size then
    error(('the tokenizer %s has %d tokens, more than the model\'s vocabulary (%d)'):format(a.from.tokenizer,
      a.tok.vocab_size, c.vocab_size), 0)
  end
  -- The data, rendered and tokenized now: a bad record is one line naming
  -- its file and line before the model is built.
  local ro = chat.record_opts(cfg)
  ro.seq_len = cfg.seq_len
  local function load(key)
    local ok2, set = pcall(chat_batches.load, cfg[key], a.tpl, a.tok, ro)
    if not ok2 then error(('--%s: %s'):format(written[key] or key, options.bare(set)), 0) end
    if #set.examples == 0 then
      error(('--%s %s holds no example with a token to train on (%d records, %d dropped)'):format(written[key] or key,
        cfg[key], set.records, set.dropped), 0)
    end
    return set
  end
  if cfg.data ~= '' then train_set = load('data') end
  if cfg.val_data ~= '' then val_set = load('val_data') end
end)

local dist = fsdp.dist
local dev = require('fsdp.sharding.options').device(cfg)
local function say(fmt, ...) console.print(fmt:format(...)) end
console.print('config:\n' .. options.format(cfg))
decoder_training.memory_limit(cfg)

for _, s in ipairs({ { train_set, cfg.data }, { val_set, cfg.val_data } }) do
  local set = s[1]
  if set then
    say('data: %s: %d conversations (%d records%s%s%s)', s[2], #set.examples, set.records,
      set.skipped > 0 and (', %d bad skipped, the first: %s'):format(set.skipped, tostring(set.first_skipped)) or '',
      set.truncated > 0 and (', %d cut to --seq_len %d'):format(set.truncated, cfg.seq_len) or '',
      set.dropped > 0 and (', %d dropped: no trained token left'):format(set.dropped) or '')
  end
end
local train_examples, val_examples = train_set and train_set.examples, val_set and val_set.examples
if not val_examples and cfg.val_fraction > 0 and train_examples then
  train_examples, val_examples = chat_batches.split(train_examples, cfg.val_fraction, cfg.seed)
  say('data: %d conversations held out for validation (--val_fraction %g)', #val_examples, cfg.val_fraction)
end
if cfg.eval and not val_examples then val_examples = train_examples end
say('chat: tokenizer %s, template %s, a turn ends at %s', tostring(chat_model.tok), chat_model.tpl.name,
  table.concat(chat_model.stop, ','))

ckpt_options.lock(cfg)
local model, n_params = decoder_training.build(R, cfg, SCRIPT, { batch = cfg.batch_size, seq = cfg.seq_len })
local opt, sched = decoder_training.optimizer(model, cfg)
local pad_id = chat_model.tok.pad_id or chat_model.stop[1]
local data = train_examples and chat_batches.Batches.new(train_examples, {
  batch_size = cfg.batch_size, seed = cfg.seed, pad_id = pad_id, pack = cfg.packing and cfg.seq_len or nil })
if data then say('batches: %s', tostring(data)) end
local val_data = val_examples and chat_batches.Batches.new(val_examples, {
  batch_size = cfg.val_batch_size > 0 and cfg.val_batch_size or cfg.batch_size, shuffle = false, pad_id = pad_id })

-- The loss on the answers of the validation set: the mean over its
-- trained tokens on every rank (weighted by tokens, as training's).
local function val_loss()
  local sum, n = 0, 0
  fsdp.no_grad(function()
    for ids, targets in val_data:batches(cfg.val_batches) do
      local k = accumulate.count_tokens(targets)
      local loss = model:loss(ids:to(dev), targets:to(dev)):item()
      if k > 0 then sum, n = sum + loss * k, n + k end
    end
  end)
  local t = fsdp.tensor({ sum, n }, { dtype = 'f64' })
  if dist.world_size() > 1 then dist.all_reduce(t) end
  return t:get(0) / t:get(1), t:get(1)
end

-- Greedy answers to the prompts of validation conversations first..last,
-- each rank its share, the model gathered whole for the time
-- (summon_full_params: generation then runs no collective). Returns the
-- number right (all ranks) and rank 0's shown lines.
local function answers(first, last, show)
  -- (by data-parallel rank: the ranks of a TP group answer the same prompts, [Note: data-parallel rank and
  -- size] in fsdp/mesh.lua)
  local mesh = require 'fsdp.mesh'
  local mine = {}
  for i = first + mesh.data_parallel_rank(), last, mesh.data_parallel_size() do mine[#mine + 1] = i end
  local right, lines = 0, {}
  model:eval()
  fsdp.summon_full_params(model, function()
    local prompts, refs = {}, {}
    for _, i in ipairs(mine) do
      prompts[#prompts + 1], refs[#refs + 1] = assistant.prompt_and_reference(val_examples[i].conv)
    end
    local replies = #prompts > 0 and chat_model:replies(model, prompts, { max_new_tokens = cfg.sample_max_new_tokens })
      or {}
    for j, r in ipairs(replies) do
      local ok = assistant.exact(r, refs[j])
      if ok then right = right + 1 end
      if show and j <= show then
        local p = prompts[j]
        local asked = p.plain and p.text or (p[#p] and p[#p].content or '')
        lines[#lines + 1] = ('  [%s] %s\n    reference: %s\n    generated: %s'):format(ok and 'right' or 'wrong',
          (asked:gsub('\n', ' ')), (refs[j]:gsub('\n', ' ')), (r:gsub('\n', ' ')))
      end
    end
  end)
  model:train()
  local t = fsdp.tensor({ right }, { dtype = 'f64' })
  if mesh.data_parallel_size() > 1 then dist.all_reduce(t, { group = mesh.data_parallel_group() }) end
  return t:get(0), lines
end

local state = { model = model, optimizer = opt, scheduler = sched, data = data }
state.guard = nonfinite.guard(cfg, state, SCRIPT)
local start_step, resumed = ckpt_options.resume(cfg, state)
pretrained.start(cfg, model, R.src, start_step, resumed)

if cfg.eval then
  local loss, n = val_loss()
  local right, lines = answers(1, #val_examples, math.min(cfg.num_samples, #val_examples))
  for _, l in ipairs(lines) do console.print(l) end
  say('eval: answer loss %.4f over %d tokens; exact match %d/%d = %.1f%%', loss, n, right, #val_examples,
    100 * right / #val_examples)
  options.expose({ model = model, cfg = cfg })
  return
end

-- (tokens/s counts real tokens, padding is not throughput: a padded
-- batch's rows hold the examples' mean length, a packed one's the epoch's
-- real fraction of --seq_len)
local mean_len = 0
for _, ex in ipairs(train_examples) do mean_len = mean_len + ex.ids:numel() end
mean_len = mean_len / #train_examples
if cfg.packing then mean_len = cfg.seq_len * data.fraction end
local log = metrics.Logger({
  total_steps = cfg.max_steps, batch_size = cfg.batch_size * cfg.grad_accum_steps, tokens_per_sample = mean_len,
  peak_tflops = cfg.peak_tflops, metrics_file = cfg.metrics_file, log_every = cfg.log_every, device = dev,
  tensorboard_dir = cfg.tensorboard_dir, config = cfg, plot = cfg.plot, profile_steps = cfg.profile_steps,
  profile_dir = cfg.profile_dir, model = model, comm_joined = cfg.comm_joined,
})
if cfg.resume_from_checkpoint then log:resume(start_step) end
local function validate(step)
  if not val_data then return end
  log:validation(step, (val_loss()))
  if cfg.num_samples > 0 then
    local n = math.min(cfg.num_samples, #val_examples)
    local right, lines = answers(1, n, n)
    say('samples at step %d (%d/%d exact):', step, right, n)
    for _, l in ipairs(lines) do console.print(l) end
  end
end

for step = start_step + 1, cfg.max_steps do
  log:begin_step(step)
  local t0 = clock.now()
  local loss = accumulate.token_mean(model, cfg.grad_accum_steps, function() return data:next() end,
    function(ids, targets, packed)
      local opts = packed and { positions = packed.positions:to(dev), segments = packed.segments:to(dev) } or nil
      return model:loss(ids:to(dev), targets:to(dev), opts)
    end)
  local r = state.guard:step(step, loss)
  r.dt = clock.now() - t0
  log:step(step, r)
  if cfg.validation_freq > 0 and (step % cfg.validation_freq == 0 or step == cfg.max_steps) then validate(step) end
  ckpt_options.after_step(cfg, state, step, pretrained.extra(cfg.model, R.fam.name, R.config, R.src))
end
log:close()
ckpt_options.finish(cfg, model)
pretrained.export(cfg, model, R.src)
options.expose({ model = model, config = R.config, cfg = cfg, opt = opt, data = data })
