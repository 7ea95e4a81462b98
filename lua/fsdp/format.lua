-- fsdp.format: tensors printed the way PyTorch prints them.
--
--   tensor([[ 0.1234, -1.5000],
--           [ 2.0000,  3.0000]])
--   tensor([1., 2., 3.], dtype=f64)
--   tensor(..., size=(4096, 4096), device='meta')
--
-- Same rules as torch._tensor_str: 4 digits, scientific notation when the
-- nonzero magnitudes span more than 1e3 or leave [1e-4, 1e8], integral
-- floats as "2.", columns padded to one width, lines wrapped at 80
-- characters, and tensors over 1000 elements summarised to their first and
-- last 3 entries per dim.
local core = require 'fsdp.core'
local Tensor = require 'fsdp.tensor'
local C = core.C

local M = {}

M.options = { precision = 4, threshold = 1000, edgeitems = 3, linewidth = 80 }

-- Python's repr of a tuple of sizes: (4096, 4096), (5,), ().
local function size_tuple(shape)
  if #shape == 1 then return '(' .. shape[1] .. ',)' end
  return '(' .. table.concat(shape, ', ') .. ')'
end

-- Nested Lua arrays of the values to show: all of them, or the edges of
-- each dim (with M.ELLIPSIS between) when summarising.
local ELLIPSIS = {}

local function collect(t, summarize, flat)
  local c = Tensor.cptr(t)
  if c.ndim == 0 then
    local v = t:item()
    flat[#flat + 1] = v
    return v
  end
  local n = tonumber(c.shape[0])
  local e = M.options.edgeitems
  local idx = {}
  if summarize and n > 2 * e then
    for i = 0, e - 1 do idx[#idx + 1] = i end
    idx[#idx + 1] = ELLIPSIS
    for i = n - e, n - 1 do idx[#idx + 1] = i end
  else
    for i = 0, n - 1 do idx[#idx + 1] = i end
  end
  local out = {}
  for k, i in ipairs(idx) do
    if i == ELLIPSIS then
      out[k] = ELLIPSIS
    elseif c.ndim == 1 then
      local v = t:get(i)
      flat[#flat + 1] = v
      out[k] = v
    else
      out[k] = collect(t:select(0, i), summarize, flat)
    end
  end
  return out
end

local function is_finite(v)
  return v == v and v ~= math.huge and v ~= -math.huge
end

local function float_text(v)
  if v ~= v then return 'nan' end
  if v == math.huge then return 'inf' end
  if v == -math.huge then return '-inf' end
  return nil
end

-- A function value -> padded string, for the values in `flat`.
local function formatter(dtype, flat)
  local p = M.options.precision
  if dtype == C.FL_BOOL then
    return function(v) return v and ' True' or 'False' end, 5
  end
  if not C.fl_dtype_is_float(dtype) then
    local width = 1
    for _, v in ipairs(flat) do width = math.max(width, #tostring(v):gsub('LL$', '')) end
    return function(v)
      local s = tostring(v):gsub('U?LL$', '')
      return (' '):rep(width - #s) .. s
    end, width
  end
  local int_mode, sci_mode, width = true, false, 1
  local lo, hi, any = math.huge, 0, false
  for _, v in ipairs(flat) do
    if is_finite(v) and v ~= 0 then
      any = true
      local a = math.abs(v)
      lo, hi = math.min(lo, a), math.max(hi, a)
      if v ~= math.ceil(v) then int_mode = false end
    end
  end
  local fmt
  if any then
    if int_mode then
      sci_mode = hi / lo > 1000 or hi > 1e8
      fmt = sci_mode and ('%.' .. p .. 'e') or '%.0f.'
    else
      sci_mode = hi / lo > 1000 or hi > 1e8 or lo < 1e-4
      fmt = sci_mode and ('%.' .. p .. 'e') or ('%.' .. p .. 'f')
    end
    for _, v in ipairs(flat) do
      if is_finite(v) and v ~= 0 then width = math.max(width, #fmt:format(v)) end
    end
  else
    fmt = int_mode and '%.0f.' or ('%.' .. p .. 'f')
  end
  return function(v)
    local s = float_text(v) or fmt:format(v)
    if v == 0 and sci_mode then s = ('%.' .. p .. 'e'):format(0) end
    return (' '):rep(width - #s) .. s
  end, width
end

local function vector_str(values, fmt, width, indent)
  local per_line = math.max(1, math.floor((M.options.linewidth - indent) / (width + 2)))
  local items = {}
  for _, v in ipairs(values) do items[#items + 1] = v == ELLIPSIS and ' ...' or fmt(v) end
  local lines = {}
  for i = 1, #items, per_line do
    lines[#lines + 1] = table.concat(items, ', ', i, math.min(i + per_line - 1, #items))
  end
  return '[' .. table.concat(lines, ',\n' .. (' '):rep(indent + 1)) .. ']'
end

local function tensor_str(values, ndim, fmt, width, indent)
  if ndim == 1 then return vector_str(values, fmt, width, indent) end
  local parts = {}
  for i, v in ipairs(values) do
    parts[i] = v == ELLIPSIS and '...' or tensor_str(v, ndim - 1, fmt, width, indent + 1)
  end
  local sep = ',' .. ('\n'):rep(ndim - 1) .. (' '):rep(indent + 1)
  return '[' .. table.concat(parts, sep) .. ']'
end

-- The printed form of a tensor.
function M.tensor(t)
  local c = rawget(t, '_c')
  if not c then return 'tensor(<freed>)' end
  local shape = core.shape_table(c)
  local dtype = c.dtype
  local kind = C.fl_device_kind_of(c.device)
  local suffixes = {}
  local default_dtype = dtype == C.FL_F32 or dtype == C.FL_I64 or dtype == C.FL_BOOL
  local body
  if c.storage == nil then
    body = '...'
    suffixes[#suffixes + 1] = 'size=' .. size_tuple(shape)
  elseif c.numel == 0 then
    body = '[]'
    if #shape ~= 1 then suffixes[#suffixes + 1] = 'size=' .. size_tuple(shape) end
  else
    local host = kind == C.FL_DEVICE_CPU and t or t:cpu()
    local summarize = tonumber(c.numel) > M.options.threshold
    local flat = {}
    local values = collect(host, summarize, flat)
    local fmt, width = formatter(dtype, flat)
    if c.ndim == 0 then
      body = fmt(values):gsub('^%s+', '')
    else
      body = tensor_str(values, c.ndim, fmt, width, #'tensor(')
    end
  end
  if not default_dtype or (c.storage == nil and dtype ~= C.FL_F32) then
    suffixes[#suffixes + 1] = 'dtype=' .. core.dtype_name(dtype)
  end
  if kind ~= C.FL_DEVICE_CPU then
    suffixes[#suffixes + 1] = "device='" .. core.device_name(c.device) .. "'"
  end
  if bit.band(c.flags, C.FL_TENSOR_FAKE) ~= 0 then
    if kind == C.FL_DEVICE_CPU then suffixes[#suffixes + 1] = "device='cpu'" end
    suffixes[#suffixes + 1] = 'fake=true'
  end
  local out = 'tensor(' .. body
  for _, s in ipairs(suffixes) do out = out .. ', ' .. s end
  return out .. ')'
end

-- Tensors print through this file ([tostring] in fsdp.tensor).
Tensor.format = function(t) return M.tensor(t) end

return M
