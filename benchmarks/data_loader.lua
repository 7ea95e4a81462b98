-- benchmarks/data_loader.lua: tokens per second the streaming loader
-- (fsdp.data.corpus over core/data) delivers from each corpus format with
-- 1 and 2 worker threads, beside the tokens per second the small-Llama CPU
-- training step consumes (benchmarks/train_step.lua's model: width 512,
-- 8 layers, 8 heads, MLP 1376, vocab 32000, batch 4 x seq 256), measured in
-- the same run. The loader must never be the bottleneck: the last column
-- is how many times faster it is than training. Prints numbers; asserts
-- nothing (machines are noisy).
--
--   fsdp-lua benchmarks/data_loader.lua [--mb=16] [--files=4] [--train_steps=3] [--tokenizer=byte]
--
-- The corpus is generated (tests/data/corpus.lua's sentences, C4-like
-- {"text", "timestamp", "url"} lines) into a temporary directory as
-- --files shards of each format: .txt paragraphs, .jsonl, .json.gz (gzip
-- -6) and .jsonl.zst (zstd -3). The loader reads each once, packing rows
-- of 257 tokens (seq 256) in batches of 64 rows.
local fsdp = require 'fsdp'
local host = require 'fsdp.host'
package.path = host.root .. '/?.lua;' .. package.path
local options = require 'fsdp.options'
local clock = require 'fsdp.clock'
local corpus = require 'fsdp.data.corpus'
local gen = require 'tests.data.corpus'

local cfg = options.config({
  mb = { 16, 'megabytes of text per format', min = 1 },
  files = { 4, 'shards per format', int = true, min = 1 },
  train_steps = { 3, 'measured training steps (after one unmeasured)', int = true, min = 1 },
  tokenizer = { 'byte', "the tokenizer ('byte', or any fsdp.data.tokenizer with a C hook)" },
}, arg, 'benchmarks/data_loader.lua')

local tok = require('fsdp.data.tokenizer').load(cfg.tokenizer)
if type(tok.c_hook) ~= 'function' then error(('--tokenizer %s has no C hook for the loader'):format(cfg.tokenizer), 0) end

local dir = require('fsdp.testing').tmpdir()
local quote = require 'fsdp.quote'
-- Run a list of words (fsdp.quote: no path reaches the shell unquoted).
local function sh(words)
  local out, rc = quote.capture(words)
  assert(rc == 0, quote.command(words) .. ': ' .. out)
end

-- The corpus: --mb of text split into --files shards per format.
local docs = gen.documents({ documents = 1000, seed = 7 })
local per_file = math.ceil(cfg.mb * 2^20 / cfg.files)
local text_bytes = 0
for k = 1, cfg.files do
  local txt = assert(io.open(('%s/part-%d.txt'):format(dir, k), 'wb'))
  local jsonl = assert(io.open(('%s/part-%d.jsonl'):format(dir, k), 'wb'))
  local n, i = 0, 0
  while n < per_file do
    i = i + 1
    -- documents of 3 generated paragraphs (a few hundred bytes), varied
    local d = docs[(i * 7 + k) % #docs + 1] .. ' ' .. docs[(i * 13 + k) % #docs + 1] .. ' ' .. docs[i % #docs + 1]
    txt:write(d, '\n\n')
    jsonl:write(('{"text":"%s","timestamp":"2019-04-25T12:00:00Z","url":"https://example.com/%d/%d"}\n'):format(
      d, k, i))
    n = n + #d
  end
  text_bytes = text_bytes + n
  txt:close()
  jsonl:close()
  local part = ('%s/part-%d'):format(dir, k)
  sh({ 'cp', part .. '.jsonl', part .. '.json' })
  sh({ 'gzip', '-6', '-f', part .. '.json' })
  sh({ 'zstd', '-q', '-3', '-f', part .. '.jsonl', '-o', part .. '.jsonl.zst' })
end

local T, ROWS = 256, 64

-- Tokens per second of one pass over a format's shards.
local function loader_rate(pattern, threads)
  local s = corpus.open(pattern, { tokenizer = tok, seq_len = T, batch_size = 1, once = true, shuffle = false,
                                    threads = threads, rank = 0, world_size = 1 })
  local t0 = clock.now()
  local rows = 0
  while true do
    local r = s:rows(ROWS)
    if not r then break end
    local n = r:size(0)
    rows = rows + n
    r:free()
    if n < ROWS then break end
  end
  local dt = clock.now() - t0
  return rows * T / dt, dt
end

-- Tokens per second the small-Llama CPU training step consumes.
local function train_rate()
  local llama = require 'models.llama'
  local optim = require 'fsdp.optim'
  local c = llama.config('small')
  local model = llama.build(c)
  model:init_weights({ seed = 0 })
  local opt = optim.AdamW(model:named_parameters(), { lr = 1e-4 })
  local B = 4
  local ids = fsdp.randint(0, c.vocab_size, { B, T }, { seed = 1 })
  local targets = fsdp.randint(0, c.vocab_size, { B, T }, { seed = 2 })
  local function step()
    local loss = model:loss(ids, targets)
    loss:backward()
    opt:step()
    opt:zero_grad()
  end
  step()
  local t0 = clock.now()
  for _ = 1, cfg.train_steps do step() end
  return B * T * cfg.train_steps / (clock.now() - t0)
end

print(('corpus: %.1f MiB of text per format in %d shards, tokenizer %s, rows of %d tokens'):format(
  text_bytes / 2^20, cfg.files, tok.name or cfg.tokenizer, T + 1))
local consume = train_rate()
print(('training (small Llama, batch 4 x seq 256, CPU): %.0f tokens/s'):format(consume))
print()
print(('%-12s %8s %14s %10s %12s'):format('format', 'threads', 'tokens/s', 'seconds', 'x training'))
for _, f in ipairs({ { 'txt', '*.txt' }, { 'jsonl', '*.jsonl' }, { 'json.gz', '*.json.gz' },
                     { 'jsonl.zst', '*.jsonl.zst' } }) do
  for _, threads in ipairs({ 1, 2 }) do
    local rate, dt = loader_rate(dir .. '/' .. f[2], threads)
    print(('%-12s %8d %14.0f %10.2f %12.0f'):format(f[1], threads, rate, dt, rate / consume))
  end
end
require('fsdp.io.files').remove_tree(dir)
