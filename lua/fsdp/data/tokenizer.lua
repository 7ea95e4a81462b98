-- fsdp.data.tokenizer: pick a tokenizer by name or path:
--   'byte'                  the byte-level fallback (fsdp.data.byte_tokenizer)
--   FILE.model              a SentencePiece model (fsdp.data.sentencepiece)
--   FILE.json               a Hugging Face tokenizer.json byte-level BPE
--                           (fsdp.data.bpe)
--   DIR                     a Hugging Face model directory: its
--                           tokenizer.model (Llama 2: the tokenizer.json
--                           beside it is the same SentencePiece model,
--                           written in a form this build does not read),
--                           else its tokenizer.json (GPT-2, Llama 3, Qwen2)
--   OWNER/NAME              a Hugging Face hub model name (the seed's
--                           --tokenizer): its snapshot in the local hub
--                           cache, as a directory (fsdp.data.hub); never
--                           fetched, a missing one says how to get it
-- A file of another name is recognised by its content ('{' starts JSON).
-- All give vocab_size, eos_id (nil when the tokenizer has none), name,
-- encode(docs) -> {i64 tensor per document} and decode(ids) -> text.
local core = require 'fsdp.core'
local files = require 'fsdp.io.files'
local byte_tokenizer = require 'fsdp.data.byte_tokenizer'
local bpe = require 'fsdp.data.bpe'
local sentencepiece = require 'fsdp.data.sentencepiece'
local hub = require 'fsdp.data.hub'

local M = {}

-- The tokenizer file a directory holds, or nil.
function M.find_in(dir)
  for _, name in ipairs({ 'tokenizer.model', 'tokenizer.json' }) do
    local p = files.join(dir, name)
    if files.is_file(p) then return p end
  end
  return nil
end

function M.load(spec)
  if spec == nil or spec == '' or spec == 'byte' then
    return byte_tokenizer.new()
  end
  if type(spec) ~= 'string' then
    core.fail(('fsdp.data.tokenizer: expected \'byte\', a tokenizer file or a model directory, got %s'):format(
      type(spec)))
  end
  if hub.is_model_name(spec) then
    local ok, dir = pcall(hub.tokenizer_dir, spec)
    if not ok then core.fail('fsdp.data.tokenizer: ' .. dir) end
    spec = dir
  end
  local path = spec
  local mode = files.mode(spec)
  if mode == 'directory' then
    path = M.find_in(spec)
    if not path then
      core.fail(('fsdp.data.tokenizer: %s holds no tokenizer.model or tokenizer.json'):format(spec))
    end
  elseif mode == nil then
    core.fail(('fsdp.data.tokenizer: %s: no such file (\'byte\', a .model or tokenizer.json file, or an HF '
      .. 'model directory)'):format(spec))
  else
    local ok, why = files.check_input(spec)
    if not ok then core.fail('fsdp.data.tokenizer: ' .. why) end
  end
  if path:match('%.json$') then return bpe.load(path) end
  if path:match('%.model$') then return sentencepiece.load(path) end
  local f, why = files.open_input(path)
  if not f then core.fail('fsdp.data.tokenizer: ' .. why) end
  local head = f:read(64) or ''
  f:close()
  if head:match('^%s*{') then return bpe.load(path) end
  return sentencepiece.load(path)
end

return M
