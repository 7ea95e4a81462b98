-- fsdp.nn.parameter: parameters, their init rules, and deferred,
-- world-size-independent initialisation.
--
-- A parameter is a Tensor with two Lua fields: `is_param = true` and `init`,
-- the rule that gives its values. Modules create parameters without values
-- (fsdp.empty: on the meta device nothing is allocated), and
-- Module:init_weights walks the tree and fills each parameter from its rule
-- and its fully qualified name. Random rules draw from the core's
-- counter-based generator keyed by
--
--   seed   = the seed given to init_weights
--   stream = FNV-1a-64(fully qualified name)     (see M.stream)
--   index  = offset + element index, row-major within the parameter
--
-- so a value depends on (seed, name, index) only: a rank that holds a
-- shard of a parameter fills it alone with `offset` = the shard's first
-- element and gets exactly the values of a single-process init of the
-- whole model. The stream function and this keying are a contract: changing
-- either changes every initialisation (tests pin golden values).
--
-- Rules are small tables (nn.init.normal(0.02) == {kind='normal', mean=0,
-- std=0.02}) or functions rule(tensor, key) for values that are computed,
-- not drawn (a rotary table); a function rule is called with the whole
-- tensor and key = {seed=, stream=, offset=, name=}. There is no
-- trunc_normal: an exact truncated normal maps a uniform draw through the
-- inverse normal CDF, which the core has no kernel for, and clamping or
-- redrawing normals gives a different distribution or breaks the
-- (seed, name, index) keying.
local ffi = require 'ffi'
local bit = require 'bit'
local factories = require 'fsdp.factories'
local random = require 'fsdp.random'
local Tensor = require 'fsdp.tensor'
local core = require 'fsdp.core'
local validate = require 'fsdp.validate'

local M = {}

-- FNV-1a, 64 bits, over the bytes of the name: offset basis
-- 0xcbf29ce484222325, prime 0x100000001b3, arithmetic mod 2^64. Returns a
-- uint64_t cdata (usable as a random `stream`).
function M.stream(name)
  local h = 0xcbf29ce484222325ULL
  for i = 1, #name do
    h = bit.bxor(h, name:byte(i)) * 0x100000001b3ULL
  end
  return ffi.cast('uint64_t', h)
end

-- init rules --------------------------------------------------------------------

local init = {}
M.init = init

-- N(mean, std^2).
function init.normal(std, mean)
  return { kind = 'normal', mean = mean or 0, std = std or 1 }
end

-- U(low, high).
function init.uniform(low, high)
  return { kind = 'uniform', low = low or 0, high = high or 1 }
end

function init.zeros() return { kind = 'zeros' } end
function init.ones() return { kind = 'ones' } end
function init.constant(value) return { kind = 'constant', value = value } end

-- U(-1/sqrt(fan_in), 1/sqrt(fan_in)): PyTorch's default for Linear and
-- Conv weights (kaiming_uniform_ with a = sqrt(5) works out to this bound)
-- and for their biases.
function init.kaiming_uniform(fan_in)
  return { kind = 'kaiming_uniform', fan_in = fan_in }
end

local KINDS = {
  normal = true, uniform = true, zeros = true, ones = true, constant = true,
  kaiming_uniform = true,
}

-- Nil when `rule` is valid, else why not.
function M.check_rule(rule)
  if type(rule) == 'function' then return nil end
  if type(rule) ~= 'table' then return ('an init rule is a table or a function, got %s'):format(type(rule)) end
  if not KINDS[rule.kind] then
    return ('unknown init rule kind %s (known: normal, uniform, zeros, ones, constant, kaiming_uniform)')
      :format(tostring(rule.kind))
  end
  -- (fsdp.validate: an infinite std or bound draws infinite values)
  if rule.kind == 'normal' and validate.problem(rule.std, validate.NONNEGATIVE) then
    return 'normal rule needs std >= 0'
  end
  if rule.kind == 'uniform' and (validate.problem(rule.low) or validate.problem(rule.high) or not (rule.low <= rule.high)) then
    return 'uniform rule needs finite numbers low <= high'
  end
  if rule.kind == 'kaiming_uniform' and validate.problem(rule.fan_in, validate.POSITIVE) then
    return 'kaiming_uniform rule needs fan_in > 0'
  end
  if rule.kind == 'constant' and validate.problem(rule.value) then
    return 'constant rule needs a finite number value'
  end
  return nil
end

-- Fill t from `rule` under key {seed=, name= (or stream=), offset=}: element
-- i of t takes the value of element offset + i of the whole parameter. On
-- meta and fake tensors nothing happens. `what` names t in errors.
function M.fill(t, rule, key, what)
  what = what or 'tensor'
  local bad = M.check_rule(rule)
  if bad then core.fail(('init of %s: %s'):format(what, bad)) end
  local stream = key.stream or (key.name and M.stream(key.name)) or 0
  local seed, offset = key.seed or random.initial_seed(), key.offset or 0
  if type(rule) == 'function' then
    rule(t, { seed = seed, stream = stream, offset = offset, name = key.name })
    return t
  end
  local k = rule.kind
  if k == 'zeros' then return t:fill_(0) end
  if k == 'ones' then return t:fill_(1) end
  if k == 'constant' then return t:fill_(rule.value) end
  local rkey = { seed = seed, stream = stream, offset = offset }
  if k == 'normal' then return t:normal_(rule.mean or 0, rule.std, rkey) end
  if k == 'uniform' then return t:uniform_(rule.low, rule.high, rkey) end
  local bound = 1 / math.sqrt(rule.fan_in)
  return t:uniform_(-bound, bound, rkey)
end

-- parameters ----------------------------------------------------------------------

-- Mark t as a parameter with an init rule. A float leaf starts requiring
-- grad; a tensor computed from others (the sharding layer's views of a
-- gathered flat parameter) keeps its place in the graph.
local function mark(t, rule)
  rawset(t, 'is_param', true)
  if rule ~= nil then rawset(t, 'init', rule) end
  if t:is_floating_point() and t:is_leaf() and not t.requires_grad then t:requires_grad_(true) end
  return t
end
M.mark = mark

-- nn.Parameter(shape, {init=rule, device=, dtype=}): a parameter without
-- values yet (init_weights fills it). nn.Parameter(tensor, {init=}) marks
-- an existing tensor (it keeps its values; `init` is used if the model is
-- re-initialised or materialised from meta).
function M.Parameter(shape_or_tensor, opts)
  opts = opts or {}
  if opts.init ~= nil then
    local bad = M.check_rule(opts.init)
    if bad then core.fail('Parameter: ' .. bad) end
  end
  if Tensor.is_tensor(shape_or_tensor) then
    return mark(shape_or_tensor, opts.init)
  end
  if type(shape_or_tensor) ~= 'table' then
    core.fail(('Parameter expects a shape table or a tensor, got %s'):format(type(shape_or_tensor)))
  end
  local t = factories.empty(shape_or_tensor, { device = opts.device, dtype = opts.dtype })
  return mark(t, opts.init)
end

return M
