-- tools/make_chat_task.lua: the data and the tiny models of the SFT
-- learning task (docs/sft.md; tools/sft_task.sh runs
-- it end to end). Deterministic for a --seed.
--
--   fsdp-lua tools/make_chat_task.lua --out=DIR [--seed=0 --train=3000 --test=200]
--
-- Writes
--   DIR/facts.jsonl   plain prompt/completion records ("17 + 5 =", " 22"): the sums the
--                     conversations use, as a base model would know them from pretraining
--   DIR/train.jsonl   multi-turn conversations (messages): a system prompt, then "What is A + B?"
--                     answered with the sum, then one or two "Add C." turns answered with the
--                     running total, which only the conversation so far tells
--   DIR/test.jsonl    held-out conversations of the same kind, none equal to a training one
--   DIR/qwen2/        a tiny Qwen2 (random weights) with Qwen2.5-Instruct's chat template
--   DIR/llama/        a tiny Llama (random weights) with SmolLM2-Instruct's chat template
-- Both models share a small byte-level BPE tokenizer with the ChatML special
-- tokens (tests/golden/tokenizers/qwen2_style.json; digits are single
-- tokens); the templates are the real ones stored in tests/data/chat_templates.
-- There is no pretrained model on the build machines: the weights are
-- random, and the task's first stage teaches them the sums (see docs/sft.md).
local fsdp = require 'fsdp'
local options = require 'fsdp.options'
local cjson = require 'cjson'
local files = require 'fsdp.io.files'
local hf = require 'models.hf'
local decoders = require 'models.decoders'

local cfg = options.config({
  out = { '', 'the directory to write (created)', output = 'dir' },
  seed = { 0, 'the data and weights seed', int = true, min = 0 },
  train = { 3000, 'training conversations', int = true, min = 1 },
  test = { 200, 'held-out conversations', int = true, min = 1 },
  width = { 128, 'the models\' width', int = true, min = 16 },
  layers = { 4, 'the models\' layers', int = true, min = 1 },
}, arg, 'tools/make_chat_task.lua', function(cfg)
  if cfg.out == '' then error('--out is needed: the directory to write', 0) end
end)

local SYSTEM = 'Answer with a number.'
local TOKENIZER = 'tests/golden/tokenizers/qwen2_style.json'
local TEMPLATES = { qwen2 = 'tests/data/chat_templates/qwen2.5-instruct',
                   llama = 'tests/data/chat_templates/smollm2-instruct' }

-- A counter-based stream of integers in [0, n).
local draws, at, block = {}, 0, 0
local function int(n)
  if at >= #draws then
    draws = fsdp.rand({ 4096 }, { seed = cfg.seed, stream = 1000 + block, dtype = 'f64' }):tolist()
    block, at = block + 1, 0
  end
  at = at + 1
  return math.floor(draws[at] * n)
end

local function conversation()
  local a, b = int(10), int(10)
  local total = a + b
  local msgs = { { role = 'system', content = SYSTEM }, { role = 'user', content = ('What is %d + %d?'):format(a, b) },
                 { role = 'assistant', content = tostring(total) } }
  for _ = 1, 1 + int(2) do
    local c = 1 + int(9)
    total = total + c
    msgs[#msgs + 1] = { role = 'user', content = ('Add %d.'):format(c) }
    msgs[#msgs + 1] = { role = 'assistant', content = tostring(total) }
  end
  return msgs
end

-- cjson writes keys in any order; role before content reads better.
local function line(msgs)
  local parts = {}
  for i, m in ipairs(msgs) do
    parts[i] = ('{"role":%s,"content":%s}'):format(cjson.encode(m.role), cjson.encode(m.content))
  end
  return '{"messages":[' .. table.concat(parts, ',') .. ']}'
end

local function write(path, lines)
  local f = assert(io.open(path, 'w'))
  f:write(table.concat(lines, '\n'), '\n')
  f:close()
end

local out = cfg.out
local seen, train, test = {}, {}, {}
while #train < cfg.train do
  local l = line(conversation())
  if not seen[l] then seen[l], train[#train + 1] = true, l end
end
while #test < cfg.test do
  local l = line(conversation())
  if not seen[l] then seen[l], test[#test + 1] = true, l end
end
-- every sum a conversation can ask: a + b (0..9 each), then + c (1..9) up to three times
local facts = {}
for x = 0, 36 do
  for c = 0, 9 do
    facts[#facts + 1] = cjson.encode({ prompt = ('%d + %d ='):format(x, c), completion = (' %d'):format(x + c) })
  end
end
write(files.join(out, 'train.jsonl'), train)
write(files.join(out, 'test.jsonl'), test)
write(files.join(out, 'facts.jsonl'), facts)

-- The models: the tokenizer and the template in a staging directory,
-- copied by save_pretrained next to the weights.
local tok_text = assert(files.read(TOKENIZER))
local tok = require('fsdp.data.bpe').load(TOKENIZER)
for family, tdir in pairs(TEMPLATES) do
  local stage = files.join(out, '.' .. family .. '-tokenizer')
  require('lfs').mkdir(stage)
  local f = assert(io.open(files.join(stage, 'tokenizer.json'), 'w'))
  f:write(tok_text)
  f:close()
  f = assert(io.open(files.join(stage, 'tokenizer_config.json'), 'w'))
  f:write(assert(files.read(files.join(tdir, 'tokenizer_config.json'))))
  f:close()
  local m = decoders.families[family].module
  local c = m.config('tiny', { dim = cfg.width, n_layers = cfg.layers, n_heads = 4, n_kv_heads = 2,
                               ffn_dim = math.ceil(cfg.width * 8 / 3 / 32) * 32, vocab_size = 768 })
  local model = m.build(c, { device = 'cpu' })
  model:init_weights({ seed = cfg.seed })
  local eos = tok:token_to_id('<|im_end|>')
  hf.save_pretrained(model, files.join(out, family), { tokenizer_from = stage,
    token_ids = { eos_token_id = eos, pad_token_id = tok:token_to_id('<|endoftext|>') } })
  os.remove(files.join(stage, 'tokenizer.json'))
  os.remove(files.join(stage, 'tokenizer_config.json'))
  os.remove(stage)
  print(('%s: %s, %d parameters, template of %s'):format(files.join(out, family), family, model:num_parameters(), tdir))
end
print(('%s: %d training and %d held-out conversations, %d facts'):format(out, #train, #test, #facts))
