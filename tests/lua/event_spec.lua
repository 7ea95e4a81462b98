-- event_spec.lua: fsdp.Event and fsdp.synchronize (core/tensor/event.c,
-- lua/fsdp/event.lua). On the CPU events are done when recorded and time
-- the host clock; on cuda they follow the compute stream (pending without a
-- GPU; run by the cudasim build, whose streams are asynchronous: tests/
-- cudasim/README.md). Errors name what is wrong.
local fsdp = require 'fsdp'

local CUDA = fsdp.cuda.is_available()

-- Work that takes a measurable while on any device.
local function busy(device)
  local n = fsdp.cuda.simulated() and 48 or 256
  local a = fsdp.randn({ n, n }, { seed = 1, device = device })
  for _ = 1, 8 do a = (a:matmul(a) / n):tanh() end
  return a
end

describe('events on the cpu', function()
  it('are done when recorded and time the host clock', function()
    local a, b = fsdp.Event('cpu', { timing = true }), fsdp.Event('cpu', { timing = true })
    assert.is_true(a:query(), 'an event never recorded counts as done')
    a:record()
    busy('cpu')
    b:record()
    assert.is_true(b:query())
    b:synchronize()
    local ms = a:elapsed_time(b)
    assert.is_true(ms > 0 and ms < 60000, 'elapsed ' .. ms .. ' ms')
    assert.are.equal(0, b:elapsed_time(b))
    fsdp.synchronize('cpu')
    fsdp.synchronize()
  end)

  it('refuse what cannot be timed or has no work, naming it', function()
    local plain, timed = fsdp.Event('cpu'), fsdp.Event('cpu', { timing = true })
    plain:record()
    timed:record()
    assert.has_error(function() plain:elapsed_time(timed) end,
      'elapsed time: both events must be made with timing on')
    local fresh = fsdp.Event('cpu', { timing = true })
    assert.has_error(function() timed:elapsed_time(fresh) end,
      'elapsed time: the end event was never recorded')
    assert.has_error(function() fsdp.Event('meta') end,
      'event: meta runs no work (events and synchronize need cpu or cuda)')
    assert.has_error(function() fsdp.synchronize('meta') end,
      'synchronize: meta runs no work (events and synchronize need cpu or cuda)')
    assert.has_error(function() fsdp.Event('cpu', { timming = true }) end,
      'Event: unknown option "timming" (expected timing)')
    assert.has_error(function() timed:elapsed_time(42) end, 'Event:elapsed_time: expected an Event')
    if not CUDA then
      local ok, err = pcall(fsdp.Event, 'cuda:0')
      assert.is_false(ok)
      assert.truthy(tostring(err):find('cuda:0 does not exist', 1, true)
                    or tostring(err):find('cuda', 1, true), tostring(err))
    end
  end)
end)

describe('events on cuda', function()
  if not CUDA then
    it('time and order the device', function()
      pending('no GPU here (' .. fsdp.cuda.status() .. '): events on cuda were not run')
    end)
    return
  end

  it('time the work queued between two records', function()
    local a, b = fsdp.Event('cuda:0', { timing = true }), fsdp.Event('cuda:0', { timing = true })
    a:record()
    local x = busy('cuda:0')
    b:record()
    b:synchronize()
    assert.is_true(b:query())
    local ms = a:elapsed_time(b)
    assert.is_true(ms >= 0 and ms < 600000, 'elapsed ' .. ms .. ' ms')
    -- the values are what the CPU computes
    local want = busy('cpu')
    assert.is_true(require('fsdp.testing').max_abs_diff(x:to('cpu'), want) < 1e-4)
    fsdp.synchronize('cuda:0')
  end)

  it('refuse events on two devices and devices that do not exist', function()
    local a = fsdp.Event('cpu', { timing = true }):record()
    local b = fsdp.Event('cuda:0', { timing = true }):record()
    assert.has_error(function() a:elapsed_time(b) end,
      'elapsed time: the events are on cpu and cuda:0 (one device needed)')
    local n = fsdp.cuda.device_count()
    local ok, err = pcall(fsdp.Event, 'cuda:' .. n)
    assert.is_false(ok)
    assert.truthy(tostring(err):find('cuda:' .. n .. ' does not exist', 1, true), tostring(err))
  end)
end)
