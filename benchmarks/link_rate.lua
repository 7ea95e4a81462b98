-- benchmarks/link_rate.lua: what the link between this job's ranks really
-- carries for the collectives FSDP uses: all_gather, reduce_scatter and
-- all_reduce of one f32 buffer, the best of a few rounds, reported per
-- kind as wire bytes per second (what fsdp.plan.cost divides by the
-- bandwidth: a ring's (G-1)/G of the buffer, 2(G-1)/G for all_reduce).
-- benchmarks/cluster_link.sh runs it on the shaped link so the plan's
-- communication time can be set against the measured rates as well as
-- against the nominal one. With several nodes of several ranks it also
-- measures each node's ranks among themselves, every node at once
-- (`intra` in the result). Ends with one line `RATES {json}`.
--
--   mpirun -np 2 fsdp-lua benchmarks/link_rate.lua [--mib=16] [--rounds=5] [--warmup=3]
local fsdp = require 'fsdp'
local options = require 'fsdp.options'
local clock = require 'fsdp.clock'
local dist = fsdp.dist

local cfg = options.config({
  mib = { 16, 'the gathered buffer, MiB' },
  rounds = { 5, 'timed rounds of each collective' },
  warmup = { 3, 'untimed rounds of each collective first', int = true, min = 1 },
}, arg, 'benchmarks/link_rate.lua')

-- Each kind on `group` (nil: the world), as wire bytes per second of one
-- rank, the best of cfg.rounds.
local function rates_on(group, label)
  local G = group and group:size() or dist.world_size()
  local n = math.floor(cfg.mib * 2^20 / 4 / G) * G
  local shard = fsdp.ones({ n / G })
  local full = fsdp.ones({ n })
  -- Untimed rounds first: on the shaped 1 Gbit/s link, the collective
  -- measured first in a job (over fresh TCP connections) got 80-86 MB/s
  -- in every timed round after one untimed round, in 4 of 7 jobs; after
  -- three untimed rounds, 114-119 MB/s in 5 of 5.
  local function timed(fn)
    for _ = 1, cfg.warmup do fn() end
    dist.barrier()
    local best = math.huge
    for _ = 1, cfg.rounds do
      local t0 = clock.now()
      fn()
      best = math.min(best, clock.now() - t0)
    end
    return best
  end
  local wire = n * 4 * (G - 1) / G
  local seconds = {
    all_gather = timed(function() dist.all_gather(shard, { group = group }) end),
    reduce_scatter = timed(function() dist.reduce_scatter(full, { group = group }) end),
    all_reduce = timed(function() dist.all_reduce(full, { group = group }) end),
  }
  local rates = {}
  for kind, s in pairs(seconds) do
    rates[kind] = (kind == 'all_reduce' and 2 or 1) * wire / s
    if dist.rank() == 0 then
      print(('%-14s %7.1f ms for %.1f MiB on %d ranks (%s): %7.1f MB/s on the wire'):format(kind, 1e3 * s,
        n * 4 / 2^20, G, label, rates[kind] / 1e6))
    end
  end
  return rates
end

-- The node's all_gather while each replica group (the same local rank on
-- every node) all-reduces a buffer 4x as large across the link, as hybrid
-- sharding's prefetched all-gathers overlap its gradient all-reduces: the
-- best of cfg.rounds, in wire bytes per second, or nil when the
-- all-reduce finished first (then the overlap was not measured).
local function intra_while_across(node)
  local _, replica = dist.hybrid_groups()
  local G = node:size()
  local n = math.floor(cfg.mib * 2^20 / 4 / G) * G
  local shard, big = fsdp.ones({ n / G }), fsdp.ones({ 4 * n })
  local best, overlapped = math.huge, true
  for round = 0, cfg.rounds do
    dist.barrier()
    local across = dist.all_reduce(big, { group = replica, async = true })
    local t0 = clock.now()
    dist.all_gather(shard, { group = node })
    local s = clock.now() - t0
    overlapped = overlapped and not across:test()
    across:wait()
    if round > 0 then best = math.min(best, s) end
  end
  local rate = n * 4 * (G - 1) / G / best
  if dist.rank() == 0 then
    print(('%-14s %7.1f ms for %.1f MiB on %d ranks (%s): %7.1f MB/s on the wire%s'):format('all_gather', 1e3 * best,
      n * 4 / 2^20, G, 'within each node, while the replica all_reduce crosses the link', rate / 1e6,
      overlapped and '' or ' (the all_reduce ended first in some round)'))
  end
  return rate
end

-- With several ranks per node: the world first, then every node's ranks
-- among themselves at once (as hybrid sharding's shard groups run), then
-- with the link busy as well.
local rates = rates_on(nil, dist.nodes() > 1 and 'across nodes' or 'one node')
if dist.nodes() > 1 and dist.local_size() > 1 then
  local node = dist.split(dist.node(), { name = 'node' })
  rates.intra = rates_on(node, 'within each node, all nodes at once')
  rates.intra.all_gather_while_across = intra_while_across(node)
end
if dist.rank() == 0 then print('RATES ' .. require('cjson').encode(rates)) end
