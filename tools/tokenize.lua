-- tools/tokenize.lua: turn text or JSONL files into token shards
-- (fsdp.data.tokens' format) for recipes/llama2_7b.lua --data=DIR.
--
--   fsdp-lua tools/tokenize.lua --input=corpus.txt --output=data/corpus --tokenizer=byte
--   fsdp-lua tools/tokenize.lua --input=a.jsonl,b.jsonl --output=data/c --tokenizer=tok.model
--   fsdp-lua tools/tokenize.lua --input=corpus.txt --output=data/c --tokenizer=llama3/tokenizer.json
--   fsdp-lua tools/tokenize.lua --input=corpus.txt --output=data/c --train_spm=8000
--
-- Documents: a JSONL line's `text` field (--text_field), or in a text file
-- each paragraph (--documents=paragraph, blank-line separated), line, or
-- the whole file. JSON lines and compressed inputs (.gz, .zst: C4's
-- .json.gz shards as downloaded) go through the core's corpus readers
-- (fsdp.data.corpus), which name the file, line and byte of a bad line; a
-- compressed text file is read by paragraph. Each document is followed by the tokenizer's EOS.
-- --val_fraction of the documents, spread evenly (document k goes to
-- validation when floor((k+1)f) > floor(kf)), form the val split. Shards
-- are written once they hold --shard_tokens tokens:
--   DIR/train-00000.safetensors ...  DIR/val-00000.safetensors ...
-- and a trained or given SentencePiece model is copied to DIR/tokenizer.model,
-- a given tokenizer.json (byte-level BPE) to DIR/tokenizer.json (with the
-- tokenizer_config.json beside it, which may name its eos). A given
-- tokenizer is loaded before anything is written.
local fsdp = require 'fsdp'
local options = require 'fsdp.options'
local tokens = require 'fsdp.data.tokens'
local tokenizer = require 'fsdp.data.tokenizer'
local clock = require 'fsdp.clock'
local corpus = require 'fsdp.data.corpus'
local utf8 = require 'fsdp.data.utf8'
local files = require 'fsdp.io.files'
local progress = require 'fsdp.observe.progress'

local cfg = options.config({
  input = { '', 'text (.txt) or JSONL (.jsonl) files, comma-separated' },
  output = { '', 'directory for the shards (created)' },
  tokenizer = { 'byte', "'byte', a SentencePiece .model, a tokenizer.json, or an HF model directory holding one" },
  train_spm = { 0, 'train a SentencePiece model of this vocabulary size on the input first' },
  spm_model_type = { 'unigram', 'model type for --train_spm: unigram or bpe' },
  text_field = { 'text', 'the JSONL field holding the text' },
  documents = { 'paragraph', 'documents of a text file: paragraph, line or file' },
  val_fraction = { 0.01, 'fraction of documents for the val split' },
  shard_tokens = { 100000000, 'tokens per shard (a shard closes once it holds this many)' },
  chunk_docs = { 2000, 'documents tokenized per call' },
  max_doc_bytes = { 8388608, 'the longest document accepted, in bytes (a longer one is an error naming its file and '
                             .. 'line, as in the streaming readers)' },
}, arg, 'tools/tokenize.lua')

-- A mistake in the options or the input: the message names the culprit
-- (the host prints it and exits 1).
local function die(fmt, ...) error(('tools/tokenize.lua: ' .. fmt):format(...), 0) end

if cfg.input == '' then die('--input is required (text or JSONL files)') end
if cfg.output == '' then die('--output is required (a directory)') end
if cfg.val_fraction < 0 or cfg.val_fraction >= 1 then die('--val_fraction must be in [0, 1)') end
if ({ paragraph = true, line = true, file = true })[cfg.documents] == nil then
  die('--documents must be paragraph, line or file, got %q', cfg.documents)
end
local inputs = {}
for p in cfg.input:gmatch('[^,]+') do
  local files = require 'fsdp.io.files'
  if not files.mode(p) then die('cannot open input %s', p) end
  -- a FIFO would block the read, a device never end
  local ok, why = files.check_input(p)
  if not ok then die('input %s', why) end
  inputs[#inputs + 1] = p
end

-- Call emit(doc) for every non-empty document of every input.
local function each_document(emit)
  for _, path in ipairs(inputs) do
    local f = io.open(path, 'rb')
    if path:match('%.jsonl$') or path:match('%.json$') or path:match('%.gz$') or path:match('%.zst$') then
      if path:match('%.txt%.[gz][zs]t?$') and cfg.documents ~= 'paragraph' then
        die('%s: a compressed text file is read by paragraph (--documents=paragraph)', path)
      end
      local ok, err = pcall(function()
        for text in corpus.documents(path, { text_field = cfg.text_field, max_doc_bytes = cfg.max_doc_bytes }) do
          if text ~= '' then emit(text) end
        end
      end)
      if not ok then die('%s', require('fsdp.options').bare(err)) end
    elseif cfg.documents == 'file' then
      local text = f:read(cfg.max_doc_bytes + 1) or '' -- no more than a document may hold
      if #text > cfg.max_doc_bytes then
        die('%s: the file (--documents=file) is %d bytes, longer than --max_doc_bytes=%d', path,
          require('fsdp.io.files').size(path), cfg.max_doc_bytes)
      end
      local bad = utf8.first_invalid(text)
      if bad then
        local _, newlines = text:sub(1, bad - 1):gsub('\n', '')
        die('%s: line %d: invalid UTF-8 at byte %d', path, newlines + 1, bad - 1)
      end
      if text:match('%S') then emit(text) end
    else
      local para, n, offset, size, first = {}, 0, 0, 0, 1
      local function too_long(what, line_no)
        die('%s: %s %d is longer than --max_doc_bytes=%d bytes', path, what, line_no, cfg.max_doc_bytes)
      end
      for line in f:lines() do
        -- invalid UTF-8 is an error as in the core's readers: a tokenizer
        -- would encode it without a word (BPE: U+FFFD; SentencePiece: unk)
        n = n + 1
        local bad = utf8.first_invalid(line)
        if bad then die('%s: line %d: invalid UTF-8 at byte %d', path, n, offset + bad - 1) end
        offset = offset + #line + 1
        if cfg.documents == 'line' then
          if #line > cfg.max_doc_bytes then too_long('line', n) end
          if line:match('%S') then emit(line) end
        elseif line:match('%S') then
          if #para == 0 then first, size = n, #line else size = size + 1 + #line end
          if size > cfg.max_doc_bytes then too_long('the paragraph from line', first) end
          para[#para + 1] = line
        elseif #para > 0 then
          emit(table.concat(para, '\n'))
          para = {}
        end
      end
      if #para > 0 then emit(table.concat(para, '\n')) end
    end
    f:close()
  end
end

-- The tokenizer, with the end-of-text id that separates documents; a given
-- one is loaded before anything is written.
local function load_tokenizer(path)
  local hub = require 'fsdp.data.hub'
  if hub.is_model_name(path) then -- the seed's OWNER/NAME: its snapshot in the local hub cache
    local ok, dir = pcall(hub.tokenizer_dir, path)
    if not ok then die('--tokenizer %s', dir) end
    path = dir
  end
  if path ~= 'byte' and require('fsdp.io.files').mode(path) == 'directory' then
    path = tokenizer.find_in(path) or path -- load() names a directory without one
  end
  local ok, tok = pcall(tokenizer.load, path)
  if not ok then die('%s', require('fsdp.options').bare(tok)) end
  if not tok.eos_id then
    die('the tokenizer %s has no end-of-text token to separate documents (no eos_token in a tokenizer_config.json '
      .. 'beside it, none of the usual names)', path)
  end
  return tok, path
end
local tok, model_path
if cfg.train_spm == 0 then tok, model_path = load_tokenizer(cfg.tokenizer) end

require('fsdp.io.files').mkdir_p(cfg.output, 'tools/tokenize.lua')

local function copy_file(from, to)
  local text, why = require('fsdp.io.files').read(from, 256 * 2^20, 'a tokenizer file')
  if not text then die('%s', why) end
  local dst = io.open(to, 'wb')
  if not dst then die('cannot write %s', to) end
  dst:write(text)
  dst:close()
end

-- The input's bytes for the progress line (fsdp.observe.progress); nil
-- when a compressed file makes the text's size unknown.
local function input_bytes()
  local total = 0
  for _, path in ipairs(inputs) do
    if path:match('%.gz$') or path:match('%.zst$') then return nil end
    total = total + (files.size(path) or 0)
  end
  return total
end

local t0 = clock.now()
if cfg.train_spm > 0 then
  local spm = require 'fsdp.data.sentencepiece'
  local corpus = os.tmpname()
  local f = assert(io.open(corpus, 'wb'))
  local reading = progress.start('reading the text for the tokenizer', { total = input_bytes(), unit = 'B' })
  each_document(function(doc)
    f:write((doc:gsub('[\r\n]', ' ')), '\n')
    reading:add(#doc + 1)
  end)
  f:close()
  reading:finish()
  -- one C call that cannot report as it goes: announced, then timed
  local phase = progress.phase(('training a SentencePiece %s model of %d pieces'):format(cfg.spm_model_type,
    cfg.train_spm))
  local pieces, trained, lines
  local ok, err = pcall(function()
    trained, pieces, lines = spm.train({ input = corpus, model_prefix = cfg.output .. '/tokenizer',
      vocab_size = cfg.train_spm, model_type = cfg.spm_model_type, warn = false })
  end)
  phase:finish(ok and ('%d pieces'):format(pieces) or 'failed')
  os.remove(corpus)
  if not ok then error(err, 0) end
  if pieces < cfg.train_spm then
    io.stderr:write(('warning: tools/tokenize.lua: --train_spm=%d, but %s supports only %d pieces: the model has %d '
      .. '(ask for at most %d, or give more text)\n'):format(cfg.train_spm, cfg.input, pieces, pieces, pieces))
  end
  if lines.long > 0 then
    io.stderr:write(('warning: tools/tokenize.lua: %d of the %d documents of %s are longer than %d bytes, which '
      .. "SentencePiece's trainer skips: --train_spm learnt its pieces from the other %d (all are tokenized into "
      .. 'the shards)\n'):format(lines.long, lines.lines, cfg.input, lines.max_sentence_length,
      lines.lines - lines.long))
  end
  os.remove(cfg.output .. '/tokenizer.vocab')
  print(('trained a SentencePiece %s model (asked for %d pieces): %s (%.1f s)'):format(cfg.spm_model_type,
    cfg.train_spm, trained, clock.now() - t0))
  tok, model_path = load_tokenizer(trained)
end
-- The tokenizer beside the shards (with the tokenizer_config.json that
-- named its eos, if any).
local kind = tok.name:match('^(%a+)')
if kind == 'sentencepiece' and model_path ~= cfg.output .. '/tokenizer.model' then
  copy_file(model_path, cfg.output .. '/tokenizer.model')
elseif kind == 'bpe' then
  copy_file(model_path, cfg.output .. '/tokenizer.json')
  local config = (model_path:match('^(.*)/[^/]*$') or '.') .. '/tokenizer_config.json'
  if require('fsdp.io.files').mode(config) == 'file' then copy_file(config, cfg.output .. '/tokenizer_config.json') end
end
local eos = fsdp.full({ 1 }, tok.eos_id, { dtype = 'i64' })
local description = kind

-- A split's pending tokens and its shard counter.
local splits = {}
for _, name in ipairs({ 'train', 'val' }) do
  splits[name] = { name = name, parts = {}, pending = 0, docs = 0, shards = 0, tokens = 0, total_docs = 0 }
end

local function flush(s)
  if s.pending == 0 then return end
  local path = ('%s/%s-%05d.safetensors'):format(cfg.output, s.name, s.shards)
  tokens.write_shard(path, fsdp.cat(s.parts, 0),
    { vocab_size = tok.vocab_size, eos_id = tok.eos_id, documents = s.docs, tokenizer = description })
  s.shards, s.tokens, s.total_docs = s.shards + 1, s.tokens + s.pending, s.total_docs + s.docs
  s.parts, s.pending, s.docs = {}, 0, 0
end

local doc_index, batch, batch_split = 0, {}, {}
local function encode_batch()
  if #batch == 0 then return end
  local encoded = tok:encode(batch)
  for i, ids in ipairs(encoded) do
    local s = splits[batch_split[i]]
    s.parts[#s.parts + 1] = ids
    s.parts[#s.parts + 1] = eos
    s.pending, s.docs = s.pending + ids:numel() + 1, s.docs + 1
    if s.pending >= cfg.shard_tokens then flush(s) end
  end
  batch, batch_split = {}, {}
end

local f = cfg.val_fraction
local tokenizing = progress.start('tokenizing', { total = input_bytes(), unit = 'B' })
local batch_bytes = 0
each_document(function(doc)
  local val = math.floor((doc_index + 1) * f) > math.floor(doc_index * f)
  doc_index = doc_index + 1
  batch[#batch + 1] = doc
  batch_split[#batch_split + 1] = val and 'val' or 'train'
  batch_bytes = batch_bytes + #doc + 1
  if #batch >= cfg.chunk_docs then
    encode_batch()
    tokenizing:add(batch_bytes)
    batch_bytes = 0
  end
end)
encode_batch()
tokenizing:add(batch_bytes)
tokenizing:finish(('%d documents'):format(doc_index))
flush(splits.train)
flush(splits.val)
if doc_index == 0 then die('no documents found in %s', cfg.input) end

local dt = clock.now() - t0
print(('tokenizer: %s'):format(tostring(tok)))
for _, name in ipairs({ 'train', 'val' }) do
  local s = splits[name]
  print(('%s: %d documents, %d tokens in %d shards (%s)'):format(name, s.total_docs, s.tokens, s.shards,
    tokens.dtype_for(tok.vocab_size)))
end
print(('%d documents in %.2f s (%.0f tokens/s) -> %s'):format(doc_index, dt,
  (splits.train.tokens + splits.val.tokens) / dt, cfg.output))
-- A small corpus at the default fraction holds out nothing (80 documents
-- at 0.01): said here, not found later as a run without validation.
if f > 0 and splits.val.total_docs == 0 then
  io.stderr:write(('tools/tokenize.lua: warning: --val_fraction=%g of %d documents puts none in the val split, so '
    .. 'training on %s validates on nothing; use --val_fraction=%g or more for at least one\n'):format(
    f, doc_index, cfg.output, math.ceil(1 / doc_index * 1e4) / 1e4))
end
