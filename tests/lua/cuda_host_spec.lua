-- cuda_host_spec.lua: pinned host memory and non-blocking copies. On
-- cuda:0: pinned round trips in f32 and bf16 with their values, is_pinned,
-- non-blocking copies both ways followed by fsdp.cuda.synchronize, the
-- fallbacks to a plain copy (pageable memory, a dtype change, strided
-- tensors), the pinned pool's reuse after a copy, and the errors. Without
-- a CUDA device: the errors that say pinned memory needs one. The device
-- half is pending without a GPU and runs in the cudasim build.
local fsdp = require 'fsdp'

local CUDA = fsdp.cuda.is_available()
local DEV = 'cuda:0'

local function values(t)
  local flat = t:cpu():float():reshape(-1)
  local out = {}
  for i = 0, flat:numel() - 1 do out[#out + 1] = flat[i]:item() end
  return out
end

local function assert_same(got, want, what)
  local g, w = values(got), values(want)
  assert.equals(#w, #g, what .. ': element count')
  for i = 1, #w do
    assert(g[i] == w[i], ('%s: element %d is %.9g, expected %.9g'):format(what, i - 1, g[i], w[i]))
  end
end

local raises = require('fsdp.testing').raises

describe('pinned memory without a CUDA device', function()
  if CUDA then return end -- the device half below tests pinning for real

  it('pin_memory says pinned memory needs a CUDA device', function()
    local x = fsdp.randn({ 3, 4 }, { seed = 1 })
    raises(function() return x:pin_memory() end, 'pin_memory: pinned memory needs a CUDA device')
    raises(function() return fsdp.empty({ 2, 2 }, { pin_memory = true }) end,
      'pinned memory needs a CUDA device')
    raises(function() return fsdp.zeros({ 2 }, { pin_memory = true }) end,
      'pinned memory needs a CUDA device')
    assert.is_false(x:is_pinned())
  end)

  it('synchronize says there is no device', function()
    -- with the backend's plugin but no device, or without the plugin,
    -- cuda:0 does not exist, and the message says why
    raises(function() fsdp.cuda.synchronize() end,
      'synchronize: cuda:0 does not exist (0 cuda device(s): ' .. fsdp.cuda.status())
  end)

  it('non_blocking on the cpu is a plain conversion', function()
    local x = fsdp.randn({ 5 }, { seed = 2 })
    assert_same(x:to('bf16', { non_blocking = true }), x:to('bf16'), 'cpu bf16')
    assert.equals(x._c, x:to('cpu', { non_blocking = true })._c)
  end)
end)

describe('pinned memory and non-blocking copies on cuda:0', function()
  if not CUDA then
    pending('no GPU here (' .. fsdp.cuda.status() .. '): pinned memory was not tested')
    return
  end

  it('pins a cpu tensor: same values, an ordinary cpu tensor for cpu ops', function()
    local x = fsdp.randn({ 4, 6 }, { seed = 3 })
    local p = x:pin_memory()
    assert.is_true(p:is_pinned())
    assert.is_false(x:is_pinned())
    assert.equals('cpu', p.device)
    assert_same(p, x, 'pinned copy')
    assert_same(p * 2 + 1, x * 2 + 1, 'cpu ops on a pinned tensor')
    assert.equals(p._c, p:pin_memory()._c, 'pinning a pinned tensor gives it back')
    -- views share the pinned storage
    assert.is_true(p:narrow(0, 1, 2):is_pinned())
    assert.is_false(p:clone():is_pinned(), 'a clone is ordinary memory')
  end)

  it('makes pinned tensors from the factories', function()
    local z = fsdp.zeros({ 3, 5 }, { pin_memory = true, dtype = 'bf16' })
    assert.is_true(z:is_pinned())
    assert.equals('bf16', z.dtype)
    assert_same(z, fsdp.zeros({ 3, 5 }), 'zeros')
    local e = fsdp.empty({ 7 }, { pin_memory = true })
    assert.is_true(e:is_pinned())
    assert.is_false(fsdp.empty({ 7 }, { pin_memory = false }):is_pinned())
  end)

  for _, dtype in ipairs({ 'f32', 'bf16' }) do
    it('round trips pinned -> cuda:0 -> pinned in ' .. dtype .. ', blocking and not', function()
      local x = fsdp.randn({ 33, 17 }, { seed = 4, dtype = dtype }):pin_memory()
      -- blocking
      local d = x:to(DEV)
      assert.equals(DEV, d.device)
      assert_same(d:cpu(), x, dtype .. ' blocking')
      -- non-blocking both ways, then synchronize before reading
      local d2 = x:to(DEV, { non_blocking = true })
      local back = d2:to('cpu', { non_blocking = true })
      assert.is_true(back:is_pinned(), 'device -> host non_blocking lands in pinned memory')
      fsdp.cuda.synchronize()
      assert_same(back, x, dtype .. ' non-blocking')
      -- copy_ into an existing pinned tensor
      local dst = fsdp.empty({ 33, 17 }, { pin_memory = true, dtype = dtype })
      dst:copy_(d2 * 3, { non_blocking = true })
      fsdp.cuda.synchronize(DEV)
      assert_same(dst, x * 3, dtype .. ' copy_ non-blocking')
    end)
  end

  it('falls back to a plain copy where a queued one cannot apply', function()
    local x = fsdp.randn({ 8, 12 }, { seed = 5 })
    -- pageable source
    assert_same(x:to(DEV, { non_blocking = true }), x, 'pageable -> device')
    -- a dtype change on the way
    local p = x:pin_memory()
    assert_same(p:to({ device = DEV, dtype = 'bf16', non_blocking = true }), x:bfloat16(),
      'pinned f32 -> device bf16')
    -- a strided device source and a strided host destination
    local d = x:to(DEV)
    local t = d:t():to('cpu', { non_blocking = true })
    fsdp.cuda.synchronize()
    assert_same(t, x:t(), 'transposed device -> host')
    local host = fsdp.zeros({ 12, 8 }, { pin_memory = true })
    host:t():copy_(d, { non_blocking = true })
    fsdp.cuda.synchronize()
    assert_same(host:t(), x, 'device -> strided pinned view')
  end)

  it('counts pinned bytes as cpu memory and reuses freed pinned blocks', function()
    local budget = fsdp.set_collect_budget(0)
    collectgarbage()
    collectgarbage() -- finalizers run in the second cycle
    local before = fsdp.memory_stats('cpu').in_use
    local p = fsdp.empty({ 1024, 64 }, { pin_memory = true })
    assert.equals(before + 1024 * 64 * 4, fsdp.memory_stats('cpu').in_use)
    local d = fsdp.randn({ 1024, 64 }, { seed = 6 }):to(DEV)
    p:copy_(d, { non_blocking = true })
    local reserved = fsdp.cuda.pinned_memory_stats().reserved
    -- freed while the copy may still run: held back until it has, then reused
    p:free()
    fsdp.cuda.synchronize()
    local q = fsdp.empty({ 1024, 64 }, { pin_memory = true })
    assert.equals(reserved, fsdp.cuda.pinned_memory_stats().reserved, 'no new pinned segment')
    -- (the pool's figure also holds freed blocks until their copies ran)
    assert.is_true(fsdp.cuda.pinned_memory_stats().allocated >= 1024 * 64 * 4)
    q:free()
    assert.equals(before, fsdp.memory_stats('cpu').in_use)
    -- with every pinned tensor gone, the whole cache goes back
    d:free()
    collectgarbage()
    collectgarbage()
    fsdp.cuda.synchronize()
    local held = fsdp.cuda.pinned_memory_stats().reserved
    assert.equals(held, fsdp.cuda.empty_pinned_cache())
    assert.same({ allocated = 0, reserved = 0 }, fsdp.cuda.pinned_memory_stats())
    fsdp.set_collect_budget(budget)
  end)

  it('names what is wrong', function()
    local d = fsdp.zeros({ 2 }, { device = DEV })
    raises(function() return d:pin_memory() end, 'pin_memory: only cpu tensors can be pinned, this one is on cuda:0')
    raises(function() return fsdp.empty({ 2 }, { pin_memory = true, device = DEV }) end,
      'pin_memory: only cpu tensors with storage can be pinned (device cuda:0)')
    raises(function() return fsdp.empty({ 2 }, { pin_memory = 'yes' }) end, 'pin_memory must be a boolean')
    raises(function() return d:to('cpu', { non_blocking = 1 }) end, 'non_blocking must be a boolean')
    raises(function() return d:to('cpu', 5) end, 'to(): options must be a table')
    raises(function() return d:copy_(d, 'fast') end, 'copy_(): options must be a table')
    raises(function() fsdp.cuda.synchronize('cpu') end, 'cuda.synchronize: expects a cuda device, got cpu')
    raises(function() fsdp.cuda.synchronize('cuda:7') end, 'synchronize: cuda:7 does not exist')
  end)
end)
