-- tools/includes.lua: the core's include graph from its sources, and the two
-- rules docs/ARCHITECTURE.md ("Layers and the device interface") states
-- about it (tools/layers.lua checks the same layering from the objects'
-- calls; this checks it from the headers, which no call shows):
--   1. A device backend (core/cpu, core/cuda) includes only its own folder,
--      the device contract (core/backend), core/base, core/tensor and the
--      public header: never a header of the layers above it (ops, tape,
--      autograd, optim, sharding, dist/comm, ...). The kernel tables it
--      fills are declared in core/backend/backend.h, so ops own their
--      dispatch and backends own kernels.
--   2. No circle of includes between folders.
-- Reads every core/**.{c,cc,h,cu,cuh}; an include resolves by its basename
-- (the build refuses two sources with one basename, and no two headers
-- share one: a header that does is reported). Prints what breaks a rule,
-- and, with --counts, the edges from backends upward and the folder graph.
--
--   luajit tools/includes.lua [--counts]      (or fsdp-lua tools/includes.lua)
local graph = require 'tools.graph'

local counts = false
for _, a in ipairs(arg) do
  if a == '--counts' then counts = true end
end

local lines = graph.lines

local BACKENDS = { cpu = true, cuda = true }
-- What a backend may include besides its own folder.
local BACKEND_MAY = { include = true, base = true, backend = true, tensor = true }
-- Includes a backend keeps on purpose, each with its reason.
local EXCEPTIONS = {
  -- NCCL is the device library of the collectives layer: cuda_nccl.cu
  -- implements core/comm's fl_device_comm_ops (dist.h) inside the cuda
  -- plugin, which links NCCL; the collectives' contract stays with them.
  ['core/cuda/cuda_nccl.cu dist.h'] = true,
}

local files = lines({ 'find', 'core', '-name', '*.c', '-o', '-name', '*.cc', '-o', '-name', '*.h',
  '-o', '-name', '*.cu', '-o', '-name', '*.cuh' })
table.sort(files)
local by_base, bad = {}, 0
for _, p in ipairs(files) do
  local b = p:match('[^/]+$')
  if p:match('%.h$') or p:match('%.cuh$') then
    if by_base[b] then
      print(('two headers named %s: %s and %s'):format(b, by_base[b], p))
      bad = bad + 1
    end
    by_base[b] = p
  end
end

local function folder(p) return p:match('^core/([^/]+)/') end

-- File edges: src -> header path (resolved), per direct #include "...".
local edges = {}
for _, p in ipairs(files) do
  local f = assert(io.open(p, 'rb'))
  local out = {}
  for l in f:lines() do
    local inc = l:match('^%s*#%s*include%s+"([^"]+)"')
    if inc then
      local h = by_base[inc:match('[^/]+$')]
      if h then out[#out + 1] = h end
    end
  end
  f:close()
  edges[p] = out
end

-- Rule 1.
local upward = 0
for _, p in ipairs(files) do
  local a = folder(p)
  if BACKENDS[a] then
    for _, h in ipairs(edges[p]) do
      local b = folder(h)
      if b ~= a and not BACKEND_MAY[b] then
        if EXCEPTIONS[p .. ' ' .. h:match('[^/]+$')] then
          if counts then print(('backend includes above it (allowed): %s -> %s'):format(p, h)) end
        else
          print(('backend includes above it: %s -> %s'):format(p, h))
          upward = upward + 1
          bad = bad + 1
        end
      end
    end
  end
end

-- Rule 2: strongly connected components (Tarjan) of the folder graph.
local fsucc, fnodes = {}, {}
for p, hs in pairs(edges) do
  local a = folder(p)
  if a and not fsucc[a] then fsucc[a] = {}; fnodes[#fnodes + 1] = a end
  for _, h in ipairs(hs) do
    local b = folder(h)
    if a and b and b ~= a then
      fsucc[a][b] = fsucc[a][b] or {}
      table.insert(fsucc[a][b], p .. ' -> ' .. h)
    end
  end
end
table.sort(fnodes)
local circles = graph.sccs(fnodes, function(v) return fsucc[v] or {} end)
for _, comp in ipairs(circles) do
  print('include circle between folders: ' .. table.concat(comp, ' <-> '))
  local inside = {}
  for _, c in ipairs(comp) do inside[c] = true end
  for _, a in ipairs(comp) do
    for b, why in pairs(fsucc[a]) do
      if inside[b] then
        table.sort(why)
        for _, w in ipairs(why) do print('    ' .. w) end
      end
    end
  end
  bad = bad + 1
end

if counts then
  for _, a in ipairs(fnodes) do
    local bs = {}
    for b, why in pairs(fsucc[a]) do bs[#bs + 1] = ('%s (%d)'):format(b, #why) end
    table.sort(bs)
    print(('folder %s includes: %s'):format(a, #bs > 0 and table.concat(bs, ', ') or '-'))
  end
end
print(('%d files, %d include(s) from backends upward, %d folder circle(s), %d problem(s)')
  :format(#files, upward, #circles, bad))
os.exit(bad == 0 and 0 or 1)
