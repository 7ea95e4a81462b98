-- fsdp.nn.pooling: nn.MaxPool2d, the maximum over kernel x kernel windows
-- of [N, C, H, W] inputs, stride defaulting to the kernel size (PyTorch's
-- default; no padding, dilation 1).
local core = require 'fsdp.core'
local validate = require 'fsdp.validate'
local Module = require 'fsdp.nn.module'
local functional = require 'fsdp.functional'

local MaxPool2d = Module:extend('MaxPool2d')

function MaxPool2d:__init(kernel_size, stride)
  for _, v in ipairs({ kernel_size, stride or kernel_size }) do
    if validate.problem(v, validate.COUNT) then
      core.fail(('MaxPool2d: kernel_size and stride must be positive integers, got %s'):format(validate.show(v)))
    end
  end
  self.kernel_size = kernel_size
  self.stride = stride or kernel_size
end

function MaxPool2d:forward(x)
  return functional.max_pool2d(x, self.kernel_size, self.stride)
end

function MaxPool2d:extra_repr()
  return ('kernel_size=%d, stride=%d, padding=0, dilation=1, ceil_mode=False'):format(
    self.kernel_size, self.stride)
end

return MaxPool2d
