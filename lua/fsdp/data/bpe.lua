-- fsdp.data.bpe: a Hugging Face tokenizer.json byte-level BPE (GPT-2,
-- Llama 3 and the models that copied them), encoded and decoded in C
-- (core/text/bpe.c) with the results of the `tokenizers` package.
--
--   local bpe = require 'fsdp.data.bpe'
--   local tok = bpe.load('llama3/tokenizer.json')
--   local ids = tok:encode({ 'first document', 'second' })   -- { i64 [n1], i64 [n2] }
--   tok:encode({ 'a prompt' }, { add_special = true })        -- with <|begin_of_text|>
--   tok:decode(ids[1])                                        -- 'first document'
--   tok:decode(ids[1], { skip_special = true })
--
-- The end-of-text token (eos_id, the document separator of token shards
-- and generation's stop id) and bos_id come from the tokenizer_config.json
-- next to the file when there is one (eos_token/bos_token), else from the
-- names GPT-2 and Llama 3 use; either may be nil.
local ffi = require 'ffi'
local fsdp = require 'fsdp'
local core = require 'fsdp.core'
local files = require 'fsdp.io.files'
local C = core.C

local M = {}

local Tokenizer = {}
Tokenizer.__index = Tokenizer
M.Tokenizer = Tokenizer

local EOS_NAMES = { '<|endoftext|>', '<|end_of_text|>', '</s>', '<|im_end|>', '<|eot_id|>' }
local BOS_NAMES = { '<|begin_of_text|>', '<s>', '<|startoftext|>' }

local function token_id(t, s)
  if s == nil then return nil end
  local id = tonumber(C.fl_bpe_token_to_id(t, s, #s))
  return id >= 0 and id or nil
end

-- The eos_token/bos_token of tokenizer_config.json beside `path`: a string
-- or {content = ...}; nil when the file or the key is missing.
local function config_tokens(path)
  local dir = path:match('^(.*)/[^/]*$') or '.'
  local cpath = dir .. '/tokenizer_config.json'
  local ok0, is = pcall(files.is_file, cpath)
  if not ok0 then core.fail('fsdp.data.bpe: ' .. is) end
  if not is then return {} end
  local text, err = files.read(cpath, files.LIMITS.text[1], 'a JSON config')
  if not text then core.fail('fsdp.data.bpe: ' .. err) end
  local ok, cfg = pcall(require('cjson').decode, text)
  if not ok or type(cfg) ~= 'table' then
    core.fail(('fsdp.data.bpe: %s/tokenizer_config.json is not valid JSON'):format(dir))
  end
  local function name(v) return type(v) == 'table' and v.content or (type(v) == 'string' and v or nil) end
  return { eos = name(cfg.eos_token), bos = name(cfg.bos_token) }
end

-- Load a tokenizer.json; an unreadable or unsupported file raises an error
-- naming the file and the field.
function M.load(path)
  local t = C.fl_bpe_load(path)
  if t == nil then core.raise() end
  t = ffi.gc(t, C.fl_bpe_free)
  local self = setmetatable({ path = path, _c = t, vocab_size = tonumber(C.fl_bpe_vocab_size(t)),
                              name = 'bpe:' .. path }, Tokenizer)
  local named = config_tokens(path)
  self.eos_id, self.bos_id = token_id(t, named.eos), token_id(t, named.bos)
  for _, n in ipairs(EOS_NAMES) do self.eos_id = self.eos_id or token_id(t, n) end
  for _, n in ipairs(BOS_NAMES) do self.bos_id = self.bos_id or token_id(t, n) end
  return self
end

local I64 = 'i64'

local function ids_tensor(ptr, n)
  return fsdp.Tensor.wrap(C.fl_from_host(1, ffi.new('int64_t[1]', n), C.FL_I64,
    C.fl_device_make(C.FL_DEVICE_CPU, 0), ptr, C.FL_I32, n))
end

-- One i64 tensor of ids per document (no EOS: the caller places it);
-- opts.add_special: the post-processor's special tokens (Llama 3's bos), as
-- `tokenizers` adds them by default.
function Tokenizer:encode(docs, opts)
  local add = opts and opts.add_special or false
  local out, ids = {}, ffi.new('const int32_t *[1]')
  for i, d in ipairs(docs) do
    local n = C.fl_bpe_encode(self._c, d, #d, add, ids)
    if n < 0 then core.raise() end
    out[i] = n == 0 and fsdp.empty({ 0 }, { dtype = I64 }) or ids_tensor(ids[0], n)
  end
  return out
end

-- The ids of one string as a Lua list (small inputs: prompts, tests).
function Tokenizer:encode_list(text, opts)
  return self:encode({ text }, opts)[1]:tolist()
end

-- The text of a 1-d integer tensor (or list) of ids; opts.skip_special
-- drops special tokens. Bytes that do not form UTF-8 (a character cut by
-- the end of the ids) become U+FFFD, as `tokenizers` decodes them.
function Tokenizer:decode(ids, opts)
  if not fsdp.is_tensor(ids) then
    if #ids == 0 then return '' end
    ids = fsdp.tensor(ids, { dtype = 'i32' })
  end
  local v = ids:to('i32'):contiguous()
  local n = v:numel()
  local text = ffi.new('const char *[1]')
  local len = C.fl_bpe_decode(self._c, ffi.cast('const int32_t *', v._c.data), n,
    opts and opts.skip_special or false, text)
  if len < 0 then core.raise() end
  return ffi.string(text[0], len)
end

-- The id of a token as the file writes it, or nil.
function Tokenizer:token_to_id(token) return token_id(self._c, token) end

function Tokenizer:id_to_token(id)
  local len = ffi.new('size_t[1]')
  local s = C.fl_bpe_id_to_token(self._c, id, len)
  if s == nil then core.raise() end
  return ffi.string(s, len[0])
end

function Tokenizer:is_special(id) return C.fl_bpe_is_special(self._c, id) end

-- The hook the streaming loader's workers encode with (fsdp.data.corpus):
-- each worker a clone of this handle (core/data/tokenizer_hooks.c).
function Tokenizer:c_hook() return C.fl_bpe_hook(self._c) end

function Tokenizer:__tostring()
  return ('BPE(%s, vocab %d, eos %s)'):format(self.path, self.vocab_size, tostring(self.eos_id))
end

return M
