-- fsdp.nn.linear: nn.Linear, y = x W^T + b, as torch.nn.Linear.
--
--   nn.Linear(in_features, out_features, {bias = true, device =, dtype =,
--             init = rule, bias_init = rule})
--
-- weight [out_features, in_features], bias [out_features]. Default init as
-- PyTorch: both U(-1/sqrt(in_features), 1/sqrt(in_features)). Models set
-- their own rules through `init` (e.g. nn.init.normal(0.02)).
local core = require 'fsdp.core'
local validate = require 'fsdp.validate'
local Module = require 'fsdp.nn.module'
local parameter = require 'fsdp.nn.parameter'
local repr = require 'fsdp.nn.repr'
local functional = require 'fsdp.functional'

local Linear = Module:extend('Linear')

local function check_size(what, v)
  if validate.problem(v, validate.INDEX) then
    core.fail(('Linear: %s must be a non-negative integer, got %s'):format(what, validate.show(v)))
  end
end

function Linear:__init(in_features, out_features, opts)
  opts = opts or {}
  check_size('in_features', in_features)
  check_size('out_features', out_features)
  self.in_features, self.out_features = in_features, out_features
  local default = parameter.init.kaiming_uniform(math.max(in_features, 1))
  local place = { device = opts.device, dtype = opts.dtype }
  self:register_parameter('weight', parameter.Parameter({ out_features, in_features },
    { init = opts.init or default, device = place.device, dtype = place.dtype }))
  if opts.bias == false then
    self:register_parameter('bias', nil)
  else
    self:register_parameter('bias', parameter.Parameter({ out_features },
      { init = opts.bias_init or default, device = place.device, dtype = place.dtype }))
  end
end

-- forward(x, ce): with ce = {targets =, ignore_index =, reduction =,
-- label_smoothing =, chunk_rows =}, the cross-entropy of the output
-- against ce.targets instead of the output, which then never exists whole
-- (F.linear_cross_entropy; a bias-free Linear: a language model's head).
function Linear:forward(x, ce)
  if ce ~= nil then
    if self.bias ~= nil then core.fail('Linear: a fused cross-entropy needs a Linear without bias') end
    return functional.linear_cross_entropy(x, self.weight, ce.targets, ce)
  end
  return functional.linear(x, self.weight, self.bias)
end

function Linear:extra_repr()
  return ('in_features=%d, out_features=%d, bias=%s'):format(
    self.in_features, self.out_features, repr.bool(self.bias ~= nil))
end

return Linear
