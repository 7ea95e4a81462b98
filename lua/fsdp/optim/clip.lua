-- fsdp.optim.clip: clipping gradients by their global L2 norm, as
-- torch.nn.utils.clip_grad_norm_ (also exported as nn.utils.clip_grad_norm_).
--
--   local total = clip.clip_grad_norm_(model:parameters(), 1.0)
--
-- The norm is sqrt of the sum over all gradients of their squares, each
-- part accumulated in double by a C kernel (fl_grad_sq_norm) in a fixed
-- order, so it is reproducible. When it exceeds max_norm every gradient is
-- scaled by max_norm / (norm + 1e-6) (PyTorch's coefficient). The sharding
-- layer adds the local sums of squares of all ranks before the sqrt; it
-- uses grad_sq_norm and scale_grads directly for that.
local ffi = require 'ffi'
local core = require 'fsdp.core'
local validate = require 'fsdp.validate'
local Tensor = require 'fsdp.tensor'
local Module = require 'fsdp.nn.module'

local C = core.C
local cptr = Tensor.cptr

local M = {}

-- The tensors of `params`: a module, an array of tensors, or an array of
-- {name, tensor} pairs.
local function tensors_of(params)
  if Module.is_module(params) then return params:parameters() end
  if Tensor.is_tensor(params) then return { params } end
  if type(params) ~= 'table' then
    core.fail(('clip_grad_norm_: params must be tensors or a module, got %s'):format(type(params)))
  end
  local out = {}
  for i, e in ipairs(params) do
    if Tensor.is_tensor(e) then out[#out + 1] = e
    elseif type(e) == 'table' and Tensor.is_tensor(e[2]) then out[#out + 1] = e[2]
    else core.fail(('clip_grad_norm_: params entry %d is not a tensor'):format(i)) end
  end
  return out
end
M.tensors_of = tensors_of

local sq_buf = ffi.new('double[1]')

-- Sum of squares of the gradients of params (those without a gradient
-- count zero), as a Lua number.
function M.grad_sq_norm(params)
  local total = 0
  for _, p in ipairs(tensors_of(params)) do
    local g = p.grad
    if g ~= nil then
      if not g:is_contiguous() then g = g:contiguous() end
      core.check(C.fl_grad_sq_norm(cptr(g), sq_buf))
      total = total + sq_buf[0]
    end
  end
  return total
end

-- The global L2 norm of the gradients.
function M.grad_norm(params)
  return math.sqrt(M.grad_sq_norm(params))
end

-- Multiply every gradient by coef in place.
function M.scale_grads(params, coef)
  for _, p in ipairs(tensors_of(params)) do
    local g = p.grad
    if g ~= nil then
      if g:is_contiguous() then
        core.check(C.fl_grad_scale_(cptr(g), coef))
      else
        local c = g:contiguous()
        core.check(C.fl_grad_scale_(cptr(c), coef))
        g:copy_(c)
      end
    end
  end
end

-- Clip the gradients of params to a global L2 norm of at most max_norm;
-- returns the norm before clipping. opts: error_if_nonfinite (false: true
-- raises when the norm is NaN or infinite; otherwise such gradients are
-- left alone), norm_type (2, the only one supported).
function M.clip_grad_norm_(params, max_norm, opts)
  opts = opts or {}
  local why = validate.problem(max_norm, validate.NONNEGATIVE)
  if why then core.fail('clip_grad_norm_: max_norm ' .. why) end
  if opts.norm_type ~= nil and opts.norm_type ~= 2 then
    core.fail(('clip_grad_norm_: only norm_type 2 is supported, got %s'):format(tostring(opts.norm_type)))
  end
  local list = tensors_of(params)
  local total = M.grad_norm(list)
  if total ~= total or total == math.huge then
    if opts.error_if_nonfinite then
      core.fail(('clip_grad_norm_: the total norm of the gradients is %s'):format(tostring(total)))
    end
    return total
  end
  local coef = max_norm / (total + 1e-6)
  if coef < 1 then M.scale_grads(list, coef) end
  return total
end

return M
