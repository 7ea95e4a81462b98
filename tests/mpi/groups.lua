-- tests/mpi/groups.lua: process groups. Run with FSDP_RANKS_PER_NODE set
-- (tests/mpi/run.sh: 4 ranks as 2 nodes of 2, and 2 ranks as 2 nodes of
-- 1), so hybrid sharding's groups exist on one machine.
local fsdp = require 'fsdp'
local dist = fsdp.dist
local T = require 'tests.mpi.tap'
local r, W = T.rank, T.world
local RPN = tonumber(os.getenv('FSDP_RANKS_PER_NODE'))
assert(RPN, 'groups.lua needs FSDP_RANKS_PER_NODE (tests/mpi/run.sh sets it)')

local function range(first, last, step)
  local t = {}
  for i = first, last, step or 1 do t[#t + 1] = i end
  return t
end

local function same_list(a, b, what)
  T.truthy(table.concat(a, ',') == table.concat(b, ','),
    ('%s: {%s}, expected {%s}'):format(what, table.concat(a, ','), table.concat(b, ',')))
end

T.test('FSDP_RANKS_PER_NODE makes blocks of ranks act as nodes', function()
  T.truthy(dist.nodes() == W / RPN, 'nodes ' .. dist.nodes())
  T.truthy(dist.node() == math.floor(r / RPN), 'node ' .. dist.node())
  T.truthy(dist.local_rank() == r % RPN, 'local rank ' .. dist.local_rank())
  T.truthy(dist.local_size() == RPN, 'local size ' .. dist.local_size())
end)

local shard, replicate = dist.hybrid_groups()

T.test('hybrid groups: shard = this node, replicate = same local rank on every node', function()
  local node, lr = dist.node(), dist.local_rank()
  same_list(shard:ranks(), range(node * RPN, node * RPN + RPN - 1), 'shard ranks')
  T.truthy(shard:rank() == lr and shard:size() == RPN, tostring(shard))
  same_list(replicate:ranks(), range(lr, W - 1, RPN), 'replicate ranks')
  T.truthy(replicate:rank() == node and replicate:size() == W / RPN, tostring(replicate))
  T.truthy(shard:name() == ('shard(node %d)'):format(node), shard:name())
end)

T.test('all_gather inside the shard group gathers the node only', function()
  local out = dist.all_gather(fsdp.full({ 2 }, r), { group = shard })
  local want = {}
  for _, k in ipairs(shard:ranks()) do want[#want + 1] = k; want[#want + 1] = k end
  T.eq(out, want, 'shard all_gather')
end)

T.test('hybrid gradient reduction: reduce_scatter(avg) in shard, all_reduce(avg) across', function()
  -- gradient of rank k: g[j] = (k + 1) * (j + 1) over RPN * n elements
  local n = 5
  local g = fsdp.arange(1, RPN * n + 1, { dtype = 'f64' }):mul(r + 1)
  local mine = dist.reduce_scatter(g, { op = 'avg', group = shard })
  dist.all_reduce(mine, { op = 'avg', group = replicate })
  -- expected: the world average of chunk local_rank
  local mean_factor = (W + 1) / 2
  local want = {}
  for i = 0, n - 1 do want[#want + 1] = mean_factor * (dist.local_rank() * n + i + 1) end
  T.eq(mine, want, 'hybrid average', 1e-12)
  -- and in bf16 (staged in f32 within each group)
  local gb = fsdp.arange(1, RPN * n + 1, { dtype = 'f64' }):mul(r + 1):bfloat16()
  local mb = dist.reduce_scatter(gb, { op = 'avg', group = shard })
  dist.all_reduce(mb, { op = 'avg', group = replicate })
  T.eq(mb, want, 'hybrid bf16 average', 0.02 * mean_factor * RPN * n)
end)

T.test('new_group: members in list order, non-members told so', function()
  local ends = dist.new_group({ W - 1, 0 })
  if r == 0 or r == W - 1 then
    T.truthy(ends:is_member(), 'member')
    T.truthy(ends:rank() == (r == W - 1 and 0 or 1), 'list order gives group ranks')
    same_list(ends:ranks(), { W - 1, 0 }, 'ranks')
    -- group rank 0 is world rank W-1: broadcast from it
    local t = dist.broadcast(fsdp.full({ 3 }, r), 0, { group = ends })
    T.eq(t, { W - 1, W - 1, W - 1 }, 'broadcast from group rank 0')
    T.eq(dist.all_reduce(fsdp.ones(1), { group = ends }), { 2 }, 'all_reduce in group')
    dist.monitored_barrier({ group = ends, timeout = 20 })
  else
    T.truthy(not ends:is_member() and ends:rank() == -1 and ends:size() == 0, tostring(ends))
    T.raises(function() dist.all_reduce(fsdp.ones(1), { group = ends }) end,
      ('rank %d is not a member of group group[%d, 0]'):format(r, W - 1))
  end
end)

T.test('split by color, and a rank opting out', function()
  local parity = dist.split(r % 2, { name = 'parity' })
  same_list(parity:ranks(), range(r % 2, W - 1, 2), 'parity ranks')
  T.eq(dist.all_reduce(fsdp.full({ 1 }, r), { group = parity }),
    { (function() local s = 0; for _, k in ipairs(parity:ranks()) do s = s + k end; return s end)() },
    'sum of the parity group')
  local some = dist.split(r == 0 and -1 or 0)
  T.truthy(some:is_member() == (r ~= 0), 'opted out')
  if r ~= 0 then T.truthy(some:size() == W - 1, 'size of the rest') end
end)

T.test('new_group misuse names the bad entry', function()
  T.raises(function() dist.new_group({ 0, 0 }) end, 'rank 0 is listed twice')
  T.raises(function() dist.new_group({ W }) end, ('rank %d (entry 0) is not in the world of %d ranks'):format(W, W))
  T.raises(function() dist.new_group({}) end, 'non-empty list')
end)

T.done()
