-- data_tokens_spec.lua: token shards end to end. tools/tokenize.lua turns a
-- generated corpus into shards with the byte-level and the SentencePiece
-- tokenizers; the dataset packs them into sequences across documents and
-- shards, shuffles deterministically, gives each rank a distinct part,
-- resumes at exactly the next batch, and names broken files; and a small
-- Llama trained from each tokenizer's shards lowers its validation loss.
local fsdp = require 'fsdp'
local host = require 'fsdp.host'
local tokens = require 'fsdp.data.tokens'
local Sampler = require 'fsdp.data.sampler'
local corpus = require 'tests.data.corpus'
local spm = require 'fsdp.data.sentencepiece'

local tmpdir = require('fsdp.testing').tmpdir

local sh = require('fsdp.testing').sh

local function tokenize(args)
  return sh(('timeout 60 %s tools/tokenize.lua %s'):format(host.exe, args))
end

local function write(path, s)
  local f = assert(io.open(path, 'wb'))
  f:write(s)
  f:close()
end

local function read(path)
  local f = assert(io.open(path, 'rb'))
  local s = f:read('*a')
  f:close()
  return s
end

-- A shard whose tokens are 0, 1, 2, ... (n of them, offset by `from`).
local function arange_shard(path, from, n, vocab)
  tokens.write_shard(path, fsdp.arange(from, from + n, { dtype = 'i64' }),
    { vocab_size = vocab or 65536, eos_id = 0, documents = 1, tokenizer = 'test' })
end

local dir = tmpdir()
local text = dir .. '/corpus.txt'
local docs = corpus.write(text, { documents = 300, seed = 7 })
corpus.write(dir .. '/corpus.jsonl', { documents = 300, seed = 7, jsonl = true, field = 'body' })

describe('tools/tokenize.lua', function()
  it('writes byte-level shards: documents followed by EOS, a val split of every tenth document', function()
    local out, rc = tokenize(('--input=%s --output=%s/byte --tokenizer=byte --val_fraction=0.1'):format(text, dir))
    assert.equals(0, rc, out)
    assert.matches('train: 270 documents', out, 1, true)
    assert.matches('val: 30 documents', out, 1, true)
    local train = tokens.open(dir .. '/byte', { seq_len = 8, batch_size = 1 })
    assert.equals(257, train.vocab_size)
    assert.equals(256, train.eos_id)
    local tok = require('fsdp.data.byte_tokenizer').new()
    -- documents 1..9 are train, the 10th val: the stream starts with doc 1, EOS, doc 2
    local n = #docs[1] + 1 + #docs[2]
    local stream = fsdp.empty({ n }, { dtype = 'i64' })
    train:_copy(stream, 0, n)
    assert.equals(docs[1] .. '\n' .. docs[2], tok:decode(stream))
    local val = tokens.open(dir .. '/byte', { split = 'val', seq_len = 8, batch_size = 1 })
    local first = fsdp.empty({ #docs[10] }, { dtype = 'i64' })
    val:_copy(first, 0, #docs[10])
    assert.equals(docs[10], tok:decode(first))
    local bytes = 0
    for i = 1, 300 do bytes = bytes + #docs[i] + 1 end
    assert.equals(bytes, train.num_tokens + val.num_tokens)
  end)

  it('warns when --val_fraction puts no document in the val split (80 documents at the default 0.01)', function()
    local small = dir .. '/small.txt'
    corpus.write(small, { documents = 80, seed = 3 })
    local out, rc = tokenize(('--input=%s --output=%s/small --tokenizer=byte'):format(small, dir))
    assert.equals(0, rc, out)
    assert.matches('val: 0 documents', out, 1, true)
    assert.matches('warning: --val_fraction=0.01 of 80 documents puts none in the val split, so training on '
      .. dir .. '/small validates on nothing; use --val_fraction=0.0125 or more', out, 1, true)
    out, rc = tokenize(('--input=%s --output=%s/small2 --tokenizer=byte --val_fraction=0.0125'):format(small, dir))
    assert.equals(0, rc, out)
    assert.matches('val: 1 documents', out, 1, true)
    assert.is_nil(out:find('warning', 1, true))
  end)

  it('trains and applies a SentencePiece model on JSONL input', function()
    local out, rc = tokenize(('--input=%s/corpus.jsonl --text_field=body --output=%s/spm --train_spm=160 '
      .. '--val_fraction=0.1'):format(dir, dir))
    assert.equals(0, rc, out)
    local tok = spm.load(dir .. '/spm/tokenizer.model')
    assert.is_true(tok.vocab_size > 50 and tok.vocab_size <= 160, 'vocab ' .. tok.vocab_size)
    assert.equals(2, tok.eos_id)
    local train = tokens.open(dir .. '/spm', { seq_len = 8, batch_size = 1 })
    assert.equals(tok.vocab_size, train.vocab_size)
    -- subwords: fewer tokens than bytes, and the first document decodes back
    local ids = tok:encode({ docs[1] })[1]
    assert.is_true(ids:numel() < 0.7 * #docs[1], ids:numel() .. " tokens for " .. #docs[1] .. " bytes")
    local stream = fsdp.empty({ ids:numel() + 1 }, { dtype = 'i64' })
    train:_copy(stream, 0, ids:numel() + 1)
    assert.same(ids:tolist(), stream:narrow(0, 0, ids:numel()):tolist())
    assert.equals(2, stream:get(ids:numel()))
    assert.equals(docs[1], tok:decode(stream:narrow(0, 0, ids:numel())))
  end)

  it('applies a tokenizer.json byte-level BPE and copies it beside the shards', function()
    local json = 'tests/golden/tokenizers/gpt2_style.json'
    local out, rc = tokenize(('--input=%s --output=%s/bpe --tokenizer=%s --val_fraction=0.1'):format(text, dir, json))
    assert.equals(0, rc, out)
    local tok = require('fsdp.data.tokenizer').load(dir .. '/bpe/tokenizer.json')
    local train = tokens.open(dir .. '/bpe', { seq_len = 8, batch_size = 1 })
    assert.equals(tok.vocab_size, train.vocab_size)
    assert.equals(tok:token_to_id('<|endoftext|>'), train.eos_id)
    assert.equals('bpe', train.tokenizer)
    local ids = tok:encode({ docs[1] })[1]
    local stream = fsdp.empty({ ids:numel() + 1 }, { dtype = 'i64' })
    train:_copy(stream, 0, ids:numel() + 1)
    assert.same(ids:tolist(), stream:narrow(0, 0, ids:numel()):tolist())
    assert.equals(train.eos_id, stream:get(ids:numel()))
    assert.equals(docs[1], tok:decode(stream:narrow(0, 0, ids:numel())))
  end)

  it('warns when the corpus supports fewer SentencePiece pieces than --train_spm asks', function()
    local small = dir .. '/small.txt'
    write(small, 'a tiny corpus\n\nof two documents\n')
    local out, rc = tokenize(('--input=%s --output=%s/small --train_spm=4000 --val_fraction=0'):format(small, dir))
    assert.equals(0, rc, out)
    local pieces = spm.load(dir .. '/small/tokenizer.model').vocab_size
    assert.is_true(pieces < 4000)
    assert.matches(('warning: tools/tokenize.lua: --train_spm=4000, but %s supports only %d pieces'):format(small,
      pieces), out, 1, true)
  end)

  it('names bad input', function()
    local out, rc = tokenize(('--input=%s/none.txt --output=%s/x'):format(dir, dir))
    assert.equals(1, rc)
    assert.matches('cannot open input ' .. dir .. '/none.txt', out, 1, true)
    write(dir .. '/bad.jsonl', '{"text": "fine"}\n{"text": broken\n')
    out, rc = tokenize(('--input=%s/bad.jsonl --output=%s/x'):format(dir, dir))
    assert.equals(1, rc)
    assert.matches('bad.jsonl: line 2 (byte 17) is not valid JSON', out, 1, true)
    out, rc = tokenize(('--input=%s/corpus.jsonl --output=%s/x'):format(dir, dir))
    assert.equals(1, rc)
    assert.matches('corpus.jsonl: line 1 (byte 0) has no "text" field (the text field; --text_field names another)',
      out, 1, true)
    out, rc = tokenize(('--input=%s --output=%s/x --tokenizer=%s/none.model'):format(text, dir, dir))
    assert.equals(1, rc)
    assert.matches('none.model', out, 1, true)
  end)
end)

describe('token datasets', function()
  it('pack the stream across shard boundaries, sequences sharing one token', function()
    local d = tmpdir()
    arange_shard(d .. '/train-00000.safetensors', 0, 10)
    arange_shard(d .. '/train-00001.safetensors', 10, 7)
    local ds = tokens.open(d, { seq_len = 4, batch_size = 1, shuffle = false })
    assert.equals(17, ds.num_tokens)
    assert.equals(4, ds.num_sequences) -- floor((17 - 1) / 4)
    local seen = {}
    for k = 1, 4 do
      local ids, targets = ds:next()
      seen[k] = ids:tolist()[1]
      assert.same({ 4 * k - 3, 4 * k - 2, 4 * k - 1, 4 * k }, targets:tolist()[1])
    end
    assert.same({ { 0, 1, 2, 3 }, { 4, 5, 6, 7 }, { 8, 9, 10, 11 }, { 12, 13, 14, 15 } }, seen)
    assert.equals('i64', ds:next().dtype) -- wraps into epoch 1
    assert.equals(1, ds:epoch())
  end)

  it('use u32 past 65536 tokens of vocabulary', function()
    local d = tmpdir()
    tokens.write_shard(d .. '/train-00000.safetensors', fsdp.tensor({ 5, 70000, 128255, 3 }, { dtype = 'i64' }),
      { vocab_size = 128256, eos_id = 3 })
    local ds = tokens.open(d, { seq_len = 3, batch_size = 1 })
    assert.equals('u32', ds.shards[1].dtype)
    assert.same({ { 5, 70000, 128255 } }, ds:next():tolist())
  end)

  it('shuffle deterministically: a permutation per epoch from (seed, epoch) only', function()
    local function order(seed, n)
      local s = Sampler.new({ n = n, batch_size = 1, seed = seed, rank = 0, world_size = 1 })
      local out = {}
      for k = 1, 2 * n do out[k] = s:next()[1] end
      return out
    end
    local a, b, c = order(1, 50), order(1, 50), order(2, 50)
    assert.same(a, b)
    assert.are_not.same(a, c)
    for e = 0, 1 do
      local seen, count = {}, 0
      for k = 1, 50 do
        local i = a[e * 50 + k]
        assert.is_nil(seen[i])
        seen[i], count = true, count + 1
      end
      assert.equals(50, count)
    end
    assert.are_not.same({ unpack(a, 1, 50) }, { unpack(a, 51, 100) }) -- a new order each epoch
    local sorted = { unpack(a, 1, 50) }
    table.sort(sorted)
    assert.equals(0, sorted[1]); assert.equals(49, sorted[50])
  end)

  it('give each rank a distinct part: 2 ranks of batch 3 read one rank of batch 6', function()
    local d = tmpdir()
    arange_shard(d .. '/train-00000.safetensors', 0, 401)
    local one = tokens.open(d, { seq_len = 4, batch_size = 6, seed = 5, rank = 0, world_size = 1 })
    local r0 = tokens.open(d, { seq_len = 4, batch_size = 3, seed = 5, rank = 0, world_size = 2 })
    local r1 = tokens.open(d, { seq_len = 4, batch_size = 3, seed = 5, rank = 1, world_size = 2 })
    for _ = 1, 20 do -- 100 sequences, 16 steps per epoch: crosses an epoch
      local whole = one:next():tolist()
      local a, b = r0:next():tolist(), r1:next():tolist()
      assert.same(whole, { a[1], a[2], a[3], b[1], b[2], b[3] })
    end
  end)

  it('resume at exactly the next batch from state()', function()
    local d = tmpdir()
    arange_shard(d .. '/train-00000.safetensors', 0, 81)
    local opts = { seq_len = 4, batch_size = 3, seed = 9, rank = 0, world_size = 1 }
    local ds = tokens.open(d, opts)
    for _ = 1, 5 do ds:next() end
    local saved = ds:state()
    -- the state is a plain table of numbers and strings (checkpoints store
    -- it), and on rank 0 the list of shards it stands on: {path, size, fingerprint}
    for k, v in pairs(saved) do
      if k == 'shards' then
        assert.same({ { d .. '/train-00000.safetensors', require('lfs').attributes(d .. '/train-00000.safetensors', 'size'),
                        saved.shards[1][3] } }, v)
        assert.truthy(v[1][3]:match('^xxh3%-64:%x+$'))
      else
        assert.is_true(type(v) == 'number' or type(v) == 'string', k)
      end
    end
    local want = {}
    for k = 1, 8 do want[k] = ds:next():tolist() end -- 6 steps per epoch: crosses into epoch 2
    local fresh = tokens.open(d, opts)
    fresh:load_state(saved)
    for k = 1, 8 do assert.same(want[k], fresh:next():tolist()) end
    assert.equals(ds:epoch(), fresh:epoch())
    -- a different dataset or option is refused
    local other = tokens.open(d, { seq_len = 5, batch_size = 3, seed = 9, rank = 0, world_size = 1 })
    assert.error_matches(function() other:load_state(saved) end, 'saved position is for 20 sequences of 4 tokens')
    assert.error_matches(function() fresh:load_state({ kind = 'synthetic', step = 1 }) end,
      'expects a state from a token dataset, got a table of kind synthetic')
  end)

  it('validate on the same batches every time, in order', function()
    local d = tmpdir()
    arange_shard(d .. '/val-00000.safetensors', 0, 41)
    local val = tokens.open(d, { split = 'val', seq_len = 4, batch_size = 2, shuffle = false, rank = 1, world_size = 2 })
    local got = {}
    for ids in val:batches(10) do got[#got + 1] = ids:get(0, 0) end
    assert.same({ 8, 24 }, got) -- 10 sequences, 2 global batches of 4; rank 1 takes sequences 2-3, 6-7
  end)

  it('name missing, truncated, corrupt and foreign files', function()
    local d = tmpdir()
    assert.error_matches(function() tokens.open(d .. '/nope', { seq_len = 4, batch_size = 1 }) end,
      'fsdp.data.tokens: ' .. d:gsub('%p', '%%%0') .. '/nope: ')
    assert.error_matches(function() tokens.open(d, { seq_len = 4, batch_size = 1 }) end,
      'holds no train%-NNNNN.safetensors shards')
    local good = d .. '/train-00000.safetensors'
    arange_shard(good, 0, 100)
    local bytes = read(good)
    write(good, bytes:sub(1, #bytes - 10))
    assert.error_matches(function() tokens.open(d, { seq_len = 4, batch_size = 1 }) end,
      'not a readable token shard: .*train%-00000.safetensors: tensor .tokens.: data_offsets %[0, 200%] run past the end')
    write(good, 'garbage that is not a safetensors header at all')
    assert.error_matches(function() tokens.open(d, { seq_len = 4, batch_size = 1 }) end,
      'not a readable token shard: .*train%-00000.safetensors')
    fsdp.save_safetensors(good, { tokens = fsdp.zeros({ 10 }, { dtype = 'u16' }) })
    assert.error_matches(function() tokens.open(d, { seq_len = 4, batch_size = 1 }) end,
      'a safetensors file but not a token shard')
    -- ids past the vocabulary: caught when a batch holds them
    tokens.write_shard(good, fsdp.tensor({ 1, 2, 300, 4, 5 }, { dtype = 'i64' }), { vocab_size = 1000, eos_id = 0 })
    local meta = read(good):gsub('"vocab_size":"1000"', '"vocab_size":"0100"')
    write(good, meta)
    local ds = tokens.open(d, { seq_len = 4, batch_size = 1, shuffle = false })
    assert.error_matches(function() ds:next() end, 'holds token id 300, outside its vocabulary of 100')
    -- shards that disagree
    arange_shard(good, 0, 100)
    arange_shard(d .. '/train-00001.safetensors', 0, 100, 512)
    assert.error_matches(function() tokens.open(d, { seq_len = 4, batch_size = 1 }) end,
      'train%-00001.safetensors %(u16, vocab 512, eos 0%) does not match')
    -- too little data for one global batch
    os.remove(d .. '/train-00001.safetensors')
    assert.error_matches(function() tokens.open(d, { seq_len = 4, batch_size = 13, world_size = 2, rank = 0 }) end,
      '24 examples are fewer than one global batch of 26 %(batch_size 13 x 2 ranks%)')
  end)
end)

describe('a small Llama trained on tokenizer shards', function()
  local function train(data, extra)
    return sh(('timeout 60 %s recipes/llama2_7b.lua --data=%s --num_layers=1 --hidden_width=64 --num_heads=2 '
      .. '--seq_len=32 --batch_size=8 --max_steps=40 --lr=3e-3 --warmup_steps=5 --validation_freq=10 '
      .. '--val_batches=4 --log_every=10 %s'):format(host.exe, data, extra or ''))
  end
  local function val_losses(out)
    local v = {}
    for loss in out:gmatch('Validation at batch %d+: loss ([%d.]+)') do v[#v + 1] = tonumber(loss) end
    return v
  end

  -- the BPE run also names its tokenizer (--tokenizer, checked against the shards)
  for _, case in ipairs({ { 'byte', 'byte' }, { 'SentencePiece', 'spm' },
                          { 'byte-level BPE', 'bpe', '--tokenizer=' .. dir .. '/bpe/tokenizer.json' } }) do
    it('lowers its validation loss (' .. case[1] .. ' tokens)', function()
      local out, rc = train(dir .. '/' .. case[2], case[3])
      assert.equals(0, rc, out)
      local v = val_losses(out)
      assert.equals(4, #v, out)
      assert.is_true(v[4] < v[1] - 0.5 and v[2] < v[1] and v[4] < v[2], out)
    end)
  end
end)
