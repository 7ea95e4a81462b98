-- fsdp.repl.complete: Tab completion of Lua names for the REPL.
--
--   complete.candidates('x = fsdp.ra', 'fsdp.ra')   -> {'fsdp.rand', 'fsdp.randint', 'fsdp.randn'}
--   complete.candidates('m.layers.', 'm.layers.')     -> {..., 'm.layers.append', 'm.layers["0"]', 'm.layers["1"]'}
--   complete.candidates('m.layers.0.ml', 'm.layers.0.ml') -> {'m.layers["0"].mlp'}
--   complete.candidates('m.layers["', '')             -> {'0"]', '1"]', ...}
--   complete.candidates('x:', 'x:')                  -> {'x:abs', 'x:add', ...} (methods only)
--
-- [Note: module names and Lua paths] Completion offers only text that
-- parses, and the one rule for writing a module's name as Lua is: a
-- segment of the name that is a Lua identifier is indexed with '.', any
-- other (the numbered children of Sequential and ModuleList) with its
-- name as a string in brackets. The module named
-- `model.layers.0.self_attn` (print(model), named_modules, checkpoint
-- keys) is `m.model.layers["0"].self_attn`. Integer indices stay Lua's
-- positions in the same list, counted from 1 as ipairs and # count them:
-- `layers[1]` is `layers["0"]` (fsdp.nn.container). M.lua_path(name)
-- spells a name that way; a path typed with the names as printed
-- (`m.model.layers.0.ml`) is respelled by the completion.
--
-- The line editor hands over the line up to the cursor and the word it will
-- replace (the tail after the last operator, bracket or blank). The access
-- path before the cursor (`a.b[1].c:`, `a.b["0"].`, literal indices in
-- brackets) is resolved from the globals by
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
local tables = require 'fsdp.tables'
local M = {}

local KEYWORDS = {
  'and', 'break', 'do', 'else', 'elseif', 'end', 'false', 'for', 'function', 'if', 'in',
  'local', 'nil', 'not', 'or', 'repeat', 'return', 'then', 'true', 'until', 'while',
}

local function is_identifier(s)
  return type(s) == 'string' and s:match('^[%a_][%w_]*$') ~= nil
end

-- A module's name as a Lua path ([Note: module names and Lua paths]):
-- 'model.layers.0.self_attn' -> 'model.layers["0"].self_attn'.
function M.lua_path(name)
  local out = {}
  for seg in (name .. '.'):gmatch('([^.]*)%.') do
    if is_identifier(seg) then
      out[#out + 1] = (#out > 0 and '.' or '') .. seg
    else
      out[#out + 1] = ('[%q]'):format(seg)
    end
  end
  return table.concat(out)
end

-- The line the REPL prints under a module whose tree has numbered
-- children, showing the rule with its first such module:
--   -- index by name: model.layers["0"] is the module named model.layers.0 (layers[1] is the same: Lua counts from 1)
-- nil for other values.
function M.module_note(value)
  if type(value) ~= 'table' or type(rawget(value, '_modules')) ~= 'table' then return nil end
  local ok, list = pcall(function() return value:named_modules() end)
  if not ok or type(list) ~= 'table' then return nil end
  for _, nm in ipairs(list) do
    local name = nm[1]
    local last = type(name) == 'string' and name:match('([^.]+)$')
    if last and last:match('^%d+$') then
      local parent = name:match('^(.-)%.?[^.]+$')
      local list_name = parent:match('([^.]+)$') or 'list'
      return ('-- index by name: %s is the module named %s (%s[%d] is the same: Lua counts from 1)'):format(
        M.lua_path(name), name, list_name, tonumber(last) + 1)
    end
  end
  return nil
end

-- The typed part of a word respelled: ".0" segments (names as printed)
-- become '["0"]'.
local function respell(stem)
  return (stem:gsub('%.(%d+)%f[^%w_]', '["%1"]'))
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

local numbered_order

local sorted = tables.sorted_keys

-- Children named by numbers in order: "10" after "9".
function numbered_order(out) -- (declared above)
  table.sort(out, function(a, b)
    local pa, na = a:match('^(.-)(%d+)"?%]?$')
    local pb, nb = b:match('^(.-)(%d+)"?%]?$')
    if pa and pb and pa == pb then return tonumber(na) < tonumber(nb) end
    return a < b
  end)
  return out
end

-- After `path[` or `path["`: the names of the value's children that are
-- no identifiers, closed ('"0"]' after '[', '0"]' after '["'); the word
-- (what libedit replaces) is what follows the last break.
local function bracket_candidates(before, env)
  local head, quote, partial = before:match('^(.-)%[(["\']?)([^"\'%]%[]*)$')
  if not head or head == '' or (quote == '' and partial ~= '') then return nil end
  local keys = parse_path(head, #head)
  if not keys then return {} end
  local value = resolve(env, keys)
  if value == nil then return {} end
  local q = quote ~= '' and quote or '"'
  local out = {}
  for k in pairs(M.names(value)) do
    if not is_identifier(k) and k:sub(1, #partial) == partial and not k:find('[\n\\"\']') then
      out[#out + 1] = (quote == '' and q or '') .. k .. q .. ']'
    end
  end
  return numbered_order(out)
end

-- Replacements for `word` given the line up to the cursor; env defaults to
-- the globals.
function M.candidates(before, word, env)
  env = env or _G
  word = word or ''
  -- Tab on a blank line indents (a loop body typed over several lines).
  if before:match('^%s*$') then return { '  ' } end
  local bracketed = bracket_candidates(before, env)
  if bracketed then return bracketed end
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
  local stem = respell(word:sub(1, #word - #partial))
  local out = {}
  for _, k in ipairs(sorted(pool)) do
    if k:sub(1, #partial) == partial and (show_private or k:sub(1, 1) ~= '_') then
      if is_identifier(k) then
        out[#out + 1] = stem .. k
      elseif k:match('^%d+$') and sep == '.' then
        -- a numbered child: by its name in brackets, the '.' dropped
        out[#out + 1] = stem:sub(1, -2) .. ('["%s"]'):format(k)
      end
    end
  end
  return numbered_order(out)
end

return M
