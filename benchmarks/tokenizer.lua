-- benchmarks/tokenizer.lua: how fast the tokenizers encode. Prints
-- tokens/s and MB/s per tokenizer; asserts nothing.
--
--   fsdp-lua benchmarks/tokenizer.lua [--mb=4] [--tokenizer=PATH,...] [--docs=2000]
--
-- The text is generated (seeded): words drawn from a Zipf-like vocabulary
-- of made-up words of 1-12 letters, with numbers, punctuation, accented and
-- CJK words and emoji mixed in, cut into --docs documents; so the words
-- repeat as in real text (the BPE word cache matters) without any download.
-- Default tokenizers: the shipped test files (tests/golden/tokenizers: a
-- GPT-2, a Llama 3 and a Qwen2 (NFC) style tokenizer.json, a SentencePiece
-- model) and the byte tokenizer. One thread, one call per document. Their
-- vocabularies are small (600-800): a real one (50k-150k) gives about a
-- third of the tokens per byte, so compare MB/s across vocabularies.
local options = require 'fsdp.options'
local clock = require 'fsdp.clock'
local tokenizer = require 'fsdp.data.tokenizer'

local cfg = options.config({
  mb = { 4, 'megabytes of text' },
  docs = { 2000, 'documents the text is cut into' },
  tokenizer = { 'tests/golden/tokenizers/gpt2_style.json,tests/golden/tokenizers/llama3_style.json,'
                .. 'tests/golden/tokenizers/qwen2_style.json,'
                .. 'tests/golden/tokenizers/spm.model,byte', 'tokenizers to measure, comma-separated' },
  seed = { 1, 'seed of the generated text' },
}, arg, 'benchmarks/tokenizer.lua')

-- A deterministic generator (Lua's math.random differs across builds).
local state = cfg.seed
local function rand(n)
  state = (state * 1103515245 + 12345) % 2147483648
  return state % n
end

local letters = 'etaoinshrdlcumwfgypbvkjxqz'
local words = {}
for i = 1, 20000 do
  local len = 1 + rand(12)
  local w = {}
  for k = 1, len do
    local j = 1 + math.min(25, math.floor(rand(1000) ^ 2 / 40000))
    w[k] = letters:sub(j, j)
  end
  words[i] = table.concat(w)
end
local extra = { 'naïve', 'café', 'Zürich', '中文', '日本語', '😀', '👍🏽', '—', '"quoted"', "it's", 'DON\'T' }

local target = math.floor(cfg.mb * 1e6)
local parts, size = {}, 0
while size < target do
  local r = rand(100)
  local w
  if r < 3 then w = extra[1 + rand(#extra)]
  elseif r < 8 then w = tostring(rand(100000))
  else w = words[1 + math.floor(20000 * (rand(10000) / 10000) ^ 3)] end
  local sep = rand(20) == 0 and '.\n' or (rand(12) == 0 and ', ' or ' ')
  parts[#parts + 1] = w .. sep
  size = size + #w + #sep
end
local text = table.concat(parts)
local docs, per = {}, math.ceil(#text / cfg.docs)
for i = 1, #text, per do docs[#docs + 1] = text:sub(i, i + per - 1) end

print(('text: %.2f MB in %d documents'):format(#text / 1e6, #docs))
for spec in cfg.tokenizer:gmatch('[^,]+') do
  local tok = tokenizer.load(spec)
  tok:encode({ docs[1] }) -- warm up (JIT, first allocations)
  local t0 = clock.now()
  local n = 0
  for _, d in ipairs(docs) do n = n + tok:encode({ d })[1]:numel() end
  local dt = clock.now() - t0
  print(('%-48s %10d tokens  %6.2f s  %12.0f tokens/s  %6.1f MB/s'):format(spec, n, dt, n / dt, #text / 1e6 / dt))
end
