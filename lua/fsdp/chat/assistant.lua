-- fsdp.chat.assistant: a model's answers to conversations through its chat
-- template: where the tokenizer and template of a model come from, the
-- ids that end a turn, and greedy or sampled replies (recipes/sft.lua's
-- sample answers and exact-match evaluation, recipes/chat.lua).
--
--   local assistant = require 'fsdp.chat.assistant'
--   local a = assistant.open(src, {tokenizer = '', chat_template = ''})   -- src: models/pretrained.open's
--   -- a.tok, a.tpl, a.stop (ids ending a turn), a.from (where they came from)
--   local texts = a:replies(model, { messages1, messages2 }, {max_new_tokens = 64})   -- greedy, batched
--   local text = a:reply(model, messages, {do_sample = true, temperature = 0.7, on_text = io.write})
--
-- The prompt is the template's rendering of the messages with
-- add_generation_prompt, tokenized as apply_chat_template(tokenize=True)
-- does (no special tokens added: the template writes them). A turn ends at
-- the first of `stop`: the tokenizer's eos, the template's eos_token, and
-- the eos_token_id of the model's generation_config.json / config.json (or
-- what a checkpoint recorded of them): Llama 3 ends a turn with <|eot_id|>
-- and the text with <|end_of_text|>, both stop.
local fsdp = require 'fsdp'
local files = require 'fsdp.io.files'
local template = require 'fsdp.chat.template'
local tokenizer = require 'fsdp.data.tokenizer'
local generate = require 'fsdp.generate'
local options = require 'fsdp.options'

local M = {}
local Assistant = {}
Assistant.__index = Assistant

local function fail(fmt, ...) error(fmt:format(...), 0) end

-- A template from a model directory (chat_template.jinja or
-- tokenizer_config.json) or a .jinja file (special tokens from the
-- tokenizer_config.json beside it, if any).
local function load_template(path)
  if files.mode(path) == 'directory' then return template.load(path) end
  local text, why = files.read(path, files.LIMITS.text[1], 'a chat template')
  if not text then fail('%s', why) end
  local special = {}
  local dir = path:match('^(.*)/[^/]*$') or '.'
  local ok, t = pcall(template.load, dir)
  if ok then special = t.special_tokens end
  return template.compile(text, { name = path, special_tokens = special })
end

-- The tokenizer, template and stop ids of a model source (src from
-- models/pretrained.open, or nil), or of opts.tokenizer / opts.chat_template
-- (a directory or file) when given. Raises one line naming what is
-- missing.
function M.open(src, opts)
  opts = opts or {}
  local dir = src and (src.hf_dir or src.tokenizer_from) or nil
  local where = src and src.path or 'the model'
  local tok_spec = (opts.tokenizer or '') ~= '' and opts.tokenizer or dir
  if not tok_spec or not tokenizer.find_in(tok_spec) and files.mode(tok_spec) == 'directory' then
    fail('%s has no tokenizer (tokenizer.json or tokenizer.model)%s: give --tokenizer', where,
      dir and (' in ' .. dir) or '')
  end
  local ok, tok = pcall(tokenizer.load, tok_spec)
  if not ok then fail('--tokenizer %s: %s', tok_spec, options.bare(tok)) end
  local tpl_spec = (opts.chat_template or '') ~= '' and opts.chat_template or dir
  if not tpl_spec then
    fail('%s has no chat template: give --chat_template (a model directory or a .jinja file)', where)
  end
  local ok2, tpl = pcall(load_template, tpl_spec)
  if not ok2 then fail('%s (give --chat_template: a model directory or a .jinja file)', tostring(tpl)) end
  local stop, seen = {}, {}
  local function add(id)
    if type(id) == 'number' and not seen[id] then stop[#stop + 1], seen[id] = id, true end
  end
  add(tok.eos_id)
  local eos_text = tpl.special_tokens and tpl.special_tokens.eos_token
  if eos_text and type(tok.token_to_id) == 'function' then add(tok:token_to_id(eos_text)) end
  local eos = src and src.token_ids and src.token_ids.eos_token_id
  if type(eos) == 'table' then for _, e in ipairs(eos) do add(e) end else add(eos) end
  if #stop == 0 then fail('%s: no end-of-turn token: neither the tokenizer nor the template names an eos', where) end
  return setmetatable({ tok = tok, tpl = tpl, stop = stop, from = { tokenizer = tok_spec, template = tpl_spec } },
    Assistant)
end

-- The prompt ids of messages with the generation prompt; {plain = text}
-- (a prompt/completion record's prompt) is the text alone, with the
-- tokenizer's own special tokens, as fsdp.data.chat_tokens trains it.
function Assistant:prompt_ids(messages, render)
  if messages.plain then
    return self.tok:encode({ messages.text }, { add_special = true })[1]:tolist(), messages.text
  end
  local o = { add_generation_prompt = true }
  for k, v in pairs(render or {}) do o[k] = v end
  local text = self.tpl:render(messages, o)
  return self.tok:encode({ text })[1]:tolist(), text
end

-- The text of generated ids, the stop id and special tokens left out.
function Assistant:text(ids)
  local keep = {}
  for _, id in ipairs(ids) do
    local stop = false
    for _, s in ipairs(self.stop) do if id == s then stop = true end end
    if stop then break end
    keep[#keep + 1] = id
  end
  if #keep == 0 then return '' end
  return self.tok:decode(fsdp.tensor(keep, { dtype = 'i64' }), { skip_special = true })
end

-- Greedy (or opts' sampling) replies to a list of conversations, batched
-- (left-padded: fsdp.generate). The model is whole on this process (not
-- sharded, or inside fsdp.summon_full_params). opts: fsdp.generate's
-- options (stop_ids default self.stop), batch (prompts per call, 16),
-- render (template options).
function Assistant:replies(model, conversations, opts)
  opts = opts or {}
  local out, batch = {}, opts.batch or 16
  local g = {}
  for k, v in pairs(opts) do if generate.DEFAULTS[k] ~= nil then g[k] = v end end
  g.stop_ids = g.stop_ids or self.stop
  for i = 1, #conversations, batch do
    local prompts = {}
    for j = i, math.min(i + batch - 1, #conversations) do prompts[#prompts + 1] = self:prompt_ids(conversations[j],
      opts.render) end
    local rows = generate.generate(model, prompts, g)
    for j, row in ipairs(rows) do out[i + j - 1] = self:text(row) end
  end
  return out
end

-- One reply, its text streamed to opts.on_text(piece) as it comes (each
-- step the reply so far is decoded whole and what is new passed on, a
-- character of several bytes once complete). Returns the text and the ids.
function Assistant:reply(model, messages, opts)
  opts = opts or {}
  local g = {}
  for k, v in pairs(opts) do if generate.DEFAULTS[k] ~= nil then g[k] = v end end
  g.stop_ids = g.stop_ids or self.stop
  local so_far, shown = {}, ''
  g.on_token = function(_, tokens, done)
    so_far[#so_far + 1] = tokens[1]
    if not opts.on_text then return end
    local text = self:text(so_far)
    while text:sub(-3) == '\239\191\189' do text = text:sub(1, -4) end
    if #text > #shown and text:sub(1, #shown) == shown then
      opts.on_text(text:sub(#shown + 1))
      shown = text
    end
    if done[1] then so_far.done = true end
  end
  local rows = generate.generate(model, { (self:prompt_ids(messages, opts.render)) }, g)
  local text = self:text(rows[1])
  if opts.on_text and #text > #shown and text:sub(1, #shown) == shown then opts.on_text(text:sub(#shown + 1)) end
  return text, rows[1]
end

-- Whether a reply is the reference: equal after trimming white space at
-- both ends (exact match).
function M.exact(reply, reference)
  return reply:match('^%s*(.-)%s*$') == reference:match('^%s*(.-)%s*$')
end

-- A conversation's prompt and reference: the messages before its last
-- assistant message, and that message's text (nil when it has none); a
-- plain prompt/completion record's {plain = true, text = prompt} and its
-- completion.
function M.prompt_and_reference(conv)
  local msgs = conv.messages
  if conv.plain then return { plain = true, text = msgs[1].content }, msgs[2].content end
  for i = #msgs, 1, -1 do
    if msgs[i].role == 'assistant' then
      local p = {}
      for j = 1, i - 1 do p[j] = msgs[j] end
      return p, msgs[i].content
    end
  end
  return nil
end

return M
