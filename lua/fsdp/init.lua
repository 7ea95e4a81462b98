-- fsdp: the Lua library of fsdp-lua.
--
--   local fsdp = require 'fsdp'
--   local x = fsdp.randn({2, 3}, {seed = 1})
--   local w = fsdp.empty({8192, 8192}, {device = 'meta', dtype = 'bf16'})
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

-- An FSDP_CPU_ISA naming no level, or one the CPU lacks, stops here, in a
-- program embedding the framework as in the host ([Note: CPU ISA levels],
-- core/base/cpu_isa.c).
core.check(C.fl_cpu_isa_check())

M.Tensor = Tensor
M.is_tensor = Tensor.is_tensor
M.C = C
M.version = ffi.string(C.fl_version())
-- The compiler's facts, and whether the CUDA backend's plugin is installed.
M.build_info = ffi.string(C.fl_build_info()) ..
  (C.fl_backend_installed(C.FL_DEVICE_CUDA) and ', cuda=plugin' or ', cuda=off')

M.manual_seed = random.manual_seed
M.initial_seed = random.initial_seed

local autograd = require 'fsdp.autograd'
require 'fsdp.format' -- tensors print through it (it installs Tensor.format)
M.autograd = autograd
M.no_grad = autograd.no_grad
M.enable_grad = autograd.enable_grad
M.is_grad_enabled = autograd.is_grad_enabled
M.set_grad_enabled = autograd.set_grad_enabled

local safetensors = require 'fsdp.io.safetensors'
M.safetensors = safetensors
M.load_safetensors = safetensors.load
M.save_safetensors = safetensors.save
M.load_safetensors_dir = safetensors.load_dir         -- multi-file (HF index) checkpoints
M.load_safetensors_into = safetensors.load_into
M.save_safetensors_sharded = safetensors.save_sharded

-- FLOPs counted by ops since the last reset (meta included).
function M.flops() return tonumber(C.fl_flops()) end
-- Set the FLOP counter of fsdp.flops() back to 0.
function M.reset_flops() C.fl_flops_reset() end

-- Bytes the memory-bound ops read and wrote since the last reset (meta
-- included; every op but matmul, linear, conv2d and attention, each operand
-- once: [Note: bytes moved] in core/base/internal.h).
function M.bytes_moved() return tonumber(C.fl_bytes_moved()) end
-- The same per op: a list of {op =, calls =, bytes =} in the order ops first
-- counted.
function M.bytes_moved_by_op()
  local max = 128
  local names = ffi.new('const char *[?]', max)
  local calls, bytes = ffi.new('int64_t[?]', max), ffi.new('int64_t[?]', max)
  local n = C.fl_bytes_moved_by_op(max, names, calls, bytes)
  local list = {}
  for i = 0, n - 1 do
    list[#list + 1] = { op = ffi.string(names[i]), calls = tonumber(calls[i]), bytes = tonumber(bytes[i]) }
  end
  return list
end
-- Set the counters of fsdp.bytes_moved() back to 0.
function M.reset_bytes_moved() C.fl_bytes_moved_reset() end

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

-- memory ----------------------------------------------------------------------

local stats_buf = ffi.new('fl_memory_stats')

-- fsdp.memory_stats(device): {in_use=, peak=, allocations=, frees=,
-- failures=, limit=, reserved=} in bytes and counts for a device
-- (default: the default device).
function M.memory_stats(device)
  core.check(C.fl_memory_stats_get(core.device(device or default_device), stats_buf))
  local s = stats_buf
  return {
    in_use = tonumber(s.in_use), peak = tonumber(s.peak),
    allocations = tonumber(s.allocations), frees = tonumber(s.frees),
    failures = tonumber(s.failures), limit = tonumber(s.limit), reserved = tonumber(s.reserved),
  }
end

-- fsdp.set_collect_budget(bytes): tensor bytes allocated between two full
-- garbage collections. Exact memory accounting: with 0, dead tensors are
-- collected before every allocation, so peak statistics count only live
-- tensors (see [Note: collecting tensors] in tensor.lua). Returns the
-- previous budget.
M.set_collect_budget = Tensor.set_collect_budget

-- fsdp.collect(): free now every tensor that nothing can reach any more.
--
-- [Note: traces pin closures]
-- Two full collections free what Lua cannot reach, but LuaJIT's compiled
-- traces are roots of their own: a trace recorded through a closure that
-- was still one of few of its prototype specializes on that closure and
-- keeps it, and its upvalues, as constants. The first model a process
-- shards creates such closures (a unit's init, the wrap policy's visit),
-- so a dropped model can keep its shards and gradients alive until the JIT
-- happens to flush those traces, at no point one can name. collect()
-- flushes the traces first (they are recorded again as the code runs) and
-- then collects twice (finalizers release C storage in the first). Tests
-- that measure memory at rest call it; so can a script between models.
function M.collect()
  jit.flush()
  collectgarbage()
  collectgarbage()
end

-- Give the allocator's cached free blocks back to the system; returns the
-- bytes released.
function M.empty_cache(device)
  return tonumber(C.fl_memory_empty_cache(core.device(device or default_device)))
end

-- The libraries behind the CPU backend's matrix products, in words:
-- "oneDNN 2.6.3 (bf16 products, and f32 ones as x W^T, ...), MKL ...
-- (the other f32 products with B untransposed, ...), OpenBLAS (the
-- rest)", with the reason for any not used ([Note: GEMM libraries],
-- core/cpu/cpu_gemm.c).
function M.cpu_gemm_library()
  return ffi.string(C.fl_cpu_gemm_library())
end

-- The CPU's instruction-set levels, lowest first (fsdp.cpu_isa's names).
M.cpu_isa_levels = { 'baseline', 'avx2', 'avx512', 'avx512_bf16', 'amx' }

-- The CPU backend's instruction-set level ([Note: CPU ISA levels],
-- core/base/cpu_isa.c): { level = 'avx2', cpu = 'avx512_bf16', text =
-- 'avx2 (capped by FSDP_CPU_ISA; the CPU offers avx512_bf16), AMD EPYC' }.
-- level is what every CPU kernel and library runs within (FSDP_CPU_ISA
-- caps it for the process); cpu is what the CPU offers.
function M.cpu_isa()
  return { level = ffi.string(C.fl_cpu_isa_name(C.fl_cpu_isa_level())),
           cpu = ffi.string(C.fl_cpu_isa_name(C.fl_cpu_isa_cpu())),
           text = ffi.string(C.fl_cpu_isa_text()) }
end

-- The loops compiled once per level and run at the one in force ([Note:
-- ISA clones], core/base/cpu_isa_dispatch.h), one entry per family:
-- { name = 'dtype.c: convert_f32_to_bf16_span', widest = 'avx512',
-- ran = 'avx2' } (ran is nil until the family's first call in this
-- process).
function M.cpu_isa_clones()
  local out, widest, ran = {}, ffi.new('int[1]'), ffi.new('int[1]')
  for i = 0, C.fl_cpu_isa_clone_count() - 1 do
    local name = ffi.string(C.fl_cpu_isa_clone(i, widest, ran))
    out[#out + 1] = { name = name, widest = M.cpu_isa_levels[widest[0] + 1],
                      ran = ran[0] >= 0 and M.cpu_isa_levels[ran[0] + 1] or nil }
  end
  return out
end

-- Choose them: 'auto' (oneDNN and MKL where installed; the default),
-- 'openblas' (OpenBLAS only), 'onednn' or 'mkl' (that one and OpenBLAS;
-- an error when it is not available). FSDP_CPU_GEMM chooses at start.
-- Returns the choice it replaced, to restore it with.
function M.cpu_gemm_use(library)
  local previous = ffi.string(C.fl_cpu_gemm_chosen())
  core.check(C.fl_cpu_gemm_use(library))
  return previous
end

-- The kernels behind the CPU backend's attention, in words: "AMX bf16
-- tiles (...), f32 blocks (the rest)", "AVX512-BF16 dot products (...),
-- f32 blocks (the rest; AMX: why not)" or "f32 blocks (why not the
-- others)" ([Note: bf16 attention kernels],
-- core/cpu/cpu_attention_native.c).
function M.cpu_attention_kernel()
  return ffi.string(C.fl_cpu_attention_kernel())
end

-- Run bf16 attention on 'amx' tiles or 'avx512_bf16' dot products (an
-- error where the CPU lacks them), on f32 copies ('f32'), or on the best
-- available ('auto', the default); the environment's FSDP_CPU_ATTENTION
-- chooses at start.
function M.cpu_attention_use(kernel)
  core.check(C.fl_cpu_attention_use(kernel))
end

-- Set the peak of fsdp.memory_stats(device) to what is in use now, and its
-- counts to 0 (device: the default device when not given).
function M.reset_memory_stats(device)
  core.check(C.fl_memory_stats_reset(core.device(device or default_device)))
end

-- Make allocations beyond `bytes` in use on device fail with an
-- out-of-memory error (0 removes the limit).
function M.set_memory_limit(device, bytes)
  core.check(C.fl_memory_set_limit(core.device(device), bytes))
end

-- events and synchronisation -----------------------------------------------------

-- fsdp.Event(device, {timing = true}): see lua/fsdp/event.lua.
M.Event = require 'fsdp.event'

-- Block until everything queued on `device` (default: the default device)
-- has run; on the CPU a no-op.
function M.synchronize(device)
  core.check(C.fl_device_synchronize(core.device(device or default_device)))
end

-- cuda ------------------------------------------------------------------------

M.cuda = {
  -- True when the CUDA backend is installed (its plugin, libfsdp_cuda.so,
  -- is next to libfsdp.so); asking does not load it.
  built = function() return C.fl_backend_installed(C.FL_DEVICE_CUDA) end,
  -- True in the cudasim test build (kernels run on the CPU, slowly).
  -- Tests shrink their sizes there.
  simulated = function() return C.fl_backend_simulated(C.FL_DEVICE_CUDA) end,
  -- The number of CUDA devices this process sees (0 without a GPU).
  device_count = function() return C.fl_device_count(C.FL_DEVICE_CUDA) end,
  -- True when at least one CUDA device can be used.
  is_available = function() return C.fl_device_count(C.FL_DEVICE_CUDA) > 0 end,
  -- The name of device 0, or why there is none (no plugin, a CUDA library
  -- missing, no driver, no GPU).
  status = function() return ffi.string(C.fl_device_status(C.FL_DEVICE_CUDA)) end,
  -- The version a library the CUDA backend loaded reports ('cudnn':
  -- 91400 for 9.14.0), or nil when it is not used or there is no backend.
  library_version = function(library)
    local v = tonumber(C.fl_device_library_version(C.FL_DEVICE_CUDA, library))
    return v >= 0 and v or nil
  end,
  -- How many scaled_dot_product_attention calls on cuda devices ran through
  -- cuDNN's fused attention and how many through the flash-style kernels,
  -- since the process started: { cudnn_forward, kernel_forward,
  -- cudnn_backward, kernel_backward }.
  attention_paths = function()
    local c = ffi.new('int64_t[4]')
    C.fl_attention_paths(C.FL_DEVICE_CUDA, c)
    return { cudnn_forward = tonumber(c[0]), kernel_forward = tonumber(c[1]),
             cudnn_backward = tonumber(c[2]), kernel_backward = tonumber(c[3]) }
  end,
}

-- Wait until everything queued on a cuda device (default cuda:0) has run:
-- needed before the host reads a tensor copied to it with non_blocking.
function M.cuda.synchronize(device)
  local d = core.device(device or 'cuda:0')
  if C.fl_device_kind_of(d) ~= C.FL_DEVICE_CUDA then
    core.fail(('cuda.synchronize: expects a cuda device, got %s'):format(core.device_name(d)))
  end
  core.check(C.fl_device_synchronize(d))
end

local pinned_buf = ffi.new('int64_t[2]')
-- The pinned host pool: {allocated =, reserved =} bytes (pinned tensors in
-- use, and what the pool holds from the system).
function M.cuda.pinned_memory_stats()
  core.check(C.fl_pinned_stats(pinned_buf, pinned_buf + 1))
  return { allocated = tonumber(pinned_buf[0]), reserved = tonumber(pinned_buf[1]) }
end

-- Give the pinned pool's wholly free segments back to the system (blocks
-- whose copies have not run yet stay); returns the bytes released.
function M.cuda.empty_pinned_cache() return tonumber(C.fl_pinned_empty_cache()) end

local offload_buf = ffi.new('fl_offload_stats')
-- Activation offload's counters (fsdp.offload_activations): saved, copies,
-- bytes, shared, kept, kept_params, restores, restored_bytes, failed,
-- prefetched (copies back started ahead of their backward), and the pinned
-- pool's pinned_allocated / pinned_reserved bytes.
function M.cuda.offload_stats()
  C.fl_offload_stats_get(offload_buf)
  local out = {}
  for _, k in ipairs({ 'saved', 'copies', 'bytes', 'shared', 'kept', 'kept_params', 'restores',
                       'restored_bytes', 'failed', 'pinned_allocated', 'pinned_reserved', 'prefetched' }) do
    out[k] = tonumber(offload_buf[k])
  end
  return out
end
-- Set the counts of fsdp.cuda.offload_stats() back to 0.
function M.cuda.reset_offload_stats() C.fl_offload_stats_reset() end

-- dtypes ------------------------------------------------------------------------

M.dtypes = {}
for d = 0, C.FL_DTYPE_COUNT - 1 do M.dtypes[#M.dtypes + 1] = core.dtype_name(d) end

-- Submodules loaded on first use (they require this module themselves):
-- fsdp.nn, fsdp.optim, fsdp.functional (also as fsdp.F), fsdp.plan (callable).
local lazy = { nn = 'fsdp.nn', optim = 'fsdp.optim', functional = 'fsdp.functional',
               F = 'fsdp.functional', dist = 'fsdp.dist', sharding = 'fsdp.sharding',
               policy = 'fsdp.sharding.policy', checkpointing = 'fsdp.checkpointing',
               lora = 'fsdp.lora',
               -- fsdp.plan(model, opts): memory, communication and time per
               -- rank without allocating; fsdp.devices: its device profiles.
               plan = 'fsdp.plan', devices = 'fsdp.devices',
               -- fsdp.progress.start(label, {total=, unit=}): progress of long work
               progress = 'fsdp.observe.progress' }
setmetatable(M, {
  -- Tab completion (fsdp.complete) offers the lazy submodules too.
  __dir = function(t)
    local names = {}
    for k in pairs(t) do names[#names + 1] = k end
    for k in pairs(lazy) do names[#names + 1] = k end
    return names
  end,
  __index = function(t, k)
    local name = lazy[k]
    if not name then return nil end
    local mod = require(name)
    rawset(t, k, mod)
    return mod
  end,
})

-- The op families add Tensor methods (t:sum(), t:matmul(), t:softmax()...):
-- load them with the library so the methods always exist. They require
-- this module, so it is registered first.
package.loaded['fsdp'] = M
M.F = require 'fsdp.functional'
M.functional = M.F
M.cat = M.F.cat
M.checkpoint = require 'fsdp.activations.checkpoint'
M.offload_activations = require 'fsdp.activations.offload'
M.fake = fake.run
M.is_fake_mode = fake.active
M.summary = require('fsdp.repl.summary').summary

-- Names that forward to a module loaded on first use: help() shows the
-- target's doc comment (fsdp.help, [Note: help texts are doc comments]).
M._forwards = setmetatable({}, { __mode = 'k' })
local function forward(module, name)
  local fn = function(...) return require(module)[name](...) end
  M._forwards[fn] = function() return require(module)[name] end
  return fn
end

-- Fully sharded data parallel (fsdp.sharding): shard a model, and what
-- works across its shards.
for _, name in ipairs({ 'shard', 'no_sync', 'grad_norm', 'clip_grad_norm', 'summon_full_params',
                        'full_state_dict' }) do
  M[name] = forward('fsdp.sharding', name)
end
M.sharding_memory = forward('fsdp.sharding', 'memory')
-- Sharded checkpoints and the streamed full state dict (fsdp.checkpointing).
M.save_full_state_dict = forward('fsdp.checkpointing.full', 'save_full_state_dict')


return M
