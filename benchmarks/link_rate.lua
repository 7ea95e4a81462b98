-- benchmarks/link_rate.lua: what the link between this job's ranks really
-- carries for the collectives FSDP uses: all_gather, reduce_scatter and
-- all_reduce of one f32 buffer, the best of a few rounds, reported per
-- kind as wire bytes per second (what fsdp.plan.cost divides by the
-- bandwidth: a ring's (G-1)/G of the buffer, 2(G-1)/G for all_reduce).
-- benchmarks/cluster_link.sh runs it on the shaped link so the plan's
-- communication time can be set against the measured rates as well as
-- against the nominal one. Ends with one line `RATES {json}`.
--
--   mpirun -np 2 fsdp-lua benchmarks/link_rate.lua [--mib=16] [--rounds=5]
local fsdp = require 'fsdp'
local recipe = require 'fsdp.recipe'
local clock = require 'fsdp.clock'
local dist = fsdp.dist

local cfg = recipe.config({
  mib = { 16, 'the gathered buffer, MiB' },
  rounds = { 5, 'timed rounds of each collective (after one untimed)' },
}, arg, 'benchmarks/link_rate.lua')

local W = dist.world_size()
local n = math.floor(cfg.mib * 2^20 / 4 / W) * W
local shard = fsdp.ones({ n / W })
local full = fsdp.ones({ n })
local function timed(fn)
  fn()
  dist.barrier()
  local best = math.huge
  for _ = 1, cfg.rounds do
    local t0 = clock.now()
    fn()
    best = math.min(best, clock.now() - t0)
  end
  return best
end
local wire = n * 4 * (W - 1) / W
local seconds = {
  all_gather = timed(function() dist.all_gather(shard) end),
  reduce_scatter = timed(function() dist.reduce_scatter(full) end),
  all_reduce = timed(function() dist.all_reduce(full) end),
}
local rates = {}
for kind, s in pairs(seconds) do
  rates[kind] = (kind == 'all_reduce' and 2 or 1) * wire / s
  if dist.rank() == 0 then
    print(('%-14s %7.1f ms for %.1f MiB on %d ranks: %7.1f MB/s on the wire'):format(kind, 1e3 * s, n * 4 / 2^20,
      W, rates[kind] / 1e6))
  end
end
if dist.rank() == 0 then print('RATES ' .. require('cjson').encode(rates)) end
