-- tests/mpi/monitored_barrier.lua: a monitored barrier that a rank misses
-- fails on every rank, naming that rank, instead of hanging; afterwards
-- the job carries on.
--
-- The last rank arrives 0.7 s late at a barrier with a 0.3 s timeout: rank 0
-- names it, the ranks that arrived hear the same names from rank 0, and
-- the late rank, whose report nobody waits for any more, fails because
-- rank 0 never answers (after 2 * 0.3 + 1 s).
local fsdp = require 'fsdp'
local dist = fsdp.dist
local T = require 'tests.mpi.tap'
local r, W = T.rank, T.world
local late = W - 1

local clock = require 'fsdp.clock'

T.test('a late rank is named by every rank that waited for it', function()
  if r == late then T.sleep(0.7) end
  local start = clock.now()
  local err = T.raises(function() dist.monitored_barrier({ timeout = 0.3 }) end,
    'monitored_barrier on group world')
  local took = clock.now() - start
  if r == 0 then
    T.truthy(err:find(('world rank %d did not arrive within 0.3 s'):format(late), 1, true), err)
    T.truthy(took < 1.0, ('rank 0 gave up after %.2f s'):format(took))
  elseif r == late then
    T.truthy(err:find('no answer from group rank 0 (world rank 0)', 1, true), err)
  else
    T.truthy(err:find(('world rank %d did not arrive within 0.3 s (reported by rank 0)'):format(late), 1, true), err)
  end
end)

T.test('the next monitored barrier (every rank present) succeeds', function()
  dist.monitored_barrier({ timeout = 20 })
end)

T.test('a monitored barrier inside a subgroup names world ranks', function()
  local pair = dist.new_group({ 0, late })
  if r == late then T.sleep(0.5) end
  if pair:is_member() then
    local err = T.raises(function() dist.monitored_barrier({ group = pair, timeout = 0.2 }) end,
      'group[0, ' .. late .. ']')
    if r == 0 then
      T.truthy(err:find(('world rank %d did not arrive'):format(late), 1, true), err)
    end
  end
  dist.monitored_barrier({ timeout = 20 })
end)

T.done()
