-- fsdp.chat.filters: the filters, tests and Python methods (str, dict,
-- list) chat templates call, with jinja2 3.1's and Python's behaviour, and
-- transformers' own `tojson` (json.dumps with ensure_ascii=False, so
-- non-ASCII text stays as is, keys in insertion order; indent, separators
-- and sort_keys passed through). The parser refuses any filter or test not
-- listed here, so a template that needs more fails at compile time.
local values = require 'fsdp.chat.values'

local NONE, kind, truthy, str = values.NONE, values.kind, values.truthy, values.str

local M = {}

local function fail(interp, msg)
  error({ template_error = true, line = interp.line, msg = msg }, 0)
end

local function arg(args, kwargs, i, name, default)
  if args[i] ~= nil then return args[i] end
  if name and kwargs[name] ~= nil then return kwargs[name] end
  return default
end

local function check_undefined(interp, v)
  if kind(v) == 'undefined' then
    if v.why then fail(interp, v.why) end
    fail(interp, ("'%s' is undefined"):format(v.name or 'value'))
  end
end

------------------------------------------------------------------------------
-- Python string helpers

-- Python's str.isspace() characters, as UTF-8.
local PY_SPACE = {}
for _, cp in ipairs({ 9, 10, 11, 12, 13, 28, 29, 30, 31, 32, 0x85, 0xA0, 0x1680, 0x2000, 0x2001, 0x2002, 0x2003,
  0x2004, 0x2005, 0x2006, 0x2007, 0x2008, 0x2009, 0x200A, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000 }) do
  PY_SPACE[values.utf8_encode(cp)] = true
end

-- str.strip / lstrip / rstrip (chars: nil for whitespace, else a set of
-- characters).
local function py_strip(s, chars, left, right)
  local set
  if chars == nil or chars == NONE then
    if values.is_ascii(s) then
      if left then s = s:gsub('^[\t\n\v\f\r\28-\31 ]+', '') end
      if right then s = s:gsub('[\t\n\v\f\r\28-\31 ]+$', '') end
      return s
    end
    set = PY_SPACE
  else
    set = {}
    for _, c in ipairs(values.chars(chars)) do set[c] = true end
  end
  local cs = values.chars(s)
  local a, b = 1, #cs
  if left then while a <= b and set[cs[a]] do a = a + 1 end end
  if right then while b >= a and set[cs[b]] do b = b - 1 end end
  return table.concat(cs, '', a, b)
end
M.py_strip = py_strip

local function plain_split(s, sep, maxsplit)
  local out = { n = 0 }
  local pos = 1
  while true do
    if maxsplit >= 0 and out.n >= maxsplit then break end
    local a, b = s:find(sep, pos, true)
    if not a then break end
    out.n = out.n + 1; out[out.n] = s:sub(pos, a - 1)
    pos = b + 1
  end
  out.n = out.n + 1; out[out.n] = s:sub(pos)
  return out
end

local function ws_split(s, maxsplit)
  local out = { n = 0 }
  local cs = values.chars(s)
  local i, n = 1, #cs
  while true do
    while i <= n and PY_SPACE[cs[i]] do i = i + 1 end
    if i > n then break end
    if maxsplit >= 0 and out.n >= maxsplit then
      local rest = py_strip(table.concat(cs, '', i, n), nil, false, true)
      out.n = out.n + 1; out[out.n] = rest
      break
    end
    local j = i
    while j <= n and not PY_SPACE[cs[j]] do j = j + 1 end
    out.n = out.n + 1; out[out.n] = table.concat(cs, '', i, j - 1)
    i = j
  end
  return out
end

local function upper(s) return (s:upper()) end
local function lower(s) return (s:lower()) end

local function capitalize(s)
  if s == '' then return s end
  local cs = values.chars(s)
  return cs[1]:upper() .. table.concat(cs, '', 2):lower()
end

-- Python's str.title(): a letter after a non-letter is upper-cased, other
-- letters lower-cased (ASCII letters; other characters pass through).
local function py_title(s)
  local prev_letter = false
  return (s:gsub('.', function(c)
    local is_letter = c:match('%a') ~= nil
    local r = c
    if is_letter then r = prev_letter and c:lower() or c:upper() end
    if c:byte() < 128 then prev_letter = is_letter else prev_letter = true end
    return r
  end))
end

local function replace(s, old, new, count)
  count = count or -1
  if old == '' then
    local cs = values.chars(s)
    local out = {}
    local n = 0
    for i = 1, #cs do
      if count < 0 or n < count then out[#out + 1] = new; n = n + 1 end
      out[#out + 1] = cs[i]
    end
    if count < 0 or n < count then out[#out + 1] = new end
    return table.concat(out)
  end
  local out, pos, n = {}, 1, 0
  while count < 0 or n < count do
    local a, b = s:find(old, pos, true)
    if not a then break end
    out[#out + 1] = s:sub(pos, a - 1); out[#out + 1] = new
    pos = b + 1; n = n + 1
  end
  out[#out + 1] = s:sub(pos)
  return table.concat(out)
end

local function need_str(interp, v, what)
  if kind(v) ~= 'str' then fail(interp, ('%s: expected a string, got %s'):format(what, kind(v))) end
  return v
end

local function prefix_test(interp, s, p, at_end)
  local kp = kind(p)
  if kp == 'tuple' or kp == 'list' then
    for i = 1, p.n do if prefix_test(interp, s, p[i], at_end) then return true end end
    return false
  end
  need_str(interp, p, at_end and 'endswith' or 'startswith')
  if at_end then return p == '' or s:sub(-#p) == p end
  return s:sub(1, #p) == p
end

local function index_to_char(s, byte_pos)
  if byte_pos == nil then return -1 end
  return values.ulen(s:sub(1, byte_pos - 1))
end

-- str.format with {} / {0} / {name} fields (no format specs).
local function py_format(interp, s, args, kwargs)
  local auto = 0
  local out = s:gsub('{{', '\1'):gsub('}}', '\2'):gsub('{([^{}]*)}', function(field)
    if field:find('[:!]') then fail(interp, 'format specs in str.format are outside the supported subset') end
    local v
    if field == '' then auto = auto + 1; v = args[auto]
    elseif field:match('^%d+$') then v = args[tonumber(field) + 1]
    else v = kwargs[field] end
    if v == nil then fail(interp, ('str.format: no value for field {%s}'):format(field)) end
    return str(v)
  end)
  return (out:gsub('\1', '{'):gsub('\2', '}'))
end

------------------------------------------------------------------------------
-- methods reachable as attributes (a.b / a['b']): nil when `name` is not one

local UNSAFE_LIST = { append = true, extend = true, insert = true, pop = true, remove = true, sort = true,
  reverse = true, clear = true }
local UNSAFE_DICT = { update = true, pop = true, popitem = true, setdefault = true, clear = true }

local function bound(fn, name) return values.callable(fn, name) end

local STR_METHODS = {
  strip = function(s, a) return py_strip(s, a[1], true, true) end,
  lstrip = function(s, a) return py_strip(s, a[1], true, false) end,
  rstrip = function(s, a) return py_strip(s, a[1], false, true) end,
  upper = function(s) return upper(s) end,
  lower = function(s) return lower(s) end,
  title = function(s) return py_title(s) end,
  capitalize = function(s) return capitalize(s) end,
  startswith = function(s, a, _, interp) return prefix_test(interp, s, a[1], false) end,
  endswith = function(s, a, _, interp) return prefix_test(interp, s, a[1], true) end,
  split = function(s, a, kw, interp)
    local sep = arg(a, kw, 1, 'sep', NONE)
    local maxsplit = arg(a, kw, 2, 'maxsplit', -1)
    local out
    if sep == NONE then out = ws_split(s, maxsplit)
    else
      need_str(interp, sep, 'split')
      if sep == '' then fail(interp, 'empty separator') end
      out = plain_split(s, sep, maxsplit)
    end
    return values.list(out)
  end,
  rsplit = function(s, a, kw, interp)
    local sep = arg(a, kw, 1, 'sep', NONE)
    local maxsplit = arg(a, kw, 2, 'maxsplit', -1)
    if sep == NONE or maxsplit >= 0 then
      if maxsplit < 0 then return values.list(ws_split(s, -1)) end
      if sep == NONE then fail(interp, 'rsplit with maxsplit and no separator is outside the supported subset') end
      local parts = plain_split(s, sep, -1)
      if parts.n - 1 <= maxsplit then return values.list(parts) end
      local head = table.concat(parts, sep, 1, parts.n - maxsplit)
      local out = { head, n = 1 }
      for i = parts.n - maxsplit + 1, parts.n do out.n = out.n + 1; out[out.n] = parts[i] end
      return values.list(out)
    end
    return values.list(plain_split(s, need_str(interp, sep, 'rsplit'), -1))
  end,
  splitlines = function(s)
    local out = { n = 0 }
    for line in (s .. '\n'):gmatch('(.-)\r?\n') do out.n = out.n + 1; out[out.n] = line end
    if s == '' or s:sub(-1) == '\n' then out[out.n] = nil; out.n = out.n - 1 end
    return values.list(out)
  end,
  replace = function(s, a, kw, interp)
    return replace(s, need_str(interp, a[1], 'replace'), need_str(interp, a[2], 'replace'), arg(a, kw, 3, 'count', -1))
  end,
  find = function(s, a, _, interp) return index_to_char(s, (s:find(need_str(interp, a[1], 'find'), 1, true))) end,
  rfind = function(s, a, _, interp)
    local sub = need_str(interp, a[1], 'rfind')
    local last, pos = nil, 1
    while true do
      local p = s:find(sub, pos, true)
      if not p then break end
      last = p; pos = p + 1
    end
    return index_to_char(s, last)
  end,
  count = function(s, a, _, interp)
    local sub = need_str(interp, a[1], 'count')
    if sub == '' then return values.ulen(s) + 1 end
    local n, pos = 0, 1
    while true do
      local p, e = s:find(sub, pos, true)
      if not p then break end
      n = n + 1; pos = e + 1
    end
    return n
  end,
  join = function(s, a, _, interp)
    local items = interp:iterate(a[1])
    local parts = {}
    for i = 1, items.n do parts[i] = need_str(interp, items[i], 'join') end
    return table.concat(parts, s)
  end,
  format = function(s, a, kw, interp) return py_format(interp, s, a, kw) end,
  isdigit = function(s) return s ~= '' and s:match('^%d+$') ~= nil end,
  isalpha = function(s) return s ~= '' and s:match('^%a+$') ~= nil end,
  isalnum = function(s) return s ~= '' and s:match('^%w+$') ~= nil end,
  isspace = function(s) return s ~= '' and py_strip(s, nil, true, true) == '' end,
  isupper = function(s) return s:match('%u') ~= nil and s:match('%l') == nil end,
  islower = function(s) return s:match('%l') ~= nil and s:match('%u') == nil end,
}

local DICT_METHODS = {
  items = function(d)
    local out = { n = #d.keys }
    for i, k in ipairs(d.keys) do out[i] = values.tuple({ k, d.map[k], n = 2 }) end
    return values.list(out)
  end,
  keys = function(d)
    local out = { n = #d.keys }
    for i, k in ipairs(d.keys) do out[i] = k end
    return values.list(out)
  end,
  values = function(d)
    local out = { n = #d.keys }
    for i, k in ipairs(d.keys) do out[i] = d.map[k] end
    return values.list(out)
  end,
  get = function(d, a, kw)
    local key = a[1]
    if kind(key) == 'float' then key = key.v end
    local v
    if type(key) == 'string' or type(key) == 'number' then v = d.map[key] end
    if v ~= nil then return v end
    return arg(a, kw, 2, 'default', NONE)
  end,
  copy = function(d)
    local c = values.dict()
    for _, k in ipairs(d.keys) do values.dict_set(c, k, d.map[k]) end
    return c
  end,
}

local LIST_METHODS = {
  index = function(l, a, _, interp)
    for i = 1, l.n do if values.eq(l[i], a[1]) then return i - 1 end end
    fail(interp, values.repr(a[1]) .. ' is not in list')
  end,
  count = function(l, a)
    local n = 0
    for i = 1, l.n do if values.eq(l[i], a[1]) then n = n + 1 end end
    return n
  end,
}

function M.method(interp, obj, k, name)
  local tbl
  if k == 'str' then tbl = STR_METHODS
  elseif k == 'dict' then
    if UNSAFE_DICT[name] then
      return values.undef(nil, ("access to attribute '%s' of 'dict' object is unsafe."):format(name))
    end
    tbl = DICT_METHODS
  elseif k == 'list' or k == 'tuple' then
    if UNSAFE_LIST[name] then
      return values.undef(nil, ("access to attribute '%s' of '%s' object is unsafe."):format(name, k))
    end
    tbl = LIST_METHODS
  else
    return nil
  end
  local f = tbl[name]
  if not f then return nil end
  return bound(function(args, kwargs, ip) return f(obj, args, kwargs, ip or interp) end, name)
end

------------------------------------------------------------------------------
-- filters: f(interp, value, args, kwargs)

local F = {}
M.filters = F

-- jinja2's environment.getitem for attribute paths ('a.b', or an int index).
local function attr_path(interp, v, attribute)
  if kind(attribute) == 'int' then return interp:getitem(v, attribute) end
  for part in tostring(attribute):gmatch('[^.]+') do
    local key = part:match('^%d+$') and tonumber(part) or part
    v = interp:getitem(v, key)
  end
  return v
end

local function length(interp, v)
  local k = kind(v)
  if k == 'str' then return values.ulen(v) end
  if k == 'list' or k == 'tuple' then return v.n end
  if k == 'dict' or k == 'namespace' then return #v.keys end
  if k == 'undefined' then return 0 end
  fail(interp, ("object of type '%s' has no len()"):format(k))
end

F.length = function(interp, v) return length(interp, v) end
F.count = F.length

F.tojson = function(interp, v, a, kw)
  local indent = arg(a, kw, 2, 'indent', NONE)
  if kind(indent) == 'float' then indent = indent.v end
  local separators = arg(a, kw, 3, 'separators', NONE)
  local seps
  if separators ~= NONE then seps = { separators[1], separators[2] } end
  local ok, r = pcall(values.json_encode, v, {
    ensure_ascii = truthy(arg(a, kw, 1, 'ensure_ascii', false)),
    indent = indent ~= NONE and indent or nil,
    separators = seps,
    sort_keys = truthy(arg(a, kw, 4, 'sort_keys', false)),
  })
  if not ok then fail(interp, tostring(r)) end
  return r
end

F.trim = function(interp, v, a, kw) return py_strip(str(v), arg(a, kw, 1, 'chars', NONE), true, true) end
F.upper = function(_, v) return upper(str(v)) end
F.lower = function(_, v) return lower(str(v)) end
F.capitalize = function(_, v) return capitalize(str(v)) end
F.title = function(_, v)
  -- jinja2: words start after runs of whitespace, '-', '(', '{', '[' or '<'
  local s = str(v)
  local out = {}
  local at_start = true
  for _, c in ipairs(values.chars(s)) do
    if c:match('^[%s%-%({%[<]$') then out[#out + 1] = c; at_start = true
    elseif at_start then out[#out + 1] = c:upper(); at_start = false
    else out[#out + 1] = c:lower() end
  end
  return table.concat(out)
end
F.string = function(_, v) return str(v) end
F.safe = function(_, v) return v end
F.escape = function(_, v)
  local map = { ['&'] = '&amp;', ['<'] = '&lt;', ['>'] = '&gt;', ["'"] = '&#39;', ['"'] = '&#34;' }
  return (str(v):gsub('[&<>\'"]', map))
end
F.e = F.escape

F.default = function(_, v, a, kw)
  local dv = arg(a, kw, 1, 'default_value', '')
  local boolean = truthy(arg(a, kw, 2, 'boolean', false))
  if kind(v) == 'undefined' or (boolean and not truthy(v)) then return dv end
  return v
end
F.d = F.default

F.first = function(interp, v)
  local items = interp:iterate(v)
  if items.n == 0 then return values.undef(nil, 'No first item, sequence was empty.') end
  return items[1]
end
F.last = function(interp, v)
  local items = interp:iterate(v)
  if items.n == 0 then return values.undef(nil, 'No last item, sequence was empty.') end
  return items[items.n]
end

F.join = function(interp, v, a, kw)
  local sep = arg(a, kw, 1, 'd', '')
  local attribute = arg(a, kw, 2, 'attribute', NONE)
  local items = interp:iterate(v)
  local parts = {}
  for i = 1, items.n do
    local x = items[i]
    if attribute ~= NONE then x = attr_path(interp, x, attribute) end
    parts[i] = str(x)
  end
  return table.concat(parts, str(sep))
end

F.replace = function(interp, v, a, kw)
  local s = str(v)
  return replace(s, str(a[1]), str(a[2]), arg(a, kw, 3, 'count', -1))
end

F.items = function(interp, v)
  local k = kind(v)
  if k == 'undefined' then return values.list() end
  if k ~= 'dict' and k ~= 'namespace' then fail(interp, 'Can only get item pairs from a mapping.') end
  return DICT_METHODS.items(v)
end

F.list = function(interp, v)
  local items = interp:iterate(v)
  local out = { n = items.n }
  for i = 1, items.n do out[i] = items[i] end
  return values.list(out)
end

F.int = function(interp, v, a, kw)
  local default = arg(a, kw, 1, 'default', 0)
  local base = arg(a, kw, 2, 'base', 10)
  local k = kind(v)
  if k == 'int' then return v end
  if k == 'bool' then return v and 1 or 0 end
  if k == 'float' then local x = v.v; return x >= 0 and math.floor(x) or -math.floor(-x) end
  if k == 'str' then
    local s = py_strip(v, nil, true, true):gsub('_', '')
    local n = tonumber(s, base)
    if n and n == math.floor(n) and s:match('^[-+]?%w+$') then return n end
    local f = tonumber(s)
    if f and base == 10 then return f >= 0 and math.floor(f) or -math.floor(-f) end
  end
  return default
end

F.float = function(interp, v, a, kw)
  local default = arg(a, kw, 1, 'default', values.float(0))
  local k = kind(v)
  if k == 'float' then return v end
  if k == 'int' then return values.float(v) end
  if k == 'bool' then return values.float(v and 1 or 0) end
  if k == 'str' then
    local f = tonumber(py_strip(v, nil, true, true))
    if f then return values.float(f) end
  end
  return default
end

F.round = function(interp, v, a, kw)
  local precision = arg(a, kw, 1, 'precision', 0)
  local method = arg(a, kw, 2, 'method', 'common')
  local x = values.num(v)
  local m = 10 ^ precision
  local r
  if method == 'common' then
    -- Python's round(): to the nearest, ties to even (on the decimal value)
    local y = x * m
    local fl = math.floor(y)
    local diff = y - fl
    if diff > 0.5 then r = fl + 1 elseif diff < 0.5 then r = fl
    else r = (fl % 2 == 0) and fl or fl + 1 end
    r = r / m
  elseif method == 'ceil' then r = math.ceil(x * m) / m
  elseif method == 'floor' then r = math.floor(x * m) / m
  else fail(interp, 'method must be common, ceil or floor') end
  return values.float(r)
end

F.abs = function(interp, v)
  local k = kind(v)
  if k == 'int' then return math.abs(v) end
  if k == 'float' then return values.float(math.abs(v.v)) end
  fail(interp, ("bad operand type for abs(): '%s'"):format(k))
end

F.reverse = function(interp, v)
  if kind(v) == 'str' then
    local cs = values.chars(v)
    local out = {}
    for i = #cs, 1, -1 do out[#out + 1] = cs[i] end
    return table.concat(out)
  end
  local items = interp:iterate(v)
  local out = { n = items.n }
  for i = 1, items.n do out[i] = items[items.n - i + 1] end
  return values.list(out)
end

F.unique = function(interp, v)
  local items = interp:iterate(v)
  local out = { n = 0 }
  for i = 1, items.n do
    local dup = false
    for j = 1, out.n do if values.eq(out[j], items[i]) then dup = true; break end end
    if not dup then out.n = out.n + 1; out[out.n] = items[i] end
  end
  return values.list(out)
end

F.sum = function(interp, v, a, kw)
  local attribute = arg(a, kw, 1, 'attribute', NONE)
  local total = arg(a, kw, 2, 'start', 0)
  local items = interp:iterate(v)
  for i = 1, items.n do
    local x = items[i]
    if attribute ~= NONE then x = attr_path(interp, x, attribute) end
    total = interp:arith('+', total, x)
  end
  return total
end

local function sorted(interp, items, reverse, attribute)
  local arr = {}
  for i = 1, items.n do arr[i] = { i, items[i] } end
  local function keyof(x)
    if attribute ~= NONE and attribute ~= nil then x = attr_path(interp, x, attribute) end
    if kind(x) == 'str' then return x:lower() end
    return x
  end
  local ok, err = pcall(table.sort, arr, function(p, q)
    local kp, kq = keyof(p[2]), keyof(q[2])
    if values.eq(kp, kq) then return p[1] < q[1] end
    if reverse then return values.lt(kq, kp) end
    return values.lt(kp, kq)
  end)
  if not ok then fail(interp, tostring(err)) end
  local out = { n = #arr }
  for i, p in ipairs(arr) do out[i] = p[2] end
  return out
end

F.sort = function(interp, v, a, kw)
  local reverse = truthy(arg(a, kw, 1, 'reverse', false))
  local attribute = arg(a, kw, 3, 'attribute', NONE)
  return values.list(sorted(interp, interp:iterate(v), reverse, attribute))
end

F.min = function(interp, v, a, kw)
  local items = sorted(interp, interp:iterate(v), false, arg(a, kw, 2, 'attribute', NONE))
  if items.n == 0 then return values.undef(nil, 'No aggregated item, sequence was empty.') end
  return items[1]
end
F.max = function(interp, v, a, kw)
  local items = sorted(interp, interp:iterate(v), true, arg(a, kw, 2, 'attribute', NONE))
  if items.n == 0 then return values.undef(nil, 'No aggregated item, sequence was empty.') end
  return items[1]
end

F.dictsort = function(interp, v, a, kw)
  local by = arg(a, kw, 2, 'by', 'key')
  local reverse = truthy(arg(a, kw, 3, 'reverse', false))
  local pairs_ = DICT_METHODS.items(v)
  local idx = by == 'value' and 2 or 1
  local arr = {}
  for i = 1, pairs_.n do arr[i] = pairs_[i] end
  table.sort(arr, function(p, q)
    local x, y = p[idx], q[idx]
    if kind(x) == 'str' then x = x:lower() end
    if kind(y) == 'str' then y = y:lower() end
    if reverse then return values.lt(y, x) end
    return values.lt(x, y)
  end)
  arr.n = #arr
  return values.list(arr)
end

F.indent = function(interp, v, a, kw)
  local width = arg(a, kw, 1, 'width', 4)
  local first = truthy(arg(a, kw, 2, 'first', false))
  local blank = truthy(arg(a, kw, 3, 'blank', false))
  local pad = kind(width) == 'str' and width or string.rep(' ', width)
  local s = str(v)
  local lines = {}
  for line in (s .. '\n'):gmatch('(.-)\n') do lines[#lines + 1] = line end
  -- jinja2 splits with splitlines(); a trailing newline is kept as is
  local trailing = s:sub(-1) == '\n'
  if trailing then lines[#lines] = nil end
  for i = 2, #lines do
    if blank or py_strip(lines[i], nil, true, true) ~= '' then lines[i] = pad .. lines[i] end
  end
  local rv = table.concat(lines, '\n')
  if trailing then rv = rv .. '\n' end
  if first then rv = pad .. rv end
  return rv
end

F.wordcount = function(_, v)
  local n = 0
  for _ in str(v):gmatch('[%w_]+') do n = n + 1 end
  return n
end

F.center = function(_, v, a, kw)
  local s = str(v)
  local width = arg(a, kw, 1, 'width', 80)
  local len = values.ulen(s)
  if width <= len then return s end
  local total = width - len
  local left = math.floor(total / 2) + ((total % 2 == 1 and width % 2 == 1) and 1 or 0)
  return string.rep(' ', left) .. s .. string.rep(' ', total - left)
end

F.batch = function(interp, v, a, kw)
  local size = arg(a, kw, 1, 'linecount', 1)
  local items = interp:iterate(v)
  local out = { n = 0 }
  local cur
  for i = 1, items.n do
    if not cur or cur.n == size then cur = values.list({ n = 0 }); out.n = out.n + 1; out[out.n] = cur end
    cur.n = cur.n + 1; cur[cur.n] = items[i]
  end
  return values.list(out)
end

-- select / reject / selectattr / rejectattr / map
local function run_test(interp, name, v, targs)
  local t = M.tests[name]
  if not t then fail(interp, ("No test named '%s'."):format(tostring(name))) end
  return t(interp, v, targs, {})
end

local function select_impl(interp, v, a, want, with_attr)
  local items = interp:iterate(v)
  local attribute, test, first_arg
  if with_attr then attribute, test, first_arg = a[1], a[2], 3
  else test, first_arg = a[1], 2 end
  local targs = { n = 0 }
  for i = first_arg, a.n or #a do targs.n = targs.n + 1; targs[targs.n] = a[i] end
  local out = { n = 0 }
  for i = 1, items.n do
    local x = items[i]
    local y = with_attr and attr_path(interp, x, attribute) or x
    local ok
    if test == nil then ok = truthy(y) else ok = run_test(interp, test, y, targs) end
    if ok == want then out.n = out.n + 1; out[out.n] = x end
  end
  return values.list(out)
end

F.select = function(interp, v, a) return select_impl(interp, v, a, true, false) end
F.reject = function(interp, v, a) return select_impl(interp, v, a, false, false) end
F.selectattr = function(interp, v, a) return select_impl(interp, v, a, true, true) end
F.rejectattr = function(interp, v, a) return select_impl(interp, v, a, false, true) end

F.map = function(interp, v, a, kw)
  local items = interp:iterate(v)
  local out = { n = items.n }
  if kw.attribute ~= nil then
    local default = kw.default
    for i = 1, items.n do
      local y = attr_path(interp, items[i], kw.attribute)
      if default ~= nil and kind(y) == 'undefined' then y = default end
      out[i] = y
    end
  else
    local name = a[1]
    local f = F[name]
    if not f then fail(interp, ("No filter named '%s'."):format(tostring(name))) end
    local fargs = { n = 0 }
    for i = 2, a.n or #a do fargs.n = fargs.n + 1; fargs[fargs.n] = a[i] end
    for i = 1, items.n do out[i] = f(interp, items[i], fargs, {}) end
  end
  return values.list(out)
end

------------------------------------------------------------------------------
-- tests: t(interp, value, args, kwargs) -> boolean

local T = {}
M.tests = T

T.defined = function(_, v) return kind(v) ~= 'undefined' end
T.undefined = function(_, v) return kind(v) == 'undefined' end
T.none = function(_, v) return v == NONE end
T.string = function(_, v) return kind(v) == 'str' end
T.mapping = function(_, v) local k = kind(v); return k == 'dict' end
T.number = function(_, v) local k = kind(v); return k == 'int' or k == 'float' or k == 'bool' end
T.integer = function(_, v) return kind(v) == 'int' end
T.float = function(_, v) return kind(v) == 'float' end
T.boolean = function(_, v) return type(v) == 'boolean' end
T['true'] = function(_, v) return v == true end
T['false'] = function(_, v) return v == false end
T.sequence = function(_, v) local k = kind(v); return k == 'str' or k == 'list' or k == 'tuple' or k == 'dict' end
T.iterable = function(_, v)
  local k = kind(v)
  return k == 'str' or k == 'list' or k == 'tuple' or k == 'dict' or k == 'undefined'
end
T.callable = function(_, v) return kind(v) == 'callable' end
T.lower = function(_, v) local s = str(v); return s:lower() == s end
T.upper = function(_, v) local s = str(v); return s:upper() == s end
T.odd = function(_, v) return values.num(v) % 2 == 1 end
T.even = function(_, v) return values.num(v) % 2 == 0 end
T.divisibleby = function(_, v, a) return values.num(v) % values.num(a[1]) == 0 end
T.escaped = function() return false end
T.sameas = function(_, v, a)
  local k = kind(v)
  if k == 'bool' or k == 'none' then return v == a[1] end
  if k == 'str' or k == 'int' then return v == a[1] end
  return rawequal(v, a[1])
end
T['in'] = function(interp, v, a) return interp:contains(a[1], v) end
T.eq = function(_, v, a) return values.eq(v, a[1]) end
T.equalto = T.eq
T['=='] = T.eq
T.ne = function(_, v, a) return not values.eq(v, a[1]) end
T['!='] = T.ne
local function order(f)
  return function(interp, v, a)
    local ok, r = pcall(f, v, a[1])
    if not ok then fail(interp, tostring(r)) end
    return r
  end
end
T.lt = order(function(x, y) return values.lt(x, y) end)
T.lessthan = T.lt
T['<'] = T.lt
T.le = order(function(x, y) return values.lt(x, y) or values.eq(x, y) end)
T['<='] = T.le
T.gt = order(function(x, y) return values.lt(y, x) end)
T.greaterthan = T.gt
T['>'] = T.gt
T.ge = order(function(x, y) return values.lt(y, x) or values.eq(x, y) end)
T['>='] = T.ge

return M
