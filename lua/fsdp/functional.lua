-- fsdp.functional: the ops as functions, PyTorch's torch.nn.functional.
--
--   local F = require 'fsdp.functional'
--   local y = F.silu(F.linear(x, w))
--
-- The union of the family modules in lua/fsdp/functional/: each adds its
-- functions to one table (and methods to Tensor). A name defined twice is
-- an error, so families cannot shadow each other silently.
local F = {}

-- Each family by a literal require, so a reader (and tools/requires.lua)
-- sees what this module depends on.
local families = {
  -- activations, unary math, reductions, dropout
  { 'fsdp.functional.elementwise', require 'fsdp.functional.elementwise' },
  -- matmul, linear, embedding, conv2d, pooling, cat/split
  { 'fsdp.functional.linear', require 'fsdp.functional.linear' },
  -- norms, softmax, cross-entropy, rotary, attention
  { 'fsdp.functional.fused', require 'fsdp.functional.fused' },
  -- mixture of experts: routing, grouped experts, aux loss
  { 'fsdp.functional.moe', require 'fsdp.functional.moe' },
}

for _, family in ipairs(families) do
  local name, module = family[1], family[2]
  for k, v in pairs(module) do
    if F[k] ~= nil then error(('fsdp.functional: %s defined by two families (%s)'):format(k, name)) end
    F[k] = v
  end
end

return F
