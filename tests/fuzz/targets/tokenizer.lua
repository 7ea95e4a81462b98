-- A Hugging Face tokenizer.json (byte-level BPE) as downloaded: load it
-- (fsdp.data.bpe over core/text/bpe.c: the JSON, vocabulary, merges,
-- regexes, added tokens, post-processor), then encode a text with its hard
-- cases (special-token names, invalid UTF-8, long runs, decomposed
-- characters for a normalizer) and decode the ids.
local bpe = require 'fsdp.data.bpe'

local TEXT = "Hello, wörld! <|endoftext|> it's 12345 \u{1F600}\n\n  \255\192 [[custom]]<|begin_of_text|>"
  .. string.rep('ab', 40) .. '   \t x cafe\u{301} <|im_start|>[[caf\u{E9}]]'

return function(path)
  local tok = bpe.load(path)
  local ids = tok:encode({ TEXT }, { add_special = true })[1]
  tok:decode(ids)
  tok:decode(ids, { skip_special = true })
end
