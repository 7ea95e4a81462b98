-- fsdp.chat.values: the Python values a chat template sees, in Lua, and the
-- Python rules for printing, comparing and truth-testing them, so that the
-- Jinja-subset interpreter (fsdp.chat.template) renders what jinja2 renders.
--
-- [Note: chat template values]
-- Python has int and float, None, lists and insertion-ordered dicts; Lua has
-- one number type and unordered tables, and jinja2 adds Undefined. Here:
--   str        a Lua string (UTF-8); lengths, indexes and slices count code
--              points as Python does (values.ulen / values.usub)
--   int        a Lua number with an integral value
--   float      values.float(x): a boxed number, printed as Python's repr
--              (1.0, 0.5, 1e-05), so `1.0` in the JSON stays a float
--   bool       a Lua boolean
--   None       values.NONE
--   Undefined  values.undef(name): prints as '', is false, iterates empty;
--              reading an attribute of it is an error (jinja2's Undefined)
--   list       values.list{...} (array part 1..n, field n)
--   dict       values.dict(): ordered keys in .keys, values in .map
--   namespace  values.namespace(): a dict whose attributes are assignable
--   tuple      values.tuple{...} (what dict.items() yields)
--   callable   values.callable(fn, name): fn(args, kwargs) with args an
--              array (field n) and kwargs a name -> value table
-- values.json_decode keeps JSON's key order and its int/float distinction,
-- because `tojson` must write dicts in insertion order and numbers as they
-- came.
local tables = require 'fsdp.tables'
local M = {}

local NONE = setmetatable({}, { __tostring = function() return 'None' end })
M.NONE = NONE

local FLOAT = {}
local LIST = {}
local DICT = {}
local NS = {}
local UNDEF = {}
local CALL = {}
local TUPLE = {}
M.FLOAT, M.LIST, M.DICT, M.NS, M.UNDEF, M.CALL, M.TUPLE = FLOAT, LIST, DICT, NS, UNDEF, CALL, TUPLE

function M.float(x) return setmetatable({ v = x }, FLOAT) end
function M.list(t) t = t or {}; t.n = t.n or #t; return setmetatable(t, LIST) end
function M.dict() return setmetatable({ keys = {}, map = {} }, DICT) end
function M.namespace() return setmetatable({ keys = {}, map = {} }, NS) end
function M.tuple(t) t = t or {}; t.n = t.n or #t; return setmetatable(t, TUPLE) end
function M.undef(name, why) return setmetatable({ name = name, why = why }, UNDEF) end
function M.callable(fn, name) return setmetatable({ fn = fn, name = name }, CALL) end

-- The kind of a value, one word: str int float bool none undefined list
-- dict namespace callable loop (loop objects carry their own kind).
function M.kind(v)
  local t = type(v)
  if t == 'string' then return 'str' end
  if t == 'number' then return 'int' end
  if t == 'boolean' then return 'bool' end
  if v == NONE or v == nil then return 'none' end
  local mt = getmetatable(v)
  if mt == FLOAT then return 'float' end
  if mt == LIST then return 'list' end
  if mt == DICT then return 'dict' end
  if mt == NS then return 'namespace' end
  if mt == UNDEF then return 'undefined' end
  if mt == CALL then return 'callable' end
  if mt == TUPLE then return 'tuple' end
  if type(v) == 'table' and v.__kind then return v.__kind end
  return 'object'
end
local kind = M.kind

function M.is_number(v) local k = kind(v); return k == 'int' or k == 'float' end
function M.num(v) if type(v) == 'number' then return v end; return v.v end
function M.is_mapping(v) local k = kind(v); return k == 'dict' or k == 'namespace' end

function M.dict_set(d, k, v)
  if d.map[k] == nil then d.keys[#d.keys + 1] = k end
  d.map[k] = v
end
function M.dict_get(d, k) return d.map[k] end
function M.dict_from_pairs(list_of_pairs)
  local d = M.dict()
  for _, p in ipairs(list_of_pairs) do M.dict_set(d, p[1], p[2]) end
  return d
end

-- Lua tables from callers (plain arrays and string-keyed tables, possibly
-- holding values already converted) into template values. Plain tables have
-- no key order, so keys are sorted; callers who need an order pass
-- values.dict / values.json_decode results.
function M.from_lua(x)
  local t = type(x)
  if t ~= 'table' then
    if x == nil then return NONE end
    return x
  end
  if getmetatable(x) then return x end
  if x[1] ~= nil or next(x) == nil then
    local l = M.list()
    for i = 1, #x do l[i] = M.from_lua(x[i]) end
    l.n = #x
    return l
  end
  local d = M.dict()
  for _, k in ipairs(tables.sorted_keys(x, tables.by_string)) do M.dict_set(d, k, M.from_lua(x[k])) end
  return d
end

------------------------------------------------------------------------------
-- UTF-8 code points (Python str indexes count characters, not bytes)

local function is_ascii(s) return not s:find('[\128-\255]') end
M.is_ascii = is_ascii

-- The characters of s as an array of byte strings.
function M.chars(s)
  local out = {}
  for ch in s:gmatch('[%z\1-\127\194-\244][\128-\191]*') do out[#out + 1] = ch end
  return out
end

function M.ulen(s)
  if is_ascii(s) then return #s end
  local _, n = s:gsub('[^\128-\191]', '')
  return n
end

-- Byte offset (0-based) of each character index 0..n, for slicing.
function M.slice_str(s, start, stop, step)
  local chars = is_ascii(s) and nil or M.chars(s)
  local n = chars and #chars or #s
  local idx = M.slice_indices(n, start, stop, step)
  if chars == nil and step == 1 and #idx > 0 then return s:sub(idx[1] + 1, idx[#idx] + 1) end
  local out = {}
  for i, k in ipairs(idx) do out[i] = chars and chars[k + 1] or s:sub(k + 1, k + 1) end
  return table.concat(out)
end

-- Python's slice(start, stop, step).indices(n) as the list of 0-based indexes.
function M.slice_indices(n, start, stop, step)
  step = step or 1
  if step == 0 then error('slice step cannot be zero', 0) end
  local function clamp(v, default, lo, hi)
    if v == nil then return default end
    if v < 0 then v = v + n; if v < lo then v = lo end
    elseif v > hi then v = hi end
    return v
  end
  local out = {}
  if step > 0 then
    local a, b = clamp(start, 0, 0, n), clamp(stop, n, 0, n)
    for i = a, b - 1, step do out[#out + 1] = i end
  else
    local a, b = clamp(start, n - 1, -1, n - 1), clamp(stop, -1, -1, n - 1)
    for i = a, b + 1, step do out[#out + 1] = i end
  end
  return out
end

------------------------------------------------------------------------------
-- Printing: str() and repr() as Python writes them

-- Python's repr of a float: the shortest digits that read back the same,
-- fixed notation for exponents -4..15, otherwise d.ddde+XX.
function M.float_repr(x)
  if x ~= x then return 'nan' end
  if x == math.huge then return 'inf' end
  if x == -math.huge then return '-inf' end
  if x == 0 then return (1 / x < 0) and '-0.0' or '0.0' end
  local s
  for p = 1, 17 do
    s = string.format('%.' .. (p - 1) .. 'e', x)
    if tonumber(s) == x then break end
  end
  local sign, mant, exp = s:match('^(-?)([%d.]+)e([-+]%d+)$')
  exp = tonumber(exp)
  local digits = mant:gsub('%.', '')
  digits = digits:gsub('0+$', '')
  if digits == '' then digits = '0' end
  if exp >= -4 and exp < 16 then
    local out
    if exp >= 0 then
      if #digits <= exp + 1 then
        out = digits .. string.rep('0', exp + 1 - #digits) .. '.0'
      else
        out = digits:sub(1, exp + 1) .. '.' .. digits:sub(exp + 2)
      end
    else
      out = '0.' .. string.rep('0', -exp - 1) .. digits
    end
    return sign .. out
  end
  local m = digits:sub(1, 1)
  if #digits > 1 then m = m .. '.' .. digits:sub(2) end
  return string.format('%s%se%s%02d', sign, m, exp < 0 and '-' or '+', math.abs(exp))
end

function M.int_str(x)
  if x == math.floor(x) and math.abs(x) < 2 ^ 63 then return string.format('%.0f', x) end
  return M.float_repr(x)
end

-- Python's repr of a str: single quotes unless the text holds a single
-- quote and no double quote.
function M.str_repr(s)
  local q = "'"
  if s:find("'", 1, true) and not s:find('"', 1, true) then q = '"' end
  local out = s:gsub('[%z\1-\31\127\\\'"]', function(c)
    if c == '\\' then return '\\\\' end
    if c == q then return '\\' .. c end
    if c == '"' or c == "'" then return c end
    if c == '\n' then return '\\n' end
    if c == '\r' then return '\\r' end
    if c == '\t' then return '\\t' end
    return string.format('\\x%02x', c:byte())
  end)
  return q .. out .. q
end

local repr
function M.str(v)
  local k = kind(v)
  if k == 'str' then return v end
  if k == 'undefined' then return '' end
  return repr(v)
end

repr = function(v)
  local k = kind(v)
  if k == 'str' then return M.str_repr(v) end
  if k == 'int' then return M.int_str(v) end
  if k == 'float' then return M.float_repr(v.v) end
  if k == 'bool' then return v and 'True' or 'False' end
  if k == 'none' then return 'None' end
  if k == 'undefined' then return '' end
  if k == 'list' then
    local parts = {}
    for i = 1, v.n do parts[i] = repr(v[i]) end
    return '[' .. table.concat(parts, ', ') .. ']'
  end
  if k == 'dict' then
    local parts = {}
    for i, key in ipairs(v.keys) do parts[i] = repr(key) .. ': ' .. repr(v.map[key]) end
    return '{' .. table.concat(parts, ', ') .. '}'
  end
  if k == 'namespace' then
    local parts = {}
    for i, key in ipairs(v.keys) do parts[i] = key .. '=' .. repr(v.map[key]) end
    return '<Namespace ' .. table.concat(parts, ', ') .. '>'
  end
  if k == 'tuple' then
    local parts = {}
    for i = 1, v.n do parts[i] = repr(v[i]) end
    return '(' .. table.concat(parts, ', ') .. (v.n == 1 and ',)' or ')')
  end
  if k == 'callable' then return '<function ' .. tostring(v.name) .. '>' end
  return '<' .. k .. '>'
end
M.repr = repr

------------------------------------------------------------------------------
-- Truth, equality, order

function M.truthy(v)
  local k = kind(v)
  if k == 'bool' then return v end
  if k == 'none' or k == 'undefined' then return false end
  if k == 'str' then return v ~= '' end
  if k == 'int' then return v ~= 0 end
  if k == 'float' then return v.v ~= 0 end
  if k == 'list' or k == 'tuple' then return v.n > 0 end
  if k == 'dict' then return #v.keys > 0 end
  return true
end

local function eq(a, b)
  local ka, kb = kind(a), kind(b)
  local na = ka == 'int' or ka == 'float' or ka == 'bool'
  local nb = kb == 'int' or kb == 'float' or kb == 'bool'
  if na and nb then
    local x = ka == 'bool' and (a and 1 or 0) or M.num(a)
    local y = kb == 'bool' and (b and 1 or 0) or M.num(b)
    return x == y
  end
  if ka ~= kb then
    if (ka == 'list' and kb == 'tuple') or (ka == 'tuple' and kb == 'list') then return false end
    return false
  end
  if ka == 'str' then return a == b end
  if ka == 'none' or ka == 'undefined' then return true end
  if ka == 'list' or ka == 'tuple' then
    if a.n ~= b.n then return false end
    for i = 1, a.n do if not eq(a[i], b[i]) then return false end end
    return true
  end
  if ka == 'dict' then
    if #a.keys ~= #b.keys then return false end
    for _, key in ipairs(a.keys) do
      local bv = b.map[key]
      if bv == nil or not eq(a.map[key], bv) then return false end
    end
    return true
  end
  return rawequal(a, b)
end
M.eq = eq

-- a < b as Python orders numbers, strings (code points: UTF-8 byte order is
-- code point order) and lists; other pairs are a TypeError.
local function lt(a, b)
  local ka, kb = kind(a), kind(b)
  if (ka == 'int' or ka == 'float' or ka == 'bool') and (kb == 'int' or kb == 'float' or kb == 'bool') then
    local x = ka == 'bool' and (a and 1 or 0) or M.num(a)
    local y = kb == 'bool' and (b and 1 or 0) or M.num(b)
    return x < y
  end
  if ka == 'str' and kb == 'str' then return a < b end
  if (ka == 'list' and kb == 'list') or (ka == 'tuple' and kb == 'tuple') then
    for i = 1, math.min(a.n, b.n) do
      if not eq(a[i], b[i]) then return lt(a[i], b[i]) end
    end
    return a.n < b.n
  end
  error(("'<' not supported between instances of '%s' and '%s'"):format(ka, kb), 0)
end
M.lt = lt

------------------------------------------------------------------------------
-- JSON: an ordered decoder (insertion order, int vs float) and Python's
-- json.dumps as transformers' tojson calls it.

local function json_error(text, pos, what)
  local line = select(2, text:sub(1, pos):gsub('\n', '')) + 1
  error(('JSON: %s at line %d (byte %d)'):format(what, line, pos), 0)
end

local ESC = { ['"'] = '"', ['\\'] = '\\', ['/'] = '/', b = '\b', f = '\f', n = '\n', r = '\r', t = '\t' }

local function utf8_encode(cp)
  if cp < 0x80 then return string.char(cp) end
  if cp < 0x800 then return string.char(0xC0 + math.floor(cp / 64), 0x80 + cp % 64) end
  if cp < 0x10000 then
    return string.char(0xE0 + math.floor(cp / 4096), 0x80 + math.floor(cp / 64) % 64, 0x80 + cp % 64)
  end
  return string.char(0xF0 + math.floor(cp / 262144), 0x80 + math.floor(cp / 4096) % 64,
    0x80 + math.floor(cp / 64) % 64, 0x80 + cp % 64)
end
M.utf8_encode = utf8_encode

function M.json_decode(text)
  local pos = 1
  local function ws() pos = text:find('[^ \t\r\n]', pos) or #text + 1 end
  local value
  local function str()
    local out = {}
    pos = pos + 1
    while true do
      local s, e = text:find('["\\]', pos)
      if not s then json_error(text, pos, 'unterminated string') end
      out[#out + 1] = text:sub(pos, s - 1)
      if text:sub(s, s) == '"' then pos = e + 1; break end
      local c = text:sub(s + 1, s + 1)
      if c == 'u' then
        local cp = tonumber(text:sub(s + 2, s + 5), 16)
        if not cp then json_error(text, s, 'bad \\u escape') end
        pos = s + 6
        if cp >= 0xD800 and cp < 0xDC00 and text:sub(pos, pos + 1) == '\\u' then
          local lo = tonumber(text:sub(pos + 2, pos + 5), 16)
          if lo and lo >= 0xDC00 and lo < 0xE000 then
            cp = 0x10000 + (cp - 0xD800) * 1024 + (lo - 0xDC00)
            pos = pos + 6
          end
        end
        out[#out + 1] = utf8_encode(cp)
      else
        if not ESC[c] then json_error(text, s, 'bad escape') end
        out[#out + 1] = ESC[c]
        pos = s + 2
      end
    end
    return table.concat(out)
  end
  value = function()
    ws()
    local c = text:sub(pos, pos)
    if c == '{' then
      local d = M.dict()
      pos = pos + 1; ws()
      if text:sub(pos, pos) == '}' then pos = pos + 1; return d end
      while true do
        ws()
        if text:sub(pos, pos) ~= '"' then json_error(text, pos, 'expected a key') end
        local k = str()
        ws()
        if text:sub(pos, pos) ~= ':' then json_error(text, pos, "expected ':'") end
        pos = pos + 1
        M.dict_set(d, k, value())
        ws()
        local c2 = text:sub(pos, pos)
        pos = pos + 1
        if c2 == '}' then return d end
        if c2 ~= ',' then json_error(text, pos - 1, "expected ',' or '}'") end
      end
    elseif c == '[' then
      local l = M.list()
      pos = pos + 1; ws()
      if text:sub(pos, pos) == ']' then pos = pos + 1; return l end
      while true do
        l.n = l.n + 1
        l[l.n] = value()
        ws()
        local c2 = text:sub(pos, pos)
        pos = pos + 1
        if c2 == ']' then return l end
        if c2 ~= ',' then json_error(text, pos - 1, "expected ',' or ']'") end
      end
    elseif c == '"' then
      return str()
    elseif text:find('^true', pos) then pos = pos + 4; return true
    elseif text:find('^false', pos) then pos = pos + 5; return false
    elseif text:find('^null', pos) then pos = pos + 4; return NONE
    else
      local s, e = text:find('^-?%d+%.?%d*[eE]?[-+]?%d*', pos)
      if not s then json_error(text, pos, 'unexpected character') end
      local lit = text:sub(s, e)
      pos = e + 1
      if lit:find('[.eE]') then return M.float(tonumber(lit)) end
      return tonumber(lit)
    end
  end
  local ok, v = pcall(function()
    local r = value()
    ws()
    if pos <= #text then json_error(text, pos, 'trailing characters') end
    return r
  end)
  if not ok then return nil, v end
  return v
end

local JSON_ESC = { ['"'] = '\\"', ['\\'] = '\\\\', ['\n'] = '\\n', ['\r'] = '\\r', ['\t'] = '\\t',
  ['\b'] = '\\b', ['\f'] = '\\f' }
local function json_str(s, ensure_ascii)
  local out = s:gsub('[%z\1-\31"\\]', function(c) return JSON_ESC[c] or string.format('\\u%04x', c:byte()) end)
  if ensure_ascii and not is_ascii(out) then
    local parts = {}
    for _, ch in ipairs(M.chars(out)) do
      if #ch == 1 then parts[#parts + 1] = ch
      else
        local b1 = ch:byte(1)
        local cp
        if #ch == 2 then cp = (b1 - 0xC0) * 64 + ch:byte(2) - 0x80
        elseif #ch == 3 then cp = (b1 - 0xE0) * 4096 + (ch:byte(2) - 0x80) * 64 + ch:byte(3) - 0x80
        else cp = (b1 - 0xF0) * 262144 + (ch:byte(2) - 0x80) * 4096 + (ch:byte(3) - 0x80) * 64 + ch:byte(4) - 0x80 end
        if cp >= 0x10000 then
          cp = cp - 0x10000
          parts[#parts + 1] = string.format('\\u%04x\\u%04x', 0xD800 + math.floor(cp / 1024), 0xDC00 + cp % 1024)
        else
          parts[#parts + 1] = string.format('\\u%04x', cp)
        end
      end
    end
    out = table.concat(parts)
  end
  return '"' .. out .. '"'
end

-- json.dumps(v, ensure_ascii, indent, separators, sort_keys) as Python
-- writes it; `indent` is nil, a number of spaces or a string.
function M.json_encode(v, opts)
  opts = opts or {}
  local indent = opts.indent
  if type(indent) == 'number' then indent = string.rep(' ', indent) end
  local item_sep, key_sep = ', ', ': '
  if indent then item_sep = ',' end
  if opts.separators then item_sep, key_sep = opts.separators[1], opts.separators[2] end
  local out = {}
  local function enc(x, depth)
    local k = kind(x)
    if k == 'str' then out[#out + 1] = json_str(x, opts.ensure_ascii)
    elseif k == 'int' then out[#out + 1] = M.int_str(x)
    elseif k == 'float' then
      local f = x.v
      if f ~= f then out[#out + 1] = 'NaN'
      elseif f == math.huge then out[#out + 1] = 'Infinity'
      elseif f == -math.huge then out[#out + 1] = '-Infinity'
      else out[#out + 1] = M.float_repr(f) end
    elseif k == 'bool' then out[#out + 1] = x and 'true' or 'false'
    elseif k == 'none' then out[#out + 1] = 'null'
    elseif k == 'list' or k == 'tuple' then
      if x.n == 0 then out[#out + 1] = '[]'; return end
      out[#out + 1] = '['
      for i = 1, x.n do
        if i > 1 then out[#out + 1] = item_sep end
        if indent then out[#out + 1] = '\n' .. string.rep(indent, depth + 1) end
        enc(x[i], depth + 1)
      end
      if indent then out[#out + 1] = '\n' .. string.rep(indent, depth) end
      out[#out + 1] = ']'
    elseif k == 'dict' then
      if #x.keys == 0 then out[#out + 1] = '{}'; return end
      local keys = x.keys
      if opts.sort_keys then
        keys = { unpack(keys) }
        table.sort(keys, function(a, b) return lt(a, b) end)
      end
      out[#out + 1] = '{'
      for i, key in ipairs(keys) do
        if i > 1 then out[#out + 1] = item_sep end
        if indent then out[#out + 1] = '\n' .. string.rep(indent, depth + 1) end
        local ks
        local kk = kind(key)
        if kk == 'str' then ks = key
        elseif kk == 'bool' then ks = key and 'true' or 'false'
        elseif kk == 'none' then ks = 'null'
        else ks = M.str(key) end
        out[#out + 1] = json_str(ks, opts.ensure_ascii)
        out[#out + 1] = key_sep
        enc(x.map[key], depth + 1)
      end
      if indent then out[#out + 1] = '\n' .. string.rep(indent, depth) end
      out[#out + 1] = '}'
    else
      local name = k == 'undefined' and 'Undefined' or k
      error(('Object of type %s is not JSON serializable'):format(name), 0)
    end
  end
  enc(v, 0)
  return table.concat(out)
end

return M
