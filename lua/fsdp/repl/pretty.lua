-- fsdp.repl.pretty: the REPL's printed form of plain Lua tables.
--
--   pretty.table({lr = 3e-4, betas = {0.9, 0.95}, name = 'adamw'})
--   --> {betas = {0.9, 0.95}, lr = 0.0003, name = "adamw"}
--
-- Keys in order (the array part first, then sorted keys), strings quoted,
-- nesting shown to a few levels, long tables cut after `max_items` entries,
-- cycles marked, and one entry per line once the one-line form passes 80
-- columns. Values that print themselves (__tostring: tensors, modules) are
-- shown by their first line only, so a model inside a table stays one
-- line. Tables with their own __tostring are left to it (format returns
-- nil for them).
local M = {}

M.max_depth = 3
M.max_items = 40
M.width = 80

local function is_identifier(s)
  return type(s) == 'string' and s:match('^[%a_][%w_]*$') ~= nil and not ({
    ['and'] = 1, ['break'] = 1, ['do'] = 1, ['else'] = 1, ['elseif'] = 1, ['end'] = 1,
    ['false'] = 1, ['for'] = 1, ['function'] = 1, ['if'] = 1, ['in'] = 1, ['local'] = 1,
    ['nil'] = 1, ['not'] = 1, ['or'] = 1, ['repeat'] = 1, ['return'] = 1, ['then'] = 1,
    ['true'] = 1, ['until'] = 1, ['while'] = 1 })[s]
end

local function has_tostring(v)
  local mt = getmetatable(v)
  return type(mt) == 'table' and rawget(mt, '__tostring') ~= nil
end

local function scalar(v)
  if type(v) == 'string' then return (('%q'):format(v):gsub('\\\n', '\\n')) end
  if type(v) == 'number' and v == math.floor(v) and math.abs(v) < 2^53 then
    return ('%d'):format(v)
  end
  if has_tostring(v) then
    local ok, text = pcall(tostring, v)
    if ok and type(text) == 'string' then
      local first = text:match('^[^\n]*')
      return first ~= text and first .. ' ...' or text
    end
  end
  return tostring(v)
end

local function key_order(a, b)
  local ta, tb = type(a), type(b)
  if ta ~= tb then return ta < tb end
  if ta == 'number' or ta == 'string' then return a < b end
  return tostring(a) < tostring(b)
end

local function render(t, depth, indent, seen)
  if seen[t] then return '<cycle>' end
  if depth > M.max_depth then return '{...}' end
  seen[t] = true
  local n = 0
  while rawget(t, n + 1) ~= nil do n = n + 1 end
  local keys = {}
  for k in pairs(t) do
    if not (type(k) == 'number' and k >= 1 and k <= n and k == math.floor(k)) then keys[#keys + 1] = k end
  end
  table.sort(keys, key_order)
  local items = {}
  local function value(v)
    if type(v) == 'table' and not has_tostring(v) then return render(v, depth + 1, indent .. '  ', seen) end
    return scalar(v)
  end
  for i = 1, n do
    if #items >= M.max_items then break end
    items[#items + 1] = value(rawget(t, i))
  end
  for _, k in ipairs(keys) do
    if #items >= M.max_items then break end
    local name = is_identifier(k) and k or '[' .. scalar(k) .. ']'
    items[#items + 1] = name .. ' = ' .. value(rawget(t, k))
  end
  local total = n + #keys
  if total > #items then items[#items + 1] = ('... (%d more)'):format(total - #items) end
  seen[t] = nil
  if #items == 0 then return '{}' end
  local one_line = '{' .. table.concat(items, ', ') .. '}'
  if #indent + #one_line <= M.width and not one_line:find('\n', 1, true) then return one_line end
  -- Several lines: array items fill lines, keyed items take one each.
  local lines, line = {}, nil
  local pad = indent .. '  '
  for i, item in ipairs(items) do
    local fits = line and i <= n and not item:find('\n', 1, true)
                 and #pad + #line + 2 + #item <= M.width
    if fits then
      line = line .. ', ' .. item
    else
      if line then lines[#lines + 1] = line end
      line = item
    end
    if i > n then lines[#lines + 1] = line; line = nil end
  end
  if line then lines[#lines + 1] = line end
  return '{\n' .. pad .. table.concat(lines, ',\n' .. pad) .. '\n' .. indent .. '}'
end

-- The printed form of a plain table, or nil for other values (and for
-- tables that print themselves).
function M.format(v)
  if type(v) ~= 'table' or has_tostring(v) then return nil end
  return render(v, 1, '', {})
end

return M
