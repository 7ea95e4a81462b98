-- fake_spec.lua: fsdp.fake: every factory inside it makes storage-less
-- tensors on the target device; every model family builds at full size
-- that way with exact parameter counts and no memory; the mode ends (and
-- the default device comes back) on return and on error.
local fsdp = require 'fsdp'
local clock = require 'fsdp.clock'

-- CPU allocations so far: fake tensors make none. (A count, not bytes in
-- use, which other specs' tensors being collected meanwhile would change.)
local function cpu_allocations()
  return fsdp.memory_stats('cpu').allocations
end

describe('fsdp.fake', function()
  it('makes every factory return fake tensors on the target device', function()
    local before = cpu_allocations()
    local made = fsdp.fake(function()
      return {
        fsdp.empty(4, 8), fsdp.zeros({ 4, 8 }), fsdp.ones(3), fsdp.full({ 2, 2 }, 7),
        fsdp.arange(10), fsdp.arange(2, 11, 3), fsdp.tensor({ { 1, 2 }, { 3, 4 } }),
        fsdp.rand(5), fsdp.randn({ 6, 2 }, { seed = 1 }), fsdp.randint(0, 9, { 3 }),
        fsdp.empty(2, { dtype = 'bf16' }),
      }
    end, { device = 'cuda:0' })
    local shapes = { { 4, 8 }, { 4, 8 }, { 3 }, { 2, 2 }, { 10 }, { 3 }, { 2, 2 }, { 5 }, { 6, 2 }, { 3 }, { 2 } }
    for i, t in ipairs(made) do
      assert.is_true(t:is_fake(), 'factory ' .. i)
      assert.are.equal('cuda:0', t.device)
      assert.are.same(shapes[i], t.shape)
      assert.is_false(t:has_storage())
    end
    assert.are.equal('i64', made[10].dtype)
    assert.are.equal('bf16', made[11].dtype)
    assert.are.equal(before, cpu_allocations())
    assert.matches("device='cuda:0', fake=true", tostring(made[1]), 1, true)
  end)

  it('keeps a device asked for by name, and meta as meta', function()
    local a, b, c = fsdp.fake(function()
      return fsdp.empty(2, { device = 'cpu' }), fsdp.zeros(2, { device = 'meta' }), fsdp.ones(2)
    end, { device = 'cuda:1' })
    assert.is_true(a:is_fake())
    assert.are.equal('cpu', a.device)
    assert.is_true(b:is_meta())
    assert.are.equal('cuda:1', c.device)
    assert.is_true(c:is_fake())
  end)

  it('without a device uses the default device', function()
    local t = fsdp.fake(function() return fsdp.randn(3, 3) end)
    assert.is_true(t:is_fake())
    assert.are.equal('cpu', t.device)
  end)

  it('ops on fake tensors give fake results and writes do nothing', function()
    local y, w = fsdp.fake(function()
      local x = fsdp.randn({ 4, 16 })
      local w = fsdp.randn({ 8, 16 })
      w:fill_(3)
      return fsdp.F.linear(x, w):relu(), w
    end)
    assert.is_true(y:is_fake())
    assert.are.same({ 4, 8 }, y.shape)
    assert.is_true(w:is_fake())
    assert.error_matches(function() w:sum():item() end, 'fake tensor of shape %[%] on cpu has no storage yet')
  end)

  it('passes arguments and results through, and nests', function()
    local a, b = fsdp.fake(function(x, y) return x + y, fsdp.is_fake_mode() end, nil, 2, 3)
    assert.are.equal(5, a)
    assert.is_true(b)
    local inner = fsdp.fake(function()
      return fsdp.fake(function() return fsdp.zeros(1) end, { device = 'cuda:2' }), fsdp.zeros(1)
    end, { device = 'cuda:0' })
    assert.are.equal('cuda:2', inner.device)
    assert.is_false(fsdp.is_fake_mode())
  end)

  it('ends on return and on error, restoring the default device', function()
    fsdp.fake(function() end, { device = 'cuda:0' })
    assert.is_false(fsdp.is_fake_mode())
    assert.are.equal('cpu', fsdp.get_default_device())
    assert.error_matches(function()
      fsdp.fake(function() error('inside') end, { device = 'cuda:0' })
    end, 'inside')
    assert.is_false(fsdp.is_fake_mode())
    assert.are.equal('cpu', fsdp.get_default_device())
    local t = fsdp.zeros(2)
    assert.is_false(t:is_fake())
    assert.are.equal(0, t:sum():item())
  end)

  it('names what is wrong', function()
    assert.error_matches(function() fsdp.fake(42) end, 'fsdp.fake: expected a function, got number')
    assert.error_matches(function() fsdp.fake(function() end, 'cuda') end,
      'fsdp.fake: expected an options table')
    assert.error_matches(function() fsdp.fake(function() end, { devcie = 'cuda:0' }) end,
      'fsdp.fake: unknown option devcie')
    assert.error_matches(function() fsdp.fake(function() end, { device = 'tpu:0' }) end, 'tpu')
    assert.is_false(fsdp.is_fake_mode())
  end)
end)

-- Every model family at full size, on a device this machine need not have.
describe('fake builds at full size', function()
  local cases = {
    { 'models.llama', 'Llama-2-70b', 68976648192 },
    { 'models.llama', 'Llama-3.1-70B', 70553706496 },
    { 'models.t5', 't5-11b', 11307321344 },
    { 'models.deepvit', '8B', 8007494160 },
    { 'models.gpt2', 'gpt2-xl', 1557611200 },
  }
  for _, case in ipairs(cases) do
    local module, name, count = case[1], case[2], case[3]
    -- (The default collection budget: fake tensors allocate nothing, and
    -- a budget of 0 would run a full collection per tensor created.)
    it(('%s %s on cuda:0: exact parameters, every tensor fake, no memory'):format(module, name), function()
      local family = require(module)
      local before = cpu_allocations()
      local t0 = clock.now()
      local model = fsdp.fake(function()
        local m = family.build(name)
        m:init_weights({ seed = 0 })   -- init rules run; fills are no-ops
        return m
      end, { device = 'cuda:0' })
      local seconds = clock.now() - t0
      print(('# fake %s: %.2f s'):format(name, seconds))
      assert.are.equal(count, model:num_parameters())
      for _, np in ipairs(model:named_parameters()) do
        assert.is_true(np[2]:is_fake(), np[1])
        assert.are.equal('cuda:0', np[2].device, np[1])
      end
      for _, nb in ipairs(model:named_buffers()) do
        assert.is_true(nb[2]:is_fake() or nb[2]:is_meta(), nb[1])
      end
      assert.are.equal(before, cpu_allocations())
      assert.are.equal(0, fsdp.memory_stats('cuda:0').in_use)
      local s = fsdp.summary(model, { print = false })
      assert.are.equal(count, s.total_params)
      assert.are.equal('cuda:0 (fake)', s.device)
    end)
  end
end)
