-- fsdp.sharding.accumulate: gradient accumulation for the training recipes,
-- k micro-batches per optimizer step with no gradient communication until
-- the last one.
--
--   local accumulate = require 'fsdp.sharding.accumulate'
--   local cfg = recipe.config(accumulate.options({...}), arg, script)
--   for step = start + 1, cfg.max_steps do
--     local loss = accumulate.forward_backward(model, cfg.grad_accum_steps, function(i)
--       local ids, targets = data:next()            -- micro-batch i of k
--       return model:loss(ids, targets)
--     end)
--     local r = state.guard:step(step, loss)       -- once per optimizer step
--   end
--
-- Micro-batch i's loss is scaled by 1/k before its backward, so the summed
-- gradient is the gradient of the mean loss over the k micro-batches: with
-- equal micro-batches and a mean-reduced loss, that of one batch k times
-- as large. The returned loss is the mean of the k losses (a number), what
-- the non-finite guard averages over ranks and logs.
--
-- [Note: gradient accumulation memory] The first k-1 backwards run inside
-- model:no_sync (fsdp.sharding): each unit packs its gradient and keeps it
-- unsharded, adding every micro-batch's into it; the last backward adds its
-- own and reduces the sum once (one reduce-scatter per unit under
-- FULL_SHARD/SHARD_GRAD_OP/hybrid, one all-reduce per unit under NO_SHARD,
-- plus the hybrid strategies' all-reduce over replicas). As with PyTorch
-- FSDP's no_sync, the price is memory: between micro-batches every rank
-- holds the whole unsharded gradient of every unit in the reduce dtype
-- (the model's parameter count x its size, not 1/world of it) through the
-- last micro-batch's forward and backward, on top of the step's usual
-- bytes (also under NO_SHARD, where it is one more whole gradient). The
-- planner adds it (fsdp.plan's grad_accum; tests/mpi/plan_memory.lua
-- measures it), so --plan and the recipes' fit check see it. Parameters
-- are still gathered for every micro-batch (forward, and backward under
-- FULL_SHARD): accumulation saves gradient communication, not parameter
-- communication.
local M = {}
local validate = require 'fsdp.validate'

M.OPTIONS = {
  grad_accum_steps = { 1, 'micro-batches per optimizer step (gradients summed locally, reduced once at the '
                          .. 'last; the step sees a batch this many times --batch_size)', int = true, min = 1 },
}

-- A recipe's own options plus these (its own win on a clash).
function M.options(own) return require('fsdp.recipe').merge(M.OPTIONS, own) end

local function sharded(model) return rawget(model, '_fsdp') ~= nil end

-- Forward and backward of k micro-batches: micro(i) returns micro-batch
-- i's loss (a scalar tensor, mean-reduced). Gradients accumulate in the
-- model; only the last backward communicates (a sharded model; an
-- unsharded one has nothing to communicate). Returns the mean loss.
function M.forward_backward(model, k, micro)
  k = k or 1
  if validate.problem(k, validate.COUNT) then
    error(('fsdp.sharding.accumulate: k must be an integer >= 1, got %s'):format(validate.show(k)), 2)
  end
  local sum = 0
  local function one(i)
    local loss = micro(i)
    sum = sum + loss:item()
    if k > 1 then loss = loss * (1 / k) end
    loss:backward()
  end
  for i = 1, k - 1 do
    if sharded(model) then model:no_sync(function() one(i) end) else one(i) end
  end
  one(k)
  return sum / k
end

return M
