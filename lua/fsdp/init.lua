-- fsdp: the Lua library of fsdp-lua.
--
--   local fsdp = require 'fsdp'
--   local x = fsdp.randn({2, 3}, {seed = 1})
--   local w = fsdp.empty({8192, 8192}, {device = 'meta', dtype = 'bf16'})
--
-- Factories take a shape (a table {2, 3} or numbers 2, 3) and an options
-- table: dtype ('f32' default), device ('cpu' default; 'meta', 'cuda:N'),
-- and for random ones seed, stream, offset (see fsdp.random); they live in
-- fsdp.factories, which this facade re-exports. It is the top of the
-- library: no module it loads, at once or on first use, requires it back
-- (docs/ARCHITECTURE.md, "Lua layers"); those lower modules take the
-- factories from fsdp.factories.
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

-- defaults and factories (fsdp.factories, re-exported) ---------------------------

local factories = require 'fsdp.factories'
for _, name in ipairs(factories.PUBLIC) do M[name] = factories[name] end
local default_device = factories.default_device

-- memory ----------------------------------------------------------------------

local stats_buf = ffi.new('fl_memory_stats')

-- fsdp.memory_stats(device): {in_use=, peak=, allocations=, frees=,
-- failures=, limit=, reserved=} in bytes and counts for a device
-- (default: the default device).
function M.memory_stats(device)
  core.check(C.fl_memory_stats_get(core.device(device or default_device()), stats_buf))
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
  return tonumber(C.fl_memory_empty_cache(core.device(device or default_device())))
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
  core.check(C.fl_memory_stats_reset(core.device(device or default_device())))
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
  core.check(C.fl_device_synchronize(core.device(device or default_device())))
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
  -- How many kernels the CUDA backend launched since the process started
  -- or reset_launches() (its own kernels; cuBLAS, cuDNN and NCCL calls
  -- launch theirs besides), and as a second value the launches the
  -- simulator saw in the cudasim build (nil elsewhere), which must agree.
  launches = function()
    local c = ffi.new('int64_t[2]')
    C.fl_kernel_launches(C.FL_DEVICE_CUDA, c)
    return tonumber(c[0]), c[1] >= 0 and tonumber(c[1]) or nil
  end,
  -- Set both counts of launches() back to 0.
  reset_launches = function() C.fl_kernel_launches_reset(C.FL_DEVICE_CUDA) end,
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
-- The pinned CPU memory pool: {allocated =, reserved =} bytes (pinned tensors in
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

-- Submodules loaded on first use, by name (start-up time: `require 'fsdp'`
-- need not load nn, optim, sharding, checkpointing or the planner):
-- fsdp.nn, fsdp.optim, fsdp.functional (also as fsdp.F), fsdp.plan (callable).
local lazy = { nn = 'fsdp.nn', optim = 'fsdp.optim', functional = 'fsdp.functional',
               F = 'fsdp.functional', dist = 'fsdp.dist', sharding = 'fsdp.sharding',
               policy = 'fsdp.sharding.policy', checkpointing = 'fsdp.checkpointing',
               lora = 'fsdp.lora', mesh = 'fsdp.mesh',
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
    local mod = require(name) -- lazy: start-up (the submodules above, loaded on first use)
    rawset(t, k, mod)
    return mod
  end,
})

-- The op families add Tensor methods (t:sum(), t:matmul(), t:softmax()...):
-- load them with the library so the methods always exist.
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
  -- lazy: start-up (sharding and checkpointing load on the first call)
  local fn = function(...) return require(module)[name](...) end
  -- lazy: start-up, as above
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
