-- fsdp.functional.elementwise: unary math and activations, reductions,
-- dropout, comparisons and where; merged into fsdp.functional (F).
--
--   local F = require 'fsdp.functional'
--   local h = F.silu_mul(gate, up)            -- silu(gate) * up in one pass
--   local y = F.dropout(h, 0.1, training)     -- mask from fsdp.random's key
--   local loss = x:square():mean()            -- Tensor methods as well
--   local v, i = scores:max(-1)               -- values and indices (i64)
--
-- Dims are 0-based and may be negative; a dims argument is a number, a
-- table of numbers, or nil for all dims. Requiring this module also adds
-- the methods below to Tensor (t:exp(), t:sum(dims, keepdim), t:eq(x) ...)
-- and the ^ operator (t ^ 2).
local core = require 'fsdp.core'
local Tensor = require 'fsdp.tensor'
local random = require 'fsdp.random'
local ffi, C = core.ffi, core.C

local wrap, cptr = Tensor.wrap, Tensor.cptr
local methods = Tensor.methods

local M = {}

-- unary math and activations ----------------------------------------------------

local function unary(op)
  return function(x) return wrap(C.fl_unary(op, cptr(x))) end
end

-- F.exp(x): e^x, elementwise.
M.exp = unary(C.FL_EXP)
-- F.log(x): the natural logarithm, elementwise.
M.log = unary(C.FL_LOG)
-- F.sqrt(x): the square root, elementwise.
M.sqrt = unary(C.FL_SQRT)
-- F.rsqrt(x): 1 / sqrt(x), elementwise.
M.rsqrt = unary(C.FL_RSQRT)
-- F.tanh(x): the hyperbolic tangent, elementwise.
M.tanh = unary(C.FL_TANH)
-- F.sigmoid(x): 1 / (1 + e^-x), elementwise.
M.sigmoid = unary(C.FL_SIGMOID)
-- F.abs(x): |x|, elementwise.
M.abs = unary(C.FL_ABS)
-- F.relu(x): max(x, 0), elementwise.
M.relu = unary(C.FL_RELU)
-- F.silu(x): x * sigmoid(x), elementwise (SiLU, swish).
M.silu = unary(C.FL_SILU)
-- F.square(x): x * x, elementwise.
M.square = unary(C.FL_SQUARE)

-- F.gelu(x) is the exact (erf) form; F.gelu(x, 'tanh') (or {approximate =
-- 'tanh'}) the tanh approximation: PyTorch's approximate='tanh', which is
-- Hugging Face's gelu_new (T5 v1.1).
function M.gelu(x, approximate)
  if type(approximate) == 'table' then approximate = approximate.approximate end
  if approximate == nil or approximate == 'none' then
    return wrap(C.fl_unary(C.FL_GELU, cptr(x)))
  end
  if approximate == 'tanh' then return wrap(C.fl_unary(C.FL_GELU_TANH, cptr(x))) end
  core.fail(("gelu: approximate must be 'none' or 'tanh', got %s"):format(tostring(approximate)))
end

-- F.pow(x, exponent) for a number exponent.
function M.pow(x, exponent)
  if type(exponent) ~= 'number' then
    core.fail(('pow: the exponent must be a number, got %s'):format(type(exponent)))
  end
  return wrap(C.fl_pow_scalar(cptr(x), exponent))
end

-- F.clamp(x, min, max): either bound may be nil.
function M.clamp(x, min, max)
  for _, v in ipairs({ { 'min', min }, { 'max', max } }) do
    if v[2] ~= nil and type(v[2]) ~= 'number' then
      core.fail(('clamp: %s must be a number or nil, got %s'):format(v[1], type(v[2])))
    end
  end
  return wrap(C.fl_clamp(cptr(x), min or 0, max or 0, min ~= nil, max ~= nil))
end

-- silu(gate) * up in one pass (Llama's MLP: down(silu_mul(gate(x), up(x)))).
function M.silu_mul(gate, up)
  return wrap(C.fl_silu_mul(cptr(gate), cptr(up)))
end

-- dropout -------------------------------------------------------------------------

-- F.dropout(x, p, training, opts): inverted dropout, PyTorch's defaults (p
-- = 0.5, training = true). With training false or p = 0 it returns x
-- itself. The mask comes from the key opts = {seed=, stream=, offset=}
-- (fsdp.random.key): without a seed the global generator supplies one,
-- which activation checkpointing replays, so a recomputed forward drops
-- the same elements. The mask is never stored (see the core's [Note:
-- dropout masks are regenerated, not saved]).
function M.dropout(x, p, training, opts)
  if p == nil then p = 0.5 end
  if training == nil then training = true end
  if type(p) ~= 'number' then core.fail(('dropout: p must be a number, got %s'):format(type(p))) end
  cptr(x)
  if not training or p == 0 then return x end
  local seed, stream, offset = random.key(opts)
  return wrap(C.fl_dropout(cptr(x), p, seed, stream, offset))
end

-- reductions -----------------------------------------------------------------------

local dims_buf = ffi.new('int[?]', C.FL_MAX_DIMS)

-- A dims argument -> count, int[] (count 0 means all dims).
local function dims_arg(op, dims)
  if dims == nil then return 0, nil end
  if type(dims) == 'number' then dims = { dims } end
  if type(dims) ~= 'table' then
    core.fail(('%s: dims must be a number, a table or nil, got %s'):format(op, type(dims)))
  end
  if #dims == 0 then
    core.fail(('%s: empty dims list (pass nil to reduce over all dims)'):format(op))
  end
  if #dims > C.FL_MAX_DIMS then core.fail(('%s: %d dims given'):format(op, #dims)) end
  for i, d in ipairs(dims) do
    if type(d) ~= 'number' or d ~= math.floor(d) then
      core.fail(('%s: dim %s is not an integer'):format(op, tostring(d)))
    end
    dims_buf[i - 1] = d
  end
  return #dims, dims_buf
end

-- F.sum(x, dims, keepdim), F.mean(x, dims, keepdim).
function M.sum(x, dims, keepdim)
  local n, arr = dims_arg('sum', dims)
  return wrap(C.fl_sum(cptr(x), n, arr, keepdim and true or false))
end

-- F.mean(x, dims, keepdim): the mean over dims (a dim, a list, or nil for
-- all), keeping them as size 1 with keepdim.
function M.mean(x, dims, keepdim)
  local n, arr = dims_arg('mean', dims)
  return wrap(C.fl_mean(cptr(x), n, arr, keepdim and true or false))
end

-- F.var(x, dims, keepdim, correction): correction 1 (unbiased) by default;
-- the third argument may also be an options table {keepdim=, correction=}.
local function var_args(keepdim, correction)
  if type(keepdim) == 'table' then keepdim, correction = keepdim.keepdim, keepdim.correction end
  if correction == nil then correction = 1 end
  return keepdim and true or false, correction
end

-- F.var(x, dims, keepdim, correction): the variance over dims, with
-- Bessel's correction 1 by default (see var_args above).
function M.var(x, dims, keepdim, correction)
  local n, arr = dims_arg('var', dims)
  local k, c = var_args(keepdim, correction)
  return wrap(C.fl_var(cptr(x), n, arr, c, k))
end

-- F.std(x, dims, keepdim, correction): the standard deviation, the square
-- root of F.var's result, with the same arguments.
function M.std(x, dims, keepdim, correction)
  local n, arr = dims_arg('std', dims)
  local k, c = var_args(keepdim, correction)
  return wrap(C.fl_std(cptr(x), n, arr, c, k))
end

local values_out = ffi.new('fl_tensor*[1]')
local indices_out = ffi.new('fl_tensor*[1]')

local function minmax(fn, x, dim, keepdim)
  local c = cptr(x)
  local flat = dim == nil
  if flat then
    x = x:reshape(-1)
    c, dim, keepdim = cptr(x), 0, false
  elseif type(dim) ~= 'number' then
    core.fail(('max/min: dim must be a number or nil, got %s'):format(type(dim)))
  end
  core.check(fn(c, dim, keepdim and true or false, values_out, indices_out))
  return wrap(values_out[0]), wrap(indices_out[0])
end

-- F.max(x, dim, keepdim) -> values, indices (i64); F.max(x) -> the largest
-- element (a 0-d tensor). NaN counts as the largest; ties give the first
-- index. F.min likewise.
function M.max(x, dim, keepdim)
  local v, i = minmax(C.fl_max_dim, x, dim, keepdim)
  if dim == nil then return v end
  return v, i
end

-- F.min(x, dim, keepdim) -> values, indices (i64); F.min(x) -> the
-- smallest element. As F.max: a NaN wins, ties give the first index.
function M.min(x, dim, keepdim)
  local v, i = minmax(C.fl_min_dim, x, dim, keepdim)
  if dim == nil then return v end
  return v, i
end

-- F.argmax(x, dim, keepdim): the indices alone; without dim, the flat index.
function M.argmax(x, dim, keepdim)
  local _, i = minmax(C.fl_max_dim, x, dim, keepdim)
  return i
end

-- F.argmin(x, dim, keepdim): the indices of F.min alone; without dim, the
-- flat index.
function M.argmin(x, dim, keepdim)
  local _, i = minmax(C.fl_min_dim, x, dim, keepdim)
  return i
end

-- comparisons and where --------------------------------------------------------------

-- The op that compares the other way round (s < t is t > s).
local COMPARE = {
  eq = { C.FL_EQ, C.FL_EQ }, ne = { C.FL_NE, C.FL_NE },
  lt = { C.FL_LT, C.FL_GT }, le = { C.FL_LE, C.FL_GE },
  gt = { C.FL_GT, C.FL_LT }, ge = { C.FL_GE, C.FL_LE },
}

local function scalar(v)
  if type(v) == 'boolean' then return v and 1 or 0 end
  return v
end

for name, ops in pairs(COMPARE) do
  -- The comparisons F.eq, F.ne, F.lt, F.le, F.gt, F.ge (a, b): a bool
  -- tensor, elementwise with broadcasting; a or b may be a number.
  M[name] = function(a, b)
    b = scalar(b)
    a = scalar(a)
    if type(b) == 'number' then return wrap(C.fl_compare_scalar(ops[1], cptr(a), b)) end
    if type(a) == 'number' then return wrap(C.fl_compare_scalar(ops[2], cptr(b), a)) end
    return wrap(C.fl_compare(ops[1], cptr(a), cptr(b)))
  end
end

-- A number as a 0-d tensor to meet `other` (a tensor or nil) on device:
-- other's dtype, unless that is an integer dtype and v is not an integer.
local function as_tensor(v, other, device)
  local dtype = 'f32'
  if other then
    local oc = cptr(other)
    dtype = core.dtype_name(oc.dtype)
    local integral = v == math.floor(v) and v > -2^63 and v < 2^63
    if not C.fl_dtype_is_float(oc.dtype) and not integral then dtype = 'f32' end
  end
  return wrap(C.fl_full(0, nil, v, core.dtype(dtype), device))
end

-- F.where(cond, a, b): cond ? a : b with broadcasting; a or b may be a
-- number (F.where(mask, scores, -math.huge)).
function M.where(cond, a, b)
  local device = cptr(cond).device
  a, b = scalar(a), scalar(b)
  if type(a) == 'number' then a = as_tensor(a, Tensor.is_tensor(b) and b or nil, device) end
  if type(b) == 'number' then b = as_tensor(b, a, device) end
  return wrap(C.fl_where(cptr(cond), cptr(a), cptr(b)))
end

-- F.masked_fill(x, mask, value): value where mask holds, x elsewhere.
function M.masked_fill(x, mask, value)
  return M.where(mask, value, x)
end

-- Tensor methods ------------------------------------------------------------------------

for _, name in ipairs({
  'exp', 'log', 'sqrt', 'rsqrt', 'tanh', 'sigmoid', 'abs', 'relu', 'gelu', 'silu', 'square',
  'pow', 'clamp', 'sum', 'mean', 'var', 'std', 'max', 'min', 'argmax', 'argmin',
  'eq', 'ne', 'lt', 'le', 'gt', 'ge', 'masked_fill',
}) do
  methods[name] = M[name]
end

-- t ^ e for a number e. (tensor.lua defines the other arithmetic operators.)
Tensor.__pow = function(a, b)
  if not Tensor.is_tensor(a) then
    core.fail('^: the base must be a tensor (number ^ tensor is not supported; use F.exp)')
  end
  return M.pow(a, b)
end

return M
