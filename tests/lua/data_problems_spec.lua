-- data_problems_spec.lua: no silent data problems (issue 18 item 5). Each
-- problem is a warning or an error naming the file and the number, on the
-- paths that can meet it: token shards (tools/tokenize.lua, then
-- recipes/llama2_7b.lua --data=DIR), streamed raw corpora (--data=FILE)
-- and T5 pairs (fsdp.data.pairs). One case per problem; what other specs
-- already show is named where it is:
--   streamed corpora: an empty or tiny validation split (corpus_spec "in
--   the recipe"), invalid UTF-8 and over-long lines of every reader
--   format (corpus_spec "name the file and the offset"), ids past the
--   model's vocabulary from the tokenizer (corpus_spec "refuse ids");
--   token shards: an id past a shard's vocabulary (data_tokens_spec),
--   --train_spm smaller than asked (data_tokens_spec); T5 pairs: an empty
--   validation split and a tokenizer the vocabulary cannot hold
--   (t5_pairs_spec).
local T = require 'fsdp.testing'
local gen = require 'tests.data.corpus'
local pairs_data = require 'fsdp.data.pairs'

local tmp = T.tmpdir()
teardown(function() os.execute('rm -rf ' .. T.quote(tmp)) end)

local function write(path, s)
  local f = assert(io.open(path, 'wb'))
  f:write(s)
  f:close()
end

local function has(out, needle) assert.truthy(out:find(needle, 1, true), ('%q not in:\n%s'):format(needle, out)) end

local TINY = '--num_layers=1 --hidden_width=16 --num_heads=2 --seq_len=16 --batch_size=2 --max_steps=2 '
  .. '--warmup_steps=1 --validation_freq=2'

local function tokenize(args) return T.run_script('tools/tokenize.lua', args, 120) end
local function llama(args) return T.run_script('recipes/llama2_7b.lua', TINY .. ' ' .. args, 120) end

describe('no silent data problems', function()
  it('a trained SentencePiece vocabulary smaller than asked, and documents its trainer skips', function()
    local docs = gen.documents({ documents = 60 })
    docs[7] = string.rep('the cat sat on the mat. ', 200) -- 4800 bytes: past SentencePiece's 4192
    write(tmp .. '/spm.txt', table.concat(docs, '\n\n') .. '\n')
    local out, rc = tokenize(('--input=%s/spm.txt --output=%s/spm --train_spm=4000'):format(tmp, tmp))
    assert.equal(0, rc, out)
    has(out, ('warning: tools/tokenize.lua: --train_spm=4000, but %s/spm.txt supports only'):format(tmp))
    has(out, ('warning: tools/tokenize.lua: 1 of the 60 documents of %s/spm.txt are longer than 4192 bytes, which '
      .. "SentencePiece's trainer skips"):format(tmp))
  end)

  it('an empty or tiny validation split of token shards', function()
    gen.write(tmp .. '/c80.txt', { documents = 80 })
    -- 80 documents at --val_fraction=0.01: none held out, said at tokenize and at training
    local out, rc = tokenize(('--input=%s/c80.txt --output=%s/c80'):format(tmp, tmp))
    assert.equal(0, rc, out)
    has(out, 'warning: --val_fraction=0.01 of 80 documents puts none in the val split')
    out, rc = llama(('--data=%s/c80'):format(tmp))
    assert.equal(0, rc, out)
    has(out, ('warning: --data %s/c80 holds no val-NNNNN.safetensors shards'):format(tmp))
    -- 2 documents held out: fewer batches than --val_batches, and fewer tokens than one batch
    out, rc = tokenize(('--input=%s/c80.txt --output=%s/c80v --val_fraction=0.025'):format(tmp, tmp))
    assert.equal(0, rc, out)
    out, rc = llama(('--data=%s/c80v --val_batches=50'):format(tmp))
    assert.equal(0, rc, out)
    assert.truthy(out:find('warning: the val split of ' .. tmp .. '/c80v holds only %d+ of the 50 %-%-val_batches'),
      out)
    has(out, 'Validation at batch 2')
    out, rc = llama(('--data=%s/c80v --val_batch_size=64'):format(tmp))
    assert.equal(0, rc, out)
    has(out, 'are fewer than one global batch of 64')
    has(out, 'training without validation')
  end)

  it('documents longer than the reader\'s limits', function()
    write(tmp .. '/long.txt', 'short one\n\n' .. string.rep('word ', 40) .. '\nmore\n\nlast\n')
    write(tmp .. '/long.jsonl', '{"text": "short"}\n{"text": "' .. string.rep('word ', 40) .. '"}\n')
    -- tools/tokenize.lua: text files (read in Lua) and JSONL (the core's reader) alike
    local out, rc = tokenize(('--input=%s/long.txt --output=%s/l1 --max_doc_bytes=100'):format(tmp, tmp))
    assert.equal(1, rc, out)
    has(out, ('%s/long.txt: the paragraph from line 3 is longer than --max_doc_bytes=100 bytes'):format(tmp))
    out, rc = tokenize(('--input=%s/long.txt --output=%s/l2 --max_doc_bytes=100 --documents=line'):format(tmp, tmp))
    assert.equal(1, rc, out)
    has(out, ('%s/long.txt: line 3 is longer than --max_doc_bytes=100 bytes'):format(tmp))
    out, rc = tokenize(('--input=%s/long.jsonl --output=%s/l3 --max_doc_bytes=100'):format(tmp, tmp))
    assert.equal(1, rc, out)
    has(out, ('%s/long.jsonl: line 2 (byte 18) is longer than the reader\'s limit of 100 bytes'):format(tmp))
    -- streamed
    out, rc = llama(('--data=%s/long.jsonl --max_doc_bytes=100'):format(tmp))
    assert.is_not.equal(0, rc, out)
    has(out, ('%s/long.jsonl: line 2 (byte 18) is longer than the reader\'s limit of 100 bytes'):format(tmp))
    -- T5 pairs are cut to --source_len/--target_len: counted and said
    write(tmp .. '/p.jsonl', '{"source": "' .. string.rep('a', 30) .. '", "target": "b"}\n{"source": "c", "target": "d"}\n')
    local ds = pairs_data.open(tmp .. '/p.jsonl', { tokenizer = 'byte', source_len = 8, target_len = 8, batch_size = 1,
                                                   rank = 0, world_size = 1 })
    assert.same({ source = 1, target = 0 }, ds.truncated)
    out = T.capture_stdout(function()
      require('models.t5_pairs').describe({ train = ds, val = ds },
        { val_batches = 1, val_data = 'v', val_fraction = 0, validation_freq = 1, source_len = 8, target_len = 8 })
    end)
    has(out, ('data: %s/p.jsonl (train split): 1 of 2 sources longer than --source_len=8'):format(tmp))
  end)

  it('a compressed file of nothing but blank lines (a gzip bomb): refused at the document limit, not read for minutes', function()
    -- 64 MiB of newlines in ~64 KiB of gzip, then a document nobody reaches
    local p = assert(io.popen(('gzip -c > %s'):format(T.quote(tmp .. '/blank.jsonl.gz')), 'w'))
    local mib = string.rep('\n', 2 ^ 20)
    for _ = 1, 64 do p:write(mib) end
    p:write('{"text": "late"}\n')
    p:close()
    local t0 = require('fsdp.clock').now()
    local out, rc = llama(('--data=%s/blank.jsonl.gz --max_doc_bytes=1048576'):format(tmp))
    assert.is_not.equal(0, rc, out)
    has(out, ('%s/blank.jsonl.gz: more than 1048576 bytes of blank lines from line 1 (byte 0) without a document, '
      .. "past the reader's limit of 1048576 bytes"):format(tmp))
    assert.is_true(require('fsdp.clock').now() - t0 < 60, 'refused late')
    -- plain text paragraphs alike
    write(tmp .. '/blank.txt', string.rep('\n', 3000) .. 'late\n')
    out, rc = llama(('--data=%s/blank.txt --max_doc_bytes=1000'):format(tmp))
    assert.is_not.equal(0, rc, out)
    has(out, ('%s/blank.txt: more than 1000 bytes of blank lines from line 1 (byte 0)'):format(tmp))
  end)

  it('invalid UTF-8', function()
    write(tmp .. '/bad.txt', 'fine text\n\ncaf\xC3\xA9 ok\nbad \xC3( here\n')
    local out, rc = tokenize(('--input=%s/bad.txt --output=%s/u1'):format(tmp, tmp))
    assert.equal(1, rc, out)
    has(out, ('%s/bad.txt: line 4: invalid UTF-8 at byte 24'):format(tmp))
    out, rc = tokenize(('--input=%s/bad.txt --output=%s/u2 --documents=file'):format(tmp, tmp))
    assert.equal(1, rc, out)
    has(out, ('%s/bad.txt: line 4: invalid UTF-8 at byte 24'):format(tmp))
    -- streamed: the core's reader says the same
    out, rc = llama(('--data=%s/bad.txt'):format(tmp))
    assert.is_not.equal(0, rc, out)
    has(out, ('%s/bad.txt: line 4: invalid UTF-8 at byte 24'):format(tmp))
    -- T5 pairs: the field and its byte (an overlong form, and a surrogate)
    write(tmp .. '/bad.jsonl', '{"source": "ok", "target": "ok"}\n{"source": "x", "target": "ab\xC0\xAF"}\n'
      .. '{"source": "\xED\xA0\x80", "target": "t"}\n')
    T.raises(function() pairs_data.open(tmp .. '/bad.jsonl', { tokenizer = 'byte', source_len = 8, target_len = 8,
                                                               batch_size = 1 }) end,
      tmp .. '/bad.jsonl:2: field "target" is not valid UTF-8 (its byte 2)')
  end)

  it('ids beyond the model\'s vocabulary', function()
    gen.write(tmp .. '/v.txt', { documents = 40 })
    local out, rc = tokenize(('--input=%s/v.txt --output=%s/v --val_fraction=0.1'):format(tmp, tmp))
    assert.equal(0, rc, out)
    -- token shards and streamed text: the vocabulary comes from the data, a smaller one is refused
    out, rc = llama(('--data=%s/v --vocab_size=100'):format(tmp))
    assert.equal(2, rc, out)
    has(out, ('--vocab_size (100) is smaller than the vocabulary of --data %s/v (257)'):format(tmp))
    out, rc = llama(('--data=%s/v.txt --vocab_size=100'):format(tmp))
    assert.equal(2, rc, out)
    has(out, ('--vocab_size (100) is smaller than the vocabulary of --data %s/v.txt (257)'):format(tmp))
  end)
end)
