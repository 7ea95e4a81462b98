-- fsdp.data.sentencepiece: a trained subword tokenizer through Debian's
-- SentencePiece command-line tools (package `sentencepiece`: spm_train,
-- spm_encode, spm_decode, spm_export_vocab), driven through files and pipes.
--
--   local spm = require 'fsdp.data.sentencepiece'
--   spm.train({ input = 'corpus.txt', model_prefix = 'out/tok', vocab_size = 512 })
--   local tok = spm.load('out/tok.model')
--   local ids = tok:encode({ 'first document', 'second' })   -- { i64 [n1], i64 [n2] }
--   tok:decode(ids[1])                                       -- 'first document'
--
-- SentencePiece encodes a line at a time, so newlines inside a document
-- become spaces (its normaliser folds whitespace anyway). The id text that
-- spm_encode prints is scanned by one JIT-compiled loop over its bytes into
-- a single u32 buffer (no Lua string per token); spm_encode itself is the
-- slower half.
local ffi = require 'ffi'
local fsdp = require 'fsdp'
local core = require 'fsdp.core'

local M = {}

local function fail(fmt, ...) core.fail('fsdp.data.sentencepiece: ' .. fmt:format(...)) end

local function quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

-- Run a shell command; its stderr goes to a temporary log, returned with
-- the status so failures can quote the tool's own message.
local function run(cmd)
  local log = os.tmpname()
  local rc = os.execute(cmd .. ' 2>' .. quote(log))
  local f = io.open(log, 'rb')
  local text = f and f:read('*a') or ''
  if f then f:close() end
  os.remove(log)
  return rc == 0 or rc == true, text
end

local function tail(text, n)
  local lines = {}
  for line in text:gmatch('[^\n]+') do lines[#lines + 1] = line end
  return table.concat(lines, '\n', math.max(1, #lines - (n or 5) + 1))
end

-- Whether the command-line tools are installed.
function M.available()
  return run('command -v spm_encode >/dev/null && command -v spm_train >/dev/null')
end

local function require_tools()
  if not M.available() then
    fail('spm_train/spm_encode not found: install Debian\'s sentencepiece package (./build.sh does)')
  end
end

-- Train a model: opts.input (a text file, one sentence or document per
-- line), model_prefix (writes <prefix>.model and <prefix>.vocab),
-- vocab_size, model_type ('unigram' or 'bpe'), character_coverage (1.0),
-- seed. Ids: pad -1, unk 0, bos 1, eos 2 (SentencePiece's defaults).
-- Returns the model path.
function M.train(opts)
  require_tools()
  for _, k in ipairs({ 'input', 'model_prefix', 'vocab_size' }) do
    if opts[k] == nil then fail('train: option %s is required', k) end
  end
  local cmd = table.concat({
    'spm_train', '--input=' .. quote(opts.input), '--model_prefix=' .. quote(opts.model_prefix),
    '--vocab_size=' .. math.floor(opts.vocab_size), '--model_type=' .. quote(opts.model_type or 'unigram'),
    '--character_coverage=' .. (opts.character_coverage or 1.0),
    -- a small corpus may not support the requested size: take what it has
    '--hard_vocab_limit=false', '--num_threads=' .. (opts.threads or 1),
    '--random_seed=' .. (opts.seed or 0), '>/dev/null',
  }, ' ')
  local ok, log = run(cmd)
  if not ok then fail('spm_train on %s failed:\n%s', opts.input, tail(log)) end
  return opts.model_prefix .. '.model'
end

local Tokenizer = {}
Tokenizer.__index = Tokenizer
M.Tokenizer = Tokenizer

-- Load a trained model: reads its vocabulary for the size and the id of </s>.
function M.load(path)
  require_tools()
  local f = io.open(path, 'rb')
  if not f then fail('cannot open model %s', path) end
  f:close()
  local p = io.popen('spm_export_vocab --model=' .. quote(path) .. ' 2>/dev/null')
  local n, eos = 0, nil
  for line in p:lines() do
    if line:match('^</s>\t') then eos = n end
    n = n + 1
  end
  p:close()
  if n == 0 then fail('%s is not a SentencePiece model (spm_export_vocab read no vocabulary)', path) end
  if not eos then fail('%s has no </s> piece: train it with an eos id (the default)', path) end
  return setmetatable({ path = path, vocab_size = n, eos_id = eos, name = 'sentencepiece:' .. path }, Tokenizer)
end

-- Scan "12 7 301\n\n5 9\n" into ids (u32) and per-line counts.
local function scan_ids(text, lines_expected)
  local n = #text
  local buf = ffi.new('uint32_t[?]', math.max(1, math.floor(n / 2) + 1))
  local counts = ffi.new('int64_t[?]', lines_expected + 1)
  local p = ffi.cast('const uint8_t *', text)
  local k, line, v, in_num = 0, 0, 0, false
  for i = 0, n - 1 do
    local c = p[i]
    if c >= 48 and c <= 57 then
      v, in_num = v * 10 + (c - 48), true
    else
      if in_num then buf[k], k, v, in_num = v, k + 1, 0, false end
      if c == 10 then
        counts[line] = k
        line = line + 1
        if line > lines_expected then break end
      end
    end
  end
  if in_num then buf[k], k = v, k + 1 end
  if line < lines_expected then counts[line] = k; line = line + 1 end
  return buf, k, counts, line
end

-- One i64 tensor of ids per document (no EOS: the caller places it).
function Tokenizer:encode(docs)
  if #docs == 0 then return {} end
  local input = os.tmpname()
  local f = assert(io.open(input, 'wb'))
  for _, d in ipairs(docs) do f:write((d:gsub('[\r\n]', ' ')), '\n') end
  f:close()
  local output = os.tmpname()
  local ok, log = run(('spm_encode --model=%s --output_format=id < %s > %s'):format(quote(self.path),
    quote(input), quote(output)))
  os.remove(input)
  local o = io.open(output, 'rb')
  local text = o and o:read('*a') or ''
  if o then o:close() end
  os.remove(output)
  if not ok then fail('spm_encode with %s failed:\n%s', self.path, tail(log)) end
  local buf, total, counts, lines = scan_ids(text, #docs)
  if lines ~= #docs then fail('spm_encode returned %d lines for %d documents', lines, #docs) end
  local all = fsdp.Tensor.wrap(fsdp.C.fl_from_host(1, ffi.new('int64_t[1]', total), fsdp.C.FL_I64,
    fsdp.C.fl_device_make(fsdp.C.FL_DEVICE_CPU, 0), buf, fsdp.C.FL_U32, total))
  local out, prev = {}, 0
  for i = 1, #docs do
    local e = tonumber(counts[i - 1])
    out[i] = all:narrow(0, prev, e - prev)
    prev = e
  end
  return out
end

-- The text of a 1-d tensor of ids.
function Tokenizer:decode(ids)
  local list = ids:to('i64'):contiguous():tolist()
  local p = io.popen(('echo %s | spm_decode --model=%s --input_format=id 2>/dev/null'):format(
    quote(table.concat(list, ' ')), quote(self.path)))
  local text = p:read('*a')
  p:close()
  return (text:gsub('\n$', ''))
end

function Tokenizer:__tostring()
  return ('SentencePiece(%s, vocab %d, eos %d)'):format(self.path, self.vocab_size, self.eos_id)
end

return M
