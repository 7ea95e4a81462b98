-- binary_spec.lua: forward values of add/sub/mul/div (tensor and scalar,
-- broadcasting, dtype promotion, in-place forms), their behaviour on meta
-- tensors (shapes and FLOPs, no memory), and their errors.
local fsdp = require 'fsdp'

describe('binary ops', function()
  local a = fsdp.tensor({ { 1, 2, 3 }, { 4, 5, 6 } })
  local b = fsdp.tensor({ 10, 20, 30 })

  it('compute with broadcasting and scalars', function()
    assert.same({ { 11, 22, 33 }, { 14, 25, 36 } }, (a + b):tolist())
    assert.same({ { -9, -18, -27 }, { -6, -15, -24 } }, (a - b):tolist())
    assert.same({ { 10, 40, 90 }, { 40, 100, 180 } }, (a * b):tolist())
    assert.same({ { 0.5, 1, 1.5 } }, (a:narrow(0, 0, 1) / 2):tolist())
    assert.same({ 5, 4, 3 }, (6 - a:select(0, 0)):tolist())
    assert.same({ -1, -2, -3 }, (-a[0]):tolist())
    assert.same({ 2, 1, 0.5 }, (2 / fsdp.tensor({ 1, 2, 4 })):tolist())
  end)

  it('promote dtypes as PyTorch does', function()
    local i = fsdp.tensor({ 1, 2 }, { dtype = 'i64' })
    local h = fsdp.tensor({ 1, 2 }, { dtype = 'bf16' })
    assert.equals('i64', (i + i).dtype)
    assert.equals('f32', (i / i).dtype)
    assert.equals('f32', (i * 0.5).dtype)
    assert.equals('i64', (i * 2).dtype)
    assert.equals('bf16', (h * i).dtype)
    assert.equals('f32', (h + fsdp.tensor({ 1, 2 }, { dtype = 'f16' })).dtype)
    assert.equals('f64', (h + fsdp.tensor({ 1, 2 }, { dtype = 'f64' })).dtype)
  end)

  it('work on strided and large inputs', function()
    local x = fsdp.arange(200 * 300, { dtype = 'f64' }):view(200, 300)
    local y = x:t() + x:t() * 2 -- strided, parallel chunks
    assert.equals(3 * (7 * 300 + 5), y:get(5, 7))
    local bf = fsdp.ones(100000, { dtype = 'bf16' }) * 3
    assert.equals(3, bf:get(99999))
  end)

  -- bf16 is computed in f32 and rounded once, whether through f32 chunks
  -- or read and written as bf16 (AVX-512, cpu_rows_avx512.c): the f32
  -- results of the same values, rounded, bit for bit. A million elements,
  -- so that a difference of an f32 ulp would show after rounding.
  it('give bf16 the f32 results rounded once', function()
    local T = require 'fsdp.testing'
    local n = 1000003
    local x = (fsdp.randn({ n }, { seed = 21 }) * 3):to('bf16')
    local y = (fsdp.randn({ n }, { seed = 22 }) * 0.5 + 3):to('bf16') -- no zeros: x / y
    local xf, yf = x:float(), y:float()
    for _, op in ipairs { 'add', 'sub', 'mul', 'div' } do
      local f = ({ add = function(p, q) return p + q end, sub = function(p, q) return p - q end,
                   mul = function(p, q) return p * q end, div = function(p, q) return p / q end })[op]
      assert.equals(0, T.max_abs_diff(f(xf, yf):bfloat16(), f(x, y)), op)
    end
    local acc, accf = x:clone(), xf:clone()
    acc:add_scaled_(y, 0.37)
    accf:add_scaled_(yf, 0.37)
    assert.equals(0, T.max_abs_diff(accf:bfloat16(), acc), 'add_scaled_')
  end)

  it('have in-place forms that broadcast into the left operand', function()
    local t = fsdp.zeros(2, 3)
    t:add_(b):mul_(2):sub_(1):div_(fsdp.tensor({ 1, 1, 0.5 }))
    assert.same({ { 19, 39, 118 }, { 19, 39, 118 } }, t:tolist())
    t:add_scaled_(fsdp.ones(3), -0.5)
    assert.equals(18.5, t:get(0, 0))
    assert.error_matches(function() b:add_(a) end, 'add_: in place, %[2, 3%] must broadcast to %[3%]')
  end)

  it('run on meta tensors: shapes and FLOPs, no memory', function()
    fsdp.reset_memory_stats('cpu')
    -- Allocations, not bytes in use: garbage of earlier specs may be freed
    -- meanwhile (it was, once, in the full suite).
    local before = fsdp.memory_stats('cpu').allocations
    fsdp.reset_flops()
    local x = fsdp.empty({ 8192, 1, 4096 }, { device = 'meta' })
    local y = fsdp.empty({ 4096 }, { device = 'meta' })
    local z = x * y + 1
    assert.same({ 8192, 1, 4096 }, z.shape)
    assert.equals('meta', z.device)
    assert.equals(2 * 8192 * 4096, fsdp.flops())
    assert.equals(before, fsdp.memory_stats('cpu').allocations)
  end)

  it('name the op and shapes in errors', function()
    assert.error_matches(function() return a + fsdp.zeros(4) end,
      'add: shapes %[2, 3%] and %[4%] do not broadcast %(dim 1: 3 vs 4%)')
    local m = fsdp.zeros(2, 3, { device = 'meta' })
    assert.error_matches(function() return m + fsdp.zeros(2, 2, { device = 'meta' }) end,
      'add: shapes %[2, 3%] and %[2, 2%]') -- shape checks happen on meta too
    assert.error_matches(function() return a * m end, 'mul: tensors on different devices %(cpu and meta%)')
    assert.error_matches(function() return a - 'x' end, 'expected a Tensor, got string')
  end)
end)
