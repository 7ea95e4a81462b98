-- fsdp.repl.complete: Tab completion of Lua names for the REPL.
--
--   complete.candidates('x = fsdp.ra', 'fsdp.ra')   -> {'fsdp.rand', 'fsdp.randint', 'fsdp.randn'}
--   complete.candidates('model.layers.0.', 'model.layers.0.') -> {'model.layers.0.input_layernorm', ...}
--   complete.candidates('x:', 'x:')                  -> {'x:abs', 'x:add', ...} (methods only)
--
-- The line editor hands over the line up to the cursor and the word it will
-- replace (the tail after the last operator, bracket or blank). The access
-- path before the cursor (`a.b[1].c:`, digits as field names like
-- `layers.0`, literal indices in brackets) is resolved from the globals by
-- indexing only: nothing is called but __index metamethods, so completing
-- never runs user code with side effects beyond them.
--
-- What a value offers: its metatable's __dir(value) when there is one (a
-- list of names: Tensors list their methods and properties, Modules their
-- children, parameters and methods, whose __index are functions), else
-- its own string keys and those reachable through __index tables. Names
-- starting with '_' are offered only when the typed prefix starts with '_'.
-- After ':' only functions are offered. Tab on a blank line indents. Needs nothing from the fsdp
-- library, like the REPL itself.
local M = {}

local KEYWORDS = {
  'and', 'break', 'do', 'else', 'elseif', 'end', 'false', 'for', 'function', 'if', 'in',
  'local', 'nil', 'not', 'or', 'repeat', 'return', 'then', 'true', 'until', 'while',
}

local function is_identifier(s)
  return type(s) == 'string' and s:match('^[%a_][%w_]*$') ~= nil
end

local function safe_index(obj, key)
  local t = type(obj)
  if t ~= 'table' and t ~= 'userdata' and t ~= 'cdata' and t ~= 'string' then return nil end
  local ok, v = pcall(function() return obj[key] end)
  if ok then return v end
  return nil
end

-- The names a value offers (a set), following __index tables a few levels.
function M.names(value)
  local names = {}
  local mt = getmetatable(value)
  if type(mt) == 'table' and type(rawget(mt, '__dir')) == 'function' then
    local ok, list = pcall(rawget(mt, '__dir'), value)
    if ok and type(list) == 'table' then
      for _, k in ipairs(list) do names[k] = true end
      return names
    end
  end
  if type(value) == 'string' then value = string end
  local seen = {}
  local t = value
  for _ = 1, 10 do
    if type(t) ~= 'table' or seen[t] then break end
    seen[t] = true
    for k in pairs(t) do
      if type(k) == 'string' then names[k] = true end
    end
    local m = getmetatable(t)
    if type(m) ~= 'table' then break end
    if type(rawget(m, '__dir')) == 'function' and t ~= value then
      local ok, list = pcall(rawget(m, '__dir'), t)
      if ok and type(list) == 'table' then for _, k in ipairs(list) do names[k] = true end end
    end
    t = rawget(m, '__index')
  end
  return names
end

-- A literal index inside brackets: a number or a quoted string without
-- escapes; nil for anything that would need evaluation.
local function literal_key(text)
  local n = text:match('^%s*(%-?%d+)%s*$')
  if n then return tonumber(n) end
  local _, s = text:match('^%s*(["\'])([^"\'\\]*)%1%s*$')
  return s
end

-- The access path ending at position `stop` of `s`: a list of keys whose
-- first is a global name, or nil when the text there is not a plain path.
-- Scans backwards one element at a time: `[literal]` or a name, the names
-- joined by '.'.
local function parse_path(s, stop)
  local keys, i = {}, stop
  while i >= 1 do
    if s:sub(i, i) == ']' then
      local depth, j = 0, i
      repeat
        local c = s:sub(j, j)
        if c == ']' then depth = depth + 1 elseif c == '[' then depth = depth - 1 end
        if depth > 0 then j = j - 1 end
      until depth == 0 or j < 1
      if j < 1 then return nil end
      local key = literal_key(s:sub(j + 1, i - 1))
      if key == nil then return nil end
      table.insert(keys, 1, key)
      i = j - 1
    else
      local name = s:sub(1, i):match('([%w_]+)$')
      if not name then return nil end
      table.insert(keys, 1, name)
      i = i - #name
      local c = s:sub(i, i)
      if c ~= '.' then
        -- The start: a global name, not a number, nor a field of a call's
        -- result, a string or a method.
        if not is_identifier(name) or c == ':' or c == ')' or c == '"' or c == "'" or c == ']' then
          return nil
        end
        return keys
      end
      i = i - 1
    end
  end
  return nil
end

-- Follow a path from env; digits after '.' name a field ("layers.0").
local function resolve(env, keys)
  local v = safe_index(env, keys[1])
  for k = 2, #keys do
    if v == nil then return nil end
    local key = keys[k]
    local nv = safe_index(v, key)
    if nv == nil and type(key) == 'string' and key:match('^%d+$') then nv = safe_index(v, tonumber(key)) end
    if nv == nil and type(key) == 'number' then nv = safe_index(v, tostring(key)) end
    v = nv
  end
  return v
end

-- Whether the cursor is inside a string literal (quotes are not balanced).
local function in_string(s)
  local quote, i = nil, 1
  while i <= #s do
    local c = s:sub(i, i)
    if quote then
      if c == '\\' then i = i + 1 elseif c == quote then quote = nil end
    elseif c == '"' or c == "'" then
      quote = c
    elseif s:sub(i, i + 1) == '--' then
      return true  -- a comment: nothing to complete
    end
    i = i + 1
  end
  return quote ~= nil
end

local function sorted(set)
  local out = {}
  for k in pairs(set) do out[#out + 1] = k end
  table.sort(out)
  return out
end

-- Replacements for `word` given the line up to the cursor; env defaults to
-- the globals.
function M.candidates(before, word, env)
  env = env or _G
  word = word or ''
  -- Tab on a blank line indents (a loop body typed over several lines).
  if before:match('^%s*$') then return { '  ' } end
  if in_string(before) then return {} end
  local partial = before:match('([%w_]*)$')
  local sep_at = #before - #partial
  local sep = before:sub(sep_at, sep_at)
  local pool, methods_only = {}, false
  if sep == '.' or sep == ':' then
    local keys = parse_path(before, sep_at - 1)
    if not keys then return {} end
    local value = resolve(env, keys)
    if value == nil then return {} end
    pool = M.names(value)
    methods_only = sep == ':'
    if methods_only then
      for k in pairs(pool) do
        -- Functions only: a child module is callable, but not a method.
        if type(safe_index(value, k)) ~= 'function' then pool[k] = nil end
      end
    else
      -- Digits are field names only where the value is not a plain array
      -- (a ModuleList's children are "0", "1", ...).
      for k in pairs(pool) do
        if not is_identifier(k) and not k:match('^%d+$') then pool[k] = nil end
      end
    end
  else
    if partial:match('^%d') then return {} end
    pool = M.names(env)
    for _, k in ipairs(KEYWORDS) do pool[k] = true end
  end
  local show_private = partial:sub(1, 1) == '_'
  local stem = word:sub(1, #word - #partial)
  local out = {}
  for _, k in ipairs(sorted(pool)) do
    if k:sub(1, #partial) == partial and (show_private or k:sub(1, 1) ~= '_')
       and (is_identifier(k) or k:match('^%d+$')) then
      out[#out + 1] = stem .. k
    end
  end
  -- Children named by numbers in order: "10" after "9".
  table.sort(out, function(a, b)
    local pa, na = a:match('^(.-)(%d+)$')
    local pb, nb = b:match('^(.-)(%d+)$')
    if pa and pb and pa == pb then return tonumber(na) < tonumber(nb) end
    return a < b
  end)
  return out
end

return M
