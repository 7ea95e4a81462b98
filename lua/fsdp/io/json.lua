-- fsdp.io.json: JSON text that round-trips every number exactly, for files
-- whose values must come back bit for bit (checkpoint indexes: learning
-- rates, RNG positions). Debian's lua-cjson prints at most 14 significant
-- digits, which loses doubles; here integers print as integers and other
-- numbers with the fewest digits (at most 17)
-- that read back as the same double. Objects are written with sorted keys and
-- indented, so files diff well. Decoding is cjson's (strtod is exact).
--
-- Lua has one number type; readers with two (Python's json, and so
-- transformers' config validation) see 1 as an int and 1.0 as a float.
-- json.float(x) marks a value that must read back as a float: an integral
-- one is written 1.0. json.null writes null (and is what decode gives for
-- null).
--
--   local json = require 'fsdp.io.json'
--   local text = json.encode({lr = 0.1 + 0.2, shape = json.array({}), eps = json.float(1)})
--   local v = json.decode(text)
local cjson = require 'cjson'

local M = {}

-- Marks a table to be written as an array even when empty.
M.array_mt = {}
function M.array(t) return setmetatable(t or {}, M.array_mt) end

-- Marks a number to be written as a float (1 -> 1.0).
M.float_mt = {}
function M.float(x)
  if type(x) ~= 'number' then error(('json.float: expected a number, got %s'):format(type(x)), 2) end
  return setmetatable({ value = x }, M.float_mt)
end

-- cjson's null (a light userdata): decode gives it for null, encode writes null.
M.null = cjson.null

local function is_array(t)
  if getmetatable(t) == M.array_mt then return true end
  local n = 0
  for _ in pairs(t) do n = n + 1 end
  return n > 0 and t[n] ~= nil and #t == n
end

local function number(x, path, style)
  if x ~= x or x == math.huge or x == -math.huge then
    if style.nonfinite_null then return 'null' end
    error(('json.encode: %s is %s, which JSON cannot hold'):format(path, tostring(x)), 0)
  end
  if x == math.floor(x) and math.abs(x) < 2 ^ 53 then return ('%d'):format(x) end
  -- The shortest of 15, 16, 17 digits that reads back as x.
  for digits = 15, 16 do
    local s = ('%.' .. digits .. 'g'):format(x)
    if tonumber(s) == x then return s end
  end
  return ('%.17g'):format(x)
end

local function encode(v, indent, out, path, style)
  local t = type(v)
  if t == 'nil' then
    out[#out + 1] = 'null'
  elseif t == 'boolean' then
    out[#out + 1] = tostring(v)
  elseif t == 'number' then
    out[#out + 1] = number(v, path, style)
  elseif t == 'string' then
    out[#out + 1] = cjson.encode(v)
  elseif v == M.null then
    out[#out + 1] = 'null'
  elseif t == 'table' and getmetatable(v) == M.float_mt then
    local s = number(v.value, path, style)
    -- An integer's digits alone read back as an int: add the fraction.
    if not s:find('[.eE]') then s = s .. '.0' end
    out[#out + 1] = s
  elseif t == 'table' then
    local inner = style.compact and '' or indent .. '  '
    if is_array(v) then
      -- Arrays of scalars stay on one line (shapes, ranges).
      local flat = true
      for _, x in ipairs(v) do if type(x) == 'table' and not style.compact then flat = false end end
      out[#out + 1] = '['
      for i, x in ipairs(v) do
        if i > 1 then out[#out + 1] = flat and ', ' or ',' end
        if not flat then out[#out + 1] = '\n' .. inner end
        encode(x, inner, out, path .. '[' .. i .. ']', style)
      end
      out[#out + 1] = (flat or #v == 0) and ']' or '\n' .. indent .. ']'
    else
      local keys = {}
      for k in pairs(v) do
        if type(k) ~= 'string' then
          error(('json.encode: %s has a key of type %s (object keys are strings)'):format(path, type(k)), 0)
        end
        keys[#keys + 1] = k
      end
      table.sort(keys)
      out[#out + 1] = '{'
      for i, k in ipairs(keys) do
        if style.compact then
          out[#out + 1] = (i > 1 and ',' or '') .. cjson.encode(k) .. ':'
        else
          out[#out + 1] = (i > 1 and ',\n' or '\n') .. inner .. cjson.encode(k) .. ': '
        end
        encode(v[k], inner, out, path .. '.' .. k, style)
      end
      out[#out + 1] = (#keys == 0 or style.compact) and '}' or '\n' .. indent .. '}'
    end
  else
    error(('json.encode: %s is a %s, which JSON cannot hold'):format(path, t), 0)
  end
end

local INDENTED = {}
function M.encode(v)
  local out = {}
  encode(v, '', out, '$', INDENTED)
  return table.concat(out) .. '\n'
end

-- v as one line (no newline at the end), numbers as exact as encode's and
-- NaN or infinite ones written as null: the records of JSONL logs
-- (fsdp.metrics), whose losses and norms must read back bit for bit.
local LINE = { compact = true, nonfinite_null = true }
function M.encode_line(v)
  local out = {}
  encode(v, '', out, '$', LINE)
  return table.concat(out)
end

-- The value of `text`; nil and cjson's message when it is not JSON.
function M.decode(text)
  local ok, v = pcall(cjson.decode, text)
  if not ok then return nil, (tostring(v):gsub('^.-: ', '')) end
  return v
end

return M
