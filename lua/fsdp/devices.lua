-- fsdp.devices: device profiles for the planner (fsdp.plan): memory, peak
-- FLOP/s, memory bandwidth and link bandwidths, as plain Lua tables.
--
--   fsdp.devices['h100-80g'].memory                  -- 81559 MiB in bytes
--   fsdp.devices.add{name = 'my-gpu', memory = 24 * 2^30, flops = {bf16 = 165e12, f32 = 82e12},
--                    mem_bw = 1e12, intra_bw = 32e9, inter_bw = 12.5e9}
--   fsdp.devices['my-gpu'] = {...}                   -- the same, checked when first used
--   fsdp.plan(model, {device = 'my-gpu', ...})       -- or device = {a profile table}
--   fsdp.devices.load('mycluster.json')              -- a profile in a file (or device = that path)
--
-- Fields (bytes, bytes/s, FLOP/s):
--   memory        what the device has in total (nvidia-smi's figure for GPUs)
--   reserved      what the runtime keeps for itself (CUDA context, library
--                 workspaces, NCCL buffers); a plan fits when its peak is at
--                 most memory - reserved
--   flops         dense peak FLOP/s per compute dtype {bf16=, f16=, f32=}
--   utilization   the fraction of peak a training step reaches (its MFU);
--                 the predicted compute time is flops / (peak * utilization)
--   mem_utilization  nil, or the fraction of mem_bw the memory-bound ops
--                 reach: then compute time is flops / (peak * utilization)
--                 + their bytes / (mem_bw * mem_utilization), utilization
--                 being the GEMMs' and attention's (fsdp.plan.cost; both
--                 measured from a kernel profile, as the H100's are)
--   mem_bw        memory bandwidth (the optimizer's pass over the shards)
--   intra_bw      per-rank bandwidth to ranks of the same node, one way
--                 (NVLink for the GPUs below)
--   inter_bw      per-rank bandwidth to other nodes, one way (the NIC per GPU)
--   node_inter_bw the node's whole bandwidth to other nodes, one way, which
--                 ranks whose collectives cross nodes at once share
--                 (fsdp.plan.cost); nil: inter_bw x ranks per node (a NIC
--                 per rank, as the GPUs below)
--   pinned_bw     device <-> pinned CPU memory, one way, as copies reach it
--                 (activation offload's traffic); nil: the planner refuses
--                 offload_activations on that device. The GPUs below: PCIe
--                 Gen4 x16 ~25 GB/s (A100, L40S), Gen5 x16 ~50 GB/s (H100,
--                 H200) each way, about 80% of the link's 32 / 64 GB/s, what
--                 pinned cudaMemcpyAsync usually measures
--   ranks_per_node  the usual node (8 GPUs; nil: 8); 'all': one node holds every rank
--                 (cpu: this machine); fsdp.plan's `nodes` or `ranks_per_node`
--                 overrides ([Note: plan node size] in fsdp.plan)
--   page          allocation granularity of gathered units (the CPU backend
--                 maps them in whole pages); nil: exact bytes
--   f32_gemm      products in bf16/f16 stage f32 copies (the CPU backend:
--                 OpenBLAS runs them on f32 copies of their operands; what
--                 oneDNN takes stages less): the planner counts what the
--                 backend says it stages
--   f32_reduce    bf16/f16 reductions are staged in f32 (MPI; NCCL is not)
--
-- The GPU figures are the vendors' datasheet numbers (dense, no sparsity;
-- f32 without TF32), NVLink and InfiniBand per GPU as in DGX/HGX systems.
-- 'cpu' is this machine: its memory from /proc/meminfo and its f32 rate
-- measured once (a few small GEMMs, ~10 ms) the first time it is asked for.
local core = require 'fsdp.core'
local validate = require 'fsdp.validate'
local files = require 'fsdp.io.files'
local autograd = require 'fsdp.autograd'
local factories = require 'fsdp.factories'
local clock = require 'fsdp.clock'

local M = {}

local GiB, MiB = 2^30, 2^20

local PROFILES = {
  ['a100-40g'] = { memory = 40960 * MiB, reserved = GiB, flops = { bf16 = 312e12, f16 = 312e12, f32 = 19.5e12 },
                   utilization = 0.5, mem_bw = 1.555e12, intra_bw = 300e9, inter_bw = 25e9,
                   pinned_bw = 25e9, ranks_per_node = 8 },
  ['a100-80g'] = { memory = 81920 * MiB, reserved = GiB, flops = { bf16 = 312e12, f16 = 312e12, f32 = 19.5e12 },
                   utilization = 0.5, mem_bw = 2.039e12, intra_bw = 300e9, inter_bw = 25e9,
                   pinned_bw = 25e9, ranks_per_node = 8 },
  ['h100-80g'] = { memory = 81559 * MiB, reserved = GiB, flops = { bf16 = 989e12, f16 = 989e12, f32 = 67e12 },
                   utilization = 0.45, mem_bw = 3.35e12, intra_bw = 450e9, inter_bw = 50e9,
                   pinned_bw = 50e9, ranks_per_node = 8 },
  ['h200-141g'] = { memory = 143771 * MiB, reserved = GiB, flops = { bf16 = 989e12, f16 = 989e12, f32 = 67e12 },
                    utilization = 0.45, mem_bw = 4.8e12, intra_bw = 450e9, inter_bw = 50e9,
                    pinned_bw = 50e9, ranks_per_node = 8 },
  ['l40s-48g'] = { memory = 46068 * MiB, reserved = GiB, flops = { bf16 = 362e12, f16 = 362e12, f32 = 91.6e12 },
                   utilization = 0.4, mem_bw = 864e9, intra_bw = 25e9, inter_bw = 25e9,
                   pinned_bw = 25e9, ranks_per_node = 8 },
  -- Ranks on one machine talk through shared memory; the figures are a
  -- declared guess (MPI over 2 cores), the memory and f32 rate are filled
  -- in from this machine on first use.
  cpu = { memory = 0, reserved = 0, flops = {}, utilization = 0.8, mem_bw = 10e9, intra_bw = 5e9,
          inter_bw = 1.25e9, node_inter_bw = 1.25e9, ranks_per_node = 'all', page = 4096, f32_gemm = true,
          f32_reduce = true,
          measured = false },
}
for name, p in pairs(PROFILES) do
  p.name = name
  M[name] = p
end

local API = { add = true, get = true, names = true, check = true, measure_cpu = true, for_cuda = true,
              load = true }

-- Profile names, sorted.
function M.names()
  local list = {}
  for k, v in pairs(M) do
    if not API[k] and type(v) == 'table' then list[#list + 1] = k end
  end
  table.sort(list)
  return list
end

local function positive(p, key, where)
  local v = p[key]
  if validate.problem(v, validate.POSITIVE) then
    core.fail(('%s: device profile %s: %s must be a positive number, got %s'):format(
      where, tostring(p.name), key, validate.show(v)))
  end
end

-- Validate a profile (errors name the profile and the field); returns it.
function M.check(p, where)
  where = where or 'fsdp.devices'
  if type(p) ~= 'table' then core.fail(('%s: a device profile must be a table, got %s'):format(where, type(p))) end
  for _, key in ipairs({ 'memory', 'mem_bw', 'intra_bw', 'inter_bw' }) do positive(p, key, where) end
  if type(p.flops) ~= 'table' or type(p.flops.f32 or p.flops.bf16) ~= 'number' then
    core.fail(('%s: device profile %s: flops must be a table of peak FLOP/s per dtype, e.g. {bf16 = 989e12, f32 = 67e12}')
      :format(where, tostring(p.name)))
  end
  for k, v in pairs(p.flops) do
    if validate.problem(v, validate.POSITIVE) then
      core.fail(('%s: device profile %s: flops.%s must be a positive number, got %s'):format(where, tostring(p.name),
        tostring(k), validate.show(v)))
    end
  end
  local u = p.utilization or 0.5
  if validate.problem(u, { positive = true, max = 1 }) then
    core.fail(('%s: device profile %s: utilization must be in (0, 1], got %s'):format(where, tostring(p.name),
      validate.show(u)))
  end
  if p.mem_utilization ~= nil and validate.problem(p.mem_utilization, { positive = true, max = 1 }) then
    core.fail(('%s: device profile %s: mem_utilization must be in (0, 1], got %s'):format(where,
      tostring(p.name), validate.show(p.mem_utilization)))
  end
  -- host_bw is the field's old name ("host" is the executable: docs/ARCHITECTURE.md, "Names").
  if p.pinned_bw == nil then p.pinned_bw, p.host_bw = p.host_bw, nil end
  if p.pinned_bw ~= nil then positive(p, 'pinned_bw', where) end
  if p.node_inter_bw ~= nil then positive(p, 'node_inter_bw', where) end
  if p.reserved ~= nil and validate.problem(p.reserved, validate.NONNEGATIVE) then
    core.fail(('%s: device profile %s: reserved must be a number >= 0'):format(where, tostring(p.name)))
  end
  return p
end

-- Add (or replace) a profile: {name=, memory=, flops=, mem_bw=, intra_bw=,
-- inter_bw=, ...}; returns it.
function M.add(p)
  if type(p) ~= 'table' or type(p.name) ~= 'string' or p.name == '' or API[p.name] then
    core.fail('fsdp.devices.add: expects a table with a name (a string that is not add/get/names/check)')
  end
  M.check(p, 'fsdp.devices.add')
  M[p.name] = p
  return p
end

local function meminfo_total()
  local f = io.open('/proc/meminfo')
  if not f then return nil end
  local text = f:read('*a')
  f:close()
  local kb = text:match('MemTotal:%s*(%d+)')
  return kb and tonumber(kb) * 1024
end

-- This machine as the 'cpu' profile: memory from /proc/meminfo, the f32
-- rate of a 384^3 matrix product (best of 5; what OpenBLAS gives the
-- linear layers). Done once; returns the profile.
function M.measure_cpu()
  local p = M.cpu
  if type(p) ~= 'table' or p.measured then return p end
  local n = 384
  local best = math.huge
  -- Under a memory limit the products may not fit: then a declared rate.
  local ok, why = pcall(function()
    local a = factories.randn({ n, n }, { seed = 1 })
    local b = factories.randn({ n, n }, { seed = 2 })
    autograd.no_grad(function()
      for _ = 1, 5 do
        local t0 = clock.now()
        local c = a:matmul(b)
        best = math.min(best, clock.now() - t0)
        c:free()
      end
    end)
    a:free(); b:free()
  end)
  p.flops.f32 = ok and 2 * n ^ 3 / math.max(best, 1e-9) or 20e9
  p.measure_error = not ok and tostring(why) or nil
  -- bf16 GEMMs convert to f32 on this backend (OpenBLAS has no sbgemm):
  -- no faster than f32.
  p.flops.bf16 = p.flops.bf16 or p.flops.f32
  p.flops.f16 = p.flops.f16 or p.flops.f32
  p.memory = (p.memory and p.memory > 0) and p.memory or meminfo_total() or 8 * GiB
  p.measured = true
  return p
end

-- Profile names by a substring of the CUDA device's name. A100s come in
-- 40 and 80 GB: the memory decides.
local CUDA_NAMES = {
  { 'H200', 'h200-141g' }, { 'H100', 'h100-80g' }, { 'L40S', 'l40s-48g' },
  { 'A100', function(gib) return gib and gib > 48 and 'a100-80g' or 'a100-40g' end },
}

-- The profile of a CUDA device from what the runtime calls it
-- (fsdp.cuda.status(): "NVIDIA H100 80GB HBM3 (sm_90, 79.1 GiB)"), or nil
-- for a GPU none of the profiles describes (MFU and plans then need a
-- profile named by the user).
function M.for_cuda(status)
  if type(status) ~= 'string' then return nil end
  local name = status:match('^(.-) %(sm_%d+') or status
  local gib = tonumber(status:match('([%d.]+) GiB%)$'))
  for _, entry in ipairs(CUDA_NAMES) do
    if name:find(entry[1], 1, true) then
      local profile = type(entry[2]) == 'function' and entry[2](gib) or entry[2]
      return M.get(profile)
    end
  end
  return nil
end

-- A profile from a JSON file: an object with a profile's fields, and
-- optionally "base", a known profile whose fields the others override,
-- e.g. {"base": "cpu", "inter_bw": 1.19e8, "node_inter_bw": 1.19e8} for
-- CPU nodes joined by 1 Gbit/s Ethernet (benchmarks/cluster_link.sh
-- writes one). Named after the file unless it says "name"; checked.
function M.load(path, where)
  where = where or 'fsdp.devices.load'
  local text, why = files.read(path, nil, 'a device profile')
  if not text then core.fail(('%s: cannot read device profile: %s'):format(where, why)) end
  local ok, fields = pcall(require('cjson').decode, text)
  if not ok or type(fields) ~= 'table' then
    core.fail(('%s: device profile %s is not a JSON object%s'):format(where, path,
      ok and '' or ' (' .. tostring(fields):gsub('^.-: ', '') .. ')'))
  end
  local p = {}
  if fields.base ~= nil then
    local base = M.get(fields.base, ('%s: %s: base'):format(where, path))
    for k, v in pairs(base) do
      if type(v) == 'table' then -- (flops: a copy, so the file's own leave the base alone)
        local copy = {}
        for kk, vv in pairs(v) do copy[kk] = vv end
        v = copy
      end
      p[k] = v
    end
  end
  for k, v in pairs(fields) do
    if k == 'flops' and type(v) == 'table' and p.flops then
      for kk, vv in pairs(v) do p.flops[kk] = vv end
    elseif k ~= 'base' then
      p[k] = v
    end
  end
  p.name = fields.name or path:match('([^/]+)%.json$') or path
  return M.check(p, ('%s: %s'):format(where, path))
end

-- The profile for a name, a table or a JSON file's path (checked); errors
-- list the known names.
function M.get(device, where)
  where = where or 'fsdp.devices'
  if type(device) == 'table' then return M.check(device, where) end
  if type(device) == 'string' and not M[device] and device:match('%.json$') then return M.load(device, where) end
  local p = type(device) == 'string' and not API[device] and M[device] or nil
  if type(p) ~= 'table' then
    core.fail(("%s: unknown device '%s' (known: %s; add one with fsdp.devices.add{...})"):format(
      where, tostring(device), table.concat(M.names(), ', ')))
  end
  p.name = p.name or device
  if device == 'cpu' then M.measure_cpu() end
  return M.check(p, where)
end

return M
