-- tests/fuzz/seeds.lua OUTDIR: the fuzzers' seed corpora, made by the
-- project's own writers so the fuzzer starts from files it really reads:
--   OUTDIR/safetensors/  files of every dtype, metadata, empty and 0-d
--                        tensors, a misaligned header (st.save, and one
--                        assembled by hand)
--   OUTDIR/tokens/       token shards (fsdp.data.tokens.write_shard)
--   OUTDIR/corpus/       raw corpus files without their names' suffixes
--                        (targets/corpus.lua picks the reader from the
--                        first bytes): JSON lines plain, gzip and zstd,
--                        text paragraphs
--   OUTDIR/index/        the index.json of a small sharded checkpoint
--                        (fsdp.checkpointing.save), and the rank files it
--                        wrote also go to safetensors/
--   OUTDIR/tokenizer/    the test tokenizer.json files (tests/golden/tokenizers:
--                        GPT-2, Llama 3 and Qwen2 style, made by the tokenizers package)
--   OUTDIR/position/     saved data positions (JSON, as a checkpoint's index
--                        holds them) of a stream over the data of
--                        tests/fuzz/position_data.lua, written here under
--                        $FUZZ_WORKDIR/position as the target writes it
--   OUTDIR/config/       the stored goldens' config.json (Llama 2 and 3, GPT-2,
--                        T5; transformers 4 and 5) and adapter_config.json files
-- Run by tests/fuzz/run.sh: build/bin/fsdp-lua tests/fuzz/seeds.lua OUTDIR.
local fsdp = require 'fsdp'
local st = require 'fsdp.io.safetensors'
local tokens = require 'fsdp.data.tokens'
local files = require 'fsdp.io.files'

local out = assert(arg[1], 'usage: fsdp-lua tests/fuzz/seeds.lua OUTDIR')
for _, sub in ipairs({ 'safetensors', 'tokens', 'index', 'tokenizer', 'corpus', 'position', 'config' }) do files.mkdir_p(files.join(out, sub)) end
local function at(sub, name) return files.join(files.join(out, sub), name) end

-- safetensors ------------------------------------------------------------------------

local dtypes = { 'f64', 'f32', 'bf16', 'f16', 'i64', 'i32', 'u8', 'bool' }
for i, dt in ipairs(dtypes) do
  local t = fsdp.randn({ 2, 3 }, { seed = i }):mul(10):to(dt)
  st.save(at('safetensors', dt .. '.safetensors'), { weight = t, bias = fsdp.zeros({ 3 }):to(dt) },
    { format = 'pt', dtype = dt })
end
st.save(at('safetensors', 'shapes.safetensors'), {
  { 'scalar', fsdp.tensor(3.5) }, { 'empty', fsdp.zeros({ 0, 4 }) }, { 'row', fsdp.ones({ 1, 5 }) },
  { 'cube', fsdp.arange(0, 24):view({ 2, 3, 4 }):to('f32') } })
local many = {}
for i = 1, 40 do many[#many + 1] = { ('layers.%d.weight'):format(i), fsdp.full({ 2 }, i) } end
st.save(at('safetensors', 'many.safetensors'), many, { note = 'forty tensors' })

-- A header whose length is not a multiple of 8: data misaligned, read by copy.
local header = '{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"a":"b"}}'
local n, len = #header, ''
for _ = 1, 8 do
  len = len .. string.char(n % 256)
  n = math.floor(n / 256)
end
local f = assert(io.open(at('safetensors', 'misaligned.safetensors'), 'wb'))
f:write(len .. header .. string.rep('\0', 8))
f:close()

-- token shards -----------------------------------------------------------------------

tokens.write_shard(at('tokens', 'u16.safetensors'), fsdp.arange(0, 64, { dtype = 'i64' }),
  { vocab_size = 100, eos_id = 99, documents = 3, tokenizer = 'byte' })
tokens.write_shard(at('tokens', 'u32.safetensors'), fsdp.arange(0, 40, { dtype = 'i64' }),
  { vocab_size = 70000, eos_id = 0, documents = 1 })
tokens.write_shard(at('tokens', 'short.safetensors'), fsdp.arange(0, 9, { dtype = 'i64' }),
  { vocab_size = 16, eos_id = 15 })

-- raw corpus files --------------------------------------------------------------------

local c4 = '{"text":"The cat chases a bird. \\u00e9t\\u00e9","timestamp":"2019-04-25T12:00:00Z","url":"https://x/1"}\n'
  .. '{"text":"My brother reads\\nold books.","url":"https://x/2"}\n\n{"text":"caf\u{e9} \u{1F600}"}\n'
local f = assert(io.open(at('corpus', 'c4'), 'wb'))
f:write(c4)
f:close()
f = assert(io.open(at('corpus', 'paragraphs'), 'wb'))
f:write('First paragraph,\nits second line.\n\n\nSecond one \u{e9}.\r\n\nthird\n')
f:close()
assert(os.execute(('gzip -c %q > %q && zstd -q -c %q > %q'):format(at('corpus', 'c4'), at('corpus', 'c4_gz'),
  at('corpus', 'c4'), at('corpus', 'c4_zst'))) == 0)

-- a sharded checkpoint's index ---------------------------------------------------------

local llama = require 'models.llama'
local ckpt = require 'fsdp.checkpointing'
local optim = require 'fsdp.optim'
local cfg = { dim = 16, n_layers = 2, n_heads = 2, n_kv_heads = 1, ffn_dim = 32, vocab_size = 32, max_seq_len = 8 }
local m = llama.CausalLM(llama.config('Llama-2-7b', cfg), { device = 'meta' })
fsdp.shard(m, { policy = fsdp.policy.transformer { llama.DecoderLayer }, seed = 1 })
local opt = optim.AdamW(m:named_parameters(), { lr = 1e-3 })
local dir = os.tmpname()
os.remove(dir)
local step_dir = ckpt.save(dir, { model = m, optimizer = opt, step = 1 })
for _, name in ipairs(files.list(step_dir)) do
  local src = files.join(step_dir, name)
  local dst = name == 'index.json' and at('index', 'index.json') or at('safetensors', 'ckpt-' .. name)
  if files.mode(src) == 'file' and (name == 'index.json' or name:match('%.safetensors$')) then files.write_atomic(dst, assert(files.read(src))) end
end
files.remove_tree(dir)
print(('seeds written to %s'):format(out))

-- tokenizer.json ----------------------------------------------------------------------

for _, name in ipairs({ 'gpt2_style.json', 'llama3_style.json', 'qwen2_style.json' }) do
  files.write_atomic(at('tokenizer', name), assert(files.read('tests/golden/tokenizers/' .. name)))
end

-- config.json and adapter_config.json ---------------------------------------------------

for _, d in ipairs({ 'llama2_tiny', 'llama3_tiny', 'llama3_tiny_v5', 'gpt2_tiny', 't5_v1_1_tiny', 't5_v1_1_tiny_v5' }) do
  files.write_atomic(at('config', d .. '.json'), assert(files.read('tests/golden/hf/' .. d .. '/config.json')))
end
for _, d in ipairs({ 'llama', 'peft_llama', 'gpt2', 't5' }) do
  files.write_atomic(at('config', 'adapter_' .. d .. '.json'),
    assert(files.read('tests/golden/hf/lora/' .. d .. '/adapter_config.json')))
end
-- saved data positions -------------------------------------------------------------------

local position_data = dofile('tests/fuzz/position_data.lua')
local pdir = (os.getenv('FUZZ_WORKDIR') or '/tmp') .. '/position'
position_data.write(pdir)
local json = require 'fsdp.io.json'
local byte = require('fsdp.data.byte_tokenizer').new()
local corpus = require 'fsdp.data.corpus'
local function position(name, st, prefix)
  files.write_atomic(at('position', name), (prefix or '') .. json.encode(st))
end
local s = corpus.open(pdir .. '/corpus', position_data.stream_opts(byte, 'stop'))
s:rows(3)
local early = s:state()
position('early.json', early)
position('early_continue.json', early, ' ')
s:rows(30)
position('in_gzip.json', s:state())
local rank1 = s:state()
rank1.files = nil
position('no_list.json', rank1)
local old = s:state()
old.before, old.through, old.files, old.num_files, old.names_digest = nil, nil, nil, nil, nil
position('old.json', old)
local ds = tokens.open(pdir .. '/shards', position_data.token_opts('stop'))
ds:next()
position('tokens.json', ds:state())
