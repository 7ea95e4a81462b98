-- fsdp.data.chat: chat and instruction records (JSON lines, also .gz/.zst;
-- a file, a directory or a glob), streamed by the core's reader
-- (core/data/reader.c, whole_record: bounded line length, invalid UTF-8
-- and non-object lines refused with file and line) and normalised to one
-- shape whatever the dataset wrote:
--
--   local chat = require 'fsdp.data.chat'
--   local it, stats = chat.records('data/*.jsonl.gz', { fields = 'messages:dialog', train_on = 'assistant' })
--   for conv, pos in it do ... end    -- conv: see below; pos {path, line, index}
--   print(stats.records, stats.skipped, stats.first)      -- bad_records = 'skip': the count and the first
--   local conv = chat.normalise(record, opts, 'where')   -- one decoded record
--
-- A conversation is
--   { messages = { {role =, content = string, tool_calls = list?, name =?, tool_call_id =?,
--                   reasoning_content =?}, ... },
--     train = { [i] = true, ... },   -- the messages whose tokens are trained
--     plain = true | nil,            -- prompt/completion strings: no template (below)
--     tools = list | nil,            -- the record's `tools`, for the template
--     format = 'messages' | 'sharegpt' | 'alpaca' | 'prompt_completion', where = 'FILE: line N' }
-- The shapes, told apart by their fields:
--   messages           {"messages": [{"role", "content"}, ...]}: roles system, user, assistant,
--                      tool; content a string, null (an assistant turn with tool_calls), or a list
--                      of parts {"type": "text", "text": ...} (joined; other part types are refused);
--                      assistant tool_calls ([{"type": "function", "function": {"name", "arguments"}}])
--   sharegpt           {"conversations": [{"from", "value"}, ...]}: human -> user, gpt -> assistant,
--                      system, and the role names above as they are
--   alpaca             {"instruction", "input"?, "output", "system"?}: one user turn (instruction,
--                      then a blank line and the input when it is not empty) and one assistant turn
--   prompt_completion  {"prompt", "completion"}: both strings (plain text: prompt .. completion,
--                      no template, the completion trained, as TRL's SFTTrainer), or both lists of
--                      messages (TRL's "conversational prompt-completion": the template renders
--                      prompt + completion, only the completion's messages are trained)
-- Other field names: opts.fields maps the names above (messages, role, content, conversations, from,
-- value, instruction, input, output, system, prompt, completion, tool_calls, tools) to the record's,
-- as a table or as the --chat_fields text 'messages:dialog,role:speaker,content:text'.
--
-- Which messages are trained: opts.train_on = 'assistant' (default) trains every assistant message
-- (for prompt_completion: the completion's) and then requires one, and requires the conversation
-- to end with one (a trailing user or tool turn would be rendered for nothing); 'all' trains every
-- message (the tokenizer side, fsdp.data.chat_tokens, then labels every token).
--
-- Bad records (not a JSON object, no known shape, a missing field or one of the wrong type, an
-- empty conversation, an unknown role or part type, the endings above) are one-line errors naming
-- the file and line, by default (opts.bad_records = 'stop'). With 'skip' they are counted
-- (stats.skipped) and the first is kept (stats.first, its message), so a run can say "skipped 12
-- bad records, the first: ..." and go on: a few broken lines in a scraped dataset should not stop
-- a job, and a silently shrinking dataset should not go unnoticed either.
local ffi = require 'ffi'
local cjson = require 'cjson'
local core = require 'fsdp.core'
local corpus = require 'fsdp.data.corpus'
local C = core.C

local M = {}

M.NAMES = { 'messages', 'role', 'content', 'conversations', 'from', 'value', 'instruction', 'input', 'output',
            'system', 'prompt', 'completion', 'tool_calls', 'tools' }
local KNOWN = {}
for _, n in ipairs(M.NAMES) do KNOWN[n] = true end

M.ROLES = { system = true, user = true, assistant = true, tool = true }
local SHAREGPT_ROLES = { human = 'user', gpt = 'assistant', system = 'system', user = 'user',
                         assistant = 'assistant', tool = 'tool' }
-- message fields templates read, kept as the record has them
local KEEP = { 'name', 'tool_call_id', 'reasoning_content' }

local function fail(fmt, ...) core.fail('fsdp.data.chat: ' .. fmt:format(...)) end

-- The field mapping: a table {canonical = name} or 'a:b,c:d' text; every
-- canonical name maps to itself unless told otherwise.
function M.fields(spec)
  local f = {}
  for _, n in ipairs(M.NAMES) do f[n] = n end
  if spec == nil or spec == '' then return f end
  local given = spec
  if type(spec) == 'string' then
    given = {}
    for item in spec:gmatch('[^,]+') do
      local k, v = item:match('^%s*([%w_]+)%s*:%s*(.-)%s*$')
      if not k or v == '' then
        fail('fields: %q is not canonical:name (e.g. messages:dialog,role:speaker,content:text)', item)
      end
      given[k] = v
    end
  elseif type(spec) ~= 'table' then
    fail('fields: expected a table or \'canonical:name,...\' text, got %s', type(spec))
  end
  for k, v in pairs(given) do
    if not KNOWN[k] then fail('fields: unknown name %q (known: %s)', tostring(k), table.concat(M.NAMES, ', ')) end
    if type(v) ~= 'string' or v == '' then fail('fields: %s must map to a field name, got %s', k, tostring(v)) end
    f[k] = v
  end
  return f
end

local function check_train_on(v)
  v = v or 'assistant'
  if v ~= 'assistant' and v ~= 'all' then fail('train_on must be assistant or all, got %s', tostring(v)) end
  return v
end

local function is_list(v) return type(v) == 'table' and (next(v) == nil or v[1] ~= nil) end
local function is_object(v) return type(v) == 'table' and (next(v) == nil or v[1] == nil) end
local function kind(v)
  if v == cjson.null then return 'null' end
  if type(v) == 'table' then return is_list(v) and 'a list' or 'an object' end
  return 'a ' .. type(v)
end

-- A record error: raised with a marker the reader turns into "file:line: ...".
local BAD = {}
local function bad(fmt, ...) error(setmetatable({ msg = fmt:format(...) }, BAD), 0) end

-- A message's content as one string.
local function content_text(v, what, f, tool_calls)
  if type(v) == 'string' then return v end
  if (v == nil or v == cjson.null) and tool_calls then return '' end
  if is_list(v) and type(v) == 'table' then
    local parts = {}
    for j, p in ipairs(v) do
      if type(p) == 'string' then
        parts[#parts + 1] = p
      elseif is_object(p) then
        if p.type ~= 'text' then
          bad('%s.%s[%d] is a part of type %s; only text parts are read', what, f.content, j, tostring(p.type))
        end
        if type(p.text) ~= 'string' then bad('%s.%s[%d].text is %s, not a string', what, f.content, j, kind(p.text)) end
        parts[#parts + 1] = p.text
      else
        bad('%s.%s[%d] is %s, not a part {"type": "text", "text": ...}', what, f.content, j, kind(p))
      end
    end
    return table.concat(parts)
  end
  if v == nil then bad('%s has no "%s" field', what, f.content) end
  bad('%s.%s is %s, not a string or a list of text parts', what, f.content, kind(v))
end

local function check_tool_calls(tc, what, f)
  if not is_list(tc) or type(tc) ~= 'table' then bad('%s.%s is %s, not a list', what, f.tool_calls, kind(tc)) end
  for j, call in ipairs(tc) do
    if not is_object(call) then bad('%s.%s[%d] is %s, not an object', what, f.tool_calls, j, kind(call)) end
    local fn = call['function']
    if not is_object(fn) or type(fn.name) ~= 'string' then
      bad('%s.%s[%d] has no function.name (a call is {"type": "function", "function": {"name", "arguments"}})',
        what, f.tool_calls, j)
    end
  end
  return tc
end

-- The messages of a list in the messages shape (role/content) or
-- ShareGPT's (from/value).
local function messages_of(list, what, f, sharegpt)
  local role_key, content_key = sharegpt and f.from or f.role, sharegpt and f.value or f.content
  if type(list) ~= 'table' or not is_list(list) then bad('"%s" is %s, not a list of messages', what, kind(list)) end
  if #list == 0 then bad('"%s" is an empty conversation', what) end
  local out = {}
  for i, m in ipairs(list) do
    local here = ('%s[%d]'):format(what, i)
    if not is_object(m) then bad('%s is %s, not a message object', here, kind(m)) end
    local role = m[role_key]
    if type(role) ~= 'string' then
      bad('%s has no "%s" string (has %s)', here, role_key, type(role) == 'nil' and 'none' or kind(role))
    end
    local r = sharegpt and SHAREGPT_ROLES[role] or (not sharegpt and M.ROLES[role] and role)
    if not r then
      bad('%s has the unknown role %q (%s)', here, role,
        sharegpt and 'known: human, gpt, system, user, assistant, tool' or 'known: system, user, assistant, tool')
    end
    local msg = { role = r }
    local tc = m[f.tool_calls]
    if tc ~= nil and tc ~= cjson.null then
      if r ~= 'assistant' then bad('%s has %s but is a %s message', here, f.tool_calls, r) end
      msg.tool_calls = check_tool_calls(tc, here, f)
    end
    msg.content = content_text(m[content_key], here, { content = content_key }, msg.tool_calls ~= nil)
    for _, k in ipairs(KEEP) do
      if type(m[k]) == 'string' then msg[k] = m[k] end
    end
    out[i] = msg
  end
  return out
end

local function string_field(rec, name, required)
  local v = rec[name]
  if v == nil or v == cjson.null then
    if required then bad('has no "%s" field', name) end
    return nil
  end
  if type(v) ~= 'string' then bad('"%s" is %s, not a string', name, kind(v)) end
  return v
end

-- The shape of a record from its fields.
local function shape(rec, f)
  if rec[f.messages] ~= nil then return 'messages' end
  if rec[f.conversations] ~= nil then return 'sharegpt' end
  if rec[f.prompt] ~= nil or rec[f.completion] ~= nil then return 'prompt_completion' end
  if rec[f.instruction] ~= nil or rec[f.output] ~= nil then return 'alpaca' end
  local keys = {}
  for k in pairs(rec) do keys[#keys + 1] = tostring(k) end
  table.sort(keys)
  bad('no "%s", "%s", "%s"/"%s" or "%s"/"%s" field (it has: %s; --chat_fields maps other names)', f.messages,
    f.conversations, f.prompt, f.completion, f.instruction, f.output, #keys > 0 and table.concat(keys, ', ')
    or 'nothing')
end

local function normalise(rec, f, train_on)
  if not is_object(rec) then bad('is %s, not a JSON object', kind(rec)) end
  local conv = { format = shape(rec, f), train = {} }
  local msgs = conv.messages
  if conv.format == 'messages' or conv.format == 'sharegpt' then
    local key = conv.format == 'messages' and f.messages or f.conversations
    msgs = messages_of(rec[key], key, f, conv.format == 'sharegpt')
    for i, m in ipairs(msgs) do conv.train[i] = train_on == 'all' or m.role == 'assistant' end
  elseif conv.format == 'alpaca' then
    local instruction, output = string_field(rec, f.instruction, true), string_field(rec, f.output, true)
    local input, system = string_field(rec, f.input), string_field(rec, f.system)
    msgs = {}
    if system and system ~= '' then msgs[1] = { role = 'system', content = system } end
    msgs[#msgs + 1] = { role = 'user', content = (input and input ~= '') and (instruction .. '\n\n' .. input)
      or instruction }
    msgs[#msgs + 1] = { role = 'assistant', content = output }
    for i, m in ipairs(msgs) do conv.train[i] = train_on == 'all' or m.role == 'assistant' end
  else
    local p, c = rec[f.prompt], rec[f.completion]
    if p == nil then bad('has "%s" but no "%s"', f.completion, f.prompt) end
    if c == nil then bad('has "%s" but no "%s"', f.prompt, f.completion) end
    if type(p) == 'string' and type(c) == 'string' then
      conv.plain = true
      msgs = { { role = 'user', content = p }, { role = 'assistant', content = c } }
      conv.train = { train_on == 'all', true }
    elseif type(p) == 'table' and type(c) == 'table' then
      local pm, cm = messages_of(p, f.prompt, f), messages_of(c, f.completion, f)
      msgs = {}
      for _, m in ipairs(pm) do msgs[#msgs + 1] = m; conv.train[#msgs] = train_on == 'all' end
      for _, m in ipairs(cm) do
        msgs[#msgs + 1] = m
        conv.train[#msgs] = train_on == 'all' or m.role == 'assistant'
      end
      if train_on == 'assistant' and cm[#cm].role ~= 'assistant' then
        bad('"%s" ends with a %s message, not an assistant one (nothing after it is trained)', f.completion,
          cm[#cm].role)
      end
    else
      bad('"%s" is %s and "%s" is %s: both strings (plain text) or both lists of messages', f.prompt, kind(p),
        f.completion, kind(c))
    end
  end
  if train_on == 'assistant' and not conv.plain then
    local any = false
    for i = 1, #msgs do any = any or conv.train[i] end
    if not any then bad('holds no assistant message to train on (--train_on=all trains every token)') end
    if msgs[#msgs].role ~= 'assistant' then
      bad('ends with a %s message, not an assistant one (nothing after it is trained; --train_on=all keeps it)',
        msgs[#msgs].role)
    end
  end
  local tools = rec[f.tools]
  if tools ~= nil and tools ~= cjson.null then
    if not is_list(tools) then bad('"%s" is %s, not a list', f.tools, kind(tools)) end
    conv.tools = tools
  end
  conv.messages = msgs
  return conv
end

-- One decoded record (a Lua table as cjson gives it) to a conversation;
-- where names it in errors ('FILE: line N', the reader's form). opts:
-- fields, train_on.
function M.normalise(rec, opts, where)
  opts = opts or {}
  local f = opts._fields or M.fields(opts.fields)
  local ok, conv = pcall(normalise, rec, f, check_train_on(opts.train_on))
  if ok then
    conv.where = where
    return conv
  end
  -- a data error: no source position of this file in front of it
  if getmetatable(conv) == BAD then error(('fsdp.data.chat: %s: the record %s'):format(where or '?', conv.msg), 0) end
  error(conv, 0)
end

local POLICIES = { stop = true, skip = true }

-- The recipe options of chat data (fsdp.options specs), and the opts of
-- records() and fsdp.data.chat_tokens.encode from a parsed config.
M.OPTIONS = {
  chat_fields = { '', 'chat data: field names other than the standard ones, canonical:name pairs (e.g. '
                      .. 'messages:dialog,role:speaker,content:text)' },
  train_on = { 'assistant', 'chat data: the tokens trained: the assistant messages\' (prompt/completion: the '
                            .. 'completion\'s) or all', one_of = { 'assistant', 'all' } },
  bad_records = { 'stop', 'chat data: a bad record stops the run naming its file and line, or is skipped and '
                          .. 'counted', one_of = { 'stop', 'skip' } },
  max_record_bytes = { 8388608, 'chat data: the longest record (JSON line) accepted, in bytes', int = true, min = 1 },
}

function M.record_opts(cfg)
  return { fields = cfg.chat_fields, train_on = cfg.train_on, bad_records = cfg.bad_records,
           max_record_bytes = cfg.max_record_bytes }
end

-- Iterate the conversations of a path (file, directory or glob of .jsonl/
-- .json, optionally .gz/.zst: fsdp.data.corpus.files). opts: fields,
-- train_on, bad_records ('stop' | 'skip'), max_record_bytes (8 MiB: a
-- longer line is an error naming it, whatever bad_records says: the
-- reader cannot step over it). Returns the iterator (conv, {path, line,
-- index}) and the stats table {records =, skipped =, first = message of
-- the first skipped}.
function M.records(spec, opts)
  opts = opts or {}
  local policy = opts.bad_records or 'stop'
  if not POLICIES[policy] then fail('bad_records must be stop or skip, got %s', tostring(policy)) end
  local nopts = { _fields = M.fields(opts.fields), train_on = check_train_on(opts.train_on) }
  local paths = corpus.files(spec)
  for _, p in ipairs(paths) do
    if p:match('%.txt$') or p:match('%.txt%.gz$') or p:match('%.txt%.zst$') then
      fail('%s: chat records are JSON lines (.jsonl or .json, optionally .gz/.zst), not text', p)
    end
  end
  local ro = ffi.new('fl_reader_opts')
  ro.max_doc_bytes = opts.max_record_bytes or 0
  ro.whole_record = true
  local stats = { records = 0, skipped = 0 }
  local k, r = 0, nil
  local text, len, pos = ffi.new('const char *[1]'), ffi.new('size_t[1]'), ffi.new('fl_doc_position')
  local function next_conv()
    while true do
      if r == nil then
        k = k + 1
        if k > #paths then return nil end
        r = ffi.gc(C.fl_reader_open(paths[k], ro), C.fl_reader_free)
        if r == nil then error('fsdp.data.chat: ' .. core.last_error(), 0) end
      end
      local rc = C.fl_reader_next(r, text, len)
      -- the reader's message names the file, line and byte; a .json file
      -- holding one JSON array (Alpaca's alpaca_data.json) says so
      if rc < 0 then
        local msg = core.last_error()
        if msg:find(': line 1 (byte 0) is not ', 1, true) and paths[k]:match('%.json$') then
          local f = io.open(paths[k], 'rb')
          local head = f and f:read(64) or ''
          if f then f:close() end
          if head:match('^%s*%[') then
            msg = msg .. (' (the file is one JSON array; records are read one JSON object per line: convert it '
              .. 'with jq -c \'.[]\' %s > records.jsonl)'):format(paths[k])
          end
        end
        error('fsdp.data.chat: ' .. msg, 0)
      end
      if rc == 1 then
        C.fl_reader_position(r, pos)
        local line = tonumber(pos.line)
        local where = ('%s: line %d'):format(paths[k], line)
        -- the reader parsed the line as an object already; cjson reads the fields
        local ok, rec = pcall(cjson.decode, ffi.string(text[0], len[0]))
        if not ok then error(('fsdp.data.chat: %s: the record is not JSON cjson reads: %s'):format(where, rec), 0) end
        local good, conv = pcall(M.normalise, rec, nopts, where)
        if good then
          stats.records = stats.records + 1
          return conv, { path = paths[k], line = line, index = tonumber(pos.index) }
        end
        if policy == 'stop' then error(conv, 0) end
        stats.skipped = stats.skipped + 1
        stats.first = stats.first or tostring(conv):gsub('^fsdp%.data%.chat: ', '')
      else
        C.fl_reader_free(ffi.gc(r, nil))
        r = nil
      end
    end
  end
  return next_conv, stats
end

return M
