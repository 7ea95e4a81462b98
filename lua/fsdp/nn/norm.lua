-- fsdp.nn.norm: the normalisation layers over the last dimension.
--
--   nn.RMSNorm(dim, {eps = 1e-6, elementwise_affine = true, device =, dtype =, init =})
--     y = x / sqrt(mean(x^2) + eps) * weight      (Llama, T5LayerNorm)
--   nn.LayerNorm(dim, {eps = 1e-5, elementwise_affine = true, bias = true, device =,
--                dtype =, init =, bias_init =})
--     y = (x - mean) / sqrt(var + eps) * weight + bias
--
-- Weights start at ones and biases at zeros, as in PyTorch (`init` and
-- `bias_init` give other rules, e.g. nn.init.normal(0.02)). The reprs are
-- PyTorch's: "RMSNorm((4096,), eps=1e-05, elementwise_affine=True)".
local core = require 'fsdp.core'
local validate = require 'fsdp.validate'
local Module = require 'fsdp.nn.module'
local parameter = require 'fsdp.nn.parameter'
local repr = require 'fsdp.nn.repr'
local functional = require 'fsdp.functional'

local M = {}

-- One normalised dimension: `dim` or {dim}.
local function normalized_dim(cls, dim)
  if type(dim) == 'table' then
    if #dim ~= 1 then
      core.fail(('%s: only the last dimension can be normalised, got normalized_shape %s')
        :format(cls, repr.tuple(dim)))
    end
    dim = dim[1]
  end
  if validate.problem(dim, validate.COUNT) then
    core.fail(('%s: dim must be a positive integer, got %s'):format(cls, validate.show(dim)))
  end
  return dim
end

local function norm_repr(self)
  return ('(%d,), eps=%s, elementwise_affine=%s'):format(
    self.dim, repr.float(self.eps), repr.bool(self.elementwise_affine))
end

-- RMSNorm -------------------------------------------------------------------------------

local RMSNorm = Module:extend('RMSNorm')
M.RMSNorm = RMSNorm

function RMSNorm:__init(dim, opts)
  opts = opts or {}
  self.dim = normalized_dim('RMSNorm', dim)
  self.eps = opts.eps or 1e-6
  self.elementwise_affine = opts.elementwise_affine ~= false
  if self.elementwise_affine then
    self:register_parameter('weight', parameter.Parameter({ self.dim },
      { init = opts.init or parameter.init.ones(), device = opts.device, dtype = opts.dtype }))
  else
    self:register_parameter('weight', nil)
  end
end

function RMSNorm:forward(x)
  return functional.rms_norm(x, self.weight, self.eps)
end

RMSNorm.extra_repr = norm_repr

-- LayerNorm -----------------------------------------------------------------------------

local LayerNorm = Module:extend('LayerNorm')
M.LayerNorm = LayerNorm

function LayerNorm:__init(dim, opts)
  opts = opts or {}
  self.dim = normalized_dim('LayerNorm', dim)
  self.eps = opts.eps or 1e-5
  self.elementwise_affine = opts.elementwise_affine ~= false
  local place = { device = opts.device, dtype = opts.dtype }
  if self.elementwise_affine then
    self:register_parameter('weight', parameter.Parameter({ self.dim },
      { init = opts.init or parameter.init.ones(), device = place.device, dtype = place.dtype }))
  else
    self:register_parameter('weight', nil)
  end
  if self.elementwise_affine and opts.bias ~= false then
    self:register_parameter('bias', parameter.Parameter({ self.dim },
      { init = opts.bias_init or parameter.init.zeros(), device = place.device, dtype = place.dtype }))
  else
    self:register_parameter('bias', nil)
  end
end

function LayerNorm:forward(x)
  return functional.layer_norm(x, self.weight, self.bias, self.eps)
end

LayerNorm.extra_repr = norm_repr

return M
