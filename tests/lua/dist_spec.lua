-- dist_spec.lua: fsdp.dist in a plain process: one rank on the `self`
-- backend, with no MPI loaded. Collectives are copies or nothing, groups
-- are this rank alone, and misuse is refused with messages naming the
-- collective, group and rank. Child processes check what a plain start
-- must not do (load libmpi, print MPI noise) and the command line
-- (--nproc). The multi-rank behaviour is tested by tests/mpi/run.sh.
local fsdp = require 'fsdp'
local dist = fsdp.dist
local host = require 'fsdp.host'

local function quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

-- Run the executable with a clean launcher environment (the spec itself
-- may run under one); returns output (stdout and stderr) and exit code.
local function run(env, ...)
  local parts = { 'env -u OMPI_COMM_WORLD_SIZE -u OMPI_COMM_WORLD_RANK -u PMI_SIZE -u PMI_RANK',
                  '-u PMIX_RANK -u SLURM_PROCID -u SLURM_NTASKS -u FSDP_BACKEND', env or '',
                  'timeout 20', quote(host.exe) }
  for i = 1, select('#', ...) do parts[#parts + 1] = quote((select(i, ...))) end
  local f = assert(io.popen(table.concat(parts, ' ') .. ' 2>&1; echo "@rc=$?"'))
  local out = f:read('*a')
  f:close()
  local body, rc = out:match('^(.-)@rc=(%d+)\n?$')
  return body, tonumber(rc)
end

local function contains(haystack, needle)
  assert.is_truthy(haystack:find(needle, 1, true),
    ('expected to find %q in:\n%s'):format(needle, haystack))
end

local function values(t) return t:double():contiguous():view(-1):tolist() end

describe('fsdp.dist on one rank', function()
  it('is the self transport, rank 0 of 1, one node', function()
    dist.init()
    dist.init() -- idempotent
    assert.is_true(dist.is_initialized())
    assert.are.equal('self', dist.transport())
    assert.are.equal(dist.transport, dist.backend) -- the old name, kept for scripts
    assert.are.equal(0, dist.rank())
    assert.are.equal(1, dist.world_size())
    assert.are.same({ 0, 1, 0, 1 }, { dist.local_rank(), dist.local_size(), dist.node(), dist.nodes() })
    local w = dist.world()
    assert.are.same({ 0 }, w:ranks())
    assert.are.equal('world', w:name())
    assert.is_true(w:is_member())
  end)

  it('collectives are copies or nothing, in every dtype', function()
    for _, dtype in ipairs { 'f32', 'f64', 'bf16', 'f16', 'i64' } do
      local x = fsdp.arange(6, { dtype = dtype }):view(2, 3)
      local g = dist.all_gather(x)
      assert.are.same({ 2, 3 }, g.shape)
      assert.are.same(values(x), values(g))
      assert.are.equal(dtype, g.dtype)
      local rs = dist.reduce_scatter(x)
      assert.are.same(values(x), values(rs))
      assert.are.same(values(x), values(dist.all_reduce(x:clone())))
      assert.are.same(values(x), values(dist.broadcast(x:clone(), 0)))
    end
    local f = fsdp.full({ 3 }, 2.5)
    assert.are.same({ 2.5, 2.5, 2.5 }, values(dist.reduce_scatter(f, { op = 'avg' })))
    assert.are.same({ 2.5, 2.5, 2.5 }, values(dist.all_reduce(f, { op = 'avg' })))
    assert.are.same({ 2.5, 2.5, 2.5 }, values(dist.all_reduce(f, { op = 'max' })))
    dist.barrier()
    dist.monitored_barrier({ timeout = 1 })
  end)

  it('a 0-d input gathers into a 1-d output; preallocated outputs are filled', function()
    assert.are.same({ 1 }, dist.all_gather(fsdp.tensor(7)).shape)
    local out = fsdp.zeros(4)
    local got = dist.all_gather(fsdp.arange(4), { out = out })
    assert.are.equal(out, got)
    assert.are.same({ 0, 1, 2, 3 }, values(out))
  end)

  it('async returns a completed Work whose wait gives the result', function()
    local w = dist.all_gather(fsdp.arange(3), { async = true })
    assert.is_true(w:is_completed())
    assert.is_true(w:test())
    assert.are.equal('all_gather_into', w:name())
    assert.are.same({ 0, 1, 2 }, values(w:wait()))
    assert.is_nil(dist.barrier({ async = true }):wait())
  end)

  it('meta and fake tensors are checked, nothing is moved', function()
    local m = fsdp.empty({ 1000, 1000 }, { device = 'meta' })
    local g = dist.all_gather(m)
    assert.is_true(g:is_meta())
    assert.are.same({ 1000, 1000 }, g.shape)
    local fake = fsdp.empty({ 8 }, { fake = true })
    assert.is_true(dist.all_gather(fake):is_fake())
    dist.all_reduce(m)
  end)

  it('groups of one: new_group, split, hybrid groups', function()
    local g = dist.new_group({ 0 })
    assert.is_true(g:is_member())
    assert.are.equal('group[0]', g:name())
    local shard, replicate = dist.hybrid_groups()
    assert.are.equal('shard(node 0)', shard:name())
    assert.are.equal('replicate(local rank 0)', replicate:name())
    assert.are.same({ 1, 1 }, { shard:size(), replicate:size() })
    assert.are.same({ 5 }, values(dist.all_reduce(fsdp.full({ 1 }, 5), { group = shard })))
    local out = dist.split(-1)
    assert.is_false(out:is_member())
    assert.are.equal(-1, out:rank())
    local ok, err = pcall(dist.all_reduce, fsdp.ones(1), { group = out })
    assert.is_false(ok)
    contains(err, 'all_reduce: rank 0 is not a member of group split(color -1 of world)')
  end)

  it('misuse names the collective, the group, the rank and the shapes', function()
    local function fails(fn, ...)
      local ok, err = pcall(fn)
      assert.is_false(ok)
      for i = 1, select('#', ...) do contains(err, (select(i, ...))) end
    end
    local x = fsdp.ones(4)
    fails(function() dist.all_gather(x, { out = fsdp.ones(5) }) end,
      'all_gather_into on group world (rank 0 of 1, world rank 0): output [5] has 5 elements, '
      .. 'expected 1 ranks x 4 (input [4]) = 4')
    fails(function() dist.reduce_scatter(fsdp.ones(4, { dtype = 'i32' }), { op = 'avg' }) end,
      'reduce_scatter on group world', 'avg needs a float dtype, the tensor is i32')
    fails(function() dist.all_reduce(fsdp.ones(2, { dtype = 'bool' })) end, 'sum of bool tensors')
    fails(function() dist.all_reduce(x, { op = 'prod' }) end, "all_reduce: unknown op 'prod'")
    fails(function() dist.broadcast(x, 1) end, 'root 1 is not a rank of the group (0 ... 0)')
    fails(function() dist.all_reduce(fsdp.ones(3, 4):t()) end, 'tensor of shape [4, 3] is not contiguous')
    fails(function() dist.reduce_scatter(x, { out = x }) end, 'input and output overlap')
    fails(function() dist.all_gather(x, { out = fsdp.ones(4, { dtype = 'f64' }) }) end,
      'input is f32, output is f64')
    fails(function() dist.monitored_barrier({ timeout = 0 }) end, 'timeout must be a positive number')
    fails(function() dist.new_group({ 1 }) end, 'rank 1 (entry 0) is not in the world of 1 ranks')
    fails(function() dist.all_reduce(x, { group = 3 }) end, 'expected a Group from fsdp.dist')
    fails(function() dist.set_timeout(-1) end, 'collective timeout must be a positive number')
  end)

  it('the collective timeout can be set', function()
    local before = dist.timeout()
    dist.set_timeout(12.5)
    assert.are.equal(12.5, dist.timeout())
    dist.set_timeout(before)
  end)

  it('one process keeps no collective log; joined time is zero; the C call checks its room', function()
    dist.all_reduce(fsdp.ones({ 4 }))
    local log, lost = dist.collective_log()
    assert.are.same({}, log)
    assert.are.equal(0, lost)
    local t, rest = require('fsdp.observe.joined').seconds(log)
    assert.are.equal(0, t.any)
    assert.are.equal(0, t.skew)
    assert.are.same({}, rest)
    local C = require('fsdp.core').C
    assert.are.equal(-1, C.fl_dist_collective_log(nil, -1, nil))
    contains(require('fsdp.core').ffi.string(C.fl_last_error()), 'collective log: room for -1 records')
  end)

  it('agree has nobody to disagree with; its digest is 64-bit FNV-1a', function()
    dist.agree('options', { lr = 1e-3, nested = { a = true } })
    local C = require('fsdp.core').C
    assert.is_true(C.fl_dist_digest('', 0) == 0xcbf29ce484222325ULL)
    assert.is_true(C.fl_dist_digest('a', 1) == 0xaf63dc4c8601ec8cULL)
    local ok, err = pcall(dist.agree, 'options', 'not a table')
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find('agree: expects a description and a table', 1, true))
  end)
end)

describe('fsdp.dist from the outside', function()
  it('prints with a rank prefix', function()
    local out, rc = run(nil, '-e', "require('fsdp').dist.print('hello', 42)")
    assert.are.equal(0, rc)
    assert.are.equal('[rank 0] hello\t42\n', out)
  end)

  it('never loads MPI in a plain run, and libfsdp.so does not link it', function()
    local out, rc = run(nil, '-e', [[
      local d = require('fsdp').dist
      d.all_reduce(require('fsdp').ones(2))
      local maps = io.open('/proc/self/maps'):read('*a')
      print(d.backend(), maps:find('libmpi', 1, true) and 'libmpi loaded' or 'no libmpi')]])
    assert.are.equal(0, rc)
    assert.are.equal('self\tno libmpi\n', out)
    local lib = host.exe:gsub('/bin/fsdp%-lua$', '/lib/libfsdp.so')
    local f = assert(io.popen('readelf -d ' .. quote(lib) .. ' 2>&1'))
    local dyn = f:read('*a')
    f:close()
    contains(dyn, 'NEEDED')
    assert.is_falsy(dyn:find('libmpi', 1, true), 'libfsdp.so must not need libmpi:\n' .. dyn)
  end)

  it('reports a missing mpi plugin with its path and the loader\'s message', function()
    local out, rc = run('FSDP_BACKEND=mpi FSDP_MPI_LIBRARY=/nonexistent/libfsdp_mpi.so', '-e',
      "require('fsdp').dist.init()")
    assert.are.equal(1, rc)
    contains(out, 'dist: the mpi backend is needed (FSDP_BACKEND=mpi) but '
      .. '/nonexistent/libfsdp_mpi.so cannot be loaded: ')
    contains(out, 'No such file or directory')
  end)

  it('refuses bad settings by name', function()
    local out, rc = run('FSDP_BACKEND=tcp', '-e', "require('fsdp').dist.init()")
    assert.are.equal(1, rc)
    contains(out, 'FSDP_BACKEND=tcp: expected mpi, self or auto')
    out, rc = run('FSDP_COLLECTIVE_TIMEOUT=soon', '-e', "require('fsdp').dist.init()")
    assert.are.equal(1, rc)
    contains(out, 'FSDP_COLLECTIVE_TIMEOUT=soon is not a positive number of seconds')
  end)

  it('a launcher\'s rank prefixes a fatal error even before init', function()
    local out, rc = run('OMPI_COMM_WORLD_RANK=3 FSDP_BACKEND=self', '-e', "error('boom')")
    assert.are.equal(1, rc)
    contains(out, 'fsdp-lua: rank 3: (command line):1: boom')
  end)

  it('os.exit keeps its status and its closing of the state in a plain run', function()
    local out, rc = run(nil, '-e', 'os.exit(7)')
    assert.are.equal(7, rc, out)
    out, rc = run(nil, '-e', 'io.stdout:write("x"); os.exit(true, true)')
    assert.are.equal(0, rc, out)
    assert.are.equal('x', out)
  end)

  it('--nproc is in --help and checks its argument', function()
    local out = run(nil, '--help')
    contains(out, '--nproc N')
    contains(out, 'FSDP_COLLECTIVE_TIMEOUT')
    local bad, rc = run(nil, '--nproc', 'two', 'x.lua')
    assert.are.equal(2, rc)
    contains(bad, "'two' is not a number of ranks for --nproc")
    local missing, rc2 = run(nil, '--nproc')
    assert.are.equal(2, rc2)
    contains(missing, "'--nproc' needs a number of ranks")
    local nested, rc3 = run('OMPI_COMM_WORLD_RANK=0', '--nproc', '2', 'x.lua')
    assert.are.equal(2, rc3)
    contains(nested, '--nproc in a process a launcher already started (rank 0)')
    local nompirun, rc4 = run('FSDP_MPIRUN=/nonexistent/mpirun', '--nproc', '2', 'x.lua')
    assert.are.equal(127, rc4)
    contains(nompirun, '--nproc 2: cannot run /nonexistent/mpirun: No such file or directory')
  end)
end)
