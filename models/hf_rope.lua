-- models/hf_rope.lua: the RoPE settings of a Hugging Face config.json, read
-- and written in both layouts transformers uses, for every family that
-- rotates its queries and keys:
--   4.x: rope_theta, rope_scaling = {type or rope_type, factor, ...}
--        (null without scaling), and top-level partial_rotary_factor and
--        original_max_position_embeddings (Phi-3 keeps the latter there);
--   5.x: rope_parameters = {rope_type, rope_theta, factor, ...}.
--
--   local hf_rope = require 'models.hf_rope'
--   local theta, scaling = hf_rope.from_hf(where, h, fail)   -- scaling nil: plain RoPE
--   local keys = hf_rope.to_hf(theta, scaling)
--   -- {rope_theta =, rope_scaling =, rope_parameters = [, partial_rotary_factor =]}
--
-- scaling is what F.rope_tables takes: {rope_type = 'linear' | 'dynamic' |
-- 'yarn' | 'longrope' | 'llama3' | 'default', and that type's keys as
-- transformers names them}; nil for the default type with the whole head
-- rotated. The types and their keys are transformers 5's
-- (modeling_rope_utils.py): the required ones must be there, the
-- optional ones may be, any other key is an error, and so is a key the
-- two layouts (or rope_theta and rope_parameters.rope_theta, or type and
-- rope_type) give different values (see [Note: config keys] in
-- models/hf.lua). original_max_position_embeddings, where a type needs it
-- and the dict leaves it out, is the top-level key of that name, else
-- max_position_embeddings (transformers' standardize_rope_params).
local json = require 'fsdp.io.json'
local validate = require 'fsdp.validate'
local tables = require 'fsdp.tables'

local M = {}

-- The top-level config.json keys from_hf reads (a family's loader lets
-- them through its key check).
M.KEYS = { 'rope_theta', 'rope_scaling', 'rope_parameters', 'partial_rotary_factor',
           'original_max_position_embeddings' }

local POSITIVE, COUNT, NONNEGATIVE = validate.POSITIVE, validate.COUNT, validate.NONNEGATIVE
local NUMBER = {} -- any finite number

-- Each type's keys (besides rope_type/type, rope_theta and
-- partial_rotary_factor, which every type takes): key -> true when
-- required, false when optional.
M.TYPES = {
  default = {},
  linear = { factor = true },
  dynamic = { factor = true },
  yarn = { factor = true, original_max_position_embeddings = true, attention_factor = false, beta_fast = false,
           beta_slow = false, mscale = false, mscale_all_dim = false, truncate = false },
  longrope = { short_factor = true, long_factor = true, original_max_position_embeddings = true,
               attention_factor = false, factor = false },
  llama3 = { factor = true, low_freq_factor = true, high_freq_factor = true, original_max_position_embeddings = true },
}
local TYPE_NAMES = 'default, linear, dynamic, yarn, longrope, llama3'

-- What each key must hold.
local RULES = { factor = POSITIVE, original_max_position_embeddings = COUNT, attention_factor = NONNEGATIVE,
                beta_fast = NUMBER, beta_slow = NUMBER, mscale = NUMBER, mscale_all_dim = NUMBER,
                low_freq_factor = POSITIVE, high_freq_factor = POSITIVE }

local function null(v) return v == nil or v == json.null end
local function is_list(v) return type(v) == 'table' and (next(v) == nil or #v > 0) end

-- The problem with value v of key k (a sentence after the key), or nil.
local function problem(k, v)
  if k == 'truncate' then return type(v) ~= 'boolean' and 'must be true or false, got ' .. validate.show(v) or nil end
  if k == 'partial_rotary_factor' then
    return not (type(v) == 'number' and v > 0 and v <= 1) and 'must be a number in (0, 1], got ' .. validate.show(v)
      or nil
  end
  if k == 'short_factor' or k == 'long_factor' then
    if not is_list(v) then return 'must be a list of numbers, got ' .. validate.show(v) end
    for i, x in ipairs(v) do
      local why = validate.problem(x, POSITIVE)
      if why then return ('entry %d %s'):format(i, why) end
    end
    return nil
  end
  return RULES[k] and validate.problem(v, RULES[k]) or nil
end

-- Problems of a scaling table as from_hf returns it (a model config's
-- rope_scaling): nil when fine, else one sentence.
function M.check_scaling(s)
  if type(s) ~= 'table' then return 'must be a table, got ' .. validate.show(s) end
  local kind = s.rope_type or s.type or 'default'
  local keys = M.TYPES[kind]
  if not keys then return ("rope_type %s is not supported (%s)"):format(validate.show(kind), TYPE_NAMES) end
  for k, v in pairs(s) do
    if k ~= 'rope_type' and k ~= 'type' and keys[k] == nil and k ~= 'partial_rotary_factor' then
      return ("has an unknown key '%s' for rope_type '%s'"):format(tostring(k), kind)
    end
    local why = problem(k, v)
    if why then return ('.%s %s'):format(k, why) end
  end
  if s.rope_type and s.type and s.rope_type ~= s.type then return 'has rope_type and type that disagree' end
  return nil
end

local function same(a, b)
  if type(a) ~= 'table' or type(b) ~= 'table' then return a == b end
  if #a ~= #b then return false end
  for k, v in pairs(a) do if b[k] ~= v then return false end end
  for k in pairs(b) do if a[k] == nil then return false end end
  return true
end

-- A copy of a rope dict without its null values.
local function present(d)
  local out = {}
  for k, v in pairs(d) do if not null(v) then out[k] = v end end
  return out
end

-- theta, scaling from config.json h (see the file comment); where names
-- the file in messages, fail(where, fmt, ...) raises one line.
function M.from_hf(where, h, fail)
  local show = validate.show
  local params, legacy = h.rope_parameters, h.rope_scaling
  if null(params) then params = nil end
  if null(legacy) then legacy = nil end
  for k, v in pairs({ rope_parameters = params, rope_scaling = legacy }) do
    if type(v) ~= 'table' or (next(v) ~= nil and #v > 0) then
      fail(where, '%s must be an object, got %s', k, show(v))
    end
  end
  params, legacy = params and present(params), legacy and present(legacy)
  if params and legacy then
    -- The same settings twice: type and rope_type are one key, and
    -- rope_theta and partial_rotary_factor may be in rope_parameters alone
    -- (5.x moved them there from the top level).
    local function kind_of(d) return d.rope_type or d.type end
    if kind_of(legacy) ~= kind_of(params) then
      fail(where, 'rope_scaling.rope_type (%s) and rope_parameters.rope_type (%s) disagree', show(kind_of(legacy)),
        show(kind_of(params)))
    end
    local keys = {}
    for k in pairs(legacy) do keys[k] = true end
    for k in pairs(params) do keys[k] = true end
    local names = {}
    for k in pairs(keys) do names[#names + 1] = tostring(k) end
    table.sort(names)
    for _, k in ipairs(names) do
      local skip = k == 'type' or k == 'rope_type'
        or ((k == 'rope_theta' or k == 'partial_rotary_factor') and legacy[k] == nil)
      if not skip and not same(legacy[k], params[k]) then
        fail(where, 'rope_scaling.%s (%s) and rope_parameters.%s (%s) disagree', k, show(legacy[k]), k,
          show(params[k]))
      end
    end
  end
  local p = params or legacy or {}
  local where_p = params and 'rope_parameters' or 'rope_scaling'
  local theta = h.rope_theta
  if null(theta) then theta = nil end
  if theta ~= nil and p.rope_theta ~= nil and theta ~= p.rope_theta then
    fail(where, 'rope_theta (%s) and %s.rope_theta (%s) disagree', show(theta), where_p, show(p.rope_theta))
  end
  local theta_key = p.rope_theta ~= nil and where_p .. '.rope_theta' or 'rope_theta'
  theta = p.rope_theta or theta or 1e4 -- transformers' default_theta
  local why = validate.problem(theta, POSITIVE)
  if why then fail(where, '%s %s', theta_key, why) end
  if p.rope_type ~= nil and p.type ~= nil and p.rope_type ~= p.type then
    fail(where, '%s.rope_type (%s) and %s.type (%s) disagree', where_p, show(p.rope_type), where_p, show(p.type))
  end
  local kind = p.rope_type or p.type or 'default'
  local keys = type(kind) == 'string' and M.TYPES[kind]
  if not keys then fail(where, '%s.rope_type %s is not supported (%s)', where_p, show(kind), TYPE_NAMES) end
  local names = {}
  for k in pairs(p) do names[#names + 1] = tostring(k) end
  table.sort(names)
  for _, k in ipairs(names) do
    if keys[k] == nil and not (k == 'rope_type' or k == 'type' or k == 'rope_theta' or k == 'partial_rotary_factor')
    then
      fail(where, "unknown key '%s.%s' for rope_type '%s'", where_p, k, kind)
    end
  end
  local scaling = { rope_type = kind }
  -- partial_rotary_factor: the dict's, else the top-level key (4.x).
  local prf, prf_key = p.partial_rotary_factor, where_p .. '.partial_rotary_factor'
  local top_prf = not null(h.partial_rotary_factor) and h.partial_rotary_factor or nil
  if prf ~= nil and top_prf ~= nil and prf ~= top_prf then
    fail(where, 'partial_rotary_factor (%s) and %s (%s) disagree', show(top_prf), prf_key, show(prf))
  end
  if prf == nil then prf, prf_key = top_prf, 'partial_rotary_factor' end
  if prf ~= nil then
    local bad = problem('partial_rotary_factor', prf)
    if bad then fail(where, '%s %s', prf_key, bad) end
    if prf ~= 1 then scaling.partial_rotary_factor = prf end
  end
  for _, k in ipairs(tables.sorted_keys(keys)) do
    local v, key = p[k], where_p .. '.' .. k
    if v == nil and k == 'original_max_position_embeddings' then
      -- transformers' standardize_rope_params: the top-level key (Phi-3's
      -- place for it), else max_position_embeddings.
      for _, top in ipairs({ 'original_max_position_embeddings', 'max_position_embeddings' }) do
        if v == nil and not null(h[top]) then v, key = h[top], top end
      end
    end
    if v == nil and keys[k] then fail(where, "%s is missing (rope_type '%s' needs it)", key, kind) end
    if v ~= nil then
      local bad = problem(k, v)
      if bad then fail(where, '%s %s', key, bad) end
      scaling[k] = v
    end
  end
  if kind == 'longrope' then
    if #scaling.short_factor ~= #scaling.long_factor then
      fail(where, '%s.short_factor (%d entries) and long_factor (%d) differ in length', where_p,
        #scaling.short_factor, #scaling.long_factor)
    end
  end
  if kind == 'llama3' and scaling.low_freq_factor == scaling.high_freq_factor then
    fail(where, '%s.low_freq_factor and high_freq_factor are both %s (llama3 needs them different)', where_p,
      show(scaling.low_freq_factor))
  end
  if kind == 'default' and scaling.partial_rotary_factor == nil then scaling = nil end
  return theta, scaling
end

-- The rotary dims of a head under scaling (partial_rotary_factor), as
-- transformers' int(head_dim * partial_rotary_factor).
function M.rotary_dim(head_dim, scaling)
  return math.floor(head_dim * (scaling and scaling.partial_rotary_factor or 1))
end

-- config.json keys for theta and scaling, both layouts (4.x reads
-- rope_theta, rope_scaling and partial_rotary_factor, 5.x
-- rope_parameters), floats as floats (json.float: transformers 5
-- validates JSON types).
function M.to_hf(theta, scaling)
  local F = json.float
  local function value(k, v)
    if k == 'short_factor' or k == 'long_factor' then
      local out = {}
      for i, x in ipairs(v) do out[i] = F(x) end
      return out
    end
    if k == 'original_max_position_embeddings' or k == 'truncate' or type(v) ~= 'number' then return v end
    return F(v)
  end
  local kind = scaling and (scaling.rope_type or scaling.type) or 'default'
  local params = { rope_type = kind, rope_theta = F(theta) }
  local legacy = json.null
  local out = { rope_theta = F(theta), rope_parameters = params }
  if scaling then
    if kind ~= 'default' then legacy = { rope_type = kind } end
    for k, v in pairs(scaling) do
      if k == 'partial_rotary_factor' then
        params[k], out[k] = F(v), F(v)
      elseif k ~= 'rope_type' and k ~= 'type' then
        params[k], legacy[k] = value(k, v), value(k, v)
      end
    end
  end
  out.rope_scaling = legacy
  return out
end

return M
