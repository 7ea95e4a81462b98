-- fsdp.dist: process groups and collectives (the C side is core/comm/).
--
--   local dist = require('fsdp').dist
--   dist.init()                                  -- optional: first use does it
--   dist.print('world', dist.world_size())       -- "[rank 1] world 4"
--   local full = dist.all_gather(shard)          -- concatenation over ranks
--   local work = dist.reduce_scatter(grad, {op = 'avg', async = true})
--   ... compute while the data moves ...
--   local mine = work:wait()
--
-- A plain `fsdp-lua x.lua` is one rank on the `self` transport (collectives
-- are copies); under mpirun / srun / `fsdp-lua --nproc N` the `mpi`
-- transport is loaded. Every rank must call the same collectives on a group in the
-- same order, and creating a group is itself collective (every rank calls,
-- members or not). Tensors are contiguous, on one device: cpu, or cuda
-- (through NCCL when every rank can use it, else through copies in CPU memory:
-- group:device_library() says which); meta and fake ones are checked and
-- left alone. Options shared by the collectives:
--   group  a Group (default: the world)
--   async  true: return a Work at once (w:wait() -> the result, w:test())
--   op     'sum' (default), 'avg' (floats), 'max', 'min'
--   out    a preallocated output (all_gather, reduce_scatter)
-- Waits fail after the collective timeout (FSDP_COLLECTIVE_TIMEOUT seconds,
-- default 600; dist.set_timeout) naming the collective, group and rank.
local core = require 'fsdp.core'
local Tensor = require 'fsdp.tensor'
local tables = require 'fsdp.tables'
local ffi, C = core.ffi, core.C
local cptr = Tensor.cptr

local M = {}

-- runtime -------------------------------------------------------------------

-- Start the transport (idempotent; every other function does it on first use).
function M.init()
  core.check(C.fl_dist_init())
  return M
end

-- Whether the process group is set up (dist.init, or any first use, did it).
function M.is_initialized() return C.fl_dist_is_initialized() end

-- The transport the collectives take: 'self' or 'mpi' ("backend" is a
-- device's: docs/ARCHITECTURE.md, "Names"). M.backend is its old name,
-- kept for scripts.
function M.transport()
  local name = C.fl_dist_transport_name()
  if name == nil then core.raise() end
  return ffi.string(name)
end
M.backend = M.transport

local function getter(fn)
  return function()
    local v = fn()
    if v < 0 then core.raise() end
    return v
  end
end

-- This process's rank in the world, 0 ... world_size() - 1.
M.rank = getter(C.fl_dist_rank)
-- The number of ranks in the job (1 outside a launcher).
M.world_size = getter(C.fl_dist_world_size)
-- This rank's index on its node and the node's rank count; the node's
-- index and the node count (FSDP_RANKS_PER_NODE=n makes blocks of n
-- consecutive ranks act as nodes).
M.local_rank = getter(C.fl_dist_local_rank)
-- The number of ranks on this rank's node.
M.local_size = getter(C.fl_dist_local_size)
-- This rank's node index, 0 ... nodes() - 1.
M.node = getter(C.fl_dist_node)
-- The number of nodes in the job (FSDP_RANKS_PER_NODE=n makes blocks of n
-- ranks act as nodes).
M.nodes = getter(C.fl_dist_nodes)

-- The rank the launcher assigned (from its environment, nothing started),
-- or nil outside a launcher.
function M.launcher_rank()
  local r = C.fl_dist_launcher_rank()
  return r >= 0 and r or nil
end

-- Seconds a wait may last before it fails.
function M.timeout() return C.fl_dist_timeout() end
-- dist.set_timeout(seconds): how long a wait may last before it fails
-- naming the collective (default FSDP_COLLECTIVE_TIMEOUT, else 600 s).
function M.set_timeout(seconds)
  if type(seconds) ~= 'number' then
    core.fail(('set_timeout: expected seconds as a number, got %s'):format(type(seconds)))
  end
  core.check(C.fl_dist_set_timeout(seconds))
end

-- Shut the transport down now (otherwise it happens at exit).
function M.finalize() C.fl_dist_finalize() end

-- print(...) prefixed with "[rank r] " so interleaved output says who spoke.
function M.print(...)
  local parts = {}
  for i = 1, select('#', ...) do parts[i] = tostring((select(i, ...))) end
  io.stdout:write(('[rank %d] %s\n'):format(M.rank(), table.concat(parts, '\t')))
  io.stdout:flush()
end

-- groups ----------------------------------------------------------------------

local Group = {}
Group.__index = Group
M.Group = Group

local function wrap_group(ptr)
  if ptr == nil then core.raise() end
  return setmetatable({ _c = ffi.gc(ptr, C.fl_group_release) }, Group)
end

function Group:is_member() return self._plan ~= nil or C.fl_group_is_member(self._c) end
-- Rank inside the group (-1 outside it) and the member count (0 outside).
function Group:rank() return self._plan and self._plan.rank or C.fl_group_rank(self._c) end
function Group:size() return self._plan and self._plan.size or C.fl_group_size(self._c) end
-- How the group moves cuda tensors: 'nccl', 'host copies' or 'undecided'
-- (before its first collective on them).
function Group:device_library()
  return self._plan and 'none (planning)' or ffi.string(C.fl_group_device_library(self._c))
end
function Group:name() return self._plan and self._plan.name or ffi.string(C.fl_group_name(self._c)) end
-- The world ranks of the members, in group order.
function Group:ranks()
  if self._plan then
    local r = {}
    for i = 1, self._plan.size do r[i] = i - 1 end
    return r
  end
  local r = {}
  for i = 0, self:size() - 1 do r[i + 1] = C.fl_group_world_rank(self._c, i) end
  return r
end
Group.__tostring = function(g)
  if not g:is_member() then return ('Group(%s, not a member)'):format(g:name()) end
  return ('Group(%s, rank %d of %d, world ranks {%s})'):format(
    g:name(), g:rank(), g:size(), table.concat(g:ranks(), ', '))
end

local world_group
-- The Group of every rank (what collectives use without a `group` option).
function M.world()
  if not world_group then world_group = wrap_group(C.fl_group_world()) end
  return world_group
end

-- [Note: planning groups]
-- A planning group stands for a group of `size` ranks that this process
-- is not part of (fsdp.plan traces what tensor parallelism's rank `rank`
-- would run, on meta tensors, without a job of that size). It is a Group
-- (so fsdp.tp takes it as it takes any), whose collectives take only meta
-- and fake tensors, move nothing, and append one record per call to
-- group.log: { kind = 'all_reduce' | 'all_gather' | 'reduce_scatter' |
-- 'broadcast', bytes = the buffer as a backend would get it (an
-- all-gather's gathered output, a reduce-scatter's whole input; as
-- collective_stats counts), size = the group size }. It makes no C group
-- and takes no part in any collective of the job.
--
-- fsdp.dist.planning_group(size, {rank =, name =}): a planning group of
-- `size` ranks as seen by rank `rank` (default 0), called `name` in
-- messages (default 'planning(<size>)').
function M.planning_group(size, opts)
  opts = opts or {}
  if type(size) ~= 'number' or size < 1 or size ~= math.floor(size) then
    core.fail(('planning_group: size must be a positive integer, got %s'):format(tostring(size)))
  end
  local rank = opts.rank or 0
  if type(rank) ~= 'number' or rank < 0 or rank >= size or rank ~= math.floor(rank) then
    core.fail(('planning_group: rank must be an integer in [0, %d), got %s'):format(size, tostring(rank)))
  end
  local g = setmetatable({ _plan = { size = size, rank = rank, name = opts.name or ('planning(%d)'):format(size) } },
                         Group)
  g.log = {}
  return g
end

function Group:is_planning() return self._plan ~= nil end

-- A group of the given world ranks (0-based, group order). Collective over
-- the world; ranks outside the list get a group that is not a member.
function M.new_group(ranks)
  if type(ranks) ~= 'table' or #ranks == 0 then
    core.fail('new_group: expected a non-empty list of world ranks')
  end
  local arr = ffi.new('int[?]', #ranks)
  for i, r in ipairs(ranks) do
    if type(r) ~= 'number' or r ~= math.floor(r) then
      core.fail(('new_group: entry %d is %s, expected an integer rank'):format(i, tostring(r)))
    end
    arr[i - 1] = r
  end
  return wrap_group(C.fl_group_new(#ranks, arr))
end

-- Split a group (default the world) by color, MPI_Comm_split style: ranks
-- with equal colors form a group ordered by key; a negative color or nil
-- opts out. opts: group, key (default: the rank), name.
function M.split(color, opts)
  opts = opts or {}
  local parent = opts.group and opts.group._c or nil
  return wrap_group(C.fl_group_split(parent, color or -1, opts.key or M.rank(), opts.name))
end

-- The groups of hybrid sharding: shard (the ranks of this node) and
-- replicate (the ranks with this local rank on every node).
function M.hybrid_groups()
  local s, r = ffi.new('fl_group*[1]'), ffi.new('fl_group*[1]')
  core.check(C.fl_group_hybrid(s, r))
  return wrap_group(s[0]), wrap_group(r[0])
end

-- works --------------------------------------------------------------------------

local Work = {}
Work.__index = Work
M.Work = Work

local done_buf = ffi.new('bool[1]')

-- Block until the collective completed; returns its result tensor.
function Work:wait()
  core.check(C.fl_work_wait(self._w))
  return self.result
end

-- Progress it; true once it completed.
function Work:test()
  core.check(C.fl_work_test(self._w, done_buf))
  return done_buf[0]
end

function Work:is_completed() return C.fl_work_is_completed(self._w) end
function Work:name() return ffi.string(C.fl_work_name(self._w)) end
Work.__tostring = function(w)
  return ('Work(%s, %s)'):format(w:name(), w:is_completed() and 'completed' or 'in flight')
end

-- A started collective: a Work when async, else waited for and released.
local function finish(ptr, result, opts)
  if ptr == nil then core.raise() end
  if opts.async then
    return setmetatable({ _w = ffi.gc(ptr, C.fl_work_release), result = result }, Work)
  end
  local rc = C.fl_work_wait(ptr)
  C.fl_work_release(ptr)
  if rc ~= 0 then core.raise() end
  return result
end

-- collectives ----------------------------------------------------------------------

local reduce_ops = { sum = C.FL_REDUCE_SUM, avg = C.FL_REDUCE_AVG, mean = C.FL_REDUCE_AVG,
                     max = C.FL_REDUCE_MAX, min = C.FL_REDUCE_MIN }

local function reduce_op(name, what)
  local op = reduce_ops[name or 'sum']
  if not op then
    core.fail(("%s: unknown op '%s' (expected 'sum', 'avg', 'max' or 'min')"):format(
      what, tostring(name)))
  end
  return op
end

local function options(opts, what)
  if opts == nil then return {} end
  if type(opts) ~= 'table' or getmetatable(opts) ~= nil then
    core.fail(('%s: expected an options table, got %s'):format(what, type(opts)))
  end
  return opts
end

-- The Group of opts.group (nil for the world).
local function group_obj(opts)
  local g = opts.group
  if g ~= nil and getmetatable(g) ~= Group then
    core.fail(('group option: expected a Group from fsdp.dist, got %s'):format(type(g)))
  end
  return g
end

-- The C group of opts.group, or NULL for the world.
local function group_of(opts)
  local g = group_obj(opts)
  return g and g._c or nil
end

-- opts.group when it is a planning group ([Note: planning groups]): then
-- `what` on t (meta or fake only) is recorded with `bytes`, and the caller
-- returns without a backend.
local function planned(opts, what, t, bytes)
  local g = opts.group
  if getmetatable(g) ~= Group or g._plan == nil then return false end -- (a wrong group fails where it is checked)
  if not (t:is_meta() or t:is_fake()) then
    core.fail(('%s: the planning group %s moves no data: it takes meta or fake tensors, got a %s tensor'):format(
      what, g:name(), t.device))
  end
  if opts.async then core.fail(('%s: the planning group %s has no async collectives'):format(what, g:name())) end
  if g._plan.size > 1 then
    g.log[#g.log + 1] = { kind = what, bytes = bytes, size = g._plan.size }
  end
  return true
end

local function nbytes(t) return t:numel() * tonumber(C.fl_dtype_size(cptr(t).dtype)) end

local function group_size(opts)
  local g = group_obj(opts)
  return g and g:size() or M.world_size()
end

-- A new tensor like t (meta stays meta, fake stays fake) with shape.
local function like(t, shape)
  local n, arr = core.shape_args(shape)
  local c = cptr(t)
  local make = t:is_fake() and C.fl_fake or C.fl_empty
  return Tensor.wrap(make(n, arr, c.dtype, c.device))
end

-- The concatenation of every group rank's t along dim 0 (a 0-d t gives a
-- 1-d result): world * t:size(0) rows. opts (as every collective's):
-- group (the world: a Group from dist.new_group), async (false: true
-- returns a Work at once, whose :wait() gives the result), out (a new
-- tensor: the tensor to write the result into).
function M.all_gather(t, opts)
  opts = options(opts, 'all_gather')
  local out = opts.out
  if not out then
    local shape, size = t.shape, group_size(opts)
    if #shape == 0 then shape = { size } else shape[1] = shape[1] * size end
    out = like(t, shape)
  end
  if planned(opts, 'all_gather', t, nbytes(out)) then return out end
  return finish(C.fl_all_gather_into(group_of(opts), cptr(out), cptr(t)), out, opts)
end

-- Rank r gets the reduction (opts.op) over ranks of chunk r of t, where t
-- splits into group-size chunks along dim 0 (or flat, when dim 0 does not
-- divide). opts: op ('sum'; 'avg', 'max', 'min'), group, async, out as
-- dist.all_gather's.
function M.reduce_scatter(t, opts)
  opts = options(opts, 'reduce_scatter')
  local op = reduce_op(opts.op, 'reduce_scatter')
  local out = opts.out
  if not out then
    local shape, size = t.shape, group_size(opts)
    if #shape >= 1 and shape[1] % size == 0 then
      shape[1] = shape[1] / size
    elseif t:numel() % size == 0 then
      shape = { t:numel() / size }
    else
      core.fail(('reduce_scatter: %d elements do not split into %d equal chunks'):format(
        t:numel(), size))
    end
    out = like(t, shape)
  end
  if planned(opts, 'reduce_scatter', t, nbytes(t)) then return out end
  return finish(C.fl_reduce_scatter(group_of(opts), cptr(out), cptr(t), op), out, opts)
end

-- t = the reduction of t over the group, in place; returns t. opts: op
-- ('sum'; 'avg', 'max', 'min'), group, async as dist.all_gather's.
function M.all_reduce(t, opts)
  opts = options(opts, 'all_reduce')
  local op = reduce_op(opts.op, 'all_reduce')
  if planned(opts, 'all_reduce', t, nbytes(t)) then return t end
  return finish(C.fl_all_reduce(group_of(opts), cptr(t), op), t, opts)
end

-- t = group rank root's t (default 0), in place; returns t.
function M.broadcast(t, root, opts)
  if type(root) == 'table' and opts == nil then root, opts = nil, root end
  opts = options(opts, 'broadcast')
  if planned(opts, 'broadcast', t, nbytes(t)) then return t end
  return finish(C.fl_broadcast(group_of(opts), cptr(t), root or 0), t, opts)
end

-- How many collectives of each kind this process has started that move
-- data between ranks (groups of one and empty tensors do not count):
-- {all_gather =, reduce_scatter =, all_reduce =, broadcast =, barrier =}.
-- Tests take differences of two calls to count a step's communication.
function M.collective_counts()
  local r = {}
  for k, s in pairs(M.collective_stats()) do r[k] = s.calls end
  return r
end

local stats_out = ffi.new('int64_t[2]')
local stats_seconds = ffi.new('double[2]')

-- What this process's collectives moved since it started, by kind:
-- { all_gather = { calls =, bytes =, wait_s =, busy_s = }, ..., any = {...} }.
-- bytes are the buffers as the transport got them (an all_gather's gathered
-- output, a reduce_scatter's whole input; 16-bit reductions through MPI
-- count as f32, their staging); wait_s the seconds the process spent blocked
-- waiting for them: communication that compute did not hide; busy_s the
-- seconds during which at least one was in flight on the mpi transport:
-- the link's time, hidden or not (core/comm/mpi/backend_mpi.c, [Note: busy
-- time]). `any` sums the kinds, its busy_s counting overlapping
-- collectives of different kinds once (fl_dist_collective_stats).
-- Differences of two calls give one step's.
function M.collective_stats()
  local r = {}
  for _, k in ipairs({ 'all_gather', 'reduce_scatter', 'all_reduce', 'broadcast', 'barrier', 'any' }) do
    core.check(C.fl_dist_collective_stats(k, stats_out, stats_out + 1, stats_seconds, stats_seconds + 1))
    r[k] = { calls = tonumber(stats_out[0]), bytes = tonumber(stats_out[1]), wait_s = stats_seconds[0],
             busy_s = stats_seconds[1] }
  end
  return r
end

local KIND_NAMES = { [0] = 'all_gather', 'reduce_scatter', 'all_reduce', 'broadcast', 'barrier' }
local log_buf = ffi.new('fl_coll_record[256]')
local log_lost = ffi.new('int64_t[1]')

-- The collectives this process saw complete since the previous call, as
-- the mpi transport logged them (core/comm/mpi/backend_mpi.c, [Note:
-- joined time]), oldest first: { comm =, sequence =, kind = 'all_gather',
-- start =, finish = } (comm and sequence name one collective alike on all
-- its members; start and finish are seconds on world rank 0's monotonic
-- clock), and how many older records the transport dropped unread (it keeps
-- the newest FL_COLL_LOG_CAPACITY). Empty on one process.
-- fsdp.observe.joined turns the logs of all ranks into communication time.
function M.collective_log()
  local out, lost = {}, 0
  repeat
    local n = C.fl_dist_collective_log(log_buf, 256, log_lost)
    if n < 0 then core.raise() end
    lost = lost + tonumber(log_lost[0])
    for i = 0, n - 1 do
      local r = log_buf[i]
      out[#out + 1] = { comm = tonumber(r.comm), sequence = tonumber(r.sequence), kind = KIND_NAMES[tonumber(r.kind)],
                        start = r.start, finish = r['end'] }
    end
  until n < 256
  return out, lost
end

-- Wait until every rank of the group (opts.group, the world by default)
-- has arrived; opts.async as dist.all_gather's.
function M.barrier(opts)
  opts = options(opts, 'barrier')
  return finish(C.fl_barrier(group_of(opts)), nil, opts)
end

-- Every group rank's string s, as an array in group rank order (PyTorch's
-- all_gather_object for text: checkpoints gather each rank's data position
-- and RNG state this way). Two all-gathers: the lengths, then the bytes
-- padded to the longest.
function M.all_gather_strings(s, opts)
  if type(s) ~= 'string' then core.fail('all_gather_strings: expects a string, got ' .. type(s)) end
  opts = options(opts, 'all_gather_strings')
  local size = group_size(opts)
  if size == 1 then return { s } end
  local len = Tensor.wrap(C.fl_empty(1, ffi.new('int64_t[1]', 1), C.FL_I64, core.device('cpu')))
  len:fill_(#s)
  local lens = M.all_gather(len, { group = opts.group })
  local longest = 0
  for r = 0, size - 1 do longest = math.max(longest, lens:get(r)) end
  local bytes = Tensor.wrap(C.fl_empty(1, ffi.new('int64_t[1]', math.max(longest, 1)), C.FL_U8, core.device('cpu')))
  ffi.copy(cptr(bytes).data, s, #s)
  local all = M.all_gather(bytes, { group = opts.group })
  local base, stride, out = ffi.cast('const char *', cptr(all).data), math.max(longest, 1), {}
  for r = 0, size - 1 do out[r + 1] = ffi.string(base + r * stride, lens:get(r)) end
  return out
end

-- Rank agreement: every rank of the group (opts.group, default the world)
-- passes its `values` (a table of key -> string, number or boolean; nested
-- tables become dotted keys) and all must be equal, or every rank raises
-- the same error naming `what`, each differing key with each rank's value
-- and the ranks. One all-gather of a 64-bit digest when they agree (the
-- usual case); the whole text is gathered only on a mismatch. Recipes call
-- it on their resolved options and fsdp.shard on the model's structure,
-- before any collective whose sizes depend on them could truncate or hang.
local function flatten(values, prefix, out)
  for k, v in pairs(values) do
    local key = prefix .. tostring(k)
    if type(v) == 'table' and getmetatable(v) == nil then
      flatten(v, key .. '.', out)
    elseif type(v) == 'number' then
      out[key] = ('%.17g'):format(v)
    elseif type(v) == 'string' then
      out[key] = v:gsub('\n', '\\n')
    elseif type(v) == 'boolean' then
      out[key] = tostring(v)
    else
      out[key] = '<' .. type(v) .. '>' -- functions, objects: their addresses differ by rank
    end
  end
  return out
end

local function canonical(values)
  local flat, lines = flatten(values, '', {}), {}
  for i, k in ipairs(tables.sorted_keys(flat)) do lines[i] = k .. '\0' .. flat[k] end
  return table.concat(lines, '\n'), flat
end

local function parse(text)
  local t = {}
  for line in (text .. '\n'):gmatch('([^\n]*)\n') do
    local k, v = line:match('^([^%z]*)%z(.*)$')
    if k then t[k] = v end
  end
  return t
end

-- "ranks 0, 1: 2; ranks 2, 3: 4" for one key's values by rank.
local function by_value(vals, size, ranks)
  local order, groups = {}, {}
  for r = 1, size do
    local v = vals[r] == nil and '(not set)' or vals[r] == '' and "''" or vals[r]
    if #v > 60 then v = v:sub(1, 57) .. '...' end
    if not groups[v] then groups[v] = {}; order[#order + 1] = v end
    table.insert(groups[v], ranks[r])
  end
  local parts = {}
  for _, v in ipairs(order) do
    local g = groups[v]
    parts[#parts + 1] = ('rank%s %s = %s'):format(#g > 1 and 's' or '', table.concat(g, ', '), v)
  end
  return table.concat(parts, '; ')
end

-- dist.agree(what, values, opts): check that every rank of the group
-- (opts.group, default the world) passes equal `values` (a table of
-- JSON-able values), collectively; otherwise every rank raises one error
-- naming `what` and, per key, which ranks hold which value. Nothing to do
-- on one rank.
function M.agree(what, values, opts)
  if type(what) ~= 'string' or type(values) ~= 'table' then
    core.fail('agree: expects a description and a table of values')
  end
  opts = options(opts, 'agree')
  local size = group_size(opts)
  if size == 1 then return end
  local text = canonical(values)
  local digest = Tensor.wrap(C.fl_empty(1, ffi.new('int64_t[1]', 1), C.FL_I64, core.device('cpu')))
  ffi.cast('uint64_t *', cptr(digest).data)[0] = C.fl_dist_digest(text, #text)
  local all = M.all_gather(digest, { group = opts.group })
  local d = ffi.cast('const uint64_t *', cptr(all).data)
  local same = true
  for r = 1, size - 1 do if d[r] ~= d[0] then same = false end end
  if same then return end
  local texts = M.all_gather_strings(text, { group = opts.group })
  local ranks = opts.group and opts.group:ranks() or {}
  if not opts.group then for r = 1, size do ranks[r] = r - 1 end end
  local tables, keys, seen = {}, {}, {}
  for r = 1, size do
    tables[r] = parse(texts[r])
    for k in pairs(tables[r]) do
      if not seen[k] then seen[k] = true; keys[#keys + 1] = k end
    end
  end
  table.sort(keys)
  local diffs = {}
  for _, k in ipairs(keys) do
    local vals, differ = {}, false
    for r = 1, size do
      vals[r] = tables[r][k]
      if vals[r] ~= vals[1] then differ = true end
    end
    if differ then diffs[#diffs + 1] = ('%s (%s)'):format(k, by_value(vals, size, ranks)) end
  end
  local shown = {}
  for i = 1, math.min(#diffs, 6) do shown[i] = diffs[i] end
  local more = #diffs > 6 and ('; and %d more'):format(#diffs - 6) or ''
  core.fail(('the ranks disagree on %s: %s%s'):format(what, table.concat(shown, '; '), more))
end

-- A barrier that names the ranks that did not arrive within opts.timeout
-- seconds (default: the collective timeout) instead of hanging.
function M.monitored_barrier(opts)
  opts = options(opts, 'monitored_barrier')
  core.check(C.fl_monitored_barrier(group_of(opts), opts.timeout or M.timeout()))
end

return M
