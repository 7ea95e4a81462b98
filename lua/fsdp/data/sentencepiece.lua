-- fsdp.data.sentencepiece: SentencePiece models (Llama 2's tokenizer.model):
-- training, encoding and decoding in process through Debian's
-- libsentencepiece (core/text/spm.cc).
--
--   local spm = require 'fsdp.data.sentencepiece'
--   spm.train({ input = 'corpus.txt', model_prefix = 'out/tok', vocab_size = 512 })
--   local tok = spm.load('out/tok.model')
--   local ids = tok:encode({ 'first document', 'second' })   -- { i64 [n1], i64 [n2] }
--   tok:decode(ids[1])                                       -- 'first document'
--
-- A document is encoded whole (newlines and all: the model's normaliser
-- decides what they become; Llama 2's keeps them as byte-fallback pieces).
local ffi = require 'ffi'
local fsdp = require 'fsdp'
local core = require 'fsdp.core'
local files = require 'fsdp.io.files'
local tables = require 'fsdp.tables'
local C = core.C

local M = {}

local function fail(fmt, ...) core.fail('fsdp.data.sentencepiece: ' .. fmt:format(...)) end

-- Train a model: opts.input (a text file, one sentence or document per
-- line), model_prefix (writes <prefix>.model and <prefix>.vocab),
-- vocab_size, model_type ('unigram' or 'bpe'), character_coverage (1.0),
-- seed, threads; opts.extra: more trainer options by name (SentencePiece's
-- own, e.g. byte_fallback = true). Ids: pad -1, unk 0, bos 1, eos 2
-- (SentencePiece's defaults). In process (libsentencepiece_train).
-- A corpus too small for vocab_size gives a smaller model (SentencePiece's
-- hard_vocab_limit=false): that is a warning on stderr naming the corpus and
-- both numbers (opts.warn = false: the caller reports it), or an error with
-- opts.strict. Lines longer than max_sentence_length bytes (SentencePiece's
-- option, 4192 by default) are skipped by its trainer, in a log line
-- this build silences: counted here and warned about the same way.
-- Returns the model path, its number of pieces, and {long =, lines =}.
function M.train(opts)
  for _, k in ipairs({ 'input', 'model_prefix', 'vocab_size' }) do
    if opts[k] == nil then fail('train: option %s is required', k) end
  end
  local f, why = files.open_input(opts.input)
  if not f then fail('train: cannot read the corpus: %s', why) end
  local max_len = tonumber((opts.extra or {}).max_sentence_length) or 4192
  local lines = { long = 0, lines = 0, max_sentence_length = max_len }
  for line in f:lines() do
    lines.lines = lines.lines + 1
    if #line > max_len then lines.long = lines.long + 1 end
  end
  f:close()
  local kw = {
    input = opts.input, model_prefix = opts.model_prefix, vocab_size = math.floor(opts.vocab_size),
    model_type = opts.model_type or 'unigram', character_coverage = opts.character_coverage or 1.0,
    hard_vocab_limit = false, num_threads = opts.threads or 1, random_seed = opts.seed or 0,
    minloglevel = 2, -- its progress log: errors come back as values
  }
  for k, v in pairs(opts.extra or {}) do kw[k] = v end
  local names = tables.sorted_keys(kw)
  local keys, values = ffi.new('const char *[?]', #names), ffi.new('const char *[?]', #names)
  local keep = {}
  for i, k in ipairs(names) do
    local v = kw[k]
    if type(v) == 'boolean' then v = v and 'true' or 'false' end
    keep[#keep + 1], keep[#keep + 2] = k, tostring(v)
    keys[i - 1], values[i - 1] = keep[#keep - 1], keep[#keep]
  end
  core.check(C.fl_spm_train(#names, keys, values))
  local path = opts.model_prefix .. '.model'
  local pieces = M.load(path).vocab_size
  if pieces < opts.vocab_size then
    local msg = ('the corpus %s supports only %d pieces, %d were asked: the model has %d (ask for at most that, or '
      .. 'give more text)'):format(opts.input, pieces, opts.vocab_size, pieces)
    if opts.strict then fail('%s', msg) end
    if opts.warn ~= false then io.stderr:write('warning: fsdp.data.sentencepiece: ', msg, '\n') end
  end
  if lines.long > 0 and opts.warn ~= false then
    io.stderr:write(('warning: fsdp.data.sentencepiece: %d of the %d lines of %s are longer than max_sentence_length '
      .. '(%d bytes): SentencePiece trains without them\n'):format(lines.long, lines.lines, opts.input, max_len))
  end
  return path, pieces, lines
end

local Tokenizer = {}
Tokenizer.__index = Tokenizer
M.Tokenizer = Tokenizer

-- Load a model; a missing file or another format raises an error naming it.
function M.load(path)
  local ok, why = files.check_input(path)
  if not ok then fail('cannot open the model: %s', why) end
  local t = C.fl_spm_load(path)
  if t == nil then core.raise() end
  t = ffi.gc(t, C.fl_spm_free)
  local function id(v) v = tonumber(v); return v >= 0 and v or nil end
  local self = setmetatable({ path = path, _c = t, vocab_size = tonumber(C.fl_spm_vocab_size(t)),
    eos_id = id(C.fl_spm_eos_id(t)), bos_id = id(C.fl_spm_bos_id(t)), unk_id = id(C.fl_spm_unk_id(t)),
    pad_id = id(C.fl_spm_pad_id(t)), name = 'sentencepiece:' .. path }, Tokenizer)
  if not self.eos_id then fail('%s has no </s> piece: train it with an eos id (the default)', path) end
  -- What encode's add_special adds: <s> before (and </s> after) a text, as
  -- transformers' LlamaTokenizer does by default; a tokenizer_config.json
  -- beside the model may say otherwise (add_bos_token, add_eos_token).
  self.add_bos, self.add_eos = self.bos_id ~= nil, false
  local cpath = (path:match('^(.*)/[^/]*$') or '.') .. '/tokenizer_config.json'
  local is_ok, is = pcall(files.is_file, cpath)
  if not is_ok then fail('%s', is) end
  if is then
    local text, err = files.read(cpath, files.LIMITS.text[1], 'a JSON config')
    if not text then fail('%s', err) end
    local ok, cfg = pcall(require('cjson').decode, text)
    if ok and type(cfg) == 'table' then
      if cfg.add_bos_token ~= nil then self.add_bos = cfg.add_bos_token == true and self.bos_id ~= nil end
      if cfg.add_eos_token ~= nil then self.add_eos = cfg.add_eos_token == true end
    end
  end
  return self
end

-- One i64 tensor of ids per document (no BOS/EOS: the caller places them);
-- opts.add_special: with <s> (and </s>) as the model's HF tokenizer adds
-- them (add_bos, add_eos).
function Tokenizer:encode(docs, opts)
  local out, ids = {}, ffi.new('const int32_t *[1]')
  for i, d in ipairs(docs) do
    local n = C.fl_spm_encode(self._c, d, #d, ids)
    if n < 0 then core.raise() end
    out[i] = n == 0 and fsdp.empty({ 0 }, { dtype = 'i64' })
      or fsdp.Tensor.wrap(C.fl_from_host(1, ffi.new('int64_t[1]', n), C.FL_I64,
        C.fl_device_make(C.FL_DEVICE_CPU, 0), ids[0], C.FL_I32, n))
    if opts and opts.add_special and (self.add_bos or self.add_eos) then
      local parts = { out[i] }
      if self.add_bos then table.insert(parts, 1, fsdp.full({ 1 }, self.bos_id, { dtype = 'i64' })) end
      if self.add_eos then parts[#parts + 1] = fsdp.full({ 1 }, self.eos_id, { dtype = 'i64' }) end
      out[i] = fsdp.cat(parts, 0)
    end
  end
  return out
end

-- The text of a 1-d integer tensor (or list) of ids; control pieces (<s>,
-- </s>) give no text, as in SentencePiece.
function Tokenizer:decode(ids)
  if not fsdp.is_tensor(ids) then
    if #ids == 0 then return '' end
    ids = fsdp.tensor(ids, { dtype = 'i32' })
  end
  local v = ids:to('i32'):contiguous()
  local text = ffi.new('const char *[1]')
  local len = C.fl_spm_decode(self._c, ffi.cast('const int32_t *', v._c.data), v:numel(), text)
  if len < 0 then core.raise() end
  return ffi.string(text[0], len)
end

function Tokenizer:id_to_piece(id)
  local len = ffi.new('size_t[1]')
  local s = C.fl_spm_id_to_piece(self._c, id, len)
  if s == nil then core.raise() end
  return ffi.string(s, len[0])
end

-- The hook the streaming loader's workers encode with (fsdp.data.corpus):
-- each worker loads the model at self.path (core/data/tokenizer_hooks.c).
function Tokenizer:c_hook() return C.fl_spm_hook(self.path) end

function Tokenizer:__tostring()
  return ('SentencePiece(%s, vocab %d, eos %d)'):format(self.path, self.vocab_size, self.eos_id)
end

return M
