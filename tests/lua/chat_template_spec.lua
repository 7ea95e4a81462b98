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
