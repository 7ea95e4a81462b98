-- fsdp.functional: the ops as functions, PyTorch's torch.nn.functional.
--
--   local F = require 'fsdp.functional'
--   local y = F.silu(F.linear(x, w))
--
-- The union of the family modules in lua/fsdp/functional/: each adds its
-- functions to one table (and methods to Tensor). A name defined twice is
-- an error, so families cannot shadow each other silently.
local F = {}

local families = {
  'fsdp.functional.elementwise', -- activations, unary math, reductions, dropout
  'fsdp.functional.linear',      -- matmul, linear, embedding, conv2d, pooling, cat/split
  'fsdp.functional.fused',       -- norms, softmax, cross-entropy, rotary, attention
  'fsdp.functional.moe',         -- mixture of experts: routing, grouped experts, aux loss
}

for _, name in ipairs(families) do
  for k, v in pairs(require(name)) do
    if F[k] ~= nil then error(('fsdp.functional: %s defined by two families (%s)'):format(k, name)) end
    F[k] = v
  end
end

return F
