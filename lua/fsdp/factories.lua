-- fsdp.factories: the tensor factories (empty, zeros, ones, full, arange,
-- tensor, rand, randn, randint) and the default dtype and device they use.
-- The `fsdp` facade re-exports every public name here (fsdp.empty is
-- factories.empty); the library's own modules (nn, optim, sharding,
-- checkpointing, ...) require this one rather than the facade, which sits
-- above them and loads them (docs/ARCHITECTURE.md, "Lua layers").
--
-- Factories take a shape (a table {2, 3} or numbers 2, 3) and an options
-- table: dtype ('f32' default), device ('cpu' default; 'meta', 'cuda:N'),
-- and for random ones seed, stream, offset (see fsdp.random).
local core = require 'fsdp.core'
local Tensor = require 'fsdp.tensor'
local random = require 'fsdp.random'
local fake = require 'fsdp.fake'
local ffi, C = core.ffi, core.C

local M = {}

-- defaults ------------------------------------------------------------------

local default_dtype = C.FL_F32
local default_device = core.device('cpu')

-- fsdp.set_default_dtype(dtype): the dtype factories use when their opts
-- name none ('f32' at start; a name such as 'bf16' or an alias such as
-- 'bfloat16').
function M.set_default_dtype(d) default_dtype = core.dtype(d) end
-- The default dtype's name ('f32' unless fsdp.set_default_dtype changed it).
function M.get_default_dtype() return core.dtype_name(default_dtype) end
-- fsdp.set_default_device(device): the device factories use when their
-- opts name none ('cpu' at start; 'meta', 'cuda:N').
function M.set_default_device(d) default_device = core.device(d) end
-- The default device's name ('cpu' unless fsdp.set_default_device changed it).
function M.get_default_device() return core.device_name(default_device) end
fake.use_default_device(M.get_default_device, M.set_default_device)

-- The options table of a factory: the argument after the shape, if any.
local function options(nextarg, ...)
  local opts = select(nextarg, ...)
  if opts == nil then return {} end
  if type(opts) ~= 'table' then
    core.fail(('expected an options table after the shape, got %s'):format(type(opts)))
  end
  return opts
end

local function placement(opts)
  local dtype = opts.dtype and core.dtype(opts.dtype) or default_dtype
  local device = opts.device and core.device(opts.device) or default_device
  return dtype, device
end

-- factories -------------------------------------------------------------------

-- {fake=true}, or any factory inside fsdp.fake(fn): a tensor that reports
-- its device and owns no storage (values and fills are skipped).
local function wants_fake(opts) return opts.fake or fake.active() end
local function make_empty(opts)
  return wants_fake(opts) and C.fl_fake or C.fl_empty
end

-- {pin_memory = true}: a cpu tensor in page-locked memory (needs a CUDA
-- device; see Tensor:pin_memory()).
local function pinned_empty(n, shape, dtype, device, opts)
  if opts.pin_memory ~= true and opts.pin_memory ~= false then
    core.fail(('pin_memory must be a boolean, got %s'):format(tostring(opts.pin_memory)))
  end
  if C.fl_device_kind_of(device) ~= C.FL_DEVICE_CPU or wants_fake(opts) then
    core.fail(('pin_memory: only cpu tensors with storage can be pinned (device %s%s)')
      :format(core.device_name(device), wants_fake(opts) and ', fake' or ''))
  end
  return Tensor.wrap(C.fl_empty_pinned(n, shape, dtype))
end

-- fsdp.empty(shape, opts): an uninitialised tensor. The shape is a table
-- ({2, 3}) or numbers (2, 3). opts (as every factory's): dtype (the
-- default dtype, 'f32'), device (the default device, 'cpu'; 'meta',
-- 'cuda:N'), fake (false; true: a tensor that reports its device but owns
-- no storage, for planning at full size; also inside fsdp.fake),
-- pin_memory (false; true: page-locked cpu memory, which needs a CUDA
-- device).
function M.empty(...)
  local n, shape, nextarg = core.shape_args(...)
  local opts = options(nextarg, ...)
  local dtype, device = placement(opts)
  if opts.pin_memory then return pinned_empty(n, shape, dtype, device, opts) end
  return Tensor.wrap(make_empty(opts)(n, shape, dtype, device))
end

-- fsdp.zeros(shape, opts): a tensor of zeros. opts: dtype, device, fake,
-- pin_memory, as fsdp.empty's.
function M.zeros(...)
  local n, shape, nextarg = core.shape_args(...)
  local opts = options(nextarg, ...)
  local dtype, device = placement(opts)
  if opts.pin_memory then return pinned_empty(n, shape, dtype, device, opts):zero_() end
  if wants_fake(opts) then return Tensor.wrap(C.fl_fake(n, shape, dtype, device)) end
  return Tensor.wrap(C.fl_zeros(n, shape, dtype, device))
end

-- fsdp.ones(shape, opts): a tensor of ones. opts: dtype, device, fake,
-- as fsdp.empty's.
function M.ones(...)
  local n, shape, nextarg = core.shape_args(...)
  local opts = options(nextarg, ...)
  local dtype, device = placement(opts)
  if wants_fake(opts) then return Tensor.wrap(C.fl_fake(n, shape, dtype, device)) end
  return Tensor.wrap(C.fl_full(n, shape, 1, dtype, device))
end

-- fsdp.full(shape, value, opts): a tensor filled with value (a number, or
-- a boolean as 1/0). opts: dtype, device, fake, as fsdp.empty's.
function M.full(shape, value, opts)
  local n, arr = core.shape_args(shape)
  if type(value) == 'boolean' then value = value and 1 or 0 end
  if type(value) ~= 'number' then
    core.fail(('full: fill value must be a number, got %s'):format(type(value)))
  end
  opts = opts or {}
  local dtype, device = placement(opts)
  if wants_fake(opts) then return Tensor.wrap(C.fl_fake(n, arr, dtype, device)) end
  return Tensor.wrap(C.fl_full(n, arr, value, dtype, device))
end

-- fsdp.arange(start, end, step, opts): the values start, start + step, ...
-- below end, as arange(end) (from 0), arange(start, end) or arange(start,
-- end, step) (step 1 when not given), each optionally followed by an
-- options table: dtype, device, fake, as fsdp.empty's.
function M.arange(...)
  local nums, opts = {}, {}
  for i = 1, select('#', ...) do
    local v = select(i, ...)
    if type(v) == 'table' then opts = v else nums[#nums + 1] = v end
  end
  local start, stop, step
  if #nums == 1 then start, stop, step = 0, nums[1], 1
  elseif #nums == 2 then start, stop, step = nums[1], nums[2], 1
  elseif #nums == 3 then start, stop, step = nums[1], nums[2], nums[3]
  else core.fail('arange expects (end), (start, end) or (start, end, step)') end
  local dtype, device = placement(opts)
  if wants_fake(opts) then
    -- The length (and the argument checks) of the meta arange, on device.
    local shape = Tensor.wrap(C.fl_arange(start, stop, step, dtype, core.device('meta')))._c.shape
    return Tensor.wrap(C.fl_fake(1, shape, dtype, device))
  end
  return Tensor.wrap(C.fl_arange(start, stop, step, dtype, device))
end

-- fsdp.tensor(data, opts): a tensor from nested Lua tables (or one number
-- or boolean), {{1, 2}, {3, 4}} giving shape [2, 2]. Lua numbers do not
-- say int or float, so the dtype is opts.dtype, else bool for booleans,
-- else the default dtype. opts: dtype, device (the default device), fake,
-- as fsdp.empty's.
function M.tensor(data, opts)
  opts = opts or {}
  local shape, values = {}, {}
  local is_bool = false
  local function walk(x, d)
    if type(x) == 'table' then
      if shape[d] == nil then shape[d] = #x
      elseif shape[d] ~= #x then
        core.fail(('tensor: ragged nested table: dim %d has lengths %d and %d'):format(d - 1, shape[d], #x))
      end
      for i = 1, #x do walk(x[i], d + 1) end
      return
    end
    if #shape >= d then core.fail('tensor: ragged nested table: a number where a table was expected') end
    if type(x) == 'boolean' then is_bool = true; x = x and 1 or 0
    elseif type(x) == 'cdata' then x = tonumber(x)
    elseif type(x) ~= 'number' then
      core.fail(('tensor: element is a %s, expected a number or boolean'):format(type(x)))
    end
    values[#values + 1] = x
  end
  walk(data, 1)
  if type(data) == 'table' then
    -- walk records sizes as it descends: the depth of the first leaf is the rank
    local depth, x = 0, data
    while type(x) == 'table' do depth = depth + 1; x = x[1] end
    for d = depth + 1, #shape do shape[d] = nil end
  end
  local dtype = opts.dtype and core.dtype(opts.dtype) or (is_bool and C.FL_BOOL or default_dtype)
  local device = opts.device and core.device(opts.device) or default_device
  local n, arr = core.shape_args(shape)
  if wants_fake(opts) then return Tensor.wrap(C.fl_fake(n, arr, dtype, device)) end
  local buf = ffi.new('double[?]', math.max(#values, 1), values)
  return Tensor.wrap(C.fl_from_host(n, arr, dtype, device, buf, C.FL_F64, #values))
end

local function random_factory(fill)
  return function(...)
    local n, shape, nextarg = core.shape_args(...)
    local opts = options(nextarg, ...)
    local dtype, device = placement(opts)
    local t = Tensor.wrap(make_empty(opts)(n, shape, dtype, device))
    local seed, stream, offset = random.key(opts)
    core.check(fill(Tensor.cptr(t), seed, stream, offset, opts))
    return t
  end
end

-- fsdp.rand(shape, opts): uniform values in [low, high). opts: low (0),
-- high (1); seed (default: the global generator, fsdp.manual_seed),
-- stream (0: another sequence for the same seed), offset (0: the index of
-- the first element, so a part equals the same part of the whole: see
-- fsdp.random); dtype, device, fake as fsdp.empty's.
M.rand = random_factory(function(c, seed, stream, offset, o)
  return C.fl_uniform_(c, seed, stream, offset, o.low or 0, o.high or 1)
end)

-- fsdp.randn(shape, opts): normal values, N(mean, std^2). opts: mean (0),
-- std (1); seed (default: the global generator, fsdp.manual_seed),
-- stream (0), offset (0), as fsdp.rand's; dtype, device, fake as
-- fsdp.empty's.
M.randn = random_factory(function(c, seed, stream, offset, o)
  return C.fl_normal_(c, seed, stream, offset, o.mean or 0, o.std or 1)
end)

-- fsdp.randint(low, high, shape, opts): integers in [low, high). opts:
-- dtype ('i64'), device (the default device), fake; seed, stream, offset
-- as fsdp.rand's.
function M.randint(low, high, shape, opts)
  opts = opts or {}
  if type(low) ~= 'number' or type(high) ~= 'number' then
    core.fail('randint expects (low, high, shape, opts)')
  end
  local n, arr = core.shape_args(shape)
  local dtype = opts.dtype and core.dtype(opts.dtype) or C.FL_I64
  local device = opts.device and core.device(opts.device) or default_device
  local t = Tensor.wrap(make_empty(opts)(n, arr, dtype, device))
  local seed, stream, offset = random.key(opts)
  core.check(C.fl_randint_(Tensor.cptr(t), seed, stream, offset, low, high))
  return t
end

-- The default device as the number core.device gives (for the facade's
-- memory and synchronisation calls, whose device argument defaults to it).
function M.default_device() return default_device end

-- The names the facade re-exports, in this order.
M.PUBLIC = { 'set_default_dtype', 'get_default_dtype', 'set_default_device', 'get_default_device', 'empty', 'zeros',
             'ones', 'full', 'arange', 'tensor', 'rand', 'randn', 'randint' }

return M
