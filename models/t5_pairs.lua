-- models/t5_pairs.lua: the T5 recipe's fine-tuning path on text pairs
-- (the seed's blog: T5 on a summarization dataset): --data=FILE.jsonl of
-- {"source": ..., "target": ...} objects, tokenized at load
-- (fsdp.data.pairs), a validation loss every --validation_freq steps on
-- --val_data or on the val split of --data, and at the end a validation
-- loss and greedy outputs on validation sources printed as text (source,
-- reference, generated) with the exact-match rate over --eval_examples.
--
--   local t5_pairs = require 'models.t5_pairs'
--   options: t5_pairs.options({...})            -- --data, --val_data, --tokenizer, ...
--   in the config check: local run = t5_pairs.open(cfg)   -- nil without --data
--                        t5_pairs.model_overrides(run, cfg, overrides); ... c = t5.config(...)
--                        t5_pairs.check_model(run, c, cfg)
--   training: local src, labels, mask = run.train:next()   -- run.train is the checkpointed data
--             t5_pairs.maybe_validate(model, run, cfg, step)
--   at the end: t5_pairs.report(model, run, cfg)
--
-- Everything a user can get wrong about the data (a missing file, a bad
-- line, an empty validation split, a split smaller than one batch, a
-- tokenizer the model's vocabulary cannot hold) is found in open() and
-- check_model(), which the recipe runs among its option checks: one line
-- naming the option, exit status 2, before a model is built.
local fsdp = require 'fsdp'
local options = require 'fsdp.options'
local metrics = require 'fsdp.observe.metrics'
local pairs_data = require 'fsdp.data.pairs'
local t5 = require 'models.t5'
local console = require 'fsdp.observe.console'
local tokenizers = require 'fsdp.data.tokenizer'
local F = fsdp.F

local M = {}

M.OPTIONS = {
  data = { '', 'source/target pairs to fine-tune on: JSONL, one object per line (empty: the synthetic --task)',
           input = 'file' },
  val_data = { '', 'validation pairs, JSONL (default: the val split of --data, every k-th pair by --val_fraction)',
               input = 'file', needs = 'data' },
  val_fraction = { 0.1, 'with --data and no --val_data: the share of its pairs held out for validation', min = 0,
                   below = 1 },
  tokenizer = { '', "with --data: 'byte' (the default: 256 bytes + EOS) or a SentencePiece .model",
                needs = 'data' },
  source_field = { 'source', 'with --data: the JSON field of the source text' },
  target_field = { 'target', 'with --data: the JSON field of the target text' },
  source_len = { 128, 'with --data: source tokens, EOS included (longer sources are truncated)', int = true,
                 min = 2 },
  target_len = { 64, 'with --data: target tokens, EOS included (longer targets are truncated)', int = true,
                 min = 2 },
  validation_freq = { 50, 'with --data: steps between validation losses (0: only after the last step)', int = true,
                      min = 0 },
  val_batches = { 0, 'with --data: batches per validation (0: the whole validation split)', int = true, min = 0 },
  val_batch_size = { 0, 'with --data: pairs per validation batch and rank (0: --batch_size; fewer when the '
                        .. 'validation split is smaller)', int = true, min = 0 },
  data_changed = require('fsdp.data.changes').OPTION,
}

-- A recipe's own options plus these (its own win on a clash).
function M.options(own) return options.merge(M.OPTIONS, own) end

-- Rank 0 speaks ("[rank 0] " first with several ranks: fsdp.console);
-- flushed, so a log file being followed shows each validation as it comes.
local function say(fmt, ...) console.print(fmt:format(...)) end

-- Open the tokenizer and both splits from the options; nil without --data.
-- Raises a usage message naming the option at fault.
function M.open(cfg)
  if cfg.data == '' then return nil end
  local ok, tok = pcall(tokenizers.load, cfg.tokenizer ~= '' and cfg.tokenizer or 'byte')
  if not ok then
    error(('--tokenizer %s: %s'):format(cfg.tokenizer, options.bare(tok)), 0)
  end
  local common = { tokenizer = tok, source_field = cfg.source_field, target_field = cfg.target_field,
                   source_len = cfg.source_len, target_len = cfg.target_len, seed = cfg.seed }
  -- A split, or nil and why not (the message without the module's name).
  local function open(path, opts)
    for k, v in pairs(common) do if opts[k] == nil then opts[k] = v end end
    local opened, ds = pcall(pairs_data.open, path, opts)
    if opened then return ds end
    return nil, (options.bare(ds):gsub('^fsdp%.data%.pairs: ', ''))
  end
  local function need(option, ds, why)
    if not ds then error(('--%s: %s'):format(option, why), 0) end
    return ds
  end
  local run = { tokenizer = tok }
  -- Validation: --val_data whole (each of its pairs is in the val split at
  -- fraction 1), or the val split of --data. An empty one is refused
  -- (first: it is what a small --data runs into): the run would report
  -- no validation loss without saying why.
  local frac = cfg.val_data == '' and cfg.val_fraction or 0
  local val_batch = cfg.val_batch_size > 0 and cfg.val_batch_size or cfg.batch_size
  local vopts = { split = 'val', batch_size = val_batch, shuffle = false, cap_batch = cfg.val_batch_size == 0 }
  if cfg.val_data ~= '' then
    vopts.val_fraction = 1
    run.val = need('val_data', open(cfg.val_data, vopts))
  else
    vopts.val_fraction = frac
    local ds, why = open(cfg.data, vopts)
    if not ds and why:find('split is empty', 1, true) then
      why = why .. '; give --val_data=FILE or a larger --val_fraction'
    end
    run.val = need('data', ds, why)
  end
  -- Training: every pair of --data that is not in its val split.
  run.train = need('data', open(cfg.data, { split = 'train', val_fraction = frac, batch_size = cfg.batch_size,
                                            data_changed = cfg.data_changed }))
  return run
end

-- The model's vocabulary and EOS come from the tokenizer unless
-- --vocab_size was given (then check_model checks it holds the tokenizer's),
-- or the model comes from --init_from (its config decides; check_model
-- still checks the tokenizer fits it).
function M.model_overrides(run, cfg, overrides)
  if not run or (cfg.init_from or '') ~= '' then return end
  if cfg.vocab_size == 0 then overrides.vocab_size = run.tokenizer.vocab_size end
  overrides.eos_token_id = run.tokenizer.eos_id
end

function M.check_model(run, c, cfg)
  if not run then return end
  if c.vocab_size < run.tokenizer.vocab_size then
    local what = cfg.vocab_size > 0 and '--vocab_size' or "the model's vocabulary"
    error(('%s (%d) is smaller than the vocabulary of --tokenizer %s (%d)'):format(what, c.vocab_size,
      cfg.tokenizer ~= '' and cfg.tokenizer or 'byte', run.tokenizer.vocab_size), 0)
  end
end

-- The data in the log: the splits, what a validation reads, and what
-- was truncated.
function M.describe(run, cfg)
  local val = run.val
  local batches = val.sampler.steps_per_epoch
  if cfg.val_batches > 0 then batches = math.min(batches, cfg.val_batches) end
  local where = cfg.val_data ~= '' and val.path
    or ('the val split of %s (--val_fraction=%g)'):format(val.path, cfg.val_fraction)
  say('data: %s, %d steps per epoch', tostring(run.train), run.train.sampler.steps_per_epoch)
  say('validation: %s, %d pairs; %d batch%s of %d per rank (%d pairs) %s', where, val.n, batches,
    batches == 1 and '' or 'es', val.batch_size, batches * val.sampler.global_batch,
    cfg.validation_freq > 0 and ('every %d steps and at the end'):format(cfg.validation_freq) or 'at the end')
  -- Truncation is allowed (long articles, short summaries) but said.
  for _, ds in ipairs({ run.train, run.val }) do
    local t = ds.truncated
    if t.source > 0 or t.target > 0 then
      say('data: %s (%s split): %d of %d sources longer than --source_len=%d and %d targets longer than '
        .. '--target_len=%d are truncated', ds.path, ds.split, t.source, ds.n, cfg.source_len, t.target,
        cfg.target_len)
    end
  end
end

-- The loss of a batch from the datasets (input_ids, labels, attention_mask),
-- moved to the device the recipe trains on (run.device: --device).
function M.loss(model, run, src, labels, mask)
  local dev = run.device or 'cpu'
  return model:loss(src:to(dev), labels:to(dev), { attention_mask = mask:to(dev) })
end

-- Mean validation loss (over the batches and the ranks), in eval mode so
-- that dropout neither changes it nor draws random numbers (a resumed run
-- then draws the uninterrupted run's); printed as the metrics log does.
function M.validate(model, run, cfg, step)
  model:eval()
  local loss = metrics.evaluate(function(src, labels, mask) return M.loss(model, run, src, labels, mask) end,
    run.val:batches(cfg.val_batches > 0 and cfg.val_batches or nil))
  model:train()
  if run.log then return run.log:validation(step, loss) end
  say('Validation at batch %d: loss %.4f, perplexity %.3f', step, loss, math.exp(loss))
  return loss
end

-- Every --validation_freq steps and at the last one.
function M.maybe_validate(model, run, cfg, step)
  if step == cfg.max_steps or (cfg.validation_freq > 0 and step % cfg.validation_freq == 0) then
    return M.validate(model, run, cfg, step)
  end
end

-- The text of ids (a Lua list) up to the first stop id (EOS, or -100 in
-- labels), control characters written as \xNN: a byte-level model early
-- in training emits any byte, escape sequences included, which a
-- terminal would act on.
local function text(tok, ids, stop)
  local n = 0
  for i, v in ipairs(ids) do
    if v == stop or v == -100 then break end
    n = i
  end
  if n == 0 then return '' end
  local s = tok:decode(fsdp.tensor({ unpack(ids, 1, n) }, { dtype = 'i64' }))
  return (s:gsub('%c', function(c) return ('\\x%02x'):format(c:byte()) end))
end

-- Greedy generation on a batch: per-row exact match of the generated
-- tokens (start token dropped) against labels up to and including eos.
-- Returns the number of rows right, and the generated ids. opts: more
-- options of t5.generate (eos_token_id).
function M.exact_match(model, src, mask, labels, opts)
  local n = labels:size(1)
  local gen = { attention_mask = mask, max_new_tokens = n }
  for k, v in pairs(opts or {}) do gen[k] = v end
  local out = t5.generate(model, src, gen)
  local got = out:narrow(1, 1, out:size(1) - 1)
  if got:size(1) < n then
    got = F.cat({ got, fsdp.zeros({ got:size(0), n - got:size(1) }, { dtype = 'i64', device = got.device }) }, 1)
  end
  local errors = F.sum((F.ne(got, labels):to('i64') * F.ne(labels, -100):to('i64')), 1)
  return F.sum(F.eq(errors, 0):to('i64')):item(), got
end

-- At the end: greedy outputs on the first --eval_examples validation pairs
-- (all ranks take part: the parameters are gathered once), the first four
-- printed as text, and their exact-match rate (token for token, EOS
-- included). Returns the number right and the number generated.
function M.report(model, run, cfg, step)
  local exact_match = M.exact_match
  local n = math.min(cfg.eval_examples, run.val.n)
  local ids = {}
  for i = 1, n do ids[i] = i - 1 end
  local src, labels, mask = run.val:gather(ids)
  local dev = run.device or 'cpu'
  model:eval()
  local right, got = fsdp.summon_full_params(model, function()
    return exact_match(model, src:to(dev), mask:to(dev), labels:to(dev), { eos_token_id = run.tokenizer.eos_id })
  end)
  model:train()
  got = got:to('cpu')
  local tok, eos = run.tokenizer, run.tokenizer.eos_id
  local S, L, G = src:tolist(), labels:tolist(), got:tolist()
  say('greedy outputs on validation sources (after step %d):', step)
  for i = 1, math.min(4, n) do
    local want, have = text(tok, L[i], eos), text(tok, G[i], eos)
    say('  source:    %s\n  reference: %s\n  generated: %s%s', text(tok, S[i], eos), want, have,
      want == have and '   (exact)' or '')
  end
  say('validation exact match: %d / %d', right, n)
  return right, n
end

return M
