-- fsdp.data.chat_tokens: one conversation (fsdp.data.chat) to the ids and
-- labels of a training example, through the model's chat template and
-- tokenizer.
--
--   local chat_tokens = require 'fsdp.data.chat_tokens'
--   local ex = chat_tokens.encode(conv, tpl, tok, { train_on = 'assistant' })
--   -- ex.ids, ex.labels: i64 [n]; ex.text: the rendered text; ex.trained: labels not -100
--   local targets = chat_tokens.targets(ex.labels)   -- what model:loss(ids, targets) takes
--
-- The renderer is an object with tpl:render(messages, opts) -> text and
-- tpl:render_spans(messages, opts) -> text, spans (the chat-template
-- interpreter): spans are the byte ranges of the assistant messages'
-- generated text in the rendered text, {start, end} 0-based with end
-- exclusive (text:sub(start + 1, end) in Lua), one per assistant message in
-- order, as transformers' {% generation %} markers give them. opts passed
-- on: add_generation_prompt = false, tools = conv.tools, and opts.render's
-- fields. A template without generation markers gives no spans; then each
-- assistant message i is found by rendering prefixes, as LLaMA-Factory and
-- axolotl do: its span runs from the end of render(messages[1..i-1],
-- add_generation_prompt = true) to the end of render(messages[1..i]), both
-- of which must be prefixes of the whole rendering (a template that
-- rewrites earlier turns, e.g. Qwen3 dropping past reasoning, is refused
-- naming the message; give it {% generation %} markers).
--
-- Labels are aligned with ids, as transformers' `labels` are (the model's
-- loss shifts them; this project's model:loss takes targets already
-- shifted: chat_tokens.targets): a token's label is its id when it lies in
-- a trained message's span, -100 elsewhere. train_on = 'all' labels every
-- token. Special tokens are the template's: the text is tokenized with no
-- special tokens added, as apply_chat_template(tokenize=True) calls the
-- tokenizer with add_special_tokens=False (the template writes bos itself:
-- no double bos). Plain prompt/completion records (conv.plain) use no
-- template: ids = [bos when the tokenizer adds one] prompt completion eos,
-- the completion and eos trained, as TRL's SFTTrainer does.
--
-- [Note: assistant spans to token labels]
-- The text is tokenized once, whole, and those ids are the example's: what
-- the model sees is exactly the tokenization of the rendered text. Which of
-- them are trained: the text is cut at every span boundary and the pieces
-- are tokenized; when the pieces' ids put together equal the whole text's
-- (the usual case: templates put span boundaries next to special tokens or
-- newlines, where the pre-tokenizer splits anyway), each token belongs to
-- one piece and is labelled by it, exactly. Otherwise a token straddles a
-- boundary, and the tokens' byte offsets decide: a token is trained when
-- it overlaps a trained span, transformers' rule for
-- return_assistant_tokens_mask (apply_chat_template marks every token whose
-- offsets overlap a generation span). The offsets come from the tokens'
-- bytes (byte-level BPE: one character of a token per byte; the byte
-- tokenizer: one byte each), checked to add up to the text's length; a
-- tokenizer whose tokens do not spell the text byte for byte (a
-- normaliser that changed it, SentencePiece's dummy prefix) is refused
-- naming the conversation and the boundary, never labelled approximately.
local fsdp = require 'fsdp'
local core = require 'fsdp.core'

local M = {}

local IGNORE = -100

local function fail(where, fmt, ...)
  error(('fsdp.data.chat_tokens: %s: '):format(where or 'a conversation') .. fmt:format(...), 0)
end

local function i64(list) return fsdp.tensor(list, { dtype = 'i64' }) end
local function empty() return fsdp.empty({ 0 }, { dtype = 'i64' }) end

local function cat(parts)
  local keep = {}
  for _, p in ipairs(parts) do
    if p:numel() > 0 then keep[#keep + 1] = p end
  end
  if #keep == 0 then return empty() end
  if #keep == 1 then return keep[1] end
  return fsdp.cat(keep, 0)
end

local function same(a, b)
  if a:numel() ~= b:numel() then return false end
  if a:numel() == 0 then return true end
  return fsdp.F.ne(a, b):to('i64'):sum():item() == 0
end

-- Each token's length in bytes of the text it spells, or nil when the
-- tokenizer cannot say (see the Note).
local function token_lengths(tok)
  if rawget(tok, '_chat_lengths') ~= nil then return rawget(tok, '_chat_lengths') or nil end
  local f = false
  if tok.name == 'byte' then
    f = function() return 1 end
  elseif type(tok.id_to_token) == 'function' and type(tok.is_special) == 'function' then
    -- byte-level BPE: the vocabulary writes each byte as one character
    local cache = {}
    f = function(id)
      local n = cache[id]
      if n then return n end
      local s = tok:id_to_token(id)
      if tok:is_special(id) then n = #s else n = #s - select(2, s:gsub('[\128-\191]', '')) end
      cache[id] = n
      return n
    end
  end
  rawset(tok, '_chat_lengths', f)
  return f or nil
end

-- Labels of whole-text ids by token offsets (the Note's fallback): a token
-- overlapping a trained span is trained. A per-token loop over one
-- example's ids, done once when the data is prepared.
local function labels_by_offsets(tok, ids, text, spans, where)
  local len = token_lengths(tok)
  if not len then
    fail(where, 'a token of %s straddles an assistant span boundary and this tokenizer gives no byte offsets to '
      .. 'place it (see [Note: assistant spans to token labels])', tostring(tok.name))
  end
  local list = ids:tolist()
  local labels, pos, k = {}, 0, 1
  for j, id in ipairs(list) do
    local a = pos
    pos = pos + len(id)
    while spans[k] and spans[k][2] <= a do k = k + 1 end
    local s = spans[k]
    labels[j] = (s and pos > s[1] and a < s[2]) and id or IGNORE
  end
  if pos ~= #text then
    fail(where, 'the tokens of %s spell %d bytes where the text has %d (a normaliser changed the text?): their '
      .. 'offsets cannot place the assistant spans', tostring(tok.name), pos, #text)
  end
  return i64(labels)
end

-- ids and labels of text with the given trained spans (0-based [s, e),
-- sorted, disjoint).
function M.tokenize(tok, text, spans, where)
  local whole = tok:encode({ text })[1]
  if #spans == 0 then return whole, fsdp.full({ whole:numel() }, IGNORE, { dtype = 'i64' }) end
  local pieces, trained, at = {}, {}, 0
  for _, s in ipairs(spans) do
    if s[1] > at then pieces[#pieces + 1], trained[#pieces + 1] = text:sub(at + 1, s[1]), false end
    if s[2] > s[1] then pieces[#pieces + 1], trained[#pieces + 1] = text:sub(s[1] + 1, s[2]), true end
    at = s[2]
  end
  if at < #text then pieces[#pieces + 1], trained[#pieces + 1] = text:sub(at + 1), false end
  local parts = tok:encode(pieces)
  if same(cat(parts), whole) then
    local labels = {}
    for i, p in ipairs(parts) do
      labels[i] = trained[i] and p or fsdp.full({ p:numel() }, IGNORE, { dtype = 'i64' })
    end
    return whole, cat(labels)
  end
  return whole, labels_by_offsets(tok, whole, text, spans, where)
end

local function check_spans(spans, n, text, where)
  if type(spans) ~= 'table' then fail(where, 'the renderer gave spans of type %s, not a list', type(spans)) end
  local at = 0
  for i, s in ipairs(spans) do
    local a, b = type(s) == 'table' and s[1], type(s) == 'table' and s[2]
    if type(a) ~= 'number' or type(b) ~= 'number' or a < at or b < a or b > #text then
      fail(where, 'the renderer\'s span %d (%s, %s) is not a byte range in order within the %d-byte text', i,
        tostring(a), tostring(b), #text)
    end
    at = b
  end
  if #spans ~= n then
    fail(where, 'the renderer marked %d assistant spans for %d assistant messages', #spans, n)
  end
end

local function render_opts(conv, opts, generation_prompt)
  local o = {}
  for k, v in pairs(opts.render or {}) do o[k] = v end
  o.add_generation_prompt = generation_prompt
  if conv.tools and o.tools == nil then o.tools = conv.tools end
  return o
end

local function prefix(msgs, i)
  local p = {}
  for j = 1, i do p[j] = msgs[j] end
  return p
end

-- Spans of every assistant message by rendering prefixes (see the top).
local function spans_by_prefix(tpl, conv, opts, text, where)
  local spans = {}
  local msgs = conv.messages
  for i, m in ipairs(msgs) do
    if m.role == 'assistant' then
      local before = tpl:render(prefix(msgs, i - 1), render_opts(conv, opts, true))
      local through = tpl:render(prefix(msgs, i), render_opts(conv, opts, false))
      if text:sub(1, #before) ~= before or text:sub(1, #through) ~= through or #through < #before then
        fail(where, 'the template renders message %d differently in the whole conversation than after its '
          .. 'prefix, and marks no {%% generation %%} spans: the assistant tokens cannot be found', i)
      end
      spans[#spans + 1] = { #before, #through }
    end
  end
  return spans
end

local function plain_specials(tok)
  local v = rawget(tok, '_chat_bos')
  if v == nil then
    v = false
    if tok.bos_id then
      local ids = tok:encode({ 'a' }, { add_special = true })[1]
      v = ids:numel() > 0 and ids:get(0) == tok.bos_id
    end
    rawset(tok, '_chat_bos', v)
  end
  return v
end

-- One conversation to {ids, labels, text, trained}: see the top. opts:
-- train_on ('assistant' | 'all'), render (more options for the renderer).
function M.encode(conv, tpl, tok, opts)
  opts = opts or {}
  local train_on = opts.train_on or 'assistant'
  if train_on ~= 'assistant' and train_on ~= 'all' then
    core.fail(('fsdp.data.chat_tokens: train_on must be assistant or all, got %s'):format(tostring(train_on)))
  end
  local where = conv.where
  local ids, labels, text
  if conv.plain then
    local p, c = conv.messages[1].content, conv.messages[2].content
    text = p .. c
    if not tok.eos_id then fail(where, 'the tokenizer %s has no eos token to end the completion', tostring(tok)) end
    ids, labels = M.tokenize(tok, text, { { train_on == 'all' and 0 or #p, #text } }, where)
    local head = plain_specials(tok) and { i64({ tok.bos_id }) } or {}
    local eos = i64({ tok.eos_id })
    local hl = #head > 0 and { i64({ train_on == 'all' and tok.bos_id or IGNORE }) } or {}
    ids = cat({ head[1] or empty(), ids, eos })
    labels = cat({ hl[1] or empty(), labels, eos })
  elseif train_on == 'all' then
    text = tpl:render(conv.messages, render_opts(conv, opts, false))
    ids = tok:encode({ text })[1]
    labels = ids:clone()
  else
    local spans
    -- (fsdp.chat.template's render_spans refuses a template without
    -- {% generation %} markers: its spans are found by prefixes below)
    if tpl.has_generation == false then
      text = tpl:render(conv.messages, render_opts(conv, opts, false))
    else
      text, spans = tpl:render_spans(conv.messages, render_opts(conv, opts, false))
    end
    if type(text) ~= 'string' then fail(where, 'the renderer gave %s, not the rendered text', type(text)) end
    local n = 0
    for _, m in ipairs(conv.messages) do if m.role == 'assistant' then n = n + 1 end end
    if spans == nil or (type(spans) == 'table' and #spans == 0) then
      spans = spans_by_prefix(tpl, conv, opts, text, where)
    end
    check_spans(spans, n, text, where)
    local trained, k = {}, 0
    for i, m in ipairs(conv.messages) do
      if m.role == 'assistant' then
        k = k + 1
        if conv.train[i] then trained[#trained + 1] = spans[k] end
      end
    end
    ids, labels = M.tokenize(tok, text, trained, where)
  end
  local count = fsdp.F.ne(labels, IGNORE):to('i64'):sum():item()
  return { ids = ids, labels = labels, text = text, trained = count }
end

-- The targets of an example's ids for model:loss (next-token prediction):
-- labels shifted left by one, -100 last.
function M.targets(labels)
  local n = labels:numel()
  if n <= 1 then return fsdp.full({ n }, IGNORE, { dtype = 'i64' }) end
  return fsdp.cat({ labels:narrow(0, 1, n - 1), i64({ IGNORE }) }, 0)
end

return M
