-- fsdp.nn.lora: nn.LoRALinear, a Linear with a trainable low-rank update
-- (LoRA, Hu et al. 2021), as PEFT's lora.Linear:
--
--   y = x W^T + b + dropout(x) A^T B^T * scaling,   scaling = alpha / rank
--                                                  (alpha / sqrt(rank) with rslora)
--
--   nn.LoRALinear(linear, {rank = 8, alpha = 16, dropout = 0, base_dtype =, rslora = false,
--                          dtype = (the adapter's; default the weight's),
--                          seed =, name = (a live base: the adapter's init values are keyed by
--                                          (seed, name.lora_A.weight); default the global seed, '')})
--
-- The layer takes over the Linear's weight and bias as its own parameters
-- (same names, so a model's state dict and Hugging Face names are
-- unchanged) and freezes them (requires_grad false); the adapter is two
-- bias-free Linears, lora_A [rank, in_features] and lora_B [out_features,
-- rank], whose parameter names (q_proj.lora_A.weight, ...) are PEFT's
-- without its "base_model.model." prefix and adapter name. PEFT's default
-- init: A kaiming_uniform(a = sqrt(5)) (bound 1/sqrt(in_features), our
-- nn.init.kaiming_uniform), B zeros, so a fresh adapter changes nothing.
-- base_dtype (e.g. 'bf16') keeps the frozen weight in that dtype; forward
-- casts it to the input's dtype. On the meta device nothing is allocated:
-- LoRA is applied before fsdp.shard, which shards the adapters and gives
-- the frozen base a flat parameter of its own ([Note: frozen parameters] in
-- fsdp/sharding/unit.lua). fsdp.lora applies it to a model by names.
local factories = require 'fsdp.factories'
local random = require 'fsdp.random'
local core = require 'fsdp.core'
local validate = require 'fsdp.validate'
local Module = require 'fsdp.nn.module'
local Linear = require 'fsdp.nn.linear'
local Dropout = require 'fsdp.nn.dropout'
local parameter = require 'fsdp.nn.parameter'
local repr = require 'fsdp.nn.repr'
local functional = require 'fsdp.functional'

local LoRALinear = Module:extend('LoRALinear')

-- The frozen copy of a base parameter in `dtype` (same init rule; on meta
-- a new empty tensor, else converted values).
local function frozen(t, dtype)
  if t == nil then return nil end
  if dtype and t.dtype ~= dtype then
    local rule = rawget(t, 'init')
    local c
    if t:is_meta() then
      c = factories.empty(t.shape, { dtype = dtype, device = 'meta' })
    else
      c = t:detach():to({ dtype = dtype })
    end
    parameter.mark(c, rule)
    t = c
  end
  t:requires_grad_(false)
  return t
end

function LoRALinear:__init(linear, opts)
  opts = opts or {}
  if not (Module.is_module(linear) and linear:is_instance_of(Linear)) then
    core.fail(('LoRALinear: expects a Linear, got %s'):format(
      Module.is_module(linear) and linear:class_name() or type(linear)))
  end
  if rawget(linear.weight, 'tp') then
    core.fail('LoRALinear: the Linear is already tensor-parallel; apply LoRA before fsdp.tp.parallelize')
  end
  -- (fsdp.validate: a NaN alpha passes `alpha <= 0` and makes every output NaN)
  local r = opts.rank or 8
  local why = validate.problem(r, validate.COUNT)
  if why then core.fail('LoRALinear: rank ' .. why) end
  local alpha = opts.alpha or r
  why = validate.problem(alpha, validate.POSITIVE)
  if why then core.fail('LoRALinear: alpha ' .. why) end
  local p = opts.dropout or 0
  why = validate.problem(p, validate.PROBABILITY)
  if why then core.fail('LoRALinear: dropout ' .. why) end
  local w = linear.weight
  self.in_features, self.out_features = linear.in_features, linear.out_features
  self.rank, self.alpha, self.rslora = r, alpha, opts.rslora and true or false
  self.scaling = self.rslora and alpha / math.sqrt(r) or alpha / r
  self:register_parameter('weight', frozen(w, opts.base_dtype))
  self:register_parameter('bias', frozen(linear.bias, opts.base_dtype))
  -- The adapter: in the weight's device and the trainable dtype (the
  -- base's unless base_dtype moved the base away from it).
  local place = { device = w:is_meta() and 'meta' or w.device, dtype = opts.dtype or w.dtype }
  self.lora_dropout = Dropout(p)
  self.lora_A = Linear(self.in_features, r, { bias = false, device = place.device, dtype = place.dtype,
                                              init = parameter.init.kaiming_uniform(self.in_features) })
  self.lora_B = Linear(r, self.out_features, { bias = false, device = place.device, dtype = place.dtype,
                                               init = parameter.init.zeros() })
  if not w:is_meta() then
    -- A live model: the adapter gets its init values now, keyed by its own
    -- full name once it is in the model (fsdp.lora.apply passes it).
    local seed, name = opts.seed or random.initial_seed(), opts.name or ''
    for _, key in ipairs({ 'lora_A', 'lora_B' }) do
      local t = self[key].weight
      parameter.fill(t, rawget(t, 'init'), { seed = seed, name = (name ~= '' and name .. '.' or '') .. key .. '.weight' })
    end
  end
end

function LoRALinear:forward(x)
  local F = functional
  local w, b = self.weight, self.bias
  if w.dtype ~= x.dtype then w = w:to({ dtype = x.dtype }) end
  if b ~= nil and b.dtype ~= x.dtype then b = b:to({ dtype = x.dtype }) end
  local y = F.linear(x, w, b)
  local u = self.lora_B(self.lora_A(self.lora_dropout(x)))
  return y + u * self.scaling
end

-- The update B A * scaling as an [out_features, in_features] tensor in
-- `dtype` (default the adapter's), from whole (unsharded) A and B.
function LoRALinear.delta(A, B, scaling, dtype)
  local d = B:matmul(A) * scaling
  if dtype and d.dtype ~= dtype then d = d:to({ dtype = dtype }) end
  return d
end

function LoRALinear:extra_repr()
  return ('in_features=%d, out_features=%d, bias=%s, rank=%d, alpha=%s%s'):format(
    self.in_features, self.out_features, repr.bool(self.bias ~= nil), self.rank, repr.float(self.alpha),
    self.rslora and ', rslora=True' or '')
end

return LoRALinear
