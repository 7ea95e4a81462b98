-- fsdp.nn.activation: the activation modules, thin wrappers of
-- fsdp.functional so activations appear in the module tree (and in
-- printed models) as they do in PyTorch.
--
--   nn.ReLU()   nn.GELU({approximate = 'none' | 'tanh'})   nn.SiLU()
local core = require 'fsdp.core'
local Module = require 'fsdp.nn.module'
local repr = require 'fsdp.nn.repr'
local functional = require 'fsdp.functional'

local M = {}

-- nn.ReLU(): max(x, 0), elementwise (F.relu).
local ReLU = Module:extend('ReLU')
M.ReLU = ReLU

function ReLU:forward(x)
  return functional.relu(x)
end

-- nn.GELU(opts): the GELU of F.gelu. opts: approximate ('none': the exact
-- erf form; 'tanh': the tanh approximation, Hugging Face's gelu_new).
local GELU = Module:extend('GELU')
M.GELU = GELU

function GELU:__init(opts)
  local approximate = opts and opts.approximate or 'none'
  if approximate ~= 'none' and approximate ~= 'tanh' then
    core.fail(("GELU: approximate must be 'none' or 'tanh', got %s"):format(tostring(approximate)))
  end
  self.approximate = approximate
end

function GELU:forward(x)
  return functional.gelu(x, { approximate = self.approximate })
end

function GELU:extra_repr()
  return 'approximate=' .. repr.str(self.approximate)
end

-- nn.SiLU(): x * sigmoid(x), elementwise (F.silu).
local SiLU = Module:extend('SiLU')
M.SiLU = SiLU

function SiLU:forward(x)
  return functional.silu(x)
end

return M
