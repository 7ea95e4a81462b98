-- fsdp.nn.conv: nn.Conv2d, a 2-d convolution over [N, C, H, W] inputs, as
-- torch.nn.Conv2d with dilation 1, one group and zero padding.
--
--   nn.Conv2d(in_channels, out_channels, kernel_size,
--             {stride = 1, padding = 0, bias = true, device =, dtype =,
--              init = rule, bias_init = rule})
--
-- kernel_size, stride and padding are a number or {h, w}. weight is
-- [out, in, kh, kw]; default init U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with
-- fan_in = in * kh * kw for weight and bias, as PyTorch.
local core = require 'fsdp.core'
local validate = require 'fsdp.validate'
local Module = require 'fsdp.nn.module'
local parameter = require 'fsdp.nn.parameter'
local repr = require 'fsdp.nn.repr'
local functional = require 'fsdp.functional'

local Conv2d = Module:extend('Conv2d')

-- A number or {h, w} as a pair {h, w} of integers >= min.
local function pair(what, v, min)
  if type(v) == 'number' then v = { v, v } end
  if type(v) ~= 'table' or #v ~= 2 then
    core.fail(('Conv2d: %s must be a number or {h, w}, got %s'):format(what, tostring(v)))
  end
  for i = 1, 2 do
    if type(v[i]) ~= 'number' or v[i] < min or v[i] ~= math.floor(v[i]) then
      core.fail(('Conv2d: %s must hold integers >= %d, got %s'):format(what, min, tostring(v[i])))
    end
  end
  return { v[1], v[2] }
end

function Conv2d:__init(in_channels, out_channels, kernel_size, opts)
  opts = opts or {}
  for _, v in ipairs({ in_channels, out_channels }) do
    if validate.problem(v, validate.COUNT) then
      core.fail(('Conv2d: channels must be positive integers, got %s'):format(validate.show(v)))
    end
  end
  self.in_channels, self.out_channels = in_channels, out_channels
  self.kernel_size = pair('kernel_size', kernel_size, 1)
  self.stride = pair('stride', opts.stride or 1, 1)
  self.padding = pair('padding', opts.padding or 0, 0)
  local k = self.kernel_size
  local default = parameter.init.kaiming_uniform(in_channels * k[1] * k[2])
  self:register_parameter('weight', parameter.Parameter({ out_channels, in_channels, k[1], k[2] },
    { init = opts.init or default, device = opts.device, dtype = opts.dtype }))
  if opts.bias == false then
    self:register_parameter('bias', nil)
  else
    self:register_parameter('bias', parameter.Parameter({ out_channels },
      { init = opts.bias_init or default, device = opts.device, dtype = opts.dtype }))
  end
end

function Conv2d:forward(x)
  return functional.conv2d(x, self.weight, self.bias,
    { stride = self.stride, padding = self.padding })
end

function Conv2d:extra_repr()
  local s = ('%d, %d, kernel_size=%s, stride=%s'):format(self.in_channels, self.out_channels,
    repr.tuple(self.kernel_size), repr.tuple(self.stride))
  if self.padding[1] ~= 0 or self.padding[2] ~= 0 then
    s = s .. ', padding=' .. repr.tuple(self.padding)
  end
  if self.bias == nil then s = s .. ', bias=False' end
  return s
end

return Conv2d
