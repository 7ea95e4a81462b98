-- fsdp.data.corpus_options: training recipes on a raw corpus. --data (or
-- the seed's --dataset) names token shards from tools/tokenize.lua or, new,
-- the files people download: a .txt/.jsonl/.json(.gz/.zst) file, a
-- directory or a glob, streamed by fsdp.data.corpus with the --tokenizer
-- (default byte; a tokenizer.json, a SentencePiece .model or an HF model
-- directory) in --loader_threads worker threads. Validation reads
-- --val_data, or the documents --val_fraction holds out of every file; an
-- empty or tiny validation split is a warning, not silence. A resume whose
-- data files changed since the checkpoint stops naming the file, or with
-- --data_changed=continue says what changed and goes on ([Note: the
-- fingerprint of a data position] in fsdp.data.corpus); the option serves
-- token shards too.
--
--   local corpus_options = require 'fsdp.data.corpus_options'
--   local spec = corpus_options.options({...})          -- adds the raw-corpus options
--   if corpus_options.is_raw(cfg.data) then train = corpus_options.open(cfg, written) end
--   local val = corpus_options.open_val(cfg, train, val_batch_size)   -- nil: no validation (warned)
local corpus = require 'fsdp.data.corpus'
local changes = require 'fsdp.data.changes'
local lfs = require 'lfs'
local dist = require 'fsdp.dist'
local token_shards = require 'fsdp.data.tokens'
local tokenizers = require 'fsdp.data.tokenizer'
local mesh = require 'fsdp.mesh'

local M = {}

local function bare(err) return (tostring(err):gsub('^[^\n:]*:%d+: ', '')) end

local function say(fmt, ...)
  if dist.rank() == 0 then
    io.stdout:write(fmt:format(...), '\n')
    io.stdout:flush()
  end
end

function M.options(spec)
  spec.text_field = { 'text', 'raw --data (.jsonl/.json lines): the field holding the text' }
  spec.max_doc_bytes = { 8388608, 'raw --data: the longest document accepted, in bytes (a longer one is an error '
                                  .. 'naming its file and line)', int = true, min = 1 }
  spec.loader_threads = { 2, 'raw --data: worker threads reading and tokenizing ahead of training', int = true,
                          min = 1, max = 64 }
  spec.val_fraction = { 0.01, 'raw --data without --val_data: the fraction of each file\'s documents held out for '
                              .. 'validation', min = 0, below = 1 }
  spec.data_changed = changes.OPTION
  return spec
end

-- Token shards (tools/tokenize.lua) or a raw corpus?
function M.is_raw(path)
  local mode = lfs.attributes(path, 'mode')
  if mode == 'file' then return not path:match('%.safetensors$') end
  if mode == 'directory' then
    -- corpus files and no shards (an empty directory gets the shards' message)
    if #token_shards.shard_paths(path, 'train') > 0 then return false end
    local ok, err = pcall(corpus.files, path)
    -- a FIFO or a device with a corpus name is that error, not "no shards"
    -- (fl_file_check_regular's words)
    if not ok and tostring(err):find(', not a regular file', 1, true) then error(bare(err), 0) end
    return ok
  end
  return true -- a glob
end

-- The --tokenizer for streaming ('byte' when not given).
function M.tokenizer(cfg)
  local name = cfg.tokenizer ~= '' and cfg.tokenizer or 'byte'
  local ok, tok = pcall(tokenizers.load, name)
  if not ok then error(('--tokenizer %s: %s'):format(name, bare(tok)), 0) end
  if type(tok.c_hook) ~= 'function' then
    error(('--tokenizer %s: this tokenizer has no C hook for the streaming loader yet; tokenize the corpus '
      .. 'with tools/tokenize.lua and pass the shard directory as --data'):format(name), 0)
  end
  if not tok.eos_id then
    error(('--tokenizer %s has no end-of-text token, which the stream places between documents'):format(name), 0)
  end
  return tok
end

local function stream_opts(cfg, tok)
  return { tokenizer = tok, seq_len = cfg.seq_len, batch_size = cfg.batch_size, seed = cfg.seed,
           threads = cfg.loader_threads, text_field = cfg.text_field, max_doc_bytes = cfg.max_doc_bytes }
end

-- The training stream of a raw --data; errors name the option.
function M.open(cfg, written)
  local tok = M.tokenizer(cfg)
  local o = stream_opts(cfg, tok)
  o.split = cfg.val_data ~= '' and 'all' or 'train'
  o.val_fraction = cfg.val_fraction
  o.data_changed = cfg.data_changed
  local ok, s = pcall(corpus.open, cfg.data, o)
  if not ok then error(('--%s: %s'):format(written and written.data or 'data', bare(s)), 0) end
  return s
end

-- The validation stream (every rank reads it whole and evaluates its part
-- of each batch), or nil after a warning when it holds no batch.
function M.open_val(cfg, train, val_batch)
  if cfg.validation_freq == 0 then return nil end
  local o = stream_opts(cfg, train.tokenizer_object)
  o.batch_size = val_batch
  o.once, o.shuffle, o.read_all = true, false, true
  local path, what
  if cfg.val_data ~= '' then
    o.split, path, what = 'all', cfg.val_data, ('--val_data %s'):format(cfg.val_data)
  else
    o.split, o.val_fraction, path = 'val', cfg.val_fraction, cfg.data
    what = ('the validation split of --data %s (--val_fraction %g of each file\'s documents)'):format(cfg.data,
      cfg.val_fraction)
  end
  local ok, val = pcall(corpus.open, path, o)
  if not ok then error(('--%s: %s'):format(cfg.val_data ~= '' and 'val_data' or 'data', bare(val)), 0) end
  local n = val:count_batches(cfg.val_batches)
  local world = mesh.data_parallel_size() -- (a TP group shares its batches)
  if n == 0 then
    say('warning: %s holds no whole validation batch (%d sequences of %d tokens); training without validation '
      .. '(give --val_data, or a larger --val_fraction)', what, val_batch * world, cfg.seq_len)
    return nil
  elseif n < cfg.val_batches then
    say('warning: %s holds only %d of the %d --val_batches asked; validating on those', what, n, cfg.val_batches)
  end
  return val
end

return M
