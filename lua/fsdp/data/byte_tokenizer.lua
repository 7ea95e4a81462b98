-- fsdp.data.byte_tokenizer: the tokenizer that needs nothing: a token per
-- byte of the UTF-8 text (ids 0-255) and EOS = 256, so vocab_size 257.
-- Any text round-trips exactly (newlines included); sequences are about
-- four times longer than with a trained subword model.
--
--   local tok = require('fsdp.data.byte_tokenizer').new()
--   local ids = tok:encode({ 'hello', 'world' })   -- { i64 [5], i64 [5] }
--   tok:decode(ids[1])                             -- 'hello'
local ffi = require 'ffi'
local fsdp = require 'fsdp'
local core = require 'fsdp.core'

local ByteTokenizer = {}
ByteTokenizer.__index = ByteTokenizer

function ByteTokenizer.new()
  return setmetatable({ vocab_size = 257, eos_id = 256, name = 'byte' }, ByteTokenizer)
end

-- One i64 tensor of ids per document (no EOS: the caller places it).
function ByteTokenizer:encode(docs)
  local out = {}
  for i, s in ipairs(docs) do
    local t = fsdp.empty({ #s }, { dtype = 'u8' })
    if #s > 0 then ffi.copy(t._c.data, s, #s) end
    out[i] = t:to('i64')
  end
  return out
end

-- The text of a 1-d integer tensor of ids; EOS ends a document and is
-- written as a newline.
function ByteTokenizer:decode(ids)
  local v = ids:to('i64'):contiguous()
  if v:numel() == 0 then return '' end
  if v:max():item() > 256 or v:min():item() < 0 then
    core.fail(('fsdp.data.byte_tokenizer: decode: ids must lie in [0, 256], got [%d, %d]'):format(
      v:min():item(), v:max():item()))
  end
  local b = fsdp.F.where(fsdp.F.eq(v, 256), 10, v):to('u8')
  return ffi.string(b._c.data, b:numel())
end

-- The core's byte tokenizer for the streaming loader's worker threads
-- (fsdp.data.corpus; [Note: the tokenizer hook] in core/include/fsdp.h):
-- the same ids as encode.
function ByteTokenizer:c_hook() return core.C.fl_byte_tokenizer_hook() end

function ByteTokenizer:__tostring() return 'ByteTokenizer(vocab 257, eos 256)' end

return ByteTokenizer
