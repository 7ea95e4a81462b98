-- fsdp.nn.dropout: nn.Dropout, zeroing each element with probability p in
-- training mode and scaling the rest by 1/(1-p); the identity in eval mode.
--
--   nn.Dropout(p)          p = 0.5 by default, as PyTorch.
--
-- The masks come from the global generator (fsdp.manual_seed), replayed
-- when activation checkpointing runs a forward again.
local core = require 'fsdp.core'
local validate = require 'fsdp.validate'
local Module = require 'fsdp.nn.module'
local repr = require 'fsdp.nn.repr'
local functional = require 'fsdp.functional'

local Dropout = Module:extend('Dropout')

function Dropout:__init(p)
  p = p or 0.5
  if validate.problem(p, { min = 0, max = 1 }) then
    core.fail(('Dropout: p must be a probability in [0, 1], got %s'):format(validate.show(p)))
  end
  self.p = p
end

function Dropout:forward(x)
  if not self.training or self.p == 0 then return x end
  return functional.dropout(x, self.p, true)
end

function Dropout:extra_repr()
  return ('p=%s, inplace=False'):format(repr.float(self.p))
end

return Dropout
