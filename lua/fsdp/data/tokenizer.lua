-- fsdp.data.tokenizer: pick a tokenizer by name: 'byte' (the byte-level
-- fallback, fsdp.data.byte_tokenizer) or the path of a SentencePiece model
-- (fsdp.data.sentencepiece). Both give vocab_size, eos_id, name,
-- encode(docs) -> {i64 tensor per document} and decode(ids) -> text.
local core = require 'fsdp.core'

local M = {}

function M.load(spec)
  if spec == nil or spec == '' or spec == 'byte' then
    return require('fsdp.data.byte_tokenizer').new()
  end
  if type(spec) ~= 'string' then
    core.fail(('fsdp.data.tokenizer: expected \'byte\' or a SentencePiece model path, got %s'):format(type(spec)))
  end
  return require('fsdp.data.sentencepiece').load(spec)
end

return M
