-- corpus_spec.lua: the raw corpus readers and the streaming loader
-- (fsdp.data.corpus over core/data). Every corpus is generated here: a
-- C4-like directory of .json.gz shards ({"text", "timestamp", "url"}
-- lines), JSONL, zstd and paragraph text. The readers give the same
-- documents in every format and name the file and offset of every broken
-- input; the stream gives the same rows for any number of threads, splits
-- disjoint parts by rank and train/val, follows the seed, and resumes at
-- exactly the next batch from a saved state (also inside a gzip file and
-- across epochs).
local fsdp = require 'fsdp'
local corpus = require 'fsdp.data.corpus'
local gen = require 'tests.data.corpus'
local testing = require 'fsdp.testing'
local byte = require('fsdp.data.byte_tokenizer').new()

local tmp = testing.tmpdir()
local raises = testing.raises

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

local function docs_of(spec, opts)
  local out = {}
  for text in corpus.documents(spec, opts) do out[#out + 1] = text end
  return out
end

local function stream(spec, opts)
  local o = { tokenizer = byte, seq_len = 16, batch_size = 2, rank = 0, world_size = 1, threads = 1 }
  for k, v in pairs(opts or {}) do o[k] = v end
  return corpus.open(spec, o)
end

-- n batches of a stream as one Lua string of their ids (easy to compare).
local function take(s, n)
  local out = {}
  for i = 1, n do
    local ids, targets = s:next()
    assert(ids:size(0) == s.batch_size and targets:size(1) == s.seq_len)
    out[i] = table.concat(ids:view({ -1 }):totable(), ',') .. '|' .. table.concat(targets:view({ -1 }):totable(), ',')
  end
  return table.concat(out, '\n')
end

-- Every token of a one-pass stream, as a Lua array (each row's first token
-- after the first row repeats the one before: it is dropped).
local function all_tokens(s)
  local out = {}
  local first = true
  while true do
    local rows = s:rows(4)
    if not rows then break end
    for _, row in ipairs(rows:totable()) do
      for j = first and 1 or 2, #row do out[#out + 1] = row[j] end
      first = false
    end
    if rows:size(0) < 4 then break end
  end
  return out
end

local c4 = tmp .. '/c4/en'
local c4_docs = gen.write_c4(c4, { shards = 4, documents = 40 })

describe('corpus readers', function()
  it('read the same documents from .jsonl, .jsonl.gz, .zst and a multi-member gzip', function()
    local docs = gen.write(tmp .. '/a.jsonl', { documents = 30, jsonl = true })
    assert.equal(0, os.execute(('gzip -kf %s/a.jsonl && zstd -qf %s/a.jsonl -o %s/a.jsonl.zst'):format(tmp, tmp, tmp)))
    for _, f in ipairs({ 'a.jsonl', 'a.jsonl.gz', 'a.jsonl.zst' }) do
      assert.same(docs, docs_of(tmp .. '/' .. f))
    end
    -- two gzip members back to back are one file (as `cat a.gz b.gz`)
    write(tmp .. '/two.json.gz', read(tmp .. '/a.jsonl.gz') .. read(tmp .. '/a.jsonl.gz'))
    assert.equal(60, #docs_of(tmp .. '/two.json.gz'))
  end)

  it('read paragraphs of a .txt file, with their line and byte positions', function()
    write(tmp .. '/p.txt', 'first para\nits second line\n\n\n  \nsecond para\r\n\nthird\n')
    local got = {}
    for text, pos in corpus.documents(tmp .. '/p.txt') do got[#got + 1] = { text, pos.index, pos.line, pos.offset } end
    assert.same({ { 'first para\nits second line', 0, 1, 0 }, { 'second para', 1, 6, 32 }, { 'third', 2, 8, 46 } }, got)
    local docs = gen.write(tmp .. '/c.txt', { documents = 25 })
    assert.same(docs, docs_of(tmp .. '/c.txt'))
  end)

  it('read a C4-like directory or glob in name order with --text_field', function()
    local files = corpus.files(c4)
    assert.equal(4, #files)
    assert.equal(c4 .. '/c4-train.00000-of-00004.json.gz', files[1])
    assert.same(files, corpus.files(c4 .. '/c4-train.*-of-00004.json.gz'))
    assert.same(c4_docs, docs_of(c4))
    assert.equal('https://example.com/0/1', docs_of(files[1], { text_field = 'url' })[1])
  end)

  it('name the file and the offset of broken input', function()
    local gz = read(c4 .. '/c4-train.00001-of-00004.json.gz')
    write(tmp .. '/trunc.json.gz', gz:sub(1, math.floor(#gz / 2)))
    raises(function() docs_of(tmp .. '/trunc.json.gz') end,
      tmp .. '/trunc.json.gz: truncated gzip stream: the file ends at compressed byte ' .. math.floor(#gz / 2))
    write(tmp .. '/bad.json.gz', gz:sub(1, 200) .. ('\255'):rep(64) .. gz:sub(265))
    raises(function() docs_of(tmp .. '/bad.json.gz') end, tmp .. '/bad.json.gz: corrupt gzip data at compressed byte')
    local zst = read(tmp .. '/a.jsonl.zst')
    write(tmp .. '/trunc.json.zst', zst:sub(1, #zst - 9))
    raises(function() docs_of(tmp .. '/trunc.json.zst') end, tmp .. '/trunc.json.zst: truncated zstd stream')
    write(tmp .. '/notgz.json.gz', '{"text": "plain"}\n')
    raises(function() docs_of(tmp .. '/notgz.json.gz') end, 'notgz.json.gz: corrupt gzip data at compressed byte 2: incorrect header check')

    write(tmp .. '/b.jsonl', '{"text": "ok"}\n\n[1, 2]\n')
    raises(function() docs_of(tmp .. '/b.jsonl') end,
      'b.jsonl: line 3 (byte 16) is not a JSON object (each line must be an object with a "text" field)')
    write(tmp .. '/b.jsonl', '{"text": "ok"}\n{"body": "no text"}\n')
    raises(function() docs_of(tmp .. '/b.jsonl') end,
      'b.jsonl: line 2 (byte 15) has no "text" field (the text field; --text_field names another)')
    write(tmp .. '/b.jsonl', '{"text": 12}\n')
    raises(function() docs_of(tmp .. '/b.jsonl') end, 'b.jsonl: line 1 (byte 0): field "text" is not a string')
    write(tmp .. '/b.jsonl', '{"text": "ok"}\n{"text": "cut\n')
    raises(function() docs_of(tmp .. '/b.jsonl') end, 'b.jsonl: line 2 (byte 15) is not valid JSON')
    write(tmp .. '/b.jsonl', '{"text": "ok"}\n{"text": "bad \192\175"}\n')
    raises(function() docs_of(tmp .. '/b.jsonl') end, 'b.jsonl: line 2: invalid UTF-8 at byte 29')
    write(tmp .. '/u.txt', 'fine\n\nab\255cd\n')
    raises(function() docs_of(tmp .. '/u.txt') end, 'u.txt: line 3: invalid UTF-8 at byte 8')
    write(tmp .. '/long.txt', 'short\n\n' .. ('x'):rep(300) .. '\n')
    raises(function() docs_of(tmp .. '/long.txt', { max_doc_bytes = 100 }) end,
      "long.txt: line 3 (byte 7) is longer than the reader's limit of 100 bytes (max_doc_bytes; --max_doc_bytes")
    write(tmp .. '/long.txt', ('y'):rep(60) .. '\n' .. ('y'):rep(60) .. '\n')
    raises(function() docs_of(tmp .. '/long.txt', { max_doc_bytes = 100 }) end,
      "long.txt: the paragraph from line 1 (byte 0) is longer than the reader's limit of 100 bytes")
    assert.equal(1, #docs_of(tmp .. '/long.txt', { max_doc_bytes = 130 }))

    raises(function() corpus.files(tmp .. '/none-*.json.gz') end, 'none-*.json.gz: no file matches the pattern')
    raises(function() corpus.files(tmp .. '/missing') end, 'missing: no such file or directory')
    write(tmp .. '/data.csv', 'a,b\n')
    raises(function() corpus.files(tmp .. '/data.csv') end,
      'data.csv: unknown corpus format (readers know .txt, .jsonl, .json, each optionally .gz or .zst)')
  end)
end)

describe('corpus streams', function()
  it('give the same rows with 1 and 3 threads and tiny queues', function()
    local a = take(stream(c4, { threads = 1 }), 40)
    assert.equal(a, take(stream(c4, { threads = 3 }), 40))
    assert.equal(a, take(stream(c4, { threads = 2, ahead_tokens = 7 }), 40))
  end)

  it('pack every document once, with eos after each', function()
    local s = stream(c4, { once = true, shuffle = false, threads = 2 })
    local toks = all_tokens(s)
    local want = {}
    for _, d in ipairs(c4_docs) do
      for i = 1, #d do want[#want + 1] = d:byte(i) end
      want[#want + 1] = 256
    end
    -- the last partial row is not delivered
    assert.is_true(#want - #toks < s.seq_len + 1)
    for i = 1, #toks do assert(toks[i] == want[i], i) end
  end)

  it('split ranks into disjoint parts by file (4 files) or by document (1 file)', function()
    for _, spec in ipairs({ c4, c4 .. '/c4-train.00002-of-00004.json.gz' }) do
      local total, eos = 0, 0
      for rank = 0, 1 do
        local toks = all_tokens(stream(spec, { once = true, rank = rank, world_size = 2, seq_len = 4 }))
        total = total + #toks
        for _, t in ipairs(toks) do if t == 256 then eos = eos + 1 end end
      end
      local docs = docs_of(spec)
      local n = 0
      for _, d in ipairs(docs) do n = n + #d + 1 end
      assert.is_true(n - total <= 2 * 5 and eos >= #docs - 2 and eos <= #docs)
    end
    -- a rank that gets no document at all says so instead of waiting forever
    write(tmp .. '/one.jsonl', '{"text": "only one"}\n')
    raises(function() stream(tmp .. '/one.jsonl', { rank = 1, world_size = 2 }):next() end,
      "one.jsonl: rank 1's part of the corpus holds no documents (1 files, documents by rank)")
  end)

  it('hold out validation documents by the tokenize rule, disjoint from training', function()
    -- document k of a file is held out when floor((k+1) f) > floor(k f): k = 9, 19, 29, 39 for f = 0.1
    local want = { val = {}, train = {} }
    for i, d in ipairs(c4_docs) do
      local k = (i - 1) % 40
      local part = want[(k % 10 == 9) and 'val' or 'train']
      for j = 1, #d do part[#part + 1] = d:byte(j) end
      part[#part + 1] = 256
    end
    for _, split in ipairs({ 'val', 'train' }) do
      local got = all_tokens(stream(c4, { once = true, split = split, val_fraction = 0.1, shuffle = false }))
      assert.is_true(#want[split] - #got <= 16 and #got > 0)
      for i = 1, #got do assert(got[i] == want[split][i], split .. ' token ' .. i) end
    end
    local v = stream(c4, { once = true, split = 'val', val_fraction = 0.001, batch_size = 1 })
    assert.equal(0, v:count_batches(4))
  end)

  it('follow the seed: the file order of each epoch is a permutation drawn from it', function()
    local function order(seed)
      local s = stream(c4, { seed = seed })
      local o = {}
      for p = 0, 7 do o[#o + 1] = s:file_name(p):match('c4%-train%.(%d+)') end
      return table.concat(o, ' ')
    end
    assert.equal(order(1), order(1))
    local seen = {}
    for seed = 1, 6 do
      local o = order(seed)
      seen[o] = true
      for _, epoch in ipairs({ o:sub(1, 23), o:sub(25) }) do
        local files = {}
        for f in epoch:gmatch('%d+') do files[#files + 1] = f end
        table.sort(files)
        assert.equal('00000 00001 00002 00003', table.concat(files, ' '))
      end
    end
    local n = 0
    for _ in pairs(seen) do n = n + 1 end
    assert.is_true(n >= 4)
    assert.equal('00000 00001 00002 00003 00000 00001 00002 00003', (function()
      local s = stream(c4, { shuffle = false })
      local o = {}
      for p = 0, 7 do o[#o + 1] = s:file_name(p):match('c4%-train%.(%d+)') end
      return table.concat(o, ' ')
    end)())
  end)

  it('resume at exactly the next batch, inside gzip files and across epochs', function()
    for _, cfg in ipairs({ { threads = 1, n = 7 }, { threads = 2, n = 130 }, { threads = 1, n = 700 } }) do
      local s = stream(c4, { threads = cfg.threads, batch_size = 3 })
      take(s, cfg.n)
      local st = s:state()
      local want = take(s, 20)
      local r = stream(c4, { threads = 2, batch_size = 3 })
      r:load_state(st)
      assert.equal(want, take(r, 20))
      if cfg.n == 700 then assert.is_true(st.epoch >= 1) end
    end
    local s = stream(c4, {})
    local st = s:state()
    st.seed = 5
    raises(function() s:load_state(st) end, 'the saved position is for seed = 5, this stream has 0')
  end)

  it('stream through the tokenizer.json BPE and the SentencePiece model: the ids of their encode', function()
    local tokenizer = require 'fsdp.data.tokenizer'
    for _, file in ipairs({ 'tests/golden/tokenizers/gpt2_style.json', 'tests/golden/tokenizers/spm.model' }) do
      local tok = tokenizer.load(file)
      local want = {}
      for _, ids in ipairs(tok:encode(c4_docs)) do
        for _, id in ipairs(ids:totable()) do want[#want + 1] = id end
        want[#want + 1] = tok.eos_id
      end
      local got = all_tokens(stream(c4, { tokenizer = tok, once = true, shuffle = false, threads = 2 }))
      assert.is_true(#got > 0.9 * #want and #got <= #want, file)
      for i = 1, #got do assert(got[i] == want[i], file .. ': token ' .. i) end
    end
  end)

  it('refuse ids beyond the model vocabulary, naming the file and the line', function()
    write(tmp .. '/v.jsonl', '{"text": "abc"}\n{"text": "ab~"}\n')
    -- the byte ids of a tokenizer that claims a vocabulary of 100
    local small = { vocab_size = 100, eos_id = 0, name = 'small', c_hook = byte.c_hook }
    raises(function() stream(tmp .. '/v.jsonl', { tokenizer = small }):next() end,
      "v.jsonl: line 2: the tokenizer gave id 126, outside the model's vocabulary of 100")
  end)

  it('raise a broken file when the stream reaches it, naming it', function()
    local dir = tmp .. '/broken'
    assert.equal(0, os.execute(('mkdir -p %s && cp %s/c4-train.00000-of-00004.json.gz %s/'):format(dir, c4, dir)))
    local gz = read(c4 .. '/c4-train.00001-of-00004.json.gz')
    write(dir .. '/c4-train.00001-of-00004.json.gz', gz:sub(1, #gz - 30))
    raises(function()
      local s = stream(dir, { shuffle = false, threads = 2 })
      for _ = 1, 1000 do s:next() end
    end, dir .. '/c4-train.00001-of-00004.json.gz: truncated gzip stream')
  end)

  it('feed tools/tokenize.lua: C4 .json.gz shards become token shards', function()
    local files = corpus.files(c4)
    local out, rc = testing.run_script('tools/tokenize.lua', ('--input=%s,%s --output=%s/tok --val_fraction=0'):format(
      files[1], files[2], tmp), 60)
    assert.equal(0, rc, out)
    local ds = require('fsdp.data.tokens').open(tmp .. '/tok', { seq_len = 8, batch_size = 1 })
    local n = 0
    for i = 1, 80 do n = n + #c4_docs[i] + 1 end
    assert.equal(n, ds.num_tokens)
    write(tmp .. '/t.txt', 'a\n\nb\n')
    assert.equal(0, os.execute(('gzip -f %s/t.txt'):format(tmp)))
    out, rc = testing.run_script('tools/tokenize.lua', ('--input=%s/t.txt.gz --output=%s/tok2 --documents=line'):format(
      tmp, tmp), 60)
    assert.equal(1, rc)
    assert.truthy(out:find('t.txt.gz: a compressed text file is read by paragraph (--documents=paragraph)', 1, true), out)
  end)

  it('in the recipe: an 80-document corpus warns that its validation split is empty', function()
    gen.write(tmp .. '/small.jsonl', { documents = 80, jsonl = true })
    local out, rc = testing.run_script('recipes/llama2_7b.lua', ('--data=%s/small.jsonl --num_layers=1 '
      .. '--hidden_width=16 --num_heads=2 --seq_len=16 --batch_size=2 --max_steps=2 --warmup_steps=1 '
      .. '--validation_freq=1'):format(tmp), 60)
    assert.equal(0, rc, out)
    assert.truthy(out:find(('warning: the validation split of --data %s/small.jsonl (--val_fraction 0.01 of each '
      .. "file's documents) holds no whole validation batch (2 sequences of 16 tokens); training without "
      .. 'validation'):format(tmp), 1, true), out)
    assert.truthy(out:find('streamed, no validation split', 1, true), out)
    out, rc = testing.run_script('recipes/llama2_7b.lua', ('--data=%s/small.jsonl --num_layers=1 '
      .. '--hidden_width=16 --num_heads=2 --seq_len=16 --batch_size=2 --max_steps=2 --warmup_steps=1 '
      .. '--validation_freq=1 --val_fraction=0.1 --val_batches=50'):format(tmp), 60)
    assert.equal(0, rc, out)
    assert.truthy(out:find('holds only %d+ of the 50 %-%-val_batches asked; validating on those'), out)
    assert.truthy(out:find('Validation at batch 2', 1, true), out)
  end)
end)
