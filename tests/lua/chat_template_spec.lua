-- chat_template_spec.lua: the Lua Jinja-subset interpreter (fsdp.chat.template)
-- against transformers 5.25's apply_chat_template on the real chat templates
-- stored in tests/data/chat_templates/ (README there names each source).
-- tests/golden/make_chat_template_goldens.py rendered every template on a
-- set of conversations (single and multi turn, with and without a system
-- prompt, add_generation_prompt on and off, tool definitions, tool calls and
-- results, Qwen 3 thinking on and off, reasoning fields, odd content:
-- unicode, quotes, braces, backslashes, newlines, content parts) and stored
-- the text, or the error the template raised, the {% generation %} spans
-- transformers' return_assistant_tokens_mask computes, and the prefix-diff
-- assistant spans. Every case must match exactly. Also: loading (jinja
-- file, inline string, list of named templates, AddedToken objects),
-- refusals naming template and line, and Jinja semantics the real
-- templates lean on.
local template = require 'fsdp.chat.template'
local values = require 'fsdp.chat.values'

local DATA = 'tests/data/chat_templates'

local function read(path)
  local f = assert(io.open(path, 'rb'))
  local s = f:read('*a')
  f:close()
  return s
end

local golden = assert(template.json_decode(read('tests/golden/chat_templates.json')))
local G = golden.map

local function spans_str(spans)
  local parts = {}
  for i, s in ipairs(spans) do parts[i] = s[1] .. '-' .. s[2] end
  return table.concat(parts, ',')
end

local function golden_spans(l)
  local parts = {}
  for i = 1, l.n do parts[i] = l[i][1] .. '-' .. l[i][2] end
  return table.concat(parts, ',')
end

-- One golden case: nil when it matches, else a line saying how it differs.
local function check_case(tpl, c)
  local conv = G.conversations.map[c.conversation]
  local kwargs = c.kwargs
  local opts = { add_generation_prompt = c.add_generation_prompt, now = G.now, extra = {} }
  if c.tools then opts.tools = G.tools end
  for _, k in ipairs(kwargs.keys) do
    if k == 'enable_thinking' then opts.enable_thinking = kwargs.map[k] else opts.extra[k] = kwargs.map[k] end
  end
  local ok, text, spans = pcall(function()
    if c.generation_spans then return tpl:render_spans(conv, opts) end
    return tpl:render(conv, opts)
  end)
  local where = ('%s/%s tools=%s gen=%s kwargs=%s'):format(c.template, c.conversation, tostring(c.tools),
    tostring(c.add_generation_prompt), values.json_encode(kwargs))
  if c.error then
    if ok then return where .. ': expected the error ' .. c.error .. ', rendered' end
    local msg = tostring(text)
    if not msg:find(c.error, 1, true) then
      return where .. ': error ' .. msg .. ' lacks ' .. c.error
    end
    if not msg:find("chat template '", 1, true) then return where .. ': error does not name the template: ' .. msg end
    return nil
  end
  if not ok then return where .. ': raised ' .. tostring(text) end
  if text ~= c.text then
    local i = 1
    while i <= #text and text:byte(i) == c.text:byte(i) do i = i + 1 end
    return ('%s: differs at byte %d: got %q, want %q'):format(where, i, text:sub(i, i + 40), c.text:sub(i, i + 40))
  end
  if c.generation_spans then
    if spans_str(spans) ~= golden_spans(c.generation_spans) then
      return where .. ': generation spans ' .. spans_str(spans) .. ' want ' .. golden_spans(c.generation_spans)
    end
  end
  local pok, _, pspans = pcall(tpl.assistant_spans_by_prefix, tpl, conv, opts)
  if c.prefix_spans then
    if not pok then return where .. ': prefix spans raised ' .. tostring(_) end
    if spans_str(pspans) ~= golden_spans(c.prefix_spans) then
      return where .. ': prefix spans ' .. spans_str(pspans) .. ' want ' .. golden_spans(c.prefix_spans)
    end
  elseif c.prefix_error then
    if pok then return where .. ': prefix spans should be refused (' .. c.prefix_error .. ')' end
  end
  return nil
end

describe('chat templates against transformers', function()
  it('renders every stored template and case exactly', function()
    local cache, diffs, n, n_err, n_gen, n_prefix = {}, {}, 0, 0, 0, 0
    local cases = G.cases
    for i = 1, cases.n do
      local c = cases[i].map
      cache[c.template] = cache[c.template] or template.load(DATA .. '/' .. c.template)
      local d = check_case(cache[c.template], c)
      n = n + 1
      if c.error then n_err = n_err + 1 end
      if c.generation_spans then n_gen = n_gen + 1 end
      if c.prefix_spans then n_prefix = n_prefix + 1 end
      if d then diffs[#diffs + 1] = d end
    end
    print(('chat templates: %d cases (%d expected errors, %d with generation spans, %d with prefix spans), '
      .. '%d differences'):format(n, n_err, n_gen, n_prefix, #diffs))
    for i = 1, math.min(#diffs, 15) do print('  ' .. diffs[i]) end
    assert.are.equal(0, #diffs)
    assert.is_true(n >= 400)
  end)
end)

describe('Jinja semantics against jinja2', function()
  it('renders every snippet as transformers\' environment does', function()
    local diffs = {}
    for i = 1, G.snippets.n do
      local c = G.snippets[i].map
      local ok, text = pcall(function()
        return template.compile(c.source, { name = 'snippet' .. i }):render_vars(G.snippet_vars)
      end)
      if c.error then
        if ok then diffs[#diffs + 1] = ('snippet %d: expected an error (%s)'):format(i, c.error) end
      elseif not ok then
        diffs[#diffs + 1] = ('snippet %d raised %s'):format(i, tostring(text))
      elseif text ~= c.text then
        diffs[#diffs + 1] = ('snippet %d: got %q want %q'):format(i, text, c.text)
      end
    end
    print(('jinja snippets: %d, %d differences'):format(G.snippets.n, #diffs))
    for _, d in ipairs(diffs) do print('  ' .. d) end
    assert.are.equal(0, #diffs)
  end)
end)

describe('refusals', function()
  local function err_of(f)
    local ok, e = pcall(f)
    assert.is_false(ok)
    return tostring(e)
  end
  local function compile_err(src) return err_of(function() template.compile(src, { name = 'mine' }) end) end

  it('names template and line for tags outside the subset', function()
    local e = compile_err('line one\n{% if x %}\n{% include "other.jinja" %}\n{% endif %}')
    assert.truthy(e:find("chat template 'mine' line 3:", 1, true), e)
    assert.truthy(e:find("'include'", 1, true), e)
    e = compile_err('a\nb\n{% frobnicate %}')
    assert.truthy(e:find("chat template 'mine' line 3: Encountered unknown tag 'frobnicate'", 1, true), e)
    e = compile_err('{% raw %}x{% endraw %}')
    assert.truthy(e:find("line 1:", 1, true) and e:find("raw", 1, true), e)
  end)

  it('names template and line for unknown filters and tests, at compile time', function()
    local e = compile_err('x\n\n{{ messages | shuffle }}')
    assert.truthy(e:find("chat template 'mine' line 3: No filter named 'shuffle'", 1, true), e)
    e = compile_err('{% if x is prime %}{% endif %}')
    assert.truthy(e:find("line 1: No test named 'prime'", 1, true), e)
  end)

  it('names template and line for bad syntax', function()
    local e = compile_err('ok\n{% if x %}\nno end')
    assert.truthy(e:find("chat template 'mine' line 3: unexpected end of template, "
      .. "expected 'elif' or 'else' or 'endif'", 1, true), e)
    e = compile_err('{{ (1 + 2 }}')
    assert.truthy(e:find("chat template 'mine' line 1:", 1, true), e)
    e = compile_err('\n{{ x + }}')
    assert.truthy(e:find("line 2:", 1, true), e)
    e = compile_err('{% for x in y %}{% endif %}')
    assert.truthy(e:find("line 1:", 1, true), e)
    e = compile_err('{% break %}')
    assert.truthy(e:find("'break' outside of a loop", 1, true), e)
  end)

  it('surfaces raise_exception\'s message naming the template and line', function()
    local tpl = template.load(DATA .. '/gemma-2-it')
    local sys_first = { { role = 'system', content = 's' }, { role = 'user', content = 'u' } }
    local e = err_of(function() tpl:render(sys_first) end)
    assert.truthy(e:find("chat template 'gemma-2-it/tokenizer_config.json' raised an exception (line 1): "
      .. 'System role not supported', 1, true), e)
    local t2 = template.compile('a\n\n{{ raise_exception("bad " ~ messages | length) }}', { name = 'r' })
    e = err_of(function() t2:render({ { role = 'user', content = 'u' } }) end)
    assert.truthy(e:find("chat template 'r' raised an exception (line 3): bad 1", 1, true), e)
  end)

  it('names the line of runtime errors', function()
    local t = template.compile('x\n{{ messages[0].content + 1 }}', { name = 'rt' })
    local e = err_of(function() t:render({ { role = 'user', content = 'u' } }) end)
    assert.truthy(e:find("chat template 'rt' line 2: can only concatenate str", 1, true), e)
    t = template.compile('{{ missing.attr }}', { name = 'rt' })
    e = err_of(function() t:render({ { role = 'user', content = 'u' } }) end)
    assert.truthy(e:find("'missing' is undefined", 1, true), e)
    t = template.compile('{% set x = [] %}{{ x.append(1) }}', { name = 'sb' })
    e = err_of(function() t:render({ { role = 'user', content = 'u' } }) end)
    assert.truthy(e:find("unsafe", 1, true), e)
  end)

  it('refuses generation spans for templates without markers, and unstable prefixes', function()
    local tpl = template.load(DATA .. '/qwen2.5-instruct')
    assert.is_false(tpl.has_generation)
    local e = err_of(function() tpl:render_spans({ { role = 'user', content = 'u' } }) end)
    assert.truthy(e:find('assistant_spans_by_prefix', 1, true), e)
    local q3 = template.load(DATA .. '/qwen3')
    e = err_of(function()
      q3:assistant_spans_by_prefix({ { role = 'user', content = 'a' }, { role = 'assistant', content = 'b' },
        { role = 'user', content = 'c' }, { role = 'assistant', content = 'd' } })
    end)
    assert.truthy(e:find('not prefix-stable at message 2', 1, true), e)
  end)
end)

describe('loading', function()
  it('reads chat_template.jinja, inline strings, named lists and AddedToken objects', function()
    local l32 = template.load(DATA .. '/llama-3.2-instruct')
    assert.are.equal('<|begin_of_text|>', l32.special_tokens.bos_token)
    local l31 = template.load(DATA .. '/llama-3.1-instruct')
    assert.are.equal('<|eot_id|>', l31.special_tokens.eos_token)
    local q = template.load(DATA .. '/qwen2.5-instruct')
    assert.is_nil(q.special_tokens.bos_token)
    local lf = template.load(DATA .. '/list-form')
    local msgs = { { role = 'user', content = 'hi' } }
    assert.truthy(lf:render(msgs):find('SmolLM', 1, true))
    -- as transformers: any tools (even an empty list) pick "tool_use"
    assert.truthy(lf:render(msgs, { tools = {} }):find('Qwen', 1, true))
    local tools = template.json_decode('[{"type": "function", "function": {"name": "f"}}]')
    assert.truthy(lf:render(msgs, { tools = tools }):find('<tools>', 1, true))
    assert.truthy(template.load(DATA .. '/list-form', { name = 'tool_use' }):render(msgs):find('Qwen', 1, true))
    local ok, e = pcall(template.load, DATA .. '/list-form', { name = 'nope' })
    assert.is_false(ok)
    assert.truthy(tostring(e):find("no template named 'nope'", 1, true))
    ok, e = pcall(template.load, DATA)
    assert.is_false(ok)
    assert.truthy(tostring(e):find('no chat_template', 1, true), tostring(e))
  end)

  it('overrides special tokens per call', function()
    local t = template.load(DATA .. '/phi-3-mini-instruct')
    local msgs = { { role = 'user', content = 'u' }, { role = 'assistant', content = 'a' } }
    local out = t:render(msgs, { eos_token = '<E>' })
    assert.are.equal('<|user|>\nu<|end|>\n<|assistant|>\na<|end|>\n<E>', out)
  end)
end)
