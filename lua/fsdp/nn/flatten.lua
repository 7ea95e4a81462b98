-- fsdp.nn.flatten: nn.Flatten, collapsing dims start_dim ... end_dim into
-- one (by default all but the batch dim), as torch.nn.Flatten.
local Module = require 'fsdp.nn.module'

local Flatten = Module:extend('Flatten')

function Flatten:__init(start_dim, end_dim)
  self.start_dim = start_dim or 1
  self.end_dim = end_dim or -1
end

function Flatten:forward(x)
  return x:flatten(self.start_dim, self.end_dim)
end

function Flatten:extra_repr()
  return ('start_dim=%d, end_dim=%d'):format(self.start_dim, self.end_dim)
end

return Flatten
