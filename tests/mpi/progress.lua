-- tests/mpi/progress.lua: collectives progress while the rank computes,
-- without the progress thread ([Note: progress from compute] in
-- core/comm/dist.c). Run under FSDP_PROGRESS_THREAD=0 with mpirun -np 2,
-- once as it is and once with FSDP_PROGRESS_FROM_COMPUTE=0, which must
-- show the difference: then nothing moves the all-gather until the wait.
local fsdp = require 'fsdp'
local dist = fsdp.dist
local clock = require 'fsdp.clock'
local T = require 'tests.mpi.tap'

local POKES = os.getenv('FSDP_PROGRESS_FROM_COMPUTE') ~= '0'
local COMPUTE_S = 0.4

-- Ops for `seconds`: each allocates its output, which is where the
-- compute thread progresses collectives.
local function compute(seconds)
  local x = fsdp.ones({ 64, 64 })
  local t0 = clock.now()
  while clock.now() - t0 < seconds do x = (x * 0.5 + 0.5):contiguous() end
  return x
end

local function busy(kind) return dist.collective_stats()[kind].busy_s end

-- How long the same all-gather takes waited for outright, here and now:
-- the compute lasts several times that (at least COMPUTE_S), so a loaded
-- machine, where the transfer itself is slower, lengthens the test rather
-- than failing it.
local function compute_seconds()
  dist.barrier()
  local t0 = clock.now()
  dist.all_gather(fsdp.full({ 4 * 2^20 }, T.rank + 1))
  local t = fsdp.full({ 1 }, clock.now() - t0)
  dist.all_reduce(t, { op = 'max' })
  return math.max(COMPUTE_S, 4 * t:item())
end

T.test(('an all-gather in flight %s while the rank computes'):format(POKES and 'completes' or 'waits'), function()
  COMPUTE_S = compute_seconds()
  dist.barrier()
  local before = busy('all_gather')
  -- 16 MiB per rank: far above any eager limit, so it needs many
  -- progress calls on both sides.
  local work = dist.all_gather(fsdp.full({ 4 * 2^20 }, T.rank + 1), { async = true })
  compute(COMPUTE_S)
  local out = work:wait()
  local s = busy('all_gather') - before
  T.truthy(out:get(0) == 1 and out:get(4 * 2^20) == 2, 'gathered values')
  if T.rank == 0 then
    io.stdout:write(('# 32 MiB all-gather in flight for %.3f s (%.2f s of compute, progress from compute %s)\n')
      :format(s, COMPUTE_S, POKES and 'on' or 'off'))
  end
  if POKES then
    T.truthy(s < COMPUTE_S * 0.75, ('the all-gather was seen complete after %.3f s of %.2f s of compute: '
      .. 'the compute thread did not progress it'):format(s, COMPUTE_S))
  else
    T.truthy(s >= COMPUTE_S * 0.9, ('the all-gather completed after %.3f s without any progress '
      .. 'call during %.2f s of compute'):format(s, COMPUTE_S))
  end
end)

T.done()
