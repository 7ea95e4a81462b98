-- fsdp.sharding.accumulate: gradient accumulation for the training recipes,
-- k micro-batches per optimizer step with no gradient communication until
-- the last one.
--
--   local accumulate = require 'fsdp.sharding.accumulate'
--   local cfg = options.config(accumulate.options({...}), arg, script)
--   for step = start + 1, cfg.max_steps do
--     local loss = accumulate.forward_backward(model, cfg.grad_accum_steps, function(i)
--       local ids, targets = data:next()            -- micro-batch i of k
--       return model:loss(ids, targets)
--     end)
--     local r = state.guard:step(step, loss)       -- once per optimizer step
--   end
--
--   -- the loss averaged over the step's target tokens (labels -100 left out), as one process would:
--   local loss, tokens = accumulate.token_mean(model, cfg.grad_accum_steps, function(i) return data:next() end,
--     function(ids, targets) return model:loss(ids, targets) end)
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
--
-- [Note: the loss of a step over its tokens]
-- forward_backward weights micro-batches, and ranks (the gradient
-- reduction averages over them), equally: right when every micro-batch
-- holds as many target tokens, wrong when they differ, which is the rule
-- with supervised fine-tuning data (only the answers' tokens are trained:
-- one micro-batch may hold 30 of them, the next 900). token_mean makes
-- the step's loss the one a single process computes on the whole batch:
--   L = (sum over every micro-batch of every rank of its tokens' losses) / N
-- with N the target tokens (targets other than -100) of the step across
-- the data-parallel ranks. Before any forward it takes the step's k
-- micro-batches, counts this rank's tokens n_i (a C count over the
-- targets) and sums them over the ranks (one all-reduce of one number per
-- step; none on one rank), so N is known and exact before the first
-- backward. Micro-batch i's loss (the model's mean over its n_i tokens)
-- is scaled by w_i = n_i * D / N before its backward, D the ranks the
-- gradient reduction averages over (fsdp.shard's group: the world by
-- default; 1 for an unsharded model, which every rank trains alone): the
-- reduction's average divides by D again, so the step's gradient is
-- sum_{r,i} (n_i D / N) grad(mean_i) / D = grad(L). The loss returned is
-- this rank's D * sum_i n_i mean_i / N, which the non-finite guard's
-- average over the ranks turns into L, the value logged. A micro-batch
-- with no target token still runs its forward and backward (the ranks'
-- collectives must match) with w_i = 0: its gradient is exactly 0 (the
-- loss kernels write 0 for ignored rows) and its NaN mean is left out of
-- the sum. A step with N = 0 is an error on every rank, before any
-- forward: nothing in it would train.
-- With equal counts (pretraining: no -100) w_i = n D / (n D k) is 1/k,
-- the same double forward_backward multiplies by, and the returned loss
-- D * (n sum_i mean_i) / (n D k) rounds to the same double as
-- sum_i mean_i / k (the products and sums of f32 values by counts below
-- 2^29 are exact in f64): the same bits as forward_backward, plus one
-- all-reduce of a count.
-- transformers' Trainer (and TRL's SFTTrainer, which inherits its loss)
-- normalises the same way since 4.46: num_items_in_batch counts the
-- step's labels other than -100 over its accumulated micro-batches (after
-- the shift, labels[..., 1:], in 5.x), summed over the processes when
-- average_tokens_across_devices (the default), each micro-batch's loss is
-- a sum divided by it and multiplied by the number of processes because
-- DDP averages gradients. What differs: transformers sums each micro-
-- batch's token losses in the model's loss (reduction sum); here the
-- model's mean is scaled by n_i D / N, equal within f32 rounding, chosen
-- so that pretraining keeps its bits. A mixture of experts' router loss,
-- added to the mean, is weighted by the micro-batch's share of the tokens
-- (transformers adds it to each micro-batch's normalised loss).
local dist = require 'fsdp.dist'
local fsdp = require 'fsdp'
local M = {}
local validate = require 'fsdp.validate'
local options = require 'fsdp.options'
local IGNORE = -100

M.OPTIONS = {
  grad_accum_steps = { 1, 'micro-batches per optimizer step (gradients summed locally, reduced once at the '
                          .. 'last; the step sees a batch this many times --batch_size)', int = true, min = 1 },
}

-- A recipe's own options plus these (its own win on a clash).
function M.options(own) return options.merge(M.OPTIONS, own) end

local function sharded(model) return rawget(model, '_fsdp') ~= nil end

-- one(i) for i = 1..k, all but the last under no_sync on a sharded model,
-- so gradients are reduced once, at the last micro-batch.
local function micro_batches(model, k, one)
  for i = 1, k - 1 do
    if sharded(model) then model:no_sync(function() one(i) end) else one(i) end
  end
  one(k)
end

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
  micro_batches(model, k, one)
  return sum / k
end

-- The ranks a sharded model's gradients are averaged over (its group, the
-- world by default), or 1 for a model every rank trains alone.
local function data_parallel(model)
  local S = rawget(model, '_fsdp')
  if not S then return 1, nil end
  return S.group and S.group:size() or dist.world_size(), S.group
end

-- The target tokens of a targets tensor (entries other than -100).
function M.count_tokens(targets)
  return fsdp.F.ne(targets, IGNORE):to('i64'):sum():item()
end

-- Forward and backward of a step's k micro-batches with the loss averaged
-- over the step's target tokens on every rank ([Note: the loss of a step
-- over its tokens]). batch(i) gives micro-batch i's ids, targets (-100:
-- not trained) and optionally a third value passed on to loss_of (a packed
-- batch's positions and segments); all k are taken first. loss_of(ids,
-- targets, extra) returns the model's mean loss over the micro-batch's
-- target tokens (model:loss).
-- Returns this rank's part of the loss (what guard:step takes: its
-- average over the ranks is the step's loss) and N, the step's target
-- tokens across the ranks.
function M.token_mean(model, k, batch, loss_of)
  k = k or 1
  if validate.problem(k, validate.COUNT) then
    error(('fsdp.sharding.accumulate: k must be an integer >= 1, got %s'):format(validate.show(k)), 2)
  end
  local batches, counts, local_n = {}, {}, 0
  for i = 1, k do
    local ids, targets, extra = batch(i)
    batches[i] = { ids, targets, extra }
    counts[i] = M.count_tokens(targets)
    local_n = local_n + counts[i]
  end
  local D, group = data_parallel(model)
  local N = local_n
  if D > 1 then
    local t = dist.all_reduce(fsdp.tensor({ local_n }, { dtype = 'f64' }), { op = 'sum',
      group = group })
    N = t:get(0)
  end
  if N == 0 then
    error(('fsdp.sharding.accumulate: the step\'s %d micro-batch%s on %d rank%s hold no target token (every '
      .. 'target is -100): nothing to train on (are all answers cut off by the sequence length?)'):format(k,
      k == 1 and '' or 'es', D, D == 1 and '' or 's'), 2)
  end
  local sum = 0
  local function one(i)
    local loss = loss_of(batches[i][1], batches[i][2], batches[i][3])
    local w = counts[i] * D / N
    if counts[i] > 0 then sum = sum + loss:item() * counts[i] end
    if w ~= 1 then loss = loss * w end
    loss:backward()
  end
  micro_batches(model, k, one)
  return sum * D / N, N
end

return M
