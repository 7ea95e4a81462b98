-- tokenizer_spec.lua: the in-process tokenizers against the reference
-- packages. tests/golden/make_tokenizer_goldens.py trained GPT-2, Llama 3
-- and Qwen2 style byte-level BPEs (tokenizers) and a SentencePiece model
-- (sentencepiece) and stored their ids and decoded texts for a corpus of
-- hard cases (unicode, emoji, numbers, whitespace runs, special and added
-- tokens, a 300-byte and a 1000-letter word, a word only ignore_merges
-- finds, composed and decomposed characters for a Qwen2 style file behind
-- an NFC normalizer); encode and decode must equal them exactly. Also: loading by directory, refusals that
-- name the file and the field, and errors on bad ids.
local cjson = require 'cjson'
local tokenizer = require 'fsdp.data.tokenizer'
local bpe = require 'fsdp.data.bpe'

local DIR = 'tests/golden/tokenizers'
local T = require 'fsdp.testing'

-- Temporary directories, removed when the spec ends.
local made = {}
local function tmpdir()
  made[#made + 1] = T.tmpdir()
  return made[#made]
end
teardown(function()
  for _, d in ipairs(made) do os.execute('rm -rf ' .. T.quote(d)) end
end)

local function read(path)
  local f = assert(io.open(path, 'rb'))
  local s = f:read('*a')
  f:close()
  return s
end

local function write(path, s)
  local f = assert(io.open(path, 'wb'))
  f:write(s)
  f:close()
end

local goldens = cjson.decode(read(DIR .. '/goldens.json'))

local function first_half(ids)
  local h = {}
  for k = 1, math.floor(#ids / 2) do h[k] = ids[k] end
  return h
end

-- The must-show count: every text of the corpus is compared (a difference
-- does not stop the comparison), the line "NAME: N texts, 0 differences"
-- is printed, and any difference fails naming the first one.
local function report(name, n, diffs, first)
  io.stdout:write(('# %s: %d texts, %d differences\n'):format(name, n, diffs))
  assert.equals(0, diffs, first)
  return n
end

local function differs(a, b) return cjson.encode(a) ~= cjson.encode(b) end

-- Every text: the ids and decodings equal the reference's; returns the
-- number of texts compared.
local function compare_hf(name, tok, ref)
  assert.equals(ref.vocab_size, tok.vocab_size)
  local diffs, first = 0, nil
  for i, text in ipairs(goldens.texts) do
    local r, what = ref.results[i], ('text %d %q'):format(i, text:sub(1, 40))
    local checks = {
      { r.ids, tok:encode_list(text), '' },
      { r.ids_special, tok:encode_list(text, { add_special = true }), ' (add_special)' },
      { r.decoded, tok:decode(r.ids), ' (decoded)' },
      { r.decoded_skip, tok:decode(r.ids, { skip_special = true }), ' (skip_special)' },
      { r.decoded_half, tok:decode(first_half(r.ids)), ' (first half of the ids)' },
    }
    for _, c in ipairs(checks) do
      if differs(c[1], c[2]) then
        diffs = diffs + 1
        first = first or ('%s%s: expected %s, got %s'):format(what, c[3], cjson.encode(c[1]), cjson.encode(c[2]))
        break
      end
    end
  end
  return report(name .. ' vs tokenizers', #goldens.texts, diffs, first)
end

describe('tokenizer.json byte-level BPE', function()
  it('equals tokenizers on a GPT-2 style file ("a b" merges, ByteLevel regex, added tokens)', function()
    local tok = tokenizer.load(DIR .. '/gpt2_style.json')
    assert.equals(27, compare_hf('gpt2_style.json', tok, goldens.gpt2_style))
    assert.equals(tok:token_to_id('<|endoftext|>'), tok.eos_id)
    assert.is_true(tok:is_special(tok.eos_id))
    assert.is_false(tok:is_special(tok:token_to_id('[[custom]]')))
  end)

  it('equals tokenizers on a Llama 3 style file (split regex, ignore_merges, [a, b] merges, template)', function()
    local tok = tokenizer.load(DIR .. '/llama3_style.json')
    compare_hf('llama3_style.json', tok, goldens.llama3_style)
    -- the vocabulary word no merge builds is one token only through ignore_merges
    assert.same({ tok:token_to_id('zzzq') }, tok:encode_list('zzzq'))
    assert.equals(tok:token_to_id('<|begin_of_text|>'), tok.bos_id)
    assert.equals(tok:token_to_id('<|end_of_text|>'), tok.eos_id)
  end)

  it('equals tokenizers behind an NFC normalizer (Qwen2 style), added tokens raw and normalized', function()
    local tok = tokenizer.load(DIR .. '/qwen2_style.json')
    compare_hf('qwen2_style.json', tok, goldens.qwen2_style)
    -- composed and decomposed spellings are one text after NFC
    assert.same(tok:encode_list('caf\u{E9} \u{212B}'), tok:encode_list('cafe\u{301} A\u{30A}'))
    local custom = tok:token_to_id('[[caf\u{E9}]]')
    assert.same({ custom }, tok:encode_list('[[cafe\u{301}]]'))
  end)

  it("follows tokenizers' quirks: a split regex's empty matches, merges listed twice (the last wins)", function()
    local dir = tmpdir()
    for _, v in ipairs(goldens.gpt2_variants) do
      local j = cjson.decode(read(DIR .. '/gpt2_style.json'))
      if v.pre_tokenizer then j.pre_tokenizer = v.pre_tokenizer end
      for k = 1, v.repeat_first_merges or 0 do j.model.merges[#j.model.merges + 1] = j.model.merges[k] end
      local path = dir .. '/' .. v.name .. '.json'
      write(path, cjson.encode(j))
      local tok = bpe.load(path)
      for i, text in ipairs(goldens.texts) do
        assert.same(v.ids[i], tok:encode_list(text), ('%s: text %d %q'):format(v.name, i, text:sub(1, 40)))
      end
    end
  end)

  it('round-trips any valid text and keeps invalid bytes as tokens', function()
    local tok = bpe.load(DIR .. '/gpt2_style.json')
    local text = 'Grüße, 世界! 🙂\n\t  x' .. string.rep('ab', 500)
    assert.equals(text, tok:decode(tok:encode({ text })[1]))
    -- invalid UTF-8: each stray byte is encoded, decoding shows U+FFFD
    local ids = tok:encode_list('a\255b\192')
    assert.is_true(#ids >= 3)
    assert.equals('a\239\191\189b\239\191\189', tok:decode(ids))
  end)

  it('takes eos and bos from tokenizer_config.json beside the file', function()
    local dir = tmpdir()
    write(dir .. '/tokenizer.json', read(DIR .. '/llama3_style.json'))
    write(dir .. '/tokenizer_config.json', cjson.encode({ eos_token = { content = '<|eot_id|>' } }))
    local tok = tokenizer.load(dir) -- a directory: its tokenizer.json
    assert.equals(tok:token_to_id('<|eot_id|>'), tok.eos_id)
  end)

  it('refuses what it does not implement, naming the file and the field', function()
    local dir = tmpdir()
    local base = read(DIR .. '/gpt2_style.json')
    local cases = {
      { function(j) j.model.type = 'WordPiece' end, 'model.type WordPiece is not implemented' },
      { function(j) j.model.type = 'Unigram' end, 'model.type Unigram is not implemented' },
      { function(j) j.normalizer = { type = 'Lowercase' } end, 'normalizer Lowercase is not implemented' },
      { function(j) j.pre_tokenizer = { type = 'Metaspace', replacement = '_' } end, 'pre_tokenizer.type: not implemented' },
      { function(j) j.pre_tokenizer = { type = 'Split', pattern = { Regex = ' ' }, behavior = 'Removed' } end,
        'pre_tokenizer.Split.behavior' },
      { function(j) j.decoder = { type = 'WordPiece' } end, 'decoder.type: not implemented' },
      { function(j) j.model.merges[1] = 'zz qq' end, 'model.merges[0] (zz + qq -> zzqq) uses a token not in model.vocab' },
      { function(j) j.model.merges[2] = 'abc' end, 'model.merges[1] "abc" is not two tokens' },
      { function(j) j.added_tokens[1].single_word = true end, 'added_tokens[0].single_word' },
      { function(j) j.model.vocab = nil end, 'model.vocab is not an object' },
    }
    for k, case in ipairs(cases) do
      local j = cjson.decode(base)
      case[1](j)
      local path = ('%s/case%d.json'):format(dir, k)
      write(path, cjson.encode(j))
      local ok, err = pcall(bpe.load, path)
      assert.is_false(ok, case[2])
      assert.matches('tokenizer ' .. path .. ': ', err, 1, true)
      assert.matches(case[2], err, 1, true)
    end
    write(dir .. '/broken.json', '{"model": ')
    local ok, err = pcall(bpe.load, dir .. '/broken.json')
    assert.is_false(ok)
    assert.matches(dir .. '/broken.json: not readable JSON', err, 1, true)
  end)

  it('names an id outside the vocabulary on decode', function()
    local tok = bpe.load(DIR .. '/gpt2_style.json')
    local ok, err = pcall(tok.decode, tok, { 5, 100000 })
    assert.is_false(ok)
    assert.matches('decode: id 100000 at position 1 is not in the vocabulary (701 ids)', err, 1, true)
  end)
end)

describe('SentencePiece through libsentencepiece', function()
  it('equals sentencepiece on a Llama 2 style model (BPE, byte fallback, split digits)', function()
    local tok = tokenizer.load(DIR .. '/spm.model')
    local ref = goldens.spm
    assert.equals(ref.vocab_size, tok.vocab_size)
    assert.equals(ref.eos_id, tok.eos_id)
    assert.equals(ref.bos_id, tok.bos_id)
    local diffs, first = 0, nil
    for i, text in ipairs(goldens.texts) do
      local what = ('text %d %q'):format(i, text:sub(1, 40))
      local ids, decoded = tok:encode({ text })[1]:tolist(), tok:decode(ref.results[i].ids)
      if differs(ref.results[i].ids, ids) or ref.results[i].decoded ~= decoded then
        diffs = diffs + 1
        first = first or ('%s: expected %s %q, got %s %q'):format(what, cjson.encode(ref.results[i].ids),
          ref.results[i].decoded, cjson.encode(ids), decoded)
      end
    end
    report('spm.model vs sentencepiece', #goldens.texts, diffs, first)
  end)

  it('adds <s> with add_special as LlamaTokenizer does, unless tokenizer_config.json says not to', function()
    local tok = tokenizer.load(DIR .. '/spm.model')
    local plain = tok:encode({ 'Hello world' })[1]:tolist()
    local with = tok:encode({ 'Hello world' }, { add_special = true })[1]:tolist()
    assert.equals(#plain + 1, #with)
    assert.equals(tok.bos_id, with[1])
    local dir = tmpdir()
    write(dir .. '/tokenizer.model', read(DIR .. '/spm.model'))
    write(dir .. '/tokenizer_config.json', cjson.encode({ add_bos_token = false, add_eos_token = true }))
    tok = tokenizer.load(dir)
    with = tok:encode({ 'Hello world' }, { add_special = true })[1]:tolist()
    assert.equals(#plain + 1, #with)
    assert.equals(tok.eos_id, with[#with])
  end)

  it('names a file that is not a model, and bad ids', function()
    local dir = tmpdir()
    write(dir .. '/junk.model', 'not a protobuf at all')
    local ok, err = pcall(tokenizer.load, dir .. '/junk.model')
    assert.is_false(ok)
    assert.matches('sentencepiece ' .. dir .. '/junk.model: not a SentencePiece model', err, 1, true)
    local tok = tokenizer.load(DIR .. '/spm.model')
    ok, err = pcall(tok.decode, tok, { 3, 600 })
    assert.is_false(ok)
    assert.matches('id 600 at position 1 is not in the vocabulary (600 pieces)', err, 1, true)
  end)

  it('names a missing tokenizer and an empty model directory', function()
    local ok, err = pcall(tokenizer.load, 'no/such/tokenizer.json')
    assert.is_false(ok)
    assert.matches('no/such/tokenizer.json: no such file', err, 1, true)
    local dir = tmpdir()
    ok, err = pcall(tokenizer.load, dir)
    assert.is_false(ok)
    assert.matches(dir .. ' holds no tokenizer.model or tokenizer.json', err, 1, true)
  end)
end)
