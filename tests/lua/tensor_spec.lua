-- tensor_spec.lua: the Lua Tensor API over the core: factories, dtypes,
-- devices, views, conversion, random numbers, element access, freeing,
-- and the errors each misuse raises.
local fsdp = require 'fsdp'

local function values(t) return t:tolist() end

describe('factories', function()
  it('build zeros, ones, full, arange and tensors from tables', function()
    assert.same({ { 0, 0, 0 }, { 0, 0, 0 } }, values(fsdp.zeros({ 2, 3 })))
    assert.same({ 1, 1 }, values(fsdp.ones(2)))
    assert.same({ { 7, 7 } }, values(fsdp.full({ 1, 2 }, 7, { dtype = 'i32' })))
    assert.same({ 0, 1, 2, 3 }, values(fsdp.arange(4)))
    assert.same({ 2, 1.5, 1 }, values(fsdp.arange(2, 0.5, -0.5, { dtype = 'f64' })))
    local t = fsdp.tensor({ { 1, 2 }, { 3, 4 } }, { dtype = 'i64' })
    assert.same({ 2, 2 }, t.shape)
    assert.equals('i64', t.dtype)
    assert.same({ { 1, 2 }, { 3, 4 } }, values(t))
    assert.equals('bool', fsdp.tensor({ true, false }).dtype)
    assert.equals(0, fsdp.tensor(5).ndim)
    assert.equals(5, fsdp.tensor(5):item())
  end)

  it('accept shapes as a table or as numbers', function()
    assert.same({ 2, 3, 4 }, fsdp.empty(2, 3, 4).shape)
    assert.same({ 2, 3, 4 }, fsdp.empty({ 2, 3, 4 }, { dtype = 'f16' }).shape)
    assert.same({}, fsdp.zeros({}).shape)
  end)

  it('reject ragged tables and bad elements with clear errors', function()
    assert.has_error(function() fsdp.tensor({ { 1, 2 }, { 3 } }) end,
      'tensor: ragged nested table: dim 1 has lengths 2 and 1')
    assert.error_matches(function() fsdp.tensor({ 'a' }) end, 'element is a string')
  end)
end)

describe('dtypes and devices', function()
  it('round-trip through every dtype', function()
    for _, d in ipairs(fsdp.dtypes) do
      local t = fsdp.tensor({ 0, 1, 2, 3 }, { dtype = d })
      assert.equals(d, t.dtype)
      local back = t:to('f64'):tolist()
      assert.same(d == 'bool' and { 0, 1, 1, 1 } or { 0, 1, 2, 3 }, back)
    end
  end)

  it('convert with rounding and saturation', function()
    assert.equals(1.0078125, fsdp.tensor({ 1.01 }):to('bf16'):get(0))
    assert.equals(65504, fsdp.tensor({ 65504 }):half():get(0))
    assert.equals(math.huge, fsdp.tensor({ 1e6 }):half():get(0))
    assert.equals(127, fsdp.tensor({ 1000 }):to('i8'):get(0))
    assert.equals(-3, fsdp.tensor({ -3.9 }):int():get(0))
  end)

  it('accept aliases and reject unknown names', function()
    assert.equals('bf16', fsdp.zeros(1, { dtype = 'bfloat16' }).dtype)
    assert.equals('f16', fsdp.zeros(1, { dtype = 'half' }).dtype)
    assert.error_matches(function() fsdp.zeros(1, { dtype = 'f8' }) end, "unknown dtype 'f8'")
    assert.error_matches(function() fsdp.zeros(1, { device = 'tpu' }) end, "unknown device 'tpu'")
  end)

  it('report cuda as unavailable without a GPU, with a reason', function()
    if fsdp.cuda.is_available() then
      pending('a GPU is present: the GPU suite covers cuda tensors')
      return
    end
    assert.equals(0, fsdp.cuda.device_count())
    assert.is_true(#fsdp.cuda.status() > 0)
    assert.error_matches(function() fsdp.zeros(2, { device = 'cuda:0' }) end, 'cuda:0')
  end)
end)

describe('meta and fake tensors', function()
  it('allocate nothing and still take views', function()
    fsdp.reset_memory_stats('cpu')
    collectgarbage(); collectgarbage()
    local before = fsdp.memory_stats('cpu').in_use
    local meta_before = fsdp.memory_stats('meta').in_use
    local m = fsdp.randn({ 100000, 100000 }, { device = 'meta' })
    assert.same({ 100000, 100000 }, m.shape)
    assert.equals('meta', m.device)
    assert.is_true(m:is_meta())
    assert.is_false(m:has_storage())
    assert.same({ 100000, 50 }, m:narrow(1, 0, 50).shape)
    assert.same({ 100000, 100000 }, m:t():contiguous().shape)
    assert.equals(before, fsdp.memory_stats('cpu').in_use)
    -- the bytes it stands for, counted on meta ([Note: virtual storage])
    collectgarbage(); collectgarbage()
    assert.equals(meta_before + 4e10, fsdp.memory_stats('meta').in_use)
    assert.error_matches(function() m:get(0, 0) end, 'meta device and has no values')
  end)

  it('fake tensors report their device without storage', function()
    local f = fsdp.empty({ 8192, 8192 }, { device = 'cuda:0', dtype = 'bf16', fake = true })
    assert.equals('cuda:0', f.device)
    assert.is_true(f:is_fake())
    assert.equals(0, f:storage_bytes())
  end)
end)

describe('views', function()
  local a
  before_each(function() a = fsdp.arange(12):view(3, 4) end)

  it('share storage and see the same values', function()
    local n = a:narrow(1, 1, 2)
    assert.same({ { 1, 2 }, { 5, 6 }, { 9, 10 } }, values(n))
    n:fill_(0)
    assert.same({ 0, 0, 0, 3 }, values(a:select(0, 0)))
  end)

  it('cover slice, select, transpose, permute, expand, squeeze, flatten', function()
    assert.same({ { 1, 3 }, { 5, 7 }, { 9, 11 } }, values(a:slice(1, 1, nil, 2)))
    assert.same({ 8, 9, 10, 11 }, values(a:select(0, -1)))
    assert.same({ 8, 9, 10, 11 }, values(a[2]))
    assert.same({ 4, 3 }, a:t().shape)
    assert.is_false(a:t():is_contiguous())
    assert.is_true(a:t():contiguous():is_contiguous())
    assert.same({ 4, 1, 3 }, a:unsqueeze(0):permute(2, 0, 1).shape)
    assert.same({ 2, 3, 4 }, a:unsqueeze(0):expand(2, 3, 4).shape)
    assert.same({ 3, 4 }, a:unsqueeze(1):squeeze().shape)
    assert.same({ 12 }, a:flatten().shape)
    assert.equals(3, a:size(0))
    assert.equals(4, a:size(-1))
  end)

  it('reshape copies where view cannot', function()
    assert.error_matches(function() a:t():view(12) end, 'cannot be viewed as %[12%]')
    assert.same({ 0, 4, 8, 1 }, { table.unpack(values(a:t():reshape(12)), 1, 4) })
  end)

  it('name the operation and shapes in errors', function()
    assert.error_matches(function() a:narrow(2, 0, 1) end,
      'narrow: dim 2 out of range for a 2%-d tensor of shape %[3, 4%]')
    assert.error_matches(function() a:view(5, -1) end, 'view: shape %[5, %-1%] is invalid')
    assert.error_matches(function() a:expand(3, 5) end, 'expand: cannot expand shape %[3, 4%] to %[3, 5%]')
    assert.error_matches(function() a:select(1, 9) end, 'select: index 9 out of range')
    assert.error_matches(function() a:permute(0, 0) end, 'permute: dim 0 appears more than once')
    assert.error_matches(function() fsdp.zeros(2, -1) end, 'zeros: negative size %-1')
    assert.error_matches(function() a:item() end, 'item: tensor of shape %[3, 4%] has 12 elements')
    assert.error_matches(function() a:copy_(fsdp.zeros(5)) end,
      'copy_: source of shape %[5%] does not broadcast to shape %[3, 4%]')
  end)
end)

describe('copy, fill, element access', function()
  it('reads a NaN with any bits back as NaN, never as nil (Note: NaNs handed to Lua)', function()
    local ffi = require 'ffi'
    local t = fsdp.zeros({ 2 }, { dtype = 'f64' })
    local p = ffi.cast('uint64_t *', require('fsdp.tensor').cptr(t).data)
    p[0] = 0xFFFFFFFFFFFFFFFFULL -- what uninitialised or poisoned memory may hold
    p[1] = 0x7FF0000000000001ULL -- a signalling NaN
    local v = t:get(0)
    assert.equals('number', type(v))
    assert.is_true(v ~= v)
    local list = t:tolist()
    assert.is_true(type(list[1]) == 'number' and list[1] ~= list[1])
    assert.is_true(type(list[2]) == 'number' and list[2] ~= list[2])
    assert.is_true(t:max():item() ~= t:max():item())
  end)

  -- Copies of transposed matrices go block by block (cpu_transpose.c):
  -- whole 16 x 16 blocks in registers for 2-byte elements, ragged edges and
  -- other element sizes one by one, batches over threads.
  it('copies transposed views exactly (2-, 4-, 8-byte elements, ragged edges, batches)', function()
    for _, dt in ipairs { 'bf16', 'f16', 'f32', 'i32', 'f64', 'i64' } do
      for _, shape in ipairs { { 3, 37, 70 }, { 130, 301 }, { 2, 64, 48 } } do
        local src = (fsdp.randn(shape, { seed = 9 }) * 100):to(dt)
        local want = src:tolist()
        local got = src:transpose(-1, -2):contiguous():tolist()
        local function check(w, g, batch)
          for i = 1, #w do
            for j = 1, #w[1] do
              if w[i][j] ~= g[j][i] then
                error(('%s %s batch %d: [%d][%d] is %s, want %s'):format(dt, table.concat(shape, 'x'),
                  batch, j - 1, i - 1, tostring(g[j][i]), tostring(w[i][j])), 0)
              end
            end
          end
        end
        if #shape == 2 then check(want, got, 0) else
          for b = 1, #want do check(want[b], got[b], b - 1) end
        end
      end
    end
  end)

  -- Views whose rows stay dense (heads moved next to the tokens) are copied
  -- row by row, the rows walked by an odometer over the other dims.
  it('copies permuted views with dense rows exactly (odometer over 3 outer dims)', function()
    for _, dt in ipairs { 'bf16', 'f32', 'i64' } do
      local src = (fsdp.randn({ 3, 5, 7, 64 }, { seed = 10 }) * 100):to(dt)
      local want = src:tolist()
      local got = src:permute(2, 0, 1, 3):contiguous():tolist() -- [7, 3, 5, 64]
      for a = 1, 3 do
        for b = 1, 5 do
          for c = 1, 7 do
            for d = 1, 64, 9 do
              assert.equals(want[a][b][c][d], got[c][a][b][d], ('%s [%d][%d][%d][%d]'):format(dt, a, b, c, d))
            end
          end
        end
      end
    end
  end)

  it('copy_ broadcasts and converts; set/get address elements', function()
    local t = fsdp.zeros({ 2, 3 }, { dtype = 'bf16' })
    t:copy_(fsdp.tensor({ 1, 2, 3 }))
    assert.same({ { 1, 2, 3 }, { 1, 2, 3 } }, values(t))
    t:set(9, 1, -1)
    assert.equals(9, t:get(1, 2))
    t[0] = 4
    assert.same({ 4, 4, 4 }, values(t[0]))
    assert.equals(t, t:zero_())
  end)
end)

describe('random numbers', function()
  it('repeat for a seed, and a slice generated alone equals the slice of the whole', function()
    local a = fsdp.randn({ 2, 3 }, { seed = 1 })
    local b = fsdp.randn({ 2, 3 }, { seed = 1 })
    assert.same(values(a), values(b))
    local whole = fsdp.randn({ 4, 3 }, { seed = 1 })
    local part = fsdp.randn({ 2, 3 }, { seed = 1, offset = 6 })
    assert.same(values(whole:narrow(0, 2, 2)), values(part))
    assert.are_not.same(values(a), values(fsdp.randn({ 2, 3 }, { seed = 2 })))
    assert.are_not.same(values(a), values(fsdp.randn({ 2, 3 }, { seed = 1, stream = 1 })))
  end)

  it('follow manual_seed when no seed is given', function()
    fsdp.manual_seed(42)
    local x, y = fsdp.rand(5):tolist(), fsdp.rand(5):tolist()
    assert.are_not.same(x, y)
    fsdp.manual_seed(42)
    assert.same(x, fsdp.rand(5):tolist())
    assert.same(y, fsdp.rand(5):tolist())
  end)

  it('respect ranges', function()
    for _, v in ipairs(fsdp.randint(3, 7, { 1000 }, { seed = 5 }):tolist()) do
      assert.is_true(v >= 3 and v < 7 and v == math.floor(v))
    end
    for _, v in ipairs(fsdp.rand({ 1000 }, { seed = 5, low = -1, high = 1 }):tolist()) do
      assert.is_true(v >= -1 and v < 1)
    end
  end)
end)

describe('memory', function()
  it('counts allocations, frees on free(), and enforces a limit', function()
    -- Collect first: a finalizer running mid-test would free unrelated memory.
    collectgarbage()
    collectgarbage('stop')
    finally(function() collectgarbage('restart') end)
    fsdp.reset_memory_stats('cpu')
    local s0 = fsdp.memory_stats('cpu')
    local t = fsdp.empty({ 1024, 1024 })
    assert.equals(s0.in_use + 4 * 1024 * 1024, fsdp.memory_stats('cpu').in_use)
    t:free()
    assert.equals(s0.in_use, fsdp.memory_stats('cpu').in_use)
    assert.error_matches(function() return t.shape end, 'tensor was freed')
    assert.equals('tensor(<freed>)', tostring(t))
    fsdp.set_memory_limit('cpu', s0.in_use + 1000)
    local ok, err = pcall(fsdp.zeros, { 1000 })
    fsdp.set_memory_limit('cpu', 0)
    assert.is_false(ok)
    assert.matches('out of memory on cpu: requested 4000 bytes', err)
  end)

  it('collects dead tensors on out of memory, so trying again can succeed', function()
    local s0 = fsdp.memory_stats('cpu')
    fsdp.set_memory_limit('cpu', s0.in_use + 6 * 2^20)
    finally(function() fsdp.set_memory_limit('cpu', 0) end)
    local dead = fsdp.empty({ 2^20 }) -- 4 MiB, dropped but not yet collected
    dead = nil
    local ok, err = pcall(fsdp.empty, { 2^20 })
    assert.is_false(ok)
    assert.matches('out of memory on cpu', err)
    assert.equals(s0.in_use, fsdp.memory_stats('cpu').in_use) -- the dead one is gone
    assert.equals(2^20, fsdp.empty({ 2^20 }):numel())
  end)
end)

-- [Note: shape arithmetic cannot overflow] in core/tensor/shape.c.
describe('shapes whose sizes overflow 64 bits', function()
  local T = require 'fsdp.testing'
  it('are refused by every way of making a tensor, naming the shape', function()
    local huge = 2 ^ 62
    T.raises(function() fsdp.empty({ 0, huge, huge }) end, 'shape [0, 4611686018427387904, 4611686018427387904] is too large')
    T.raises(function() fsdp.empty({ huge, 4 }) end, 'is too large')
    T.raises(function() fsdp.empty({ 2 ^ 61 }, { dtype = 'f64' }) end, 'is too large')
    T.raises(function() fsdp.empty({ 0, huge, huge }, { device = 'meta' }) end, 'is too large')
    T.raises(function() fsdp.zeros({ 1, 1 }):expand({ 2 ^ 40, 2 ^ 40 }) end, 'is too large')
    T.raises(function() fsdp.zeros({ 0 }):view({ 2 ^ 40, 2 ^ 40, 0 }) end, 'too large')
    T.raises(function() fsdp.zeros({ 0 }):reshape({ 0, huge, huge }) end, 'too large')
    -- the largest shapes that fit still work (on meta: nothing allocated)
    local ok = fsdp.empty({ 0, 2 ^ 30, 2 ^ 28 }, { device = 'meta' })
    assert.equal(0, ok:numel())
  end)
end)

describe('FLOP counts of huge shapes', function()
  it('saturate instead of overflowing (meta tensors of any valid shape)', function()
    local F = require 'fsdp.functional'
    fsdp.reset_flops()
    local a = fsdp.empty({ 2 ^ 29, 2 ^ 29 }, { device = 'meta' })
    local b = fsdp.empty({ 2 ^ 29, 2 ^ 28 }, { device = 'meta' })
    local c = F.matmul(a, b) -- 2 * 2^29 * 2^28 * 2^29 = 2^87 multiply-adds
    assert.equal(2 ^ 28, c:size(1))
    assert.is_true(fsdp.flops() >= 2 ^ 62)
    F.matmul(a, b) -- the total saturates too
    assert.is_true(fsdp.flops() >= 2 ^ 62)
  end)
end)

describe('Tensor get and set indices', function()
  it('count from the end when negative and must be one per dimension, named by the method', function()
    local t = fsdp.tensor({ { 1, 2, 3 }, { 4, 5, 6 } })
    assert.equals(6, t:get(-1, -1))
    assert.equals(4, t:get({ 1, 0 }))
    t:set(9, -2, -1)
    assert.equals(9, t:get(0, 2))
    assert.error_matches(function() t:get(1) end, 'get: 1 indices for a 2-d tensor', nil, true)
    assert.error_matches(function() t:set(0, 1, 2, 3) end, 'set: 3 indices for a 2-d tensor', nil, true)
  end)
end)
