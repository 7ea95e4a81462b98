-- chat_spec.lua: chat and instruction records (fsdp.data.chat) and their
-- ids and labels (fsdp.data.chat_tokens). Records in every shape people
-- have (messages with text parts and tool calls, ShareGPT, Alpaca,
-- prompt/completion as strings and as messages, other field names mapped)
-- read from JSONL, .gz and .zst files, a directory and a glob, normalised
-- to messages and trained flags; bad records are errors naming file and
-- line, or skipped and counted. Labels: a ChatML renderer written here (a
-- test double with the chat-template interpreter's interface, render and
-- render_spans) over the byte tokenizer and a Qwen2-style byte-level BPE
-- (tests/golden/tokenizers): the ids are always the whole text's
-- tokenization, and the trained tokens spell exactly the assistant spans;
-- a span boundary inside a pre-token labels the straddling token as
-- transformers does; a template without generation markers is labelled by
-- rendering prefixes; plain prompt/completion gets bos, eos and no template.
local fsdp = require 'fsdp'
local cjson = require 'cjson'
local chat = require 'fsdp.data.chat'
local chat_tokens = require 'fsdp.data.chat_tokens'
local testing = require 'fsdp.testing'
local byte = require('fsdp.data.byte_tokenizer').new()
local bpe = require('fsdp.data.bpe').load('tests/golden/tokenizers/qwen2_style.json')

local tmp = testing.tmpdir()

local function write(path, lines)
  local f = assert(io.open(path, 'wb'))
  for _, l in ipairs(lines) do f:write(type(l) == 'string' and l or cjson.encode(l), '\n') end
  f:close()
  return path
end

local function all(spec, opts)
  local out = {}
  local it, stats = chat.records(spec, opts)
  for conv, pos in it do out[#out + 1] = conv; conv.pos = pos end
  return out, stats
end

-- The test double: ChatML (Qwen's format) with the spans the
-- {% generation %} markers of such a template give: an assistant message's
-- content and its <|im_end|>. spans = false: a template without markers.
local function chatml(spans)
  local tpl = {}
  function tpl:render_spans(messages, opts)
    local parts, out, at = {}, {}, 0
    local function add(s) parts[#parts + 1] = s; at = at + #s end
    for _, m in ipairs(messages) do
      add('<|im_start|>' .. m.role .. '\n')
      local body = m.content
      for _, c in ipairs(m.tool_calls or {}) do body = body .. '<tool_call>' .. c['function'].name .. '</tool_call>' end
      if m.role == 'assistant' then
        local s = at
        add(body .. '<|im_end|>')
        out[#out + 1] = { s, at }
        add('\n')
      else
        add(body .. '<|im_end|>\n')
      end
    end
    if opts and opts.add_generation_prompt then add('<|im_start|>assistant\n') end
    return table.concat(parts), spans ~= false and out or {}
  end
  function tpl:render(messages, opts) return (self:render_spans(messages, opts)) end
  return tpl
end

-- The text the trained labels spell.
local function trained_text(tok, ex)
  local keep = fsdp.F.ne(ex.labels, -100)
  local list, ids = ex.labels:tolist(), {}
  for _, v in ipairs(list) do if v ~= -100 then ids[#ids + 1] = v end end
  assert.equals(keep:to('i64'):sum():item(), #ids)
  return tok:decode(fsdp.tensor(ids, { dtype = 'i64' }))
end

local function same_ids(a, b)
  assert.same(a:tolist(), b:tolist())
end

describe('chat records', function()
  it('reads every shape to messages and trained flags', function()
    local p = write(tmp .. '/shapes.jsonl', {
      { messages = { { role = 'system', content = 'Be brief.' }, { role = 'user', content = 'Hi' },
                     { role = 'assistant', content = 'Hello' }, { role = 'user', content = { { type = 'text',
                       text = 'Two ' }, { type = 'text', text = 'parts' } } },
                     { role = 'assistant', content = cjson.null, tool_calls = { { type = 'function',
                       ['function'] = { name = 'add', arguments = { a = 1 } } } } },
                     { role = 'tool', content = '2', name = 'add' }, { role = 'assistant', content = 'It is 2.' } },
        tools = { { type = 'function', ['function'] = { name = 'add' } } } },
      { conversations = { { from = 'system', value = 'S' }, { from = 'human', value = 'Q' },
                          { from = 'gpt', value = 'A' } } },
      { instruction = 'Add', input = '1 and 2', output = '3', system = 'Math.' },
      { instruction = 'Say hi', input = '', output = 'hi' },
      { prompt = 'The sky is', completion = ' blue.' },
      { prompt = { { role = 'user', content = 'Q1' }, { role = 'assistant', content = 'A1' },
                   { role = 'user', content = 'Q2' } }, completion = { { role = 'assistant', content = 'A2' } } },
    })
    local c = all(p)
    assert.equals(6, #c)
    assert.equals('messages', c[1].format)
    assert.equals('Two parts', c[1].messages[4].content)
    assert.equals('', c[1].messages[5].content)
    assert.equals('add', c[1].messages[5].tool_calls[1]['function'].name)
    assert.equals('add', c[1].messages[6].name)
    assert.same({ false, false, true, false, true, false, true }, c[1].train)
    assert.equals('add', c[1].tools[1]['function'].name)
    assert.equals(p .. ': line 1', c[1].where)
    assert.same({ { role = 'system', content = 'S' }, { role = 'user', content = 'Q' },
                  { role = 'assistant', content = 'A' } }, c[2].messages)
    assert.same({ { role = 'system', content = 'Math.' }, { role = 'user', content = 'Add\n\n1 and 2' },
                  { role = 'assistant', content = '3' } }, c[3].messages)
    assert.same({ { role = 'user', content = 'Say hi' }, { role = 'assistant', content = 'hi' } }, c[4].messages)
    assert.is_true(c[5].plain)
    assert.same({ false, true }, c[5].train)
    -- conversational prompt/completion: only the completion is trained
    assert.is_nil(c[6].plain)
    assert.same({ false, false, false, true }, c[6].train)
    -- train_on = all trains every message
    local a = all(p, { train_on = 'all' })
    assert.same({ true, true, true, true, true, true, true }, a[1].train)
    assert.same({ true, true, true, true }, a[6].train)
  end)

  it('maps other field names (--chat_fields)', function()
    local p = write(tmp .. '/mapped.jsonl', {
      { dialog = { { speaker = 'user', text = 'Hi' }, { speaker = 'assistant', text = 'Yo' } } } })
    local c = all(p, { fields = 'messages:dialog,role:speaker,content:text' })
    assert.same({ { role = 'user', content = 'Hi' }, { role = 'assistant', content = 'Yo' } }, c[1].messages)
    testing.raises(function() chat.fields('messages=dialog') end, 'is not canonical:name')
    testing.raises(function() chat.fields('mesages:dialog') end, 'unknown name "mesages"')
  end)

  it('reads .gz and .zst files, a directory and a glob', function()
    local dir = tmp .. '/many'
    assert(os.execute('mkdir -p ' .. dir))
    local rec = { messages = { { role = 'user', content = 'x' }, { role = 'assistant', content = 'y' } } }
    write(dir .. '/a.jsonl', { rec, rec })
    write(dir .. '/b.jsonl', { rec })
    write(dir .. '/c.jsonl', { rec })
    assert(os.execute(('gzip %s/b.jsonl && zstd -q --rm %s/c.jsonl'):format(dir, dir)))
    local c = all(dir)
    assert.equals(4, #c)
    assert.equals(dir .. '/b.jsonl.gz: line 1', c[3].where)
    assert.equals(dir .. '/c.jsonl.zst: line 1', c[4].where)
    assert.equals(3, #all(dir .. '/*.jsonl*z*') + 1)
  end)

  local bad = {
    { 'not JSON', '{"messages": [', 'is not valid JSON' },
    { 'not an object', '[1, 2]', 'is not a JSON object' },
    { 'no known shape', { text = 'plain' }, 'no "messages", "conversations", "prompt"/"completion" or '
      .. '"instruction"/"output" field (it has: text; --chat_fields maps other names)' },
    { 'messages not a list', { messages = 'hi' }, '"messages" is a string, not a list of messages' },
    { 'an empty conversation', { messages = {} }, 'is an empty conversation' },
    { 'an unknown role', { messages = { { role = 'bot', content = 'x' } } }, 'unknown role "bot"' },
    { 'a missing role', { messages = { { content = 'x' } } }, 'messages[1] has no "role" string' },
    { 'content of a wrong type', { messages = { { role = 'user', content = 3 } } },
      'messages[1].content is a number, not a string or a list of text parts' },
    { 'an image part', { messages = { { role = 'user', content = { { type = 'image' } } } } },
      'part of type image; only text parts are read' },
    { 'tool_calls on a user message', { messages = { { role = 'user', content = 'x', tool_calls = {} } } },
      'has tool_calls but is a user message' },
    { 'a conversation ending with the user', { messages = { { role = 'user', content = 'a' },
      { role = 'assistant', content = 'b' }, { role = 'user', content = 'c' } } },
      'ends with a user message, not an assistant one' },
    { 'no assistant turn', { messages = { { role = 'user', content = 'a' } } }, 'holds no assistant message' },
    { 'alpaca without output', { instruction = 'a' }, 'has no "output" field' },
    { 'prompt without completion', { prompt = 'a' }, 'has "prompt" but no "completion"' },
    { 'prompt and completion of mixed kinds', { prompt = 'a', completion = { { role = 'assistant',
      content = 'b' } } }, '"prompt" is a string and "completion" is a list' },
    { 'sharegpt unknown speaker', { conversations = { { from = 'robot', value = 'x' } } },
      'unknown role "robot" (known: human, gpt, system' },
  }
  for i, case in ipairs(bad) do
    it(('refuses %s in one line naming file and line'):format(case[1]), function()
      local good = { messages = { { role = 'user', content = 'a' }, { role = 'assistant', content = 'b' } } }
      local p = write(('%s/bad%d.jsonl'):format(tmp, i), { good, '', case[2] })
      local ok, err = pcall(all, p)
      assert.is_false(ok)
      err = tostring(err)
      assert.matches(p .. ': line 3', err, 1, true)
      assert.is_nil(err:find('chat_spec.lua', 1, true), err)
      assert.matches(case[3], err, 1, true)
      assert.is_nil(err:find('\n'), err)
    end)
  end

  it('says how to convert a .json file that holds one JSON array', function()
    local p = tmp .. '/alpaca_data.json'
    local f = assert(io.open(p, 'wb'))
    f:write('[\n  {"instruction": "a", "input": "", "output": "b"}\n]\n')
    f:close()
    local ok, err = pcall(all, p)
    assert.is_false(ok)
    assert.matches(p .. ': line 1 (byte 0) is not', tostring(err), 1, true)
    assert.matches("the file is one JSON array; records are read one JSON object per line: convert it with jq -c '.[]'",
      tostring(err), 1, true)
  end)

  it('with bad_records = skip counts what it skips and keeps the first message', function()
    local good = { messages = { { role = 'user', content = 'a' }, { role = 'assistant', content = 'b' } } }
    local p = write(tmp .. '/skip.jsonl', { good, { messages = {} }, good, { text = 'x' }, good })
    local c, stats = all(p, { bad_records = 'skip' })
    assert.equals(3, #c)
    assert.equals(3, stats.records)
    assert.equals(2, stats.skipped)
    assert.matches(p .. ': line 2: the record "messages" is an empty conversation', stats.first, 1, true)
    testing.raises(function() chat.records(p, { bad_records = 'ignore' }) end, 'bad_records must be stop or skip')
    testing.raises(function() chat.records(p, { train_on = 'answers' }) end, 'train_on must be assistant or all')
  end)

  it('has recipe options whose defaults read records', function()
    local options = require 'fsdp.options'
    local cfg = options.config(chat.OPTIONS, { '--train_on=all', '--chat_fields=messages:dialog' }, 'chat_spec')
    local o = chat.record_opts(cfg)
    assert.same({ fields = 'messages:dialog', train_on = 'all', bad_records = 'stop', max_record_bytes = 8388608 }, o)
    local p = write(tmp .. '/opts.jsonl', { { dialog = { { role = 'user', content = 'a' } } } })
    assert.same({ true }, all(p, o)[1].train)
  end)

  it('refuses a line longer than max_record_bytes, naming it', function()
    local p = write(tmp .. '/long.jsonl', { { messages = { { role = 'user', content = ('x'):rep(200) },
      { role = 'assistant', content = 'b' } } } })
    local ok, err = pcall(all, p, { max_record_bytes = 100 })
    assert.is_false(ok)
    assert.matches(p, tostring(err), 1, true)
    assert.matches('line 1', tostring(err), 1, true)
  end)
end)

describe('chat tokens and labels', function()
  local conv = chat.normalise({ messages = {
    { role = 'system', content = 'You add.' }, { role = 'user', content = 'What is 2+2?' },
    { role = 'assistant', content = 'It is 4.' }, { role = 'user', content = 'And 3+3?' },
    { role = 'assistant', content = 'It is 6.' } } }, {}, 'spec:1')

  for _, case in ipairs({ { 'the byte tokenizer', byte }, { 'a byte-level BPE (Qwen2 style)', bpe } }) do
    local tok = case[2]
    it(('labels exactly the assistant spans with %s; the ids are the whole text\'s'):format(case[1]), function()
      local ex = chat_tokens.encode(conv, chatml(), tok)
      same_ids(tok:encode({ ex.text })[1], ex.ids)
      assert.equals(ex.ids:numel(), ex.labels:numel())
      assert.equals('It is 4.<|im_end|>It is 6.<|im_end|>', trained_text(tok, ex))
      -- labels equal the ids where trained
      local keep = fsdp.F.ne(ex.labels, -100)
      assert.same(fsdp.F.where(keep, ex.ids, -100):tolist(), ex.labels:tolist())
      -- the template writes the specials: no bos added (the byte tokenizer has none; the BPE's is not added)
      assert.equals(tok:encode({ '<|im_start|>' })[1]:get(0), ex.ids:get(0))
      -- train_on = all: every token
      local all_ex = chat_tokens.encode(conv, chatml(), tok, { train_on = 'all' })
      same_ids(ex.ids, all_ex.ids)
      same_ids(all_ex.ids, all_ex.labels)
    end)
  end

  it('uses the special tokens of the BPE: <|im_start|> and <|im_end|> are one token each', function()
    local ex = chat_tokens.encode(conv, chatml(), bpe)
    local im_end = bpe:token_to_id('<|im_end|>')
    local n = 0
    for _, v in ipairs(ex.labels:tolist()) do if v == im_end then n = n + 1 end end
    assert.equals(2, n)
  end)

  it('trains only the completion of a conversational prompt/completion', function()
    local c = chat.normalise({ prompt = { { role = 'user', content = 'Q1' }, { role = 'assistant', content = 'A1' },
      { role = 'user', content = 'Q2' } }, completion = { { role = 'assistant', content = 'A2' } } }, {}, 'spec:2')
    local ex = chat_tokens.encode(c, chatml(), bpe)
    assert.equals('A2<|im_end|>', trained_text(bpe, ex))
  end)

  it('labels a token straddling a span boundary as transformers does (overlap)', function()
    -- a template whose span starts inside the token " th" (this small
    -- vocabulary has it): the pieces tokenize otherwise than the whole
    -- text, so offsets decide
    local tpl = {}
    function tpl:render_spans(messages)
      local text = 'User: ' .. messages[1].content .. '\nBot: ' .. messages[2].content
      local s = #text - #messages[2].content + 1 -- after the space: inside " th"
      return text, { { s, #text } }
    end
    function tpl:render(m) return (self:render_spans(m)) end
    local c = chat.normalise({ messages = { { role = 'user', content = 'hi' },
      { role = 'assistant', content = ' there' } } }, {}, 'spec:3')
    local ex = chat_tokens.encode(c, tpl, bpe)
    same_ids(bpe:encode({ ex.text })[1], ex.ids)
    -- the token " th" overlaps the span: trained whole, its space too
    assert.equals(' there', trained_text(bpe, ex))
    assert.equals(' th', bpe:decode({ bpe:encode({ ' there' })[1]:get(0) }))
  end)

  it('finds the assistant spans of a template without generation markers by rendering prefixes', function()
    local a = chat_tokens.encode(conv, chatml(), bpe)
    local b = chat_tokens.encode(conv, chatml(false), bpe)
    same_ids(a.ids, b.ids)
    -- the prefix spans run to the end of the message's rendering: its newline too
    assert.equals('It is 4.<|im_end|>\nIt is 6.<|im_end|>\n', trained_text(bpe, b))
  end)

  it('refuses a template that rewrites earlier turns and marks no spans, naming the conversation', function()
    local tpl = chatml(false)
    local plain = tpl.render_spans
    function tpl:render(m, o) return (plain(self, m, o)) .. (#m == #conv.messages and '' or 'x') end
    function tpl:render_spans(m, o) return self:render(m, o), {} end
    local ok, err = pcall(chat_tokens.encode, conv, tpl, bpe)
    assert.is_false(ok)
    assert.matches('spec:1: the template renders message 3 differently', tostring(err), 1, true)
  end)

  it('refuses spans that do not match the assistant messages', function()
    local tpl = {}
    function tpl:render_spans() return 'abc', { { 0, 1 } } end
    local ok, err = pcall(chat_tokens.encode, conv, tpl, byte)
    assert.is_false(ok)
    assert.matches('spec:1: the renderer marked 1 assistant spans for 2 assistant messages', tostring(err), 1, true)
    function tpl:render_spans() return 'abc', { { 2, 1 }, { 2, 3 } } end
    ok, err = pcall(chat_tokens.encode, conv, tpl, byte)
    assert.matches('span 1 (2, 1) is not a byte range in order', tostring(err), 1, true)
  end)

  it('gives plain prompt/completion bos (when the tokenizer adds one), the completion and eos', function()
    local c = chat.normalise({ prompt = 'The sky is', completion = ' blue.' }, {}, 'spec:4')
    local ex = chat_tokens.encode(c, nil, byte)
    local want = byte:encode({ 'The sky is blue.' })[1]:tolist()
    want[#want + 1] = byte.eos_id
    assert.same(want, ex.ids:tolist())
    local labels = ex.labels:tolist()
    for i = 1, #('The sky is') do assert.equals(-100, labels[i]) end
    assert.equals(#' blue.' + 1, ex.trained)
    assert.equals(byte.eos_id, labels[#labels])
  end)

  it('shifts labels into the targets model:loss takes', function()
    local t = chat_tokens.targets(fsdp.tensor({ -100, 5, 6, -100 }, { dtype = 'i64' }))
    assert.same({ 5, 6, -100, -100 }, t:tolist())
  end)
end)
