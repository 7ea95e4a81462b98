-- tools/layers.lua: the core's dependency graph from its object files, and
-- the two rules docs/ARCHITECTURE.md ("Layers") states about it:
--   1. core/tensor (with core/base and the device contract, core/backend)
--      is the ground floor: its files call no function defined above it
--      (backends, tape, ops, autograd, dist, ...). A
--      backend is reached only through its vtable, which is data, so the
--      built-in cpu backend's table does not count as a call.
--   2. No circle: no two files (and no two layers) call each other,
--      directly or around a loop, other than within one layer's files;
--      in core/comm not even there.
--   3. core/comm's own three layers ([Note: the layers of core/comm] in
--      core/comm/collectives.c): calls run from API to work to transport,
--      never back up, and every file of core/comm has one of them.
-- Reads `nm` of the release objects (build/obj/release/fsdp, and
-- fsdp_mpi and fsdp_cuda when those plugins are built), prints the circles
-- and the calls that break rules 1 and 3, and exits non-zero if there are
-- any.
--
--   luajit tools/layers.lua [OBJDIR...]      (or fsdp-lua tools/layers.lua)
--   luajit tools/layers.lua --files          also list file-level circles
--                                            within a layer
local graph = require 'tools.graph'

local dirs, list_files = {}, false
for _, a in ipairs(arg) do
  if a == '--files' then list_files = true else dirs[#dirs + 1] = a end
end
if #dirs == 0 then
  dirs = { 'build/obj/release/fsdp', 'build/obj/release/fsdp_mpi', 'build/obj/release/fsdp_cuda' }
end

local lines = graph.lines

-- Object basename -> source path (premake names objects by basename; the
-- build refuses two sources with one basename).
local source_of = {}
for _, p in ipairs(lines({ 'find', 'core', '-name', '*.c', '-o', '-name', '*.cu' })) do
  local base = p:match('([^/]+)%.cu?$')
  source_of[base] = p
end

local defined, kind_of, uses = {}, {}, {}
local objects = 0
for _, dir in ipairs(dirs) do
  -- (./ keeps a directory named -x from reading as an option of find)
  local objs = lines({ 'find', dir:match('^%-') and './' .. dir or dir, '-maxdepth', '1', '-name', '*.o' })
  table.sort(objs)
  for _, obj in ipairs(objs) do
    local base = obj:match('([^/]+)%.o$'):gsub('%.cu$', ''):gsub('%.sim$', '')
    local src = source_of[base]
    if src then
      objects = objects + 1
      uses[src] = uses[src] or {}
      for _, l in ipairs(lines({ 'nm', obj })) do
        local t, name = l:match('^%x*%s+(%a)%s+(%S+)$')
        if t == 'U' then
          uses[src][name] = true
        elseif t and t:match('[TDRB]') then
          defined[name] = src
          kind_of[name] = t
        end
      end
    end
  end
end
if objects == 0 then
  io.stderr:write('layers.lua: no objects in ' .. table.concat(dirs, ', ') .. ' (build first)\n')
  os.exit(2)
end

-- A layer is a folder of core/: the recording of autograd's nodes
-- (core/tape) sits below ops, its engine (core/autograd: it runs ops to sum
-- gradients) above them.
local function layer(src) return src:match('^core/([^/]+)/') end

-- Folders whose files must not call each other in a circle even within
-- their layer (rule 2): the others' in-layer circles are only listed
-- (--files).
local no_file_circles = { comm = true }

-- Rule 3: core/comm's layers, bottom first, and the layer of each file.
local comm_layers = { 'transport', 'work', 'API' }
local comm_layer_of = {
  ['core/comm/transport.c'] = 1, ['core/comm/communicator.c'] = 1,
  ['core/comm/device_path.c'] = 1, ['core/comm/backend_self.c'] = 1,
  ['core/comm/mpi/backend_mpi.c'] = 1, ['core/comm/mpi/ring.c'] = 1,
  ['core/comm/work.c'] = 2,
  ['core/comm/dist.c'] = 3, ['core/comm/group.c'] = 3, ['core/comm/collectives.c'] = 3,
  ['core/comm/monitored_barrier.c'] = 3,
}

-- File graph: a -> b when a calls a function of b (data references, the
-- vtables and kernel tables, are how layers reach upward on purpose).
local edges, callers = {}, {}
for src, names in pairs(uses) do
  edges[src] = {}
  for name in pairs(names) do
    local d = defined[name]
    if d and d ~= src and kind_of[name] == 'T' then
      edges[src][d] = edges[src][d] or {}
      table.insert(edges[src][d], name)
    end
  end
end

local sccs = graph.sccs

local bad = 0

-- Rule 1.
local ground = { base = true, backend = true, tensor = true }
for _, src in ipairs((function() local t = {} for s in pairs(edges) do t[#t + 1] = s end table.sort(t) return t end)()) do
  if layer(src) == 'tensor' then
    for d, names in pairs(edges[src]) do
      if not ground[layer(d)] then
        table.sort(names)
        print(('tensor calls above it: %s -> %s (%s)'):format(src, d, table.concat(names, ', ')))
        bad = bad + 1
      end
    end
  end
end

-- Rule 2, between layers.
local lnodes, lsucc = {}, {}
for src, out in pairs(edges) do
  local a = layer(src)
  if not lsucc[a] then lsucc[a] = {}; lnodes[#lnodes + 1] = a end
  for d in pairs(out) do
    local b = layer(d)
    if b ~= a then lsucc[a][b] = true end
  end
end
for _, comp in ipairs(sccs(lnodes, function(v) return lsucc[v] or {} end)) do
  print('circle between layers: ' .. table.concat(comp, ' <-> '))
  for _, a in ipairs(comp) do
    for src, out in pairs(edges) do
      if layer(src) == a then
        for d, names in pairs(out) do
          local b = layer(d)
          for _, c in ipairs(comp) do
            if b == c and b ~= a then
              table.sort(names)
              print(('    %s -> %s (%s)'):format(src, d, table.concat(names, ', ')))
            end
          end
        end
      end
    end
  end
  bad = bad + 1
end

-- Rule 2, between files of different layers.
local fnodes = {}
for src in pairs(edges) do fnodes[#fnodes + 1] = src end
for _, comp in ipairs(sccs(fnodes, function(v) return edges[v] or {} end)) do
  local layers = {}
  for _, f in ipairs(comp) do layers[layer(f)] = true end
  local n = 0
  for _ in pairs(layers) do n = n + 1 end
  local strict = n == 1 and no_file_circles[layer(comp[1])]
  if n > 1 or strict or list_files then
    print(('circle between files%s: %s'):format(n > 1 and '' or ' (one layer)', table.concat(comp, ' <-> ')))
    if n > 1 or strict then bad = bad + 1 end
  end
end

-- Rule 3.
local comm_files = {}
for src in pairs(edges) do
  if layer(src) == 'comm' then comm_files[#comm_files + 1] = src end
end
table.sort(comm_files)
for _, src in ipairs(comm_files) do
  local from = comm_layer_of[src]
  if not from then
    print(('%s has no layer of core/comm (name it in tools/layers.lua, comm_layer_of)'):format(src))
    bad = bad + 1
  else
    for d, names in pairs(edges[src]) do
      local to = comm_layer_of[d]
      if to and to > from then
        table.sort(names)
        print(('core/comm calls up a layer: %s (%s) -> %s (%s) (%s)'):format(src, comm_layers[from], d,
          comm_layers[to], table.concat(names, ', ')))
        bad = bad + 1
      end
    end
  end
end

print(('%d object files, %d problem(s)'):format(objects, bad))
os.exit(bad == 0 and 0 or 1)
