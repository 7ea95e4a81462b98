-- fsdp.chat.template: a model's chat template, rendered as transformers'
-- tokenizer.apply_chat_template(messages, tokenize=False, ...) renders it,
-- by a Jinja-subset interpreter in Lua (fsdp.chat.lexer / parser / eval /
-- filters / values). Anything outside the subset is refused with the
-- template's name and line, at compile time where the parser can tell.
--
--   local template = require 'fsdp.chat.template'
--   local tpl = template.load('path/to/hf_model_dir')     -- or template.compile(src, {name='x'})
--   local text = tpl:render(messages, { add_generation_prompt = true })
--   local text, spans = tpl:render_spans(messages)         -- {% generation %} spans
--   local text, spans = tpl:assistant_spans_by_prefix(messages)  -- templates without markers
--
-- Messages are a list of {role=, content=, ...}: plain Lua tables (their
-- keys are then sorted, Lua tables have no order) or values read with
-- template.json_decode, which keeps JSON's key order and int/float kinds so
-- that `tojson` writes what Python writes. Spans are {start, stop}: 0-based
-- byte offsets into the text, stop exclusive (transformers reports
-- character offsets; bytes are what token offsets in this project use).
--
-- [Note: chat template rendering contract]
-- render() passes the template what transformers passes: `messages` (None
-- values dropped from each message, reasoning aliased as transformers 5
-- does: a `reasoning_content`, `thinking` or `reasoning` field is copied to
-- `thinking` (first) and `reasoning_content` (last)), `tools` and
-- `documents` (None when not given: defined, but none), `add_generation_prompt`,
-- the tokenizer's special tokens (bos_token, eos_token, unk_token,
-- sep_token, pad_token, cls_token, mask_token: those tokenizer_config.json
-- sets, overridable per call) and any extra variables (enable_thinking,
-- opts.extra). Globals: raise_exception, strftime_now (opts.now pins the
-- clock, seconds since the epoch, UTC), namespace, dict, range.
local values = require 'fsdp.chat.values'
local lexer = require 'fsdp.chat.lexer'
local parser = require 'fsdp.chat.parser'
local eval = require 'fsdp.chat.eval'
local filters = require 'fsdp.chat.filters'
local tables = require 'fsdp.tables'

local NONE, kind = values.NONE, values.kind

local M = {}

M.json_decode = values.json_decode
M.values = values

local SPECIAL = { 'bos_token', 'eos_token', 'unk_token', 'sep_token', 'pad_token', 'cls_token', 'mask_token' }
M.SPECIAL_TOKENS = SPECIAL

local Template = {}
Template.__index = Template

local function name_of(opts) return (opts and opts.name) or 'chat_template' end

-- A compiled template; raises "chat template 'NAME' line N: why" when the
-- source is outside the subset or not valid Jinja.
function M.compile(source, opts)
  opts = opts or {}
  local name = name_of(opts)
  if type(source) ~= 'string' then
    error(("chat template '%s': expected the template source as a string, got %s"):format(name, type(source)), 2)
  end
  local ok, tree = pcall(function()
    local toks = lexer.tokenize(source)
    return parser.parse(toks, { filters = filters.filters, tests = filters.tests, values = values })
  end)
  if not ok then error(("chat template '%s' %s"):format(name, tostring(tree)), 0) end
  local has_generation = source:find('{%%[-+]?%s*generation%s*[-+]?%%}') ~= nil
  return setmetatable({ name = name, source = source, tree = tree, special_tokens = opts.special_tokens or {},
    has_generation = has_generation }, Template)
end

------------------------------------------------------------------------------
-- loading from a model directory

local function read_file(path)
  local f = io.open(path, 'rb')
  if not f then return nil end
  local text = f:read('*a')
  f:close()
  return text
end

-- A special token as tokenizer_config.json writes it: a string, or an
-- AddedToken object {content=...}; nil when absent or null.
local function token_string(v)
  if type(v) == 'string' then return v end
  if kind(v) == 'dict' and type(v.map.content) == 'string' then return v.map.content end
  return nil
end

-- The chat template of a Hugging Face model directory: chat_template.jinja
-- when present, else tokenizer_config.json's chat_template (a string, or a
-- list of {name, template}: opts.name picks one, else render picks
-- "tool_use" when tools are given and it exists, else "default", as
-- transformers does). Special tokens come from tokenizer_config.json.
function M.load(dir, opts)
  opts = opts or {}
  local cfg_path = dir .. '/tokenizer_config.json'
  local cfg_text = read_file(cfg_path)
  local cfg
  if cfg_text then
    local err
    cfg, err = values.json_decode(cfg_text)
    if not cfg then error(('chat template: %s: %s'):format(cfg_path, err), 0) end
    if kind(cfg) ~= 'dict' then error(('chat template: %s: expected a JSON object'):format(cfg_path), 0) end
  end
  local special = {}
  if cfg then
    for _, k in ipairs(SPECIAL) do special[k] = token_string(cfg.map[k]) end
  end
  local base = dir:match('([^/]+)/*$') or dir
  local jinja_path = dir .. '/chat_template.jinja'
  local source = read_file(jinja_path)
  if source then
    return M.compile(source, { name = opts.name or (base .. '/chat_template.jinja'), special_tokens = special })
  end
  local ct = cfg and cfg.map.chat_template
  if ct == nil or ct == NONE then
    error(('chat template: %s has no chat_template.jinja and %s no chat_template'):format(dir,
      cfg and cfg_path or 'no tokenizer_config.json'), 0)
  end
  if type(ct) == 'string' then
    return M.compile(ct, { name = opts.name or (base .. '/tokenizer_config.json'), special_tokens = special })
  end
  if kind(ct) ~= 'list' then
    error(('chat template: %s: chat_template must be a string or a list of {name, template}'):format(cfg_path), 0)
  end
  local named, order = {}, {}
  for i = 1, ct.n do
    local e = ct[i]
    local n = kind(e) == 'dict' and e.map.name
    local t = kind(e) == 'dict' and e.map.template
    if type(n) ~= 'string' or type(t) ~= 'string' then
      error(('chat template: %s: chat_template[%d] needs a string name and template'):format(cfg_path, i - 1), 0)
    end
    named[n] = M.compile(t, { name = base .. '/tokenizer_config.json:' .. n, special_tokens = special })
    order[#order + 1] = n
  end
  if opts.name then
    if not named[opts.name] then
      error(("chat template: %s has no template named '%s' (it has: %s)"):format(cfg_path, opts.name,
        table.concat(order, ', ')), 0)
    end
    return named[opts.name]
  end
  return setmetatable({ name = base, named = named, names = order, special_tokens = special,
    has_generation = (named.default and named.default.has_generation) or false }, Template)
end

------------------------------------------------------------------------------
-- rendering

local function copy_message(m)
  local k = kind(m)
  if k ~= 'dict' then error(('chat template: a message must be a table with role and content, got %s'):format(k), 0) end
  local d = values.dict()
  for _, key in ipairs(m.keys) do
    local v = m.map[key]
    if v ~= NONE then values.dict_set(d, key, v) end
  end
  -- transformers 5: reasoning under any of its names is passed as
  -- `thinking` (placed first) and `reasoning_content` (placed last)
  local reasoning
  for _, f in ipairs({ 'reasoning_content', 'thinking', 'reasoning' }) do
    if d.map[f] ~= nil then reasoning = d.map[f]; break end
  end
  if reasoning ~= nil then
    local a = values.dict()
    values.dict_set(a, 'thinking', reasoning)
    for _, key in ipairs(d.keys) do values.dict_set(a, key, d.map[key]) end
    values.dict_set(a, 'thinking', reasoning)
    values.dict_set(a, 'reasoning_content', reasoning)
    d = a
  end
  return d
end

local function to_messages(messages)
  local v = values.from_lua(messages)
  if kind(v) ~= 'list' then error(('chat template: messages must be a list, got %s'):format(kind(v)), 0) end
  if v.n == 0 then error('chat template: cannot apply a chat template to an empty conversation', 0) end
  local out = { n = v.n }
  for i = 1, v.n do out[i] = copy_message(v[i]) end
  return values.list(out)
end

local function globals(opts)
  local g = {}
  g.raise_exception = values.callable(function(args, _, interp)
    error({ template_error = true, raised = true, line = interp.line, msg = values.str(args[1] or '') }, 0)
  end, 'raise_exception')
  g.strftime_now = values.callable(function(args)
    local fmt = values.str(args[1] or '')
    if opts.now then return os.date('!' .. fmt, opts.now) end
    return os.date(fmt)
  end, 'strftime_now')
  g.namespace = values.callable(function(args, kwargs, interp)
    local ns = values.namespace()
    if args[1] ~= nil then
      local src = args[1]
      if kind(src) ~= 'dict' then eval.rt_error(interp, 'namespace() takes a dict or keyword arguments') end
      for _, k in ipairs(src.keys) do values.dict_set(ns, k, src.map[k]) end
    end
    -- Python keeps keyword order; kwargs here lost it, so sort for a stable repr
    for _, k in ipairs(tables.sorted_keys(kwargs)) do
      if k:sub(1, 1) == '_' then
        eval.rt_error(interp, ("Chat templates cannot store underscore-prefixed attributes on a namespace, "
          .. "but got '%s'."):format(k))
      end
      values.dict_set(ns, k, kwargs[k])
    end
    return ns
  end, 'namespace')
  g.dict = values.callable(function(args, kwargs)
    local d = values.dict()
    if args[1] ~= nil and kind(args[1]) == 'dict' then
      for _, k in ipairs(args[1].keys) do values.dict_set(d, k, args[1].map[k]) end
    end
    for _, k in ipairs(tables.sorted_keys(kwargs)) do values.dict_set(d, k, kwargs[k]) end
    return d
  end, 'dict')
  g.range = values.callable(function(args, _, interp)
    local a, b, c = args[1], args[2], args[3] or 1
    if b == nil then a, b = 0, a end
    for _, x in ipairs({ a, b, c }) do
      if kind(x) ~= 'int' then eval.rt_error(interp, 'range() takes integers') end
    end
    if c == 0 then eval.rt_error(interp, 'range() arg 3 must not be zero') end
    local out = { n = 0 }
    for i = a, b - (c > 0 and 1 or -1), c do out.n = out.n + 1; out[out.n] = i end
    if out.n > 100000 then
      eval.rt_error(interp, 'Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).')
    end
    return values.list(out)
  end, 'range')
  return g
end

function Template:pick(opts)
  if not self.named then return self end
  if opts.tools ~= nil and self.named.tool_use then return self.named.tool_use end
  if self.named.default then return self.named.default end
  error(("chat template: %s has several templates (%s) and none named 'default'; pass {name=...} to load")
    :format(self.name, table.concat(self.names, ', ')), 0)
end

local function context(self, messages, opts)
  local ctx = {}
  for _, k in ipairs(SPECIAL) do
    local v = opts[k]
    if v == nil then v = self.special_tokens[k] end
    if v ~= nil then ctx[k] = v end
  end
  if opts.extra then
    for k, v in pairs(opts.extra) do ctx[k] = values.from_lua(v) end
  end
  if opts.enable_thinking ~= nil then ctx.enable_thinking = opts.enable_thinking end
  ctx.messages = to_messages(messages)
  ctx.tools = opts.tools ~= nil and values.from_lua(opts.tools) or NONE
  ctx.documents = opts.documents ~= nil and values.from_lua(opts.documents) or NONE
  ctx.add_generation_prompt = opts.add_generation_prompt and true or false
  return ctx
end

local function run(self, messages, opts, ctx)
  opts = opts or {}
  local tpl = self:pick(opts)
  ctx = ctx or context(tpl, messages, opts)
  local ok, text, spans = pcall(eval.run, tpl.tree, globals(opts), ctx)
  if not ok then
    local e = text
    if type(e) == 'table' and e.template_error then
      if e.raised then
        error(("chat template '%s' raised an exception (line %d): %s"):format(tpl.name, e.line or 0, e.msg), 0)
      end
      error(("chat template '%s' line %d: %s"):format(tpl.name, e.line or 0, e.msg), 0)
    end
    error(("chat template '%s': %s"):format(tpl.name, tostring(e)), 0)
  end
  return text, spans
end

-- The rendered conversation. opts: add_generation_prompt, tools,
-- documents, bos_token / eos_token / ... (override the loaded ones),
-- enable_thinking, extra (more template variables), now (strftime_now's
-- clock, epoch seconds).
function Template:render(messages, opts)
  local text = run(self, messages, opts)
  return text
end

-- The template rendered with exactly the variables `vars` (a table of
-- name -> value, or a values.dict), none of render()'s: for tests and for
-- templates that are not chat templates. Returns text and generation spans.
function Template:render_vars(vars, opts)
  local ctx = {}
  if kind(vars) == 'dict' then
    for _, k in ipairs(vars.keys) do ctx[k] = vars.map[k] end
  else
    for k, v in pairs(vars or {}) do ctx[k] = values.from_lua(v) end
  end
  return run(self, nil, opts, ctx)
end

-- The rendered conversation and the spans of its {% generation %} blocks
-- (what transformers' return_assistant_tokens_mask marks): a list of
-- {start, stop}, 0-based byte offsets, stop exclusive. Errors when the
-- template has no generation markers (see assistant_spans_by_prefix).
function Template:render_spans(messages, opts)
  local tpl = self:pick(opts or {})
  if not tpl.has_generation then
    error(("chat template '%s' has no {%% generation %%} markers; use assistant_spans_by_prefix"):format(tpl.name), 2)
  end
  return run(self, messages, opts)
end

-- For templates without generation markers: each assistant message's span
-- is the text that rendering messages[1..i] adds to rendering
-- messages[1..i-1] with add_generation_prompt=true (the approach of
-- prefix-diffing loss-mask builders, e.g. LLaMA-Factory's and the manual
-- masking TRL documents before {% generation %}): the span holds the
-- message and what the template closes it with (end-of-turn token), not the
-- assistant header. It requires the template to be prefix-stable: each
-- partial render must be a prefix of the full one; a template that renders
-- earlier turns differently once later ones follow (Qwen 3 drops past
-- thinking) is refused naming the message. Returns text and spans as
-- render_spans.
function Template:assistant_spans_by_prefix(messages, opts)
  opts = opts or {}
  local msgs = values.from_lua(messages)
  local full = self:render(msgs, opts)
  local spans = {}
  local function with(n, gen)
    local sub = { n = n }
    for j = 1, n do sub[j] = msgs[j] end
    local o = {}
    for k, v in pairs(opts) do o[k] = v end
    o.add_generation_prompt = gen
    return self:render(values.list(sub), o)
  end
  for i = 1, msgs.n do
    local m = msgs[i]
    local role = kind(m) == 'dict' and m.map.role
    if role == 'assistant' then
      if i == 1 then
        error(("chat template '%s': message 1 is an assistant message; prefix spans need a message before it")
          :format(self.name), 0)
      end
      local before = with(i - 1, true)
      local upto = (i == msgs.n and not opts.add_generation_prompt) and full or with(i, false)
      if upto:sub(1, #before) ~= before or full:sub(1, #upto) ~= upto then
        error(("chat template '%s' is not prefix-stable at message %d (assistant): rendering the conversation up "
          .. "to it is not a prefix of rendering all of it; use a template with {%% generation %%} markers")
          :format(self.name, i), 0)
      end
      spans[#spans + 1] = { #before, #upto }
    end
  end
  return full, spans
end

return M
