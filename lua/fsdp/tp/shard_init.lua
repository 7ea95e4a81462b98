-- fsdp.tp.shard_init: a TP shard's init rule and slices of logical tensors.
--
-- [Note: TP init keying] A TP-sharded parameter keeps its name, and its
-- values are those of a single-process init of the logical (global)
-- tensor: local element (i, j) takes the counter-based draw of its global
-- index under the parameter's own (seed, name) key (fsdp.nn.parameter). The
-- rule is wrapped, not changed, so the global fan_in/fan_out the rule was
-- built with stays. A dim-0 shard (colwise, vocab) is one contiguous run of
-- the global tensor: its draws start at rank * local numel. A dim-1 shard
-- (rowwise) is one run per row: a piece of it (the whole local tensor, or
-- a flat FSDP segment starting at key.offset) is drawn as the global rows
-- it touches, whose columns are then narrowed to this rank's -- one draw
-- call per piece (T times the piece's elements drawn), no loop over rows.
-- Index-free rules (zeros, ones, constant) are kept as they are. Function
-- rules (computed tables) cannot be re-keyed and are refused.
local core = require 'fsdp.core'
local parameter = require 'fsdp.nn.parameter'
local factories = require 'fsdp.factories'

local M = {}

local INDEX_FREE = { zeros = true, ones = true, constant = true }

local function numel(shape)
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  return n
end

-- The rule that fills this rank's shard (described by tp = {dim, size,
-- rank, global_shape}) with the logical tensor's values. `what` names the
-- parameter in errors.
function M.rule(rule, tp, what)
  if rule == nil then return nil end
  if type(rule) == 'table' and INDEX_FREE[rule.kind] then return rule end
  if type(rule) ~= 'table' then
    core.fail(('tp: parameter %s has a computed (function) init rule, which a TP shard cannot re-key'):format(what))
  end
  local g = tp.global_shape
  local local_shape = {}
  for i, s in ipairs(g) do local_shape[i] = s end
  local_shape[tp.dim + 1] = g[tp.dim + 1] / tp.size
  if tp.dim == 0 then
    local base = tp.rank * numel(local_shape)
    return function(t, key)
      return parameter.fill(t, rule, { seed = key.seed, stream = key.stream, offset = base + key.offset }, what)
    end
  end
  if tp.dim ~= 1 or #g ~= 2 then
    core.fail(('tp: parameter %s: only dim 0, or dim 1 of a matrix, can be TP-sharded (dim %d of %d-d)')
      :format(what, tp.dim, #g))
  end
  local cols_g, cols_l = g[2], local_shape[2]
  local col0 = tp.rank * cols_l
  return function(t, key)
    if t:is_meta() or t:is_fake() or t:numel() == 0 then return t end
    local o, n = key.offset, t:numel()
    local r0, r1 = math.floor(o / cols_l), math.floor((o + n - 1) / cols_l)
    local rows = factories.empty({ r1 - r0 + 1, cols_g }, { dtype = t.dtype, device = t.device })
    parameter.fill(rows, rule, { seed = key.seed, stream = key.stream, offset = r0 * cols_g }, what)
    local mine = rows:narrow(1, col0, cols_l):contiguous():reshape(-1):narrow(0, o - r0 * cols_l, n)
    t:copy_(mine:reshape(t.shape))
    return t
  end
end

-- This rank's slice of a logical tensor (a checkpoint's, a live model's).
function M.slice(full, tp)
  local n = full:size(tp.dim) / tp.size
  return full:narrow(tp.dim, tp.rank * n, n):contiguous()
end

M.numel = numel

return M
