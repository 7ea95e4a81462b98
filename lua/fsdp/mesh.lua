-- fsdp.mesh: a device mesh, the ranks of the job arranged in named
-- dimensions, so two kinds of parallelism can each take their own groups:
-- tensor parallelism (tp) inside a node, fully sharded data parallelism
-- (dp_shard) and replication (dp_replicate, HSDP's replicas) across.
--
--   local mesh = require('fsdp.mesh').new({ dp_replicate = 1, dp_shard = 2, tp = 2 })
--   print(mesh)                      -- mesh dp_replicate 1 x dp_shard 2 x tp 2 (rank 3: 0,1,1)
--   mesh:size('tp'), mesh:coordinate('dp'), mesh:group('dp_shard')
--   fsdp.shard(model, { mesh = mesh, strategy = 'FULL_SHARD' })
--
-- [Note: the device mesh]
-- Dimensions are ordered outermost -> innermost: dp_replicate, dp_shard,
-- tp. Ranks are laid out node by node (sorted by node, then local rank,
-- which is the world order under mpirun and srun), and mesh position p has
-- coordinates (p // (S*T), (p // T) % S, p % T): a TP group is T
-- consecutive positions, inside one node as long as T divides the ranks
-- per node (checked). 'dp' is the flattened dp_replicate x dp_shard
-- (coordinate replicate*S + shard): the data-parallel ranks, the ones that
-- see different batches; the ranks of one TP group see the same batch.
-- Every group is made when the mesh is built, collectively, in one fixed
-- order (dp_replicate, dp_shard, tp, dp), and each group's rank is the
-- coordinate along its dimension.
--
-- [Note: data-parallel rank and size]
-- What reduces "over the data-parallel ranks" (data samplers' rank and
-- world, the step's token count and loss, metrics) asks M.data_parallel_rank(),
-- M.data_parallel_size() and M.data_parallel_group(): with no current mesh
-- (M.set_current) they are the world's, so a run without a mesh is what it
-- always was; with one they are its 'dp' coordinate, size and group.
local core = require 'fsdp.core'
local dist = require 'fsdp.dist'
local Tensor = require 'fsdp.tensor'
local ffi, C = core.ffi, core.C

local M = {}

-- The dimensions, outermost first.
M.DIMS = { 'dp_replicate', 'dp_shard', 'tp' }
local KNOWN = { dp_replicate = true, dp_shard = true, tp = true }
-- What mesh:size/coordinate/group accept.
local QUERY = { dp_replicate = true, dp_shard = true, tp = true, dp = true }

local Mesh = {}
Mesh.__index = Mesh
Mesh.__name = 'Mesh'
M.Mesh = Mesh

local function fail(fmt, ...) core.fail('fsdp.mesh: ' .. fmt:format(...)) end

local function is_size(v) return type(v) == 'number' and v >= 1 and v == math.floor(v) and v < 2^31 end

-- The sizes a spec {dp_replicate=, dp_shard=, tp=} stands for on a world of
-- `world` ranks: omitted sizes are 1, except an omitted dp_shard, which
-- takes what the others leave (world / (dp_replicate * tp)). Checks names and sizes; returns {dp_replicate=, dp_shard=,
-- tp=}. Shared by M.new and the planner (fsdp.plan's `mesh` option), which
-- plans for worlds it does not run in. `who` names the caller in errors.
function M.resolve_sizes(spec, world, who)
  who = who or 'fsdp.mesh'
  local function bad(fmt, ...) core.fail(who .. ': ' .. fmt:format(...)) end
  if type(spec) ~= 'table' then bad('expected a table {dp_replicate=, dp_shard=, tp=}, got %s', type(spec)) end
  for k, v in pairs(spec) do
    if not KNOWN[k] then
      bad("unknown mesh dimension '%s' (known: %s)", tostring(k), table.concat(M.DIMS, ', '))
    end
    if not is_size(v) then bad('mesh dimension %s must be a positive integer, got %s', k, tostring(v)) end
  end
  local sizes = { dp_replicate = spec.dp_replicate or 1, dp_shard = spec.dp_shard, tp = spec.tp or 1 }
  local infer = spec.dp_shard == nil and 'dp_shard' or nil
  local known = sizes.dp_replicate * sizes.tp * (sizes.dp_shard or 1)
  if infer then
    if world % known ~= 0 then
      bad('the world\'s %d rank%s do not split into dp_replicate %d x tp %d (%d ranks) times a whole dp_shard',
        world, world == 1 and '' or 's', sizes.dp_replicate, sizes.tp, known)
    end
    sizes[infer] = world / known
  elseif known ~= world then
    bad('mesh dp_replicate %d x dp_shard %d x tp %d is %d ranks, but the world has %d', sizes.dp_replicate,
      sizes.dp_shard, sizes.tp, known, world)
  end
  return sizes
end

-- Each rank's node, local rank and node size, gathered (collective).
local function placements()
  local world = dist.world_size()
  local mine = Tensor.wrap(C.fl_empty(1, ffi.new('int64_t[1]', 3), C.FL_I64, core.device('cpu')))
  local p = ffi.cast('int64_t *', Tensor.cptr(mine).data)
  p[0], p[1], p[2] = dist.node(), dist.local_rank(), dist.local_size()
  local all = world > 1 and dist.all_gather(mine) or mine
  local a = ffi.cast('const int64_t *', Tensor.cptr(all).data)
  local out = {}
  for r = 0, world - 1 do
    out[r + 1] = { rank = r, node = tonumber(a[3 * r]), local_rank = tonumber(a[3 * r + 1]),
                   local_size = tonumber(a[3 * r + 2]) }
  end
  return out
end

-- mesh.new(spec): the mesh of this job's world (collective: every rank
-- calls it with the same spec). See [Note: the device mesh].
function M.new(spec)
  local world = dist.world_size()
  -- Ranks agree on the spec first (before any check that could fail on
  -- some ranks only): the same error everywhere, or the same mesh.
  local shown = {}
  if type(spec) == 'table' then
    for k, v in pairs(spec) do shown[tostring(k)] = type(v) == 'number' and v or tostring(v) end
  end
  dist.agree('the device mesh (fsdp.mesh.new)', { spec = shown })
  local sizes = M.resolve_sizes(spec, world, 'fsdp.mesh')
  local R, S, T = sizes.dp_replicate, sizes.dp_shard, sizes.tp
  local places = placements()
  local nodes = {}
  for _, pl in ipairs(places) do nodes[pl.node] = pl.local_size end
  local n_nodes = 0
  for _ in pairs(nodes) do n_nodes = n_nodes + 1 end
  if n_nodes > 1 and T > 1 then
    for node, size in pairs(nodes) do
      if size % T ~= 0 then
        fail('tp %d does not divide the %d ranks of node %d: a tensor-parallel group must not straddle nodes '
          .. '(its collectives run every layer); use a tp that divides the ranks per node', T, size, node)
      end
    end
  end
  table.sort(places, function(a, b)
    if a.node ~= b.node then return a.node < b.node end
    return a.local_rank < b.local_rank
  end)
  local self = setmetatable({ sizes = { dp_replicate = R, dp_shard = S, tp = T, dp = R * S }, world = world,
                              ranks = {}, nodes = n_nodes }, Mesh)
  for p, pl in ipairs(places) do self.ranks[p] = pl.rank end -- mesh position p - 1 -> world rank
  local me = dist.rank()
  local pos
  for p, r in ipairs(self.ranks) do if r == me then pos = p - 1 end end
  self.position = pos
  local c = { dp_replicate = math.floor(pos / (S * T)), dp_shard = math.floor(pos / T) % S, tp = pos % T }
  c.dp = c.dp_replicate * S + c.dp_shard
  self.coords = c
  -- The groups, in one fixed order. A group holds the ranks whose other
  -- coordinates equal this rank's: color = the position with this
  -- dimension's coordinate zeroed (dp: the tp coordinate), key = the
  -- coordinate, so the group's rank is the coordinate.
  local strides = { dp_replicate = S * T, dp_shard = T, tp = 1 }
  self.groups = {}
  for _, d in ipairs(M.DIMS) do
    self.groups[d] = dist.split(pos - c[d] * strides[d], { key = c[d], name = 'mesh ' .. d })
  end
  self.groups.dp = dist.split(c.tp, { key = c.dp, name = 'mesh dp' })
  return self
end

local function check_dim(dim, what)
  if not QUERY[dim] then
    fail("%s: unknown dimension '%s' (known: dp_replicate, dp_shard, tp, dp)", what, tostring(dim))
  end
end

-- The number of ranks along dim ('dp': dp_replicate x dp_shard).
function Mesh:size(dim)
  check_dim(dim, 'size')
  return self.sizes[dim]
end

-- This rank's 0-based index along dim ('dp': replicate * dp_shard + shard).
function Mesh:coordinate(dim)
  check_dim(dim, 'coordinate')
  return self.coords[dim]
end

-- The fsdp.dist Group of the ranks that differ from this one only along
-- dim ('dp': along dp_replicate and dp_shard); its rank is the coordinate.
function Mesh:group(dim)
  check_dim(dim, 'group')
  return self.groups[dim]
end

-- {{name=, size=}...}, outermost first.
function Mesh:dims()
  local out = {}
  for i, d in ipairs(M.DIMS) do out[i] = { name = d, size = self.sizes[d] } end
  return out
end

-- The world rank at a mesh coordinate {dp_replicate=, dp_shard=, tp=}
-- (missing ones 0).
function Mesh:rank_at(coord)
  local s = self.sizes
  local p = ((coord.dp_replicate or 0) * s.dp_shard + (coord.dp_shard or 0)) * s.tp + (coord.tp or 0)
  return self.ranks[p + 1]
end

Mesh.__tostring = function(m)
  local parts = {}
  for i, d in ipairs(M.DIMS) do parts[i] = ('%s %d'):format(d, m.sizes[d]) end
  return ('mesh %s (rank %d: %d,%d,%d)'):format(table.concat(parts, ' x '), dist.rank(), m.coords.dp_replicate,
    m.coords.dp_shard, m.coords.tp)
end

function M.is_mesh(x) return getmetatable(x) == Mesh end

-- the current mesh and the data-parallel ranks ([Note: data-parallel rank and size]) ----

local current

-- Make `mesh` the job's mesh (nil: none), what the data-parallel
-- functions below answer from. Recipes set it right after building it.
function M.set_current(mesh)
  if mesh ~= nil and not M.is_mesh(mesh) then
    fail('set_current: expected a mesh from fsdp.mesh.new, got %s', type(mesh))
  end
  current = mesh
end

function M.current() return current end

-- This rank's index among the data-parallel ranks (ranks of one TP group
-- share it), and their number.
function M.data_parallel_rank() return current and current.coords.dp or dist.rank() end
function M.data_parallel_size() return current and current.sizes.dp or dist.world_size() end
-- The Group of the data-parallel ranks holding this rank's TP coordinate
-- (nil: the world).
function M.data_parallel_group() return current and current.groups.dp or nil end

return M
