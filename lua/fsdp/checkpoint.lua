-- fsdp.checkpoint: activation checkpointing chosen by a predicate over
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

-- Wrap module m's forward. Its parameters are looked up at each call (the
-- sharding layer may swap them for views) and given to the checkpoint so
-- they get gradients even when no input requires grad.
local function wrap(m)
  local forward = m.forward
  m.forward = function(self, ...)
    if not autograd.is_grad_enabled() then return forward(self, ...) end
    return autograd.checkpoint_with_params(self:parameters(), forward, self, ...)
  end
  m._checkpointed = true
end

-- Checkpoint the modules of `model` for which check_fn(module, name) is
-- true, outermost first (a match inside a checkpointed module is left
-- alone: it is recomputed as part of its parent). opts.every = k keeps
-- only every k-th match (the 1st, k+1-th, ...). Returns the names wrapped.
return function(model, check_fn, opts)
  opts = opts or {}
  local every = opts.every or 1
  local wrapped, inside, matches = {}, {}, 0
  for _, nm in ipairs(model:named_modules()) do
    local name, m = nm[1], nm[2]
    local covered = false
    for prefix in pairs(inside) do
      if name:sub(1, #prefix + 1) == prefix .. '.' then covered = true end
    end
    if not covered and not rawget(m, '_checkpointed') and check_fn(m, name) then
      matches = matches + 1
      if (matches - 1) % every == 0 then
        wrap(m)
        inside[name] = true
        wrapped[#wrapped + 1] = name
      end
    end
  end
  return wrapped
end
