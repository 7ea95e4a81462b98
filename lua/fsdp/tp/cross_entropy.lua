-- fsdp.tp.cross_entropy: the cross-entropy of logits split by vocabulary
-- over a TP group, without ever gathering them (Megatron-LM's
-- vocab_parallel_cross_entropy).
--
--   loss = tp.cross_entropy(logits [N, V/T] (or [..., V/T]), targets [N] (or [...]), {
--            group =, vocab_start = (this rank's first vocab row), ignore_index = -100,
--            reduction = 'mean' | 'sum' | 'none'})
--
-- Per row, with z this rank's logits and the three all-reduces over the
-- group being the only communication ([N] floats each):
--   m   = max over ranks of max_j z_j          (a shift only: no gradient)
--   s   = sum over ranks of sum_j exp(z_j - m)  (reduce_from: identity backward)
--   z_t = sum over ranks of (z_t - m if this rank holds the target, else 0)
--   loss = log(s) - z_t
-- After the reductions every rank holds the same loss, so the reductions'
-- backward is the identity (fsdp.tp.collectives) and each rank's logits
-- get exactly their slice of softmax - onehot. Composed from existing ops
-- (max, exp, sum, log, nll_loss for the pick, where): no per-element Lua.
-- The math runs in f32 (as the fused kernels accumulate). Ignored rows
-- (targets == ignore_index) count nothing; a mean over no targets is nan,
-- as F.cross_entropy's. label_smoothing is refused.
local core = require 'fsdp.core'
local F = require 'fsdp.functional'
local dist = require 'fsdp.dist'
local autograd = require 'fsdp.autograd'
local collectives = require 'fsdp.tp.collectives'

local M = {}

local REDUCTIONS = { mean = true, sum = true, none = true }

function M.cross_entropy(logits, targets, opts)
  opts = opts or {}
  local group, start = opts.group, opts.vocab_start
  if group == nil or type(start) ~= 'number' then
    core.fail('tp.cross_entropy: needs opts.group (the TP group) and opts.vocab_start (this rank\'s first row)')
  end
  local reduction = opts.reduction or 'mean'
  if not REDUCTIONS[reduction] then
    core.fail(("tp.cross_entropy: reduction must be 'mean', 'sum' or 'none', got %s"):format(tostring(reduction)))
  end
  if (opts.label_smoothing or 0) ~= 0 then
    core.fail('tp.cross_entropy: label_smoothing is not supported with a vocab-parallel head')
  end
  local ignore = opts.ignore_index or -100
  local V = logits:size(-1)
  local z = logits:reshape(-1, V)
  if z.dtype ~= 'f32' then z = z:to({ dtype = 'f32' }) end
  local t = targets:reshape(-1)
  if t:size(0) ~= z:size(0) then
    core.fail(('tp.cross_entropy: %d rows of logits, %d targets'):format(z:size(0), t:size(0)))
  end
  -- the global row max, a constant shift
  local m = autograd.no_grad(function()
    local local_max = F.max(z:detach(), 1, true)
    return dist.all_reduce(local_max:contiguous(), { group = group, op = 'max' })
  end)
  local shifted = z - m
  local s = collectives.reduce_from(F.sum(F.exp(shifted), 1), group)
  -- this rank's target columns; others (and ignored rows) pick nothing
  local rel = t - start
  local idx = F.clamp(rel, 0, V - 1)
  local mine = F.eq(idx, rel)
  local picked = -F.nll_loss(shifted, F.where(mine, idx, -100), { ignore_index = -100, reduction = 'none' })
  picked = collectives.reduce_from(picked, group)
  local valid = F.ne(t, ignore)
  local per_row = F.where(valid, F.log(s) - picked, 0)
  if reduction == 'none' then return per_row:reshape(targets.shape) end
  local total = F.sum(per_row)
  if reduction == 'sum' then return total end
  return total / F.sum(valid:to({ dtype = 'f32' }))
end

return M
