-- fsdp.validate: the one numeric check every validation shares: recipe
-- options (fsdp.options), model configs (models/common.lua), the values of
-- config.json and adapter_config.json, generation, layer and optimizer
-- arguments. Each says what is wrong the same way, and none lets NaN
-- through: `v <= 0` is false for NaN, so a check written as a comparison
-- accepts it (lora_alpha NaN made every logit NaN); and a size written as
-- 1e12, Infinity or 2e308 is an integer to math.floor.
--
--   local validate = require 'fsdp.validate'
--   validate.problem(0 / 0, {positive = true})          -- 'must be a finite number, got nan'
--   validate.problem(2.5, {int = true, min = 1})         -- 'must be an integer, got 2.5'
--   validate.check(alpha, {positive = true}, 'LoRALinear: alpha')   -- raises "LoRALinear: alpha must be ..."
--   validate.show({1, {a = 2}})                          -- '[1, {"a": 2}]' (never "table: 0x...")
--
-- A rule: int (an integer, at most 2^53 in magnitude: past it doubles
-- skip integers, so 1e300 is no count), min (>= it), max (<= it), positive
-- (> 0), below (< it), nonfinite (true: inf and -inf pass; NaN never does).
-- A bound that a NaN fails is checked as `not (v >= min)`, never `v < min`.
local json = require 'fsdp.io.json'
local M = {}

-- The largest integer a double holds with every integer below it.
M.MAX_INT = 2 ^ 53

-- Whether x is a number that is neither NaN nor infinite.
function M.finite(x)
  return type(x) == 'number' and x == x and x ~= math.huge and x ~= -math.huge
end

local function show_number(x)
  if x ~= x then return 'nan' end
  if x == math.huge then return 'inf' end
  if x == -math.huge then return '-inf' end
  if x == math.floor(x) and math.abs(x) < 1e15 then return ('%d'):format(x) end
  return tostring(x)
end

-- Any value as a message shows it: numbers as Lua writes them (nan, inf,
-- 1e+12), strings quoted, JSON null as null, tables as compact JSON (keys
-- sorted, long ones cut with "..."), so nested garbage in a file reads as
-- what the file holds.
function M.show(v, limit)
  limit = limit or 80
  local out, n = {}, 0
  local function put(s)
    if n <= limit then out[#out + 1] = s end
    n = n + #s
  end
  local null = json.null
  local function walk(x, depth)
    local t = type(x)
    if t == 'number' then put(show_number(x))
    elseif t == 'string' then put(require('cjson').encode(x))
    elseif t == 'boolean' or t == 'nil' then put(tostring(x))
    elseif x == null then put('null')
    elseif t == 'table' and depth < 6 then
      local m = getmetatable(x)
      if m and m == json.float_mt then return walk(x.value, depth) end
      local len = #x
      local count = 0
      for _ in pairs(x) do count = count + 1 end
      if count > 0 and count == len then
        put('[')
        for i = 1, len do
          if i > 1 then put(', ') end
          walk(x[i], depth + 1)
          if n > limit then break end
        end
        put(']')
      else
        local keys = {}
        for k in pairs(x) do keys[#keys + 1] = tostring(k) end
        table.sort(keys)
        put('{')
        for i, k in ipairs(keys) do
          if i > 1 then put(', ') end
          put(require('cjson').encode(k) .. ': ')
          local val = x[k]
          if val == nil then val = x[tonumber(k)] end
          walk(val, depth + 1)
          if n > limit then break end
        end
        put('}')
      end
    else
      put(t)
    end
  end
  walk(v, 0)
  local s = table.concat(out)
  if n > limit then s = s:sub(1, limit) .. '...' end
  return s
end

local function bound(x) return show_number(x) end

-- What is wrong with v under `rule` (see the top), as a phrase to follow
-- the thing's name ("must be > 0, got nan"), or nil when nothing is.
function M.problem(v, rule)
  rule = rule or {}
  if v == nil then return 'is missing' end
  if type(v) ~= 'number' then return 'must be a number, got ' .. M.show(v) end
  if v ~= v or (not rule.nonfinite and (v == math.huge or v == -math.huge)) then
    return 'must be a finite number, got ' .. show_number(v)
  end
  if rule.int and v ~= math.floor(v) then return 'must be an integer, got ' .. show_number(v) end
  if rule.int and math.abs(v) > M.MAX_INT then
    return 'must be an integer of at most 2^53 (a count a double holds exactly), got ' .. show_number(v)
  end
  if rule.positive and not (v > 0) then return 'must be > 0, got ' .. show_number(v) end
  if rule.min and not (v >= rule.min) then
    return ('must be >= %s, got %s'):format(bound(rule.min), show_number(v))
  end
  if rule.max and not (v <= rule.max) then
    return ('must be <= %s, got %s'):format(bound(rule.max), show_number(v))
  end
  if rule.below and not (v < rule.below) then
    return ('must be < %s, got %s'):format(bound(rule.below), show_number(v))
  end
  return nil
end

-- Raise "<what> <problem>" (one line, no location: `what` names the
-- thing at fault) when v breaks the rule; returns v otherwise.
function M.check(v, rule, what)
  local why = M.problem(v, rule)
  if why then error(('%s %s'):format(what, why), 0) end
  return v
end

-- Rules the checks use most, by name.
M.COUNT = { int = true, min = 1 }          -- a size: layers, width, heads, vocabulary
M.INDEX = { int = true, min = 0 }          -- a token id, a step, a seed
M.POSITIVE = { positive = true }           -- a rate, a scale, a temperature
M.NONNEGATIVE = { min = 0 }                -- an epsilon, a weight decay, an init std
M.PROBABILITY = { min = 0, below = 1 }     -- a dropout rate
M.FRACTION = { min = 0, max = 1 }          -- a decay rate: rho, dampening

return M
