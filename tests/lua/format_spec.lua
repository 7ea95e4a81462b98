-- format_spec.lua: tensors print as PyTorch prints them (values, shape,
-- dtype, device), including summarised large tensors and meta tensors.
local fsdp = require 'fsdp'

describe('printing', function()
  it('formats floats with 4 digits and aligned columns', function()
    assert.equals('tensor([[ 1.5000, -2.2500],\n        [ 3.0000,  4.0000]])',
      tostring(fsdp.tensor({ { 1.5, -2.25 }, { 3, 4 } })))
  end)

  it('prints integral floats with a trailing dot, ints plainly', function()
    assert.equals('tensor([1., 2., 3.])', tostring(fsdp.tensor({ 1, 2, 3 })))
    assert.equals('tensor([ 1, -2, 30])', tostring(fsdp.tensor({ 1, -2, 30 }, { dtype = 'i64' })))
    assert.equals('tensor([1, 2], dtype=i32)', tostring(fsdp.tensor({ 1, 2 }, { dtype = 'i32' })))
  end)

  it('switches to scientific notation for wide ranges', function()
    assert.equals('tensor([1.0000e-05, 1.0000e+05])', tostring(fsdp.tensor({ 1e-5, 1e5 })))
  end)

  it('names non-default dtypes, booleans and scalars', function()
    assert.equals('tensor([1., 1.], dtype=bf16)', tostring(fsdp.ones(2, { dtype = 'bf16' })))
    assert.equals('tensor([ True, False])', tostring(fsdp.tensor({ true, false })))
    assert.equals('tensor(3.1416)', tostring(fsdp.tensor(3.14159)))
    assert.equals('tensor([nan, inf])', tostring(fsdp.tensor({ 0 / 0, math.huge })))
  end)

  it('prints empty, meta and fake tensors by their size', function()
    assert.equals('tensor([], size=(3, 0))', tostring(fsdp.zeros(3, 0)))
    assert.equals("tensor(..., size=(4096, 4096), device='meta')",
      tostring(fsdp.empty({ 4096, 4096 }, { device = 'meta' })))
    assert.equals("tensor(..., size=(5,), dtype=bf16, device='meta')",
      tostring(fsdp.empty(5, { device = 'meta', dtype = 'bf16' })))
    assert.equals("tensor(..., size=(2, 2), device='cuda:1', fake=true)",
      tostring(fsdp.empty(2, 2, { device = 'cuda:1', fake = true })))
  end)

  it('summarises tensors over 1000 elements', function()
    assert.equals('tensor([ 100.,  101.,  102.,  ..., 2097., 2098., 2099.])',
      tostring(fsdp.arange(100, 2100)))
    -- nonzero magnitudes spanning more than 1e3 switch to scientific notation
    assert.equals('tensor([0.0000e+00, 1.0000e+00, 2.0000e+00,  ..., 1.9970e+03, 1.9980e+03,\n'
      .. '        1.9990e+03])', tostring(fsdp.arange(2000)))
    local lines = {}
    for l in tostring(fsdp.randn({ 50, 50 }, { seed = 1 })):gmatch('[^\n]+') do lines[#lines + 1] = l end
    assert.equals(7, #lines)
    assert.equals('        ...,', lines[4])
  end)

  it('wraps long rows at 80 columns', function()
    local s = tostring(fsdp.arange(0, 2, 0.1, { dtype = 'f64' }))
    local first = s:match('^[^\n]+')
    assert.is_true(#first <= 80)
    assert.is_truthy(s:find('\n        ', 1, true))
  end)

end)
