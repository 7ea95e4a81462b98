-- fsdp.functional.linear: matmul, linear, embedding, conv2d, max_pool2d,
-- cat, split and chunk (merged into `require 'fsdp.functional'`).
--
--   local y = F.linear(x, w, b)               -- x @ w^T + b, one GEMM
--   local h = F.embedding(ids, wte)           -- rows of wte
--   local q, k, v = unpack(qkv:split(768, -1))
--
-- Tensor methods added here: t:matmul(u), t:split(size_or_sizes, dim),
-- t:chunk(n, dim). Dims are 0-based and may be negative. The products and
-- windows run in C (core/ops/matmul.c, conv2d.c, ...); split and chunk are
-- views made by narrow, so they cost nothing and have autograd already.
local core = require 'fsdp.core'
local validate = require 'fsdp.validate'
local Tensor = require 'fsdp.tensor'
local ffi, C = core.ffi, core.C
local wrap, cptr = Tensor.wrap, Tensor.cptr

local M = {}

-- torch.matmul: dot, matrix-vector, matrix and batched (broadcast) products.
function M.matmul(a, b)
  return wrap(C.fl_matmul(cptr(a), cptr(b)))
end

-- y = x @ w^T + b: x [..., in], w [out, in], b [out] or nil.
function M.linear(x, w, b)
  return wrap(C.fl_linear(cptr(x), cptr(w), b ~= nil and cptr(b) or nil))
end

-- Rows of w [V, D] for integer ids of any shape -> [..., D].
-- padding_idx (a number, or {padding_idx = n}; negative counts from the
-- end as in PyTorch): that row gets no gradient.
function M.embedding(ids, w, padding_idx)
  if type(padding_idx) == 'table' then padding_idx = padding_idx.padding_idx end
  local c = cptr(w)
  if padding_idx == nil then
    padding_idx = -1
  elseif c.ndim == 2 then
    local V = tonumber(c.shape[0])
    if padding_idx < -V or padding_idx >= V then
      core.fail(('embedding: padding_idx %d out of range for a weight of %d rows'):format(padding_idx, V))
    end
    if padding_idx < 0 then padding_idx = padding_idx + V end
  end
  return wrap(C.fl_embedding(cptr(ids), c, padding_idx))
end

-- A number or a pair {h, w} (as PyTorch's int-or-tuple arguments).
local function pair(op, name, v, default)
  if v == nil then v = default end
  if type(v) == 'number' then return v, v end
  if type(v) == 'table' and #v == 2 and type(v[1]) == 'number' and type(v[2]) == 'number' then
    return v[1], v[2]
  end
  core.fail(('%s: %s must be a number or a pair {h, w}, got %s'):format(op, name, tostring(v)))
end

local conv_opts = ffi.new('fl_conv2d_options')

-- conv2d(x, w, b, {stride=, padding=, dilation=}): NCHW cross-correlation.
-- Each option is a number or {h, w}; padding may also be 'valid' (0) or
-- 'same' (stride 1, odd dilated kernel: output size equals input size).
function M.conv2d(x, w, b, opts)
  opts = opts or {}
  local wc = cptr(w)
  local dh, dw = pair('conv2d', 'dilation', opts.dilation, 1)
  local ph, pw
  if opts.padding == 'valid' then
    ph, pw = 0, 0
  elseif opts.padding == 'same' then
    local sh, sw = pair('conv2d', 'stride', opts.stride, 1)
    if sh ~= 1 or sw ~= 1 then core.fail("conv2d: padding='same' needs stride 1") end
    if wc.ndim ~= 4 then core.fail("conv2d: weight must be [out, in, kh, kw]") end
    local eh, ew = dh * (tonumber(wc.shape[2]) - 1), dw * (tonumber(wc.shape[3]) - 1)
    if eh % 2 ~= 0 or ew % 2 ~= 0 then
      core.fail(("conv2d: padding='same' needs an odd (dilated) kernel, got %dx%d"):format(eh + 1, ew + 1))
    end
    ph, pw = eh / 2, ew / 2
  else
    ph, pw = pair('conv2d', 'padding', opts.padding, 0)
  end
  conv_opts.stride[0], conv_opts.stride[1] = pair('conv2d', 'stride', opts.stride, 1)
  conv_opts.padding[0], conv_opts.padding[1] = ph, pw
  conv_opts.dilation[0], conv_opts.dilation[1] = dh, dw
  return wrap(C.fl_conv2d(cptr(x), wc, b ~= nil and cptr(b) or nil, conv_opts))
end

local pool_opts = ffi.new('fl_conv2d_options')
local pool_indices = ffi.new('fl_tensor *[1]')

-- max_pool2d(x, kernel, stride, {padding=, dilation=, return_indices=}):
-- stride defaults to the kernel; the options table may come third
-- (then its `stride` field is used). With return_indices, also returns
-- the i64 flat index (h * W + w) of each maximum in its plane.
function M.max_pool2d(x, kernel, stride, opts)
  if type(stride) == 'table' and stride[1] == nil then
    opts, stride = stride, stride.stride
  end
  opts = opts or {}
  local kh, kw = pair('max_pool2d', 'kernel', kernel)
  pool_opts.stride[0], pool_opts.stride[1] = pair('max_pool2d', 'stride', stride, { kh, kw })
  pool_opts.padding[0], pool_opts.padding[1] = pair('max_pool2d', 'padding', opts.padding, 0)
  pool_opts.dilation[0], pool_opts.dilation[1] = pair('max_pool2d', 'dilation', opts.dilation, 1)
  if opts.return_indices then
    local out = wrap(C.fl_max_pool2d(cptr(x), kh, kw, pool_opts, pool_indices))
    return out, wrap(pool_indices[0])
  end
  return wrap(C.fl_max_pool2d(cptr(x), kh, kw, pool_opts, nil))
end

-- cat(list, dim): a new tensor joining the list's tensors along dim (0).
function M.cat(list, dim)
  if type(list) ~= 'table' or Tensor.is_tensor(list) then
    core.fail(('cat: expected a list of tensors, got %s'):format(Tensor.is_tensor(list) and 'a Tensor' or type(list)))
  end
  local n = #list
  if n == 0 then core.fail('cat: expected at least one tensor, got an empty list') end
  local arr = ffi.new('const fl_tensor *[?]', n)
  for i = 1, n do
    if not Tensor.is_tensor(list[i]) then
      core.fail(('cat: element %d of the list is a %s, not a Tensor'):format(i - 1, type(list[i])))
    end
    arr[i - 1] = cptr(list[i])
  end
  return wrap(C.fl_cat(n, arr, dim or 0))
end

local function wrap_dim(op, t, dim)
  local nd = t:dim()
  local d = dim < 0 and dim + nd or dim
  if d < 0 or d >= nd then
    core.fail(('%s: dim %d out of range for a %d-d tensor of shape %s'):format(
      op, dim, nd, core.format_shape(t.shape)))
  end
  return d
end

-- split(t, size, dim): views of `size` along dim (the last may be
-- smaller); split(t, {s1, s2, ...}, dim): views of those sizes, which must
-- add up to the dim's size. Returns a Lua array.
function M.split(t, sizes, dim)
  dim = wrap_dim('split', t, dim or 0)
  local total = t:size(dim)
  local parts = {}
  if type(sizes) == 'number' then
    if validate.problem(sizes, validate.COUNT) then
      core.fail(('split: split size must be a positive integer, got %s'):format(validate.show(sizes)))
    end
    if total == 0 then return { t:narrow(dim, 0, 0) } end
    for start = 0, total - 1, sizes do
      parts[#parts + 1] = t:narrow(dim, start, math.min(sizes, total - start))
    end
    return parts
  end
  if type(sizes) ~= 'table' then
    core.fail(('split: expected a size or a list of sizes, got %s'):format(type(sizes)))
  end
  local sum = 0
  for i = 1, #sizes do
    local s = sizes[i]
    if validate.problem(s, validate.INDEX) then
      core.fail(('split: size %d is %s, expected a non-negative integer'):format(i - 1, validate.show(s)))
    end
    sum = sum + s
  end
  if sum ~= total then
    core.fail(('split: sizes %s add up to %d but dim %d of shape %s has size %d'):format(
      core.format_shape(sizes), sum, dim, core.format_shape(t.shape), total))
  end
  local start = 0
  for i = 1, #sizes do
    parts[i] = t:narrow(dim, start, sizes[i])
    start = start + sizes[i]
  end
  return parts
end

-- chunk(t, n, dim): at most n views of equal size ceil(size / n) along dim
-- (the last may be smaller, and there may be fewer than n, as in PyTorch).
function M.chunk(t, n, dim)
  if validate.problem(n, validate.COUNT) then
    core.fail(('chunk: number of chunks must be a positive integer, got %s'):format(validate.show(n)))
  end
  dim = wrap_dim('chunk', t, dim or 0)
  local total = t:size(dim)
  if total == 0 then
    local parts = {}
    for i = 1, n do parts[i] = t:narrow(dim, 0, 0) end
    return parts
  end
  return M.split(t, math.ceil(total / n), dim)
end

local methods = Tensor.methods
methods.matmul = M.matmul
methods.split = M.split
methods.chunk = M.chunk

return M
