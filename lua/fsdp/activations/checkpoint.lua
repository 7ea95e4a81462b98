-- fsdp.activations.checkpoint (fsdp.checkpoint): activation checkpointing chosen by a predicate over
-- modules, the way policies are written in this project.
--
--   local llama = require 'models.llama'
--   fsdp.checkpoint(model, function(m) return m:is_instance_of(llama.DecoderLayer) end)
--   fsdp.checkpoint(model, is_block, {every = 2})   -- every second match
--
-- A checkpointed module keeps only its inputs during forward: its forward
-- runs without recording, and backward re-runs it (with the random numbers
-- of the first run) to get the gradients (fsdp.autograd.checkpoint). Memory
-- for activations then scales with the number of checkpointed blocks, not
-- with everything inside them, for one extra forward of compute.
local autograd = require 'fsdp.autograd'
local select_modules = require 'fsdp.activations.select_modules'
local offload = require 'fsdp.activations.offload'

-- The parameter slots of m's tree, read at each call (the sharding layer
-- swaps parameters for views of gathered units): the distinct tensors, and
-- a swap that rebinds every slot holding a tensor t to map[t] during the
-- recompute (see autograd.checkpoint_with_params).
local function params_of(m)
  local slots, tensors, seen = {}, {}, {}
  for _, nm in ipairs(m:named_modules()) do
    local ps = rawget(nm[2], '_parameters')
    for _, key in ipairs(rawget(nm[2], '_param_names')) do
      local t = ps[key]
      if t ~= nil then
        slots[#slots + 1] = { ps, key, t }
        if not seen[t] then seen[t] = true; tensors[#tensors + 1] = t end
      end
    end
  end
  local function swap(map)
    for _, s in ipairs(slots) do s[1][s[2]] = map[s[3]] end
    return function()
      for _, s in ipairs(slots) do s[1][s[2]] = s[3] end
    end
  end
  return { tensors = tensors, swap = swap }
end

-- Wrap module m's forward: the checkpoint gets its parameters too, so they
-- get gradients even when no input requires grad.
local function wrap(m)
  local forward = m.forward
  m.forward = function(self, ...)
    if not autograd.is_grad_enabled() then return forward(self, ...) end
    -- A module whose activations are offloaded (fsdp.offload_activations,
    -- applied before this): the checkpoint's kept inputs are what moves.
    if rawget(self, '_offloaded') and not autograd.in_backward() then
      return offload.scoped(autograd.checkpoint_with_params, params_of(self),
                                             forward, self, ...)
    end
    return autograd.checkpoint_with_params(params_of(self), forward, self, ...)
  end
  m._checkpointed = true
end

-- fsdp.checkpoint(model, check_fn, opts): activation checkpointing of the
-- modules of `model` for which check_fn(module, name) is true, outermost
-- first (a match inside a checkpointed module is left alone: it is
-- recomputed as part of its parent). Their forward keeps only its inputs
-- and runs again in backward. opts: every (1; k keeps only every k-th
-- match: the 1st, k+1-th, ...). Returns the names wrapped.
return function(model, check_fn, opts)
  opts = opts or {}
  local wrapped = {}
  for _, nm in ipairs(select_modules(model, check_fn, opts.every or 1, '_checkpointed')) do
    wrap(nm[2])
    wrapped[#wrapped + 1] = nm[1]
  end
  return wrapped
end
