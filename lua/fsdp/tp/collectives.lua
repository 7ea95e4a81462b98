-- fsdp.tp.collectives: the collectives of tensor parallelism as autograd
-- nodes, so a TP layer's forward is ordinary ops plus these (Megatron-LM's
-- mappings, Shoeybi et al. 2019):
--
--   copy_to(x, group)          forward: identity          backward: all-reduce (sum)
--   reduce_from(x, group)      forward: all-reduce (sum)  backward: identity
--   gather(x, dim, group)      forward: all-gather on dim backward: this rank's slice (split)
--   split(x, dim, group)       forward: this rank's slice backward: all-gather on dim
--   gather(x, dim, group, {backward = 'reduce_scatter'}) and
--   reduce_scatter(x, dim, group)    forward: reduce-scatter on dim  backward: all-gather
--                                    (the pair sequence parallelism uses)
--
-- Why these backwards: after a reduce_from every TP rank holds the same
-- value and computes the same downstream loss, so each already has the
-- whole gradient (identity); a copy_to feeds one replicated input to
-- rank-local computations, whose partial input gradients must be summed.
--
-- The collectives are fsdp.dist's, so cpu tensors go through MPI and cuda
-- tensors through NCCL (or host copies); meta and fake tensors pass
-- through shape-only (the planner traces TP layers like any other). A
-- group of one is the identity everywhere. Forward outputs are new
-- tensors (dist's all-reduce is in place: reducing the producer's own
-- output could corrupt a value its backward saved).
local dist = require 'fsdp.dist'
local autograd = require 'fsdp.autograd'
local core = require 'fsdp.core'

local M = {}

local function check_group(group, what)
  if group == nil or getmetatable(group) ~= dist.Group then
    core.fail(('tp.%s: expected an fsdp.dist Group, got %s'):format(what, type(group)))
  end
end

local function records(x) return autograd.is_grad_enabled() and x.requires_grad end

-- A Lua node from x to out (made without a graph) whose backward maps the
-- output gradient through fn.
local function attach(name, x, out, fn)
  if records(x) then
    autograd.attach(name, { x }, { out }, function(grads)
      local g = grads[1]
      if g == nil then return {} end
      return { fn(g) }
    end)
  end
  return out
end

local function all_reduce(t, group)
  local c = t:is_contiguous() and t:clone() or t:contiguous()
  return dist.all_reduce(c, { group = group })
end

-- dim moved to the front, contiguous: fsdp.dist gathers and scatters along dim 0.
local function to_front(t, dim)
  if dim == 0 then return t:contiguous() end
  return t:transpose(0, dim):contiguous()
end
local function from_front(t, dim)
  if dim == 0 then return t end
  return t:transpose(0, dim):contiguous()
end

local function norm_dim(x, dim, what)
  local n = x:dim()
  local d = dim < 0 and dim + n or dim
  if d < 0 or d >= n then
    core.fail(('tp.%s: dim %d is out of range for a %d-d tensor'):format(what, dim, n))
  end
  return d
end

local function gather_raw(t, dim, group)
  return from_front(dist.all_gather(to_front(t, dim), { group = group }), dim)
end

local function slice_raw(t, dim, group)
  local n, size = t:size(dim), group:size()
  if n % size ~= 0 then
    core.fail(('tp.split: size %d of dim %d does not divide into %d ranks'):format(n, dim, size))
  end
  local part = n / size
  return t:narrow(dim, group:rank() * part, part):contiguous()
end

local function reduce_scatter_raw(t, dim, group)
  local n, size = t:size(dim), group:size()
  if n % size ~= 0 then
    core.fail(('tp.reduce_scatter: size %d of dim %d does not divide into %d ranks'):format(n, dim, size))
  end
  return from_front(dist.reduce_scatter(to_front(t, dim), { group = group }), dim)
end

-- Identity forward; the gradient is summed over the group.
function M.copy_to(x, group)
  check_group(group, 'copy_to')
  if group:size() == 1 then return x end
  local out = autograd.no_grad(function() return x:detach() end)
  return attach('TPCopyToRegion', x, out, function(g) return all_reduce(g, group) end)
end

-- The sum over the group; the gradient passes through.
function M.reduce_from(x, group)
  check_group(group, 'reduce_from')
  if group:size() == 1 then return x end
  local out = autograd.no_grad(function() return all_reduce(x:detach(), group) end)
  return attach('TPReduceFromRegion', x, out, function(g) return g end)
end

-- The group's x concatenated along dim (in group rank order). opts.backward:
-- 'split' (default: the downstream is replicated, each rank keeps its
-- slice of the gradient) or 'reduce_scatter' (each rank's downstream is its
-- own: the slices are summed over ranks, sequence parallelism).
function M.gather(x, dim, group, opts)
  check_group(group, 'gather')
  local how = opts and opts.backward or 'split'
  if how ~= 'split' and how ~= 'reduce_scatter' then
    core.fail(("tp.gather: backward must be 'split' or 'reduce_scatter', got %s"):format(tostring(how)))
  end
  dim = norm_dim(x, dim, 'gather')
  if group:size() == 1 then return x end
  local out = autograd.no_grad(function() return gather_raw(x:detach(), dim, group) end)
  return attach('TPGather', x, out, function(g)
    if how == 'split' then return slice_raw(g, dim, group) end
    return reduce_scatter_raw(g, dim, group)
  end)
end

-- This rank's slice of x along dim (size divisible by the group size);
-- the gradient is all-gathered.
function M.split(x, dim, group)
  check_group(group, 'split')
  dim = norm_dim(x, dim, 'split')
  if group:size() == 1 then return x end
  local out = autograd.no_grad(function() return slice_raw(x:detach(), dim, group) end)
  return attach('TPSplit', x, out, function(g) return gather_raw(g, dim, group) end)
end

-- This rank's slice along dim of the sum over the group; the gradient is
-- all-gathered.
function M.reduce_scatter(x, dim, group)
  check_group(group, 'reduce_scatter')
  dim = norm_dim(x, dim, 'reduce_scatter')
  if group:size() == 1 then return x end
  local out = autograd.no_grad(function() return reduce_scatter_raw(x:detach(), dim, group) end)
  return attach('TPReduceScatter', x, out, function(g) return gather_raw(g, dim, group) end)
end

return M
