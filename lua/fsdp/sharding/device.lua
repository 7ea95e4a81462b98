-- fsdp.sharding.device: the --device option every recipe shares, and what
-- a GPU changes in a recipe's defaults.
--
--   local device = require 'fsdp.sharding.device'
--   local cfg = options.config(device.options({...}), arg, script)
--   local dev = device.resolve(cfg)            -- 'cpu' or 'cuda:N'
--   ids = ids:to(dev)
--
-- --device=auto (the default) is cuda:<local rank> (modulo the GPUs this
-- process sees) where this build sees a GPU, else cpu; --device=cuda is
-- the same but refuses a machine without one; --device=cuda:N names the
-- device; --device=cpu trains on the CPU.
-- The value stays as written in the config (ranks on a node agree on
-- 'auto' while each uses its own GPU); resolve() gives the device.
--
-- [Note: GPU defaults]
-- On a cuda device a recipe's options that the user did not give take the
-- values a GPU user expects (their specs' default_from, fsdp.options): bf16
-- mixed precision (--mixed_precision, fsdp.sharding.options), the detected
-- GPU's profile for --plan (--plan_device) and its peak for MFU
-- (--peak_tflops, from fsdp.devices.for_cuda); the step log then also shows
-- the caching allocator's allocated / reserved / peak bytes
-- (fsdp.metrics). What the user gives always wins; on the CPU nothing
-- changes.
local fsdp = require 'fsdp'
local suggest = require 'fsdp.suggest'
local options = require 'fsdp.options'
local core = require 'fsdp.core'

local M = {}

-- What is wrong with a --device value (before anything is built), or nil
-- and the device it names ('cpu' or 'cuda:N').
local resolved = {}
function M.check(text)
  if resolved[text] then return nil, resolved[text] end
  local index
  if text == 'cuda' or text == 'auto' then
    index = nil
  elseif text:match('^cuda:%d+$') then
    index = tonumber(text:match('%d+'))
  elseif text ~= 'cpu' then
    return ("must be auto, cpu, cuda or cuda:N; got '%s'%s"):format(text,
      suggest.hint(text, { 'auto', 'cpu', 'cuda' }))
  end
  local dev = 'cpu'
  if text ~= 'cpu' then
    local count = fsdp.cuda.device_count()
    if count == 0 then
      if text ~= 'auto' then
        return ('(%s) asks for a GPU, but there is none here (%s); use --device=cpu or --device=auto'):format(text,
          fsdp.cuda.status())
      end
    else
      if not index then
        -- The GPU of the local rank, modulo the GPUs this process sees
        -- (torchrun/torchtitan's rule): one GPU per rank where all of a
        -- node's GPUs are visible, and cuda:0 where the launcher binds one
        -- GPU to each rank (srun --gpus-per-task=1, CUDA_VISIBLE_DEVICES
        -- per rank). More ranks than GPUs share them (collectives then go
        -- through host copies: [Note: collectives on device tensors]).
        local ok, lr = pcall(fsdp.dist.local_rank)
        if not ok then return ('(%s): cannot tell this rank\'s local rank: %s'):format(text, tostring(lr)) end
        index = lr % count
      elseif index >= count then
        return ('(%s) is not on this machine, which has %d CUDA device%s (cuda:0%s)'):format(text, count, count == 1 and '' or 's',
          count > 1 and ('..cuda:%d'):format(count - 1) or '')
      end
      dev = 'cuda:' .. index
    end
  end
  resolved[text] = dev
  return nil, dev
end

M.OPTIONS = {
  device = { 'auto', 'where the model, the batches and the loss live: auto (cuda:<local rank> with a GPU, '
                     .. 'else cpu), cpu, cuda, cuda:N; on cuda, options not given take GPU defaults',
             check = function(v) return (M.check(v)) end },
}

-- The compute dtype a config names: --mixed_precision, else --dtype.
local function compute_dtype(cfg)
  local mp = cfg.mixed_precision or ''
  return mp ~= '' and mp or cfg.dtype or 'f32'
end

-- What a bf16 run gets on this CPU, or nil where bf16 is the faster
-- choice. Without bf16 dot products (below the avx512_bf16 level: AVX2
-- CPUs, and AVX-512 ones without AVX512-BF16 such as Skylake-SP, Cascade
-- Lake and Ice Lake servers) each bf16 product is converted to f32 and
-- run as an f32 product ([Note: the bf16 routes], core/cpu/cpu_matmul.c),
-- so a bf16 step costs f32's plus the conversions and mixed precision's
-- casts: benchmarks/train_step.lua measured it 11-14% slower than f32 at
-- avx2 and 9-18% slower at avx512 (GPT-2 124M and the small Llama on a
-- Zen 5 capped by FSDP_CPU_ISA; README, "Performance (CPU)"); from
-- avx512_bf16 bf16 was 1.5-1.8x faster.
function M.cpu_precision_note(cfg)
  if compute_dtype(cfg) ~= 'bf16' then return nil end
  local isa, rank = fsdp.cpu_isa(), {}
  for i, name in ipairs(fsdp.cpu_isa_levels) do rank[name] = i end
  if rank[isa.level] >= rank.avx512_bf16 then return nil end
  return ('bf16 is slower than f32 at the %s level (no bf16 dot products: its products run in f32 after '
    .. 'conversions); train in f32 for speed, bf16 only to save memory'):format(isa.level)
end

-- How the ranks of this node use the device, for the log: on the CPU, its
-- instruction-set level, and where bf16 is the slower choice there, that.
function M.describe(cfg)
  local dev = M.resolve(cfg)
  -- The CPU's instruction-set level: what a run's speed and its last bits
  -- depend on ([Note: CPU ISA levels], core/base/cpu_isa.c).
  if dev == 'cpu' then
    local note = M.cpu_precision_note(cfg)
    return 'cpu, ISA ' .. fsdp.cpu_isa().text .. (note and ('; ' .. note) or '')
  end
  local count, ranks = fsdp.cuda.device_count(), fsdp.dist.local_size()
  local how = ''
  if not cfg.device:match(':') and ranks > 1 then
    how = ranks <= count and ' (each rank the GPU of its local rank)'
      or (' (%d ranks on this node see %d GPU%s each: cuda:<local rank mod %d>, shared unless the launcher binds '
          .. 'one GPU to each rank)'):format(ranks, count, count == 1 and '' or 's', count)
  end
  local p = M.profile(cfg)
  return ('%s%s, %s, %s'):format(dev, how, fsdp.cuda.status(),
    p and ('profile ' .. p.name) or 'no fsdp.devices profile (give --peak_tflops for MFU)')
end

-- A recipe's own options plus --device.
function M.options(own) return options.merge(M.OPTIONS, own) end

-- The device a config's --device names: 'cpu' or 'cuda:N' (checked when
-- the options were read).
function M.resolve(cfg)
  local why, dev = M.check(cfg.device or 'cpu')
  if why then core.fail('--device ' .. why) end
  return dev
end

function M.is_cuda(cfg) return M.resolve(cfg):match('^cuda') ~= nil end

-- The fsdp.devices profile of the GPU a config trains on, or nil (the CPU,
-- or a GPU the profiles do not know).
function M.profile(cfg)
  if not M.is_cuda(cfg) then return nil end
  return fsdp.devices.for_cuda(fsdp.cuda.status())
end

-- default_from of the shared options (fsdp.options: run when the user did
-- not give the option, in the order of the keys).
-- --mixed_precision: bf16 on a GPU.
function M.default_mixed_precision(cfg)
  if M.is_cuda(cfg) then return 'bf16' end
end

-- --plan_device: the detected GPU's profile; on a GPU without one, --plan
-- must be told which.
function M.default_plan_device(cfg)
  if not M.is_cuda(cfg) then return nil end
  local p = M.profile(cfg)
  if p then return p.name end
  if cfg.plan then
    return nil, ('is needed with --plan on this GPU (%s), which fsdp.devices has no profile for (known: %s)'):format(
      fsdp.cuda.status(), table.concat(fsdp.devices.names(), ', '))
  end
end

-- --peak_tflops: the detected GPU's dense peak in the compute dtype
-- (--mixed_precision, else --dtype), so the log reports MFU.
function M.default_peak_tflops(cfg)
  local p = M.profile(cfg)
  if not p then return nil end
  local dtype = (cfg.mixed_precision or '') ~= '' and cfg.mixed_precision or cfg.dtype or 'f32'
  local flops = p.flops[dtype]
  return flops and flops / 1e12 or nil
end

-- The option a recipe declares for MFU, with the GPU default.
function M.peak_tflops_option()
  return { 0, 'peak TFLOPS of one device, for MFU (0: not reported; on a GPU fsdp.devices knows: its peak)',
           min = 0, default_from = M.default_peak_tflops }
end

return M
