-- fsdp.tensor: the Tensor class, a Lua handle on a reference-counted C
-- tensor (fl_tensor).
--
-- A Tensor is a small table {_c = cdata}; the cdata carries a finalizer that
-- drops the C reference, so tensors are freed by the garbage collector, or
-- at once by t:free(). Dims and indices are 0-based and may be negative, as
-- in PyTorch (see docs/ARCHITECTURE.md for why). Properties (t.shape,
-- t.dtype, t.device, t.ndim) are computed from the C struct on access.
-- (#t is not available: LuaJIT, like Lua 5.1, ignores __len on tables; use
-- t:size(0).)
local core = require 'fsdp.core'
local random = require 'fsdp.random'
local ffi, C = core.ffi, core.C

local Tensor = {}
Tensor.__name = 'Tensor'

local methods = {}
local properties = {}

-- [Note: collecting tensors]
-- A Tensor is a few dozen bytes to Lua's collector, which cannot see the
-- megabytes of C storage it may pin. Left alone, the collector runs far too
-- rarely: a training loop's dead activations and gradients pile up, and
-- memory grows by a model's worth per step. So the binding paces the
-- collector by C allocation: once the bytes allocated since the last full
-- collection exceed a budget, the next tensor created runs a full
-- collection first. The budget is a quarter of the live bytes, clamped to
-- [min_budget, MAX_BUDGET]: most live bytes in training are long-lived
-- (weights, optimizer state), so dead activations stay a fraction of a
-- step's and the caching allocator gets their blocks back warm; a full
-- collection of the small Lua heap costs about a millisecond.
-- min_budget = 0 collects before every allocation: exact memory
-- accounting (tests, memory planning checks), at some speed.
local MAX_BUDGET = 256 * 2^20
local min_budget = 64 * 2^20
local gc_mark, gc_budget = 0, min_budget
local stats_buf = ffi.new('fl_memory_stats')
local cpu = C.fl_device_make(C.FL_DEVICE_CPU, 0)

-- While held (Tensor.hold_collector), Lua's own incremental collector
-- stays stopped: a full collection restarts it, so each one here stops it
-- again.
local held = false
local function full_collection()
  collectgarbage('collect')
  if held then collectgarbage('stop') end
end
Tensor.full_collection = full_collection

local function pace_collector()
  local total = tonumber(C.fl_memory_allocated_total())
  if total - gc_mark < gc_budget then return end
  full_collection()
  C.fl_memory_stats_get(cpu, stats_buf)
  gc_mark = tonumber(C.fl_memory_allocated_total())
  -- A budget of 0 stays 0: every allocation collects (exact accounting).
  gc_budget = min_budget <= 0 and 0 or math.min(MAX_BUDGET, math.max(min_budget, tonumber(stats_buf.in_use) / 4))
end

-- Stop (true) or restart (false) Lua's automatic collector: only the
-- budget's collections and explicit ones run while it is held, so when
-- tensors die is decided by the program, not by how much Lua allocated
-- (fsdp.plan's trace, [Note: exact collection while tracing]). Returns
-- the previous setting.
function Tensor.hold_collector(on)
  local was = held
  held = on and true or false
  collectgarbage(held and 'stop' or 'restart')
  return was
end

-- Set the smallest collection budget in bytes (0: collect before every
-- allocation, for exact peak memory); returns the previous one.
function Tensor.set_collect_budget(bytes)
  local previous = min_budget
  min_budget = bytes
  gc_budget = math.min(gc_budget, math.max(bytes, 0))
  return previous
end

-- Wrap a new C reference (or raise the core's error if ptr is NULL). Out
-- of memory first collects the dead tensors Lua still holds, so a caller
-- that catches the error and tries again (a smaller batch, the batch
-- finder) starts from what is really live.
local function wrap(ptr)
  if ptr == nil then
    if C.fl_last_status() == C.FL_ERR_OOM then
      local msg = core.last_error()
      full_collection()
      gc_mark = tonumber(C.fl_memory_allocated_total())
      core.fail(msg)
    end
    core.raise()
  end
  pace_collector()
  return setmetatable({ _c = ffi.gc(ptr, C.fl_tensor_release) }, Tensor)
end
Tensor.wrap = wrap

-- The C struct of a tensor argument, with a clear error for a freed one or
-- for something that is not a tensor.
local function cptr(t)
  local c = type(t) == 'table' and rawget(t, '_c')
  if c then return c end
  if getmetatable(t) == Tensor then core.fail('tensor was freed') end
  core.fail(('expected a Tensor, got %s'):format(type(t)))
end
Tensor.cptr = cptr

-- Whether x is a Tensor (freed ones included).
function Tensor.is_tensor(x)
  return getmetatable(x) == Tensor
end

Tensor.__index = function(t, k)
  local m = methods[k]
  if m then return m end
  local p = properties[k]
  if p then return p(t) end
  if type(k) == 'number' then return t:select(0, k) end
  return nil
end

-- The names Tab completion offers (fsdp.complete): methods and properties.
Tensor.__dir = function()
  local names = {}
  for k in pairs(methods) do names[#names + 1] = k end
  for k in pairs(properties) do names[#names + 1] = k end
  return names
end

Tensor.__newindex = function(t, k, v)
  if k == 'grad' then
    core.check(C.fl_set_grad(cptr(t), v and cptr(v) or nil))
    return
  end
  if type(k) == 'number' then
    local row = t:select(0, k)
    if Tensor.is_tensor(v) then row:copy_(v) else row:fill_(v) end
    return
  end
  if methods[k] or properties[k] then
    core.fail(('Tensor.%s cannot be assigned'):format(k))
  end
  rawset(t, k, v)
end

-- Printing lives in fsdp.format and backward in fsdp.autograd, both a
-- layer above this file (they require it): each installs itself here when
-- loaded (Tensor.format, Tensor.run_backward), and require 'fsdp' loads
-- both. Until then a tensor prints as its shape, dtype and device.
function Tensor.format(t)
  return ('tensor(size=(%s), dtype=%s, device=%s)'):format(table.concat(t.shape, ', '), t.dtype, t.device)
end
Tensor.__tostring = function(t) return Tensor.format(t) end

-- properties ------------------------------------------------------------------

function properties.shape(t) return core.shape_table(cptr(t)) end
function properties.ndim(t) return cptr(t).ndim end
function properties.dtype(t) return core.dtype_name(cptr(t).dtype) end
function properties.device(t) return core.device_name(cptr(t).device) end
function properties.requires_grad(t) return C.fl_requires_grad(cptr(t)) end

-- The accumulated gradient (a Tensor sharing the C gradient) or nil.
function properties.grad(t)
  local g = C.fl_grad(cptr(t))
  if g == nil then return nil end
  return wrap(g)
end

-- Name of the node that computed t ("MulBackward"), nil for a leaf.
function properties.grad_fn(t)
  local n = C.fl_grad_fn_name(cptr(t))
  return n ~= nil and ffi.string(n) or nil
end

-- geometry ----------------------------------------------------------------------

function methods:dim() return cptr(self).ndim end

function methods:numel() return tonumber(cptr(self).numel) end
methods.nelement = methods.numel

local function wrap_dim(c, d)
  local n = c.ndim
  local w = d < 0 and d + n or d
  if w < 0 or w >= n then
    core.fail(('dim %d out of range for a %d-d tensor of shape %s'):format(
      d, n, core.format_shape(core.shape_table(c))))
  end
  return w
end

-- t:size() -> {2, 3}; t:size(d) -> the size of dim d.
function methods:size(d)
  local c = cptr(self)
  if d == nil then return core.shape_table(c) end
  return tonumber(c.shape[wrap_dim(c, d)])
end

function methods:stride(d)
  local c = cptr(self)
  if d == nil then
    local s = {}
    for i = 0, c.ndim - 1 do s[i + 1] = tonumber(c.stride[i]) end
    return s
  end
  return tonumber(c.stride[wrap_dim(c, d)])
end

function methods:storage_offset() return tonumber(cptr(self).offset) end
function methods:is_contiguous() return C.fl_tensor_is_contiguous(cptr(self)) end
function methods:is_meta() return C.fl_device_kind_of(cptr(self).device) == C.FL_DEVICE_META end
function methods:is_fake() return bit.band(cptr(self).flags, C.FL_TENSOR_FAKE) ~= 0 end
function methods:has_storage() return C.fl_tensor_has_storage(cptr(self)) end
function methods:is_floating_point() return core.dtype_is_float(cptr(self).dtype) end
function methods:element_size() return tonumber(C.fl_dtype_size(cptr(self).dtype)) end
function methods:storage_bytes() return tonumber(C.fl_tensor_storage_bytes(cptr(self))) end

-- Release this handle's reference now instead of at garbage collection.
-- The memory returns to the allocator once no other view uses it.
function methods:free()
  local c = rawget(self, '_c')
  if c then
    ffi.gc(c, nil)
    C.fl_tensor_release(c)
    rawset(self, '_c', nil)
  end
end

-- autograd ----------------------------------------------------------------------

function methods:requires_grad_(on)
  if on == nil then on = true end
  core.check(C.fl_requires_grad_(cptr(self), on))
  return self
end

function methods:is_leaf() return cptr(self).grad_fn == nil end
function methods:detach() return wrap(C.fl_detach(cptr(self))) end

-- Backpropagate from this tensor (a scalar, or give `grad` of its shape).
-- opts.retain_graph keeps the graph's saved tensors so a second backward
-- through it works (as PyTorch's retain_graph=True).
function methods:backward(grad, opts)
  if not Tensor.run_backward then core.fail('backward: fsdp.autograd is not loaded (require \'fsdp\')') end
  Tensor.run_backward(self, grad, opts)
end

-- arithmetic: t + u, t - 2, 3 * t, t / u, -t, with broadcasting -----------------

local BINARY = { add = C.FL_ADD, sub = C.FL_SUB, mul = C.FL_MUL, div = C.FL_DIV }

local function binary(op, a, b)
  if type(b) == 'number' then
    return wrap(C.fl_binary_scalar(op, cptr(a), b, false))
  elseif type(a) == 'number' then
    return wrap(C.fl_binary_scalar(op, cptr(b), a, true))
  end
  return wrap(C.fl_binary(op, cptr(a), cptr(b)))
end

for name, op in pairs(BINARY) do
  methods[name] = function(a, b) return binary(op, a, b) end
  -- In place, outside autograd (optimizers, accumulation): a = a op b.
  methods[name .. '_'] = function(a, b)
    if type(b) == 'number' then
      local c = cptr(a)
      b = wrap(C.fl_full(0, nil, b, c.dtype, c.device))
    end
    core.check(C.fl_binary_(op, cptr(a), cptr(b)))
    return a
  end
end

Tensor.__add = function(a, b) return binary(C.FL_ADD, a, b) end
Tensor.__sub = function(a, b) return binary(C.FL_SUB, a, b) end
Tensor.__mul = function(a, b) return binary(C.FL_MUL, a, b) end
Tensor.__div = function(a, b) return binary(C.FL_DIV, a, b) end
Tensor.__unm = function(a) return wrap(C.fl_binary_scalar(C.FL_MUL, cptr(a), -1, false)) end

-- self += alpha * other, outside autograd.
function methods:add_scaled_(other, alpha)
  core.check(C.fl_add_scaled_(cptr(self), cptr(other), alpha or 1))
  return self
end

-- Sum down to `shape`, undoing a broadcast (PyTorch's sum_to_size).
function methods:sum_to(...)
  local n, shape = core.shape_args(...)
  return wrap(C.fl_sum_to(cptr(self), n, shape))
end

-- views -----------------------------------------------------------------------

function methods:view(...)
  local n, shape = core.shape_args(...)
  return wrap(C.fl_view(cptr(self), n, shape))
end

function methods:reshape(...)
  local n, shape = core.shape_args(...)
  return wrap(C.fl_reshape(cptr(self), n, shape))
end

function methods:narrow(dim, start, length)
  return wrap(C.fl_narrow(cptr(self), dim, start, length))
end

-- t:slice(dim, start, stop, step): Python's t[start:stop:step] along dim;
-- stop defaults to the end, step to 1.
function methods:slice(dim, start, stop, step)
  return wrap(C.fl_slice(cptr(self), dim, start or 0, stop or 2^62, step or 1))
end

function methods:select(dim, index)
  return wrap(C.fl_select(cptr(self), dim, index))
end

function methods:transpose(d0, d1)
  return wrap(C.fl_transpose(cptr(self), d0, d1))
end

-- The transpose of a 2-d tensor.
function methods:t()
  local c = cptr(self)
  if c.ndim ~= 2 then
    core.fail(('t() expects a 2-d tensor, got shape %s'):format(core.format_shape(core.shape_table(c))))
  end
  return wrap(C.fl_transpose(c, 0, 1))
end

function methods:permute(...)
  local dims = type(...) == 'table' and ... or { ... }
  local arr = ffi.new('int[?]', math.max(#dims, 1), dims)
  return wrap(C.fl_permute(cptr(self), #dims, arr))
end

function methods:expand(...)
  local n, shape = core.shape_args(...)
  return wrap(C.fl_expand(cptr(self), n, shape))
end

function methods:expand_as(other)
  return wrap(C.fl_expand(cptr(self), cptr(other).ndim, cptr(other).shape))
end

function methods:unsqueeze(dim)
  return wrap(C.fl_unsqueeze(cptr(self), dim))
end

-- t:squeeze(dim) removes dim (size 1); t:squeeze() removes every size-1 dim.
function methods:squeeze(dim)
  local c = cptr(self)
  if dim ~= nil then return wrap(C.fl_squeeze(c, dim)) end
  local shape = {}
  for i = 0, c.ndim - 1 do
    if c.shape[i] ~= 1 then shape[#shape + 1] = tonumber(c.shape[i]) end
  end
  return self:view(shape)
end

function methods:flatten(start_dim, end_dim)
  return wrap(C.fl_flatten(cptr(self), start_dim or 0, end_dim or -1))
end

function methods:contiguous() return wrap(C.fl_contiguous(cptr(self))) end
function methods:clone() return wrap(C.fl_clone(cptr(self))) end

-- conversion ----------------------------------------------------------------------

-- t:to('bf16'), t:to('cpu'), t:to{dtype=, device=}, t:to(other_tensor).
-- Options {non_blocking = true} (as a second argument, or in the table):
-- a transfer between a pinned cpu tensor and a cuda device is queued
-- without blocking (to the cpu the result is pinned); call
-- fsdp.cuda.synchronize() before reading what came to the host.
function methods:to(x, opts)
  local c = cptr(self)
  local dtype, device = c.dtype, c.device
  local non_blocking = false
  if Tensor.is_tensor(x) then
    dtype, device = cptr(x).dtype, cptr(x).device
  elseif type(x) == 'table' then
    if x.dtype then dtype = core.dtype(x.dtype) end
    if x.device then device = core.device(x.device) end
    non_blocking = x.non_blocking
  elseif type(x) == 'string' then
    if C.fl_dtype_parse(x) >= 0 then dtype = core.dtype(x)
    else C.fl_clear_error(); device = core.device(x) end
  else
    core.fail(('to() expects a dtype, a device, a table or a tensor, got %s'):format(type(x)))
  end
  if opts ~= nil then
    if type(opts) ~= 'table' then
      core.fail(('to(): options must be a table like {non_blocking = true}, got %s'):format(type(opts)))
    end
    non_blocking = opts.non_blocking
  end
  if non_blocking ~= nil and non_blocking ~= false and non_blocking ~= true then
    core.fail(('to(): non_blocking must be a boolean, got %s'):format(tostring(non_blocking)))
  end
  if non_blocking then return wrap(C.fl_to_non_blocking(c, dtype, device)) end
  return wrap(C.fl_to(c, dtype, device))
end

-- Page-locked CPU memory (needs a CUDA device): a pinned copy of this
-- cpu tensor, or itself when already pinned.
function methods:pin_memory() return wrap(C.fl_pin_memory(cptr(self))) end
function methods:is_pinned() return C.fl_is_pinned(cptr(self)) end

local function caster(dtype)
  return function(self) return wrap(C.fl_to(cptr(self), dtype, cptr(self).device)) end
end
methods.float = caster(C.FL_F32)
methods.double = caster(C.FL_F64)
methods.half = caster(C.FL_F16)
methods.bfloat16 = caster(C.FL_BF16)
methods.long = caster(C.FL_I64)
methods.int = caster(C.FL_I32)
methods.byte = caster(C.FL_U8)
methods.bool = caster(C.FL_BOOL)

function methods:cpu() return self:to('cpu') end

-- in-place ------------------------------------------------------------------------

function methods:fill_(value)
  if type(value) == 'boolean' then value = value and 1 or 0 end
  core.check(C.fl_fill_(cptr(self), value))
  return self
end

function methods:zero_() return self:fill_(0) end

-- t:copy_(src [, {non_blocking = true}]): see to() for non_blocking.
function methods:copy_(src, opts)
  if opts ~= nil and type(opts) ~= 'table' then
    core.fail(('copy_(): options must be a table like {non_blocking = true}, got %s'):format(type(opts)))
  end
  if opts and opts.non_blocking then
    core.check(C.fl_copy_non_blocking_(cptr(self), cptr(src)))
  else
    core.check(C.fl_copy_(cptr(self), cptr(src)))
  end
  return self
end

-- Random fills take the same options as the factories: {seed=, stream=,
-- offset=} (see fsdp.random).
function methods:uniform_(low, high, opts)
  local seed, stream, offset = random.key(opts)
  core.check(C.fl_uniform_(cptr(self), seed, stream, offset, low or 0, high or 1))
  return self
end

function methods:normal_(mean, std, opts)
  local seed, stream, offset = random.key(opts)
  core.check(C.fl_normal_(cptr(self), seed, stream, offset, mean or 0, std or 1))
  return self
end

function methods:random_(low, high, opts)
  local seed, stream, offset = random.key(opts)
  core.check(C.fl_randint_(cptr(self), seed, stream, offset, low, high))
  return self
end

-- element access (printing, tests, small data; never for compute) -----------------

local index_buf = ffi.new('int64_t[?]', C.FL_MAX_DIMS)
local value_buf = ffi.new('double[1]')
local int_buf = ffi.new('int64_t[1]')

local function is_integer_dtype(dtype)
  return not C.fl_dtype_is_float(dtype) and dtype ~= C.FL_BOOL
end

-- Value at a 0-based index given as numbers or a table; Lua number for
-- float and 32-bit-or-smaller types, int64 cdata for i64/u32 beyond 2^53.
-- The 0-based indices of get/set (numbers or one table; negative ones
-- count from the end) into index_buf.
local function put_index(op, c, ...)
  local idx = type(...) == 'table' and ... or { ... }
  if #idx ~= c.ndim then
    core.fail(('%s: %d indices for a %d-d tensor'):format(op, #idx, c.ndim))
  end
  for i = 1, #idx do
    local v = idx[i]
    if v < 0 then v = v + c.shape[i - 1] end
    index_buf[i - 1] = v
  end
end

function methods:get(...)
  local c = cptr(self)
  put_index('get', c, ...)
  if is_integer_dtype(c.dtype) then
    core.check(C.fl_get_i64(c, index_buf, int_buf))
    local v = int_buf[0]
    local n = tonumber(v)
    if n >= -2^53 and n <= 2^53 then return n end
    return v
  end
  core.check(C.fl_get(c, index_buf, value_buf))
  if c.dtype == C.FL_BOOL then return value_buf[0] ~= 0 end
  return value_buf[0]
end

-- t:set(value, i, j, ...)
function methods:set(value, ...)
  local c = cptr(self)
  put_index('set', c, ...)
  if type(value) == 'boolean' then value = value and 1 or 0 end
  core.check(C.fl_set(c, index_buf, value))
  return self
end

-- The single value of a one-element tensor (from a device: copied to the
-- host, which waits for the work that produced it, as torch's item()).
function methods:item()
  local c = cptr(self)
  if c.numel ~= 1 then
    core.fail(('item: tensor of shape %s has %d elements, not 1'):format(
      core.format_shape(core.shape_table(c)), tonumber(c.numel)))
  end
  if C.fl_device_kind_of(c.device) ~= C.FL_DEVICE_CPU and c.storage ~= nil then
    return self:cpu():item()
  end
  local idx = {}
  for i = 1, c.ndim do idx[i] = 0 end
  return self:get(idx)
end

-- Nested Lua tables of the values (a number for a 0-d tensor).
function methods:tolist()
  local c = cptr(self)
  if C.fl_device_kind_of(c.device) ~= C.FL_DEVICE_CPU and c.storage ~= nil then
    return self:cpu():tolist()
  end
  local n = tonumber(c.numel)
  local float = C.fl_dtype_is_float(c.dtype)
  local dtype = float and C.FL_F64 or C.FL_I64
  local buf = ffi.new(float and 'double[?]' or 'int64_t[?]', math.max(n, 1))
  core.check(C.fl_to_host(c, buf, dtype, n))
  local shape = core.shape_table(c)
  local pos = 0
  local function build(d)
    if d > #shape then
      local v = buf[pos]
      pos = pos + 1
      if c.dtype == C.FL_BOOL then return v ~= 0 end
      return tonumber(v)
    end
    local out = {}
    for i = 1, shape[d] do out[i] = build(d + 1) end
    return out
  end
  return build(1)
end
methods.totable = methods.tolist

Tensor.methods = methods
Tensor.properties = properties

return Tensor
