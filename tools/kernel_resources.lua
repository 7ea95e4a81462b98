-- tools/kernel_resources.lua: what each CUDA kernel costs the GPU that runs
-- it, read from ptxas's own report (nvcc --resource-usage), which the build
-- keeps beside every object as OBJECT.ptxas (mk/cuda.mk): registers per
-- thread, static shared memory, stack frame and register spills, per
-- architecture.
--
--   fsdp-lua tools/kernel_resources.lua                 the sm_90 table, every kernel
--   fsdp-lua tools/kernel_resources.lua --arch=sm_80    another architecture built
--   fsdp-lua tools/kernel_resources.lua --check         TAP: one line per source file;
--                                                       not ok on a spill or too much smem
--   fsdp-lua tools/kernel_resources.lua --dir=DIR       where the .ptxas files are
--                                                       (default build/obj/release/fsdp_cuda)
--
-- Why a check without a GPU: a spill turns register traffic into local
-- memory traffic in every thread of a kernel, and a kernel over the static
-- shared-memory limit does not launch; both are decided by ptxas at build
-- time, so CI sees them (docs/ARCHITECTURE.md, "Kernel resources").
-- Kernels allowed to spill are listed in ALLOWED with the reason.
local options = require 'fsdp.options'
local quote = require 'fsdp.quote'

local cfg = options.config({
  arch = { 'sm_90', 'the architecture to report (the build makes sm_80 and sm_90)' },
  dir = { 'build/obj/release/fsdp_cuda', 'where the build keeps OBJECT.ptxas' },
  check = { false, 'print TAP and exit 1 on a spill or a static shared memory over the limit' },
  smem_limit = { 48 * 1024, 'static shared memory per block that a kernel may use (bytes)' },
}, arg, 'tools/kernel_resources.lua')

-- Kernels allowed to spill, as Lua patterns over the demangled name, with
-- why. A new spill anywhere else fails --check.
local ALLOWED = {
  { '<double[,>]', 'an f64 instantiation (of any template arguments): f64 serves finite-difference checks, '
    .. 'not training, and needs twice the registers of the f32 one under the same launch bounds' },
  { 'rms_norm_dx_kernel<float, true>', 'add_rms_norm\'s backward for rows the vector path declines (misaligned or '
    .. 'strided): a third operand\'s lane walk beside rms_norm\'s; its own instance, so rms_norm\'s stays clean' },
  { 'rms_norm_dx_vec_kernel<2, 2, true>', 'add_rms_norm\'s backward for f16 x with an f16 weight (bf16 and f32, '
    .. 'the training dtypes, do not spill): 4 bytes' },
}

-- Demangled names of the mangled ones, through c++filt in one call.
local function demangle(names)
  if #names == 0 then return {} end
  local tmp = os.tmpname()
  local f = assert(io.open(tmp, 'w'))
  f:write(table.concat(names, '\n'), '\n')
  f:close()
  local p = assert(io.popen(quote.command({ 'c++filt' }) .. ' < ' .. quote.shell(tmp)))
  local out = {}
  for line in p:lines() do out[#out + 1] = line end
  p:close()
  os.remove(tmp)
  assert(#out == #names, 'c++filt gave ' .. #out .. ' names for ' .. #names)
  return out
end

-- The kernels of one report: { name, arch, registers, smem, stack, spill_stores, spill_loads }.
local function parse(path)
  local kernels, by_name, current = {}, {}, nil
  for line in io.lines(path) do
    local name, arch = line:match("Compiling entry function '([^']+)' for '(sm_%d+)'")
    if name then
      current = { name = name, arch = arch, registers = 0, smem = 0, stack = 0,
                  spill_stores = 0, spill_loads = 0 }
      kernels[#kernels + 1] = current
      by_name[name .. '@' .. arch] = current
    end
    local props = line:match('Function properties for (%S+)')
    if props then current = current and current.name == props and current or nil end
    local stack, stores, loads = line:match('(%d+) bytes stack frame, (%d+) bytes spill stores, (%d+) bytes spill loads')
    if stack and current then
      current.stack, current.spill_stores, current.spill_loads = tonumber(stack), tonumber(stores), tonumber(loads)
    end
    local regs = line:match('Used (%d+) registers')
    if regs and current then
      current.registers = tonumber(regs)
      current.smem = tonumber(line:match('(%d+) bytes smem') or 0)
      current = nil -- the entry's report ends with its usage line
    end
  end
  return kernels
end

local function ls(dir)
  local lfs = require 'lfs'
  local files = {}
  if lfs.attributes(dir, 'mode') ~= 'directory' then return files end
  for name in lfs.dir(dir) do
    if name:match('%.ptxas$') and lfs.attributes(dir .. '/' .. name, 'mode') == 'file' then
      files[#files + 1] = dir .. '/' .. name
    end
  end
  table.sort(files)
  return files
end

local files = ls(cfg.dir)
if #files == 0 then
  local why = cfg.dir .. ' has no .ptxas reports (the CUDA plugin is built by nvcc in the release '
    .. 'configuration: ./build.sh where the CUDA toolkit is)'
  if cfg.check then print('1..0 # SKIP ' .. why) os.exit(0) end
  io.stderr:write('kernel_resources: ', why, '\n')
  os.exit(1)
end

local rows, mangled = {}, {}
for _, f in ipairs(files) do
  local source = f:match('([^/]+)%.o%.ptxas$') or f
  for _, k in ipairs(parse(f)) do
    if k.arch == cfg.arch then
      k.source = source
      rows[#rows + 1] = k
      mangled[#mangled + 1] = k.name
    end
  end
end
local names = demangle(mangled)
for i, k in ipairs(rows) do k.pretty = names[i] end

local function allowed(k)
  for _, a in ipairs(ALLOWED) do
    if k.pretty:find(a[1]) then return a[2] end
  end
end

if cfg.check then
  local n, failed = 0, 0
  local by_source = {}
  for _, k in ipairs(rows) do
    by_source[k.source] = by_source[k.source] or {}
    table.insert(by_source[k.source], k)
  end
  local sources = {}
  for s in pairs(by_source) do sources[#sources + 1] = s end
  table.sort(sources)
  for _, s in ipairs(sources) do
    local bad = {}
    for _, k in ipairs(by_source[s]) do
      if (k.spill_stores > 0 or k.spill_loads > 0) and not allowed(k) then
        bad[#bad + 1] = ('%s spills %d bytes stored, %d loaded (%d registers)')
          :format(k.pretty, k.spill_stores, k.spill_loads, k.registers)
      end
      if k.smem > cfg.smem_limit then
        bad[#bad + 1] = ('%s uses %d bytes of static shared memory (limit %d)'):format(k.pretty, k.smem, cfg.smem_limit)
      end
    end
    n = n + 1
    if #bad == 0 then
      print(('ok %d - %s: %d kernels for %s, no spills, static shared memory within %d bytes')
        :format(n, s, #by_source[s], cfg.arch, cfg.smem_limit))
    else
      failed = failed + 1
      print(('not ok %d - %s: %d kernels for %s'):format(n, s, #by_source[s], cfg.arch))
      for _, b in ipairs(bad) do print('#   ' .. b) end
    end
  end
  print('1..' .. n)
  os.exit(failed == 0 and 0 or 1)
end

table.sort(rows, function(a, b)
  if a.source ~= b.source then return a.source < b.source end
  return a.pretty < b.pretty
end)
print(('%-22s %5s %7s %6s %7s  %s'):format('source (' .. cfg.arch .. ')', 'regs', 'smem', 'stack', 'spills', 'kernel'))
for _, k in ipairs(rows) do
  local spills = k.spill_stores + k.spill_loads
  print(('%-22s %5d %7d %6d %7s  %s%s'):format(k.source, k.registers, k.smem, k.stack,
    spills > 0 and (k.spill_stores .. '/' .. k.spill_loads) or '-', k.pretty:sub(1, 100),
    spills > 0 and allowed(k) and '  (allowed: f64)' or ''))
end
