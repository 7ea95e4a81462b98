-- cuda_elem_spec.lua: the CUDA element kernels (core/cuda/cuda_copy.cu,
-- cuda_binary.cu, cuda_unary.cu, cuda_reduce.cu, cuda_compare.cu) where
-- backend_ops_spec does not reach: random fills and dropout masks that must
-- equal the CPU's bit for bit, dtype conversions with special values,
-- strided and broadcast layouts, integer arithmetic, and reductions large
-- enough to take the chunked paths. Needs a GPU; pending otherwise.
local fsdp = require 'fsdp'
local F = fsdp.F

local CUDA = fsdp.cuda.is_available()
local DEV = 'cuda:0'

-- Element-wise identity of two lists: equal numbers (with the sign of
-- zero), or both NaN.
local function same_values(a, b)
  assert.equal(#a, #b)
  for i = 1, #a do
    local x, y = a[i], b[i]
    local ok = (x ~= x and y ~= y) or (x == y and (x ~= 0 or 1 / x == 1 / y))
    if not ok then
      error(('element %d: cuda gives %s, cpu %s'):format(i, tostring(x), tostring(y)), 2)
    end
  end
end

local function flat(t) return t:to('cpu'):contiguous():view(-1):tolist() end

-- max |got - want| / max |want| in f64.
local function rel_error(got, want)
  local g, w = got:to('cpu'):to('f64'), want:to('cpu'):to('f64')
  local scale = F.max(F.abs(w):view(-1), 0):item()
  return F.max(F.abs(g - w):view(-1), 0):item() / math.max(scale, 1e-300)
end

if not CUDA then
  describe('cuda element kernels', function()
    pending('no GPU here (' .. fsdp.cuda.status() .. '): the cuda element kernels were not run')
  end)
  return
end

describe('cuda random fills', function()
  it('uniform and randint equal the CPU bit for bit, offsets and all dtypes', function()
    for _, dt in ipairs({ 'f32', 'f64', 'bf16', 'f16' }) do
      local opts = { seed = 1234, low = -2, high = 3, dtype = dt }
      local c = fsdp.rand({ 37, 11 }, opts)
      opts.device = DEV
      same_values(flat(fsdp.rand({ 37, 11 }, opts)), flat(c))
    end
    for _, dt in ipairs({ 'i64', 'i32', 'f32' }) do
      local c = fsdp.randint(-5, 1000003, { 1001 }, { seed = 7, dtype = dt })
      local g = fsdp.randint(-5, 1000003, { 1001 }, { seed = 7, dtype = dt, device = DEV })
      same_values(flat(g), flat(c))
    end
    -- a strided target and a first_index that is not a multiple of 4
    local g = fsdp.zeros({ 6, 10 }, { device = DEV })
    local c = fsdp.zeros({ 6, 10 })
    g:t():uniform_(0, 1, { seed = 3, offset = 5 })
    c:t():uniform_(0, 1, { seed = 3, offset = 5 })
    same_values(flat(g), flat(c))
  end)

  it('normal fills (generated on the host) equal the CPU', function()
    local c = fsdp.randn({ 333 }, { seed = 11 })
    same_values(flat(fsdp.randn({ 333 }, { seed = 11, device = DEV })), flat(c))
  end)

  it('dropout keeps the CPU mask exactly', function()
    local x = fsdp.randn({ 33, 65 }, { seed = 2 })
    local c = F.dropout(x, 0.3, true, { seed = 9 })
    local g = F.dropout(x:to(DEV), 0.3, true, { seed = 9 })
    same_values(flat(g), flat(c))
    -- a transposed input walks the same row-major element order
    same_values(flat(F.dropout(x:t():to(DEV), 0.5, true, { seed = 4 })),
                flat(F.dropout(x:t(), 0.5, true, { seed = 4 })))
  end)
end)

describe('cuda copies and fills', function()
  it('converts special values as the CPU does', function()
    local vals = { 0, -0.0, 1.5, -2.5, 65504, 65520, 1e30, -1e30, 3.4e38, 1 / 0, -1 / 0, 0 / 0,
                   2.5, 3.5, -7.9, 300, -300, 2 ^ 40 + 1, 1e-8, 6e-8, 1e-40 }
    local src = fsdp.tensor(vals, { dtype = 'f64' })
    local dtypes = { 'f64', 'f32', 'bf16', 'f16', 'i64', 'i32', 'i16', 'i8', 'u8', 'bool' }
    for _, from in ipairs(dtypes) do
      local c0 = src:to(from)
      local g0 = c0:to(DEV)
      for _, to in ipairs(dtypes) do
        same_values(flat(g0:to(to)), flat(c0:to(to)))
      end
    end
    local big = fsdp.tensor({ 9007199254740993, -9007199254740993, 2 ^ 62 + 3 }, { dtype = 'i64' })
    for _, to in ipairs({ 'f32', 'bf16', 'f16', 'f64', 'i32' }) do
      same_values(flat(big:to(DEV):to(to)), flat(big:to(to)))
    end
  end)

  it('copies strided and broadcast views, and fills strided views', function()
    local x = fsdp.randn({ 4, 5, 6 }, { seed = 1 })
    local g = x:to(DEV)
    same_values(flat(g:permute(2, 0, 1):contiguous()), flat(x:permute(2, 0, 1):contiguous()))
    local dst_g, dst_c = fsdp.zeros({ 3, 4, 6 }, { device = DEV, dtype = 'bf16' }), fsdp.zeros({ 3, 4, 6 }, { dtype = 'bf16' })
    dst_g:copy_(g:narrow(1, 1, 1):narrow(0, 0, 1))
    dst_c:copy_(x:narrow(1, 1, 1):narrow(0, 0, 1))
    same_values(flat(dst_g), flat(dst_c))
    g:transpose(0, 2):fill_(2.75)
    same_values(flat(g), flat(fsdp.full({ 4, 5, 6 }, 2.75)))
    local h = fsdp.zeros({ 5, 7 }, { device = DEV, dtype = 'f16' })
    h:narrow(1, 2, 3):fill_(-1.0 / 3)
    local hc = fsdp.zeros({ 5, 7 }, { dtype = 'f16' })
    hc:narrow(1, 2, 3):fill_(-1.0 / 3)
    same_values(flat(h), flat(hc))
  end)
end)

describe('cuda binary, compare and where', function()
  it('integer arithmetic is exact', function()
    local a = fsdp.tensor({ 2 ^ 53 + 1, -7, 123456789012, 5 }, { dtype = 'i64' })
    local b = fsdp.tensor({ 3, 2, -1000, 0 }, { dtype = 'i64' })
    local ga, gb = a:to(DEV), b:to(DEV)
    same_values(flat(ga + gb), flat(a + b))
    same_values(flat(ga - gb), flat(a - b))
    same_values(flat(ga * gb), flat(a * b))
    same_values(flat(ga / gb), flat(a / b)) -- true division in f32
  end)

  it('mixed dtypes and broadcasting match the CPU bit for bit', function()
    local a = fsdp.randn({ 7, 1, 9 }, { seed = 1 }):to('bf16')
    local b = fsdp.randn({ 5, 1 }, { seed = 2 })
    same_values(flat(a:to(DEV) * b:to(DEV)), flat(a * b))
    same_values(flat(a:to(DEV) + b:to(DEV):to('f64')), flat(a + b:to('f64')))
    local x, y = fsdp.randn({ 1000 }, { seed = 3 }), fsdp.randn({ 1000 }, { seed = 4 })
    local cx = x:clone()
    local gx = x:to(DEV)
    gx:add_scaled_(y:to(DEV), 0.37)
    cx:add_scaled_(y, 0.37)
    same_values(flat(gx), flat(cx))
  end)

  it('every comparison, mixed int/float operands, and where', function()
    local a = fsdp.tensor({ 1, 2, 3, 0 / 0, -0.0, 2 ^ 53 + 1 }, { dtype = 'f64' })
    local b = fsdp.tensor({ 1, 3, 2, 1, 0, 2 ^ 53 }, { dtype = 'i64' })
    for _, op in ipairs({ 'eq', 'ne', 'lt', 'le', 'gt', 'ge' }) do
      same_values(flat(a:to(DEV)[op](a:to(DEV), b:to(DEV)):to('i32')), flat(a[op](a, b):to('i32')))
    end
    local x, y = fsdp.randn({ 4, 6 }, { seed = 5 }), fsdp.randn({ 6 }, { seed = 6 }):to('f16')
    local c = x:gt(0)
    same_values(flat(F.where(c:to(DEV), x:to(DEV), y:to(DEV))), flat(F.where(c, x, y)))
  end)
end)

describe('cuda reductions', function()
  it('large sums take the chunked paths and stay within f32 rounding', function()
    local x = fsdp.randn({ 3, 200000 }, { seed = 8 })
    local g = x:to(DEV)
    assert.is_true(rel_error(F.sum(g, 1), F.sum(x, 1)) < 1e-6)     -- rows, chunked
    assert.is_true(rel_error(F.sum(g, 0), F.sum(x, 0)) < 1e-6)     -- cols
    assert.is_true(rel_error(F.sum(g), F.sum(x)) < 1e-6)           -- everything
    assert.is_true(rel_error(F.mean(g:t(), 0), F.mean(x:t(), 0)) < 1e-6) -- a strided input
    local y = fsdp.randn({ 64, 33, 40 }, { seed = 9 }):to('bf16')
    assert.is_true(rel_error(F.sum(y:to(DEV), { 0, 2 }), F.sum(y, { 0, 2 })) < 1e-2)
    local i = fsdp.randint(-2 ^ 40, 2 ^ 40, { 1000, 37 }, { seed = 1 })
    same_values(flat(F.sum(i:to(DEV), 0)), flat(F.sum(i, 0)))
    same_values(flat(F.sum(i:to(DEV))), flat(F.sum(i)))
  end)

  it('max/min pick the first of ties and the first NaN, as the CPU', function()
    local v = fsdp.tensor({ { 1, 3, 3, 2 }, { 0 / 0, 5, 0 / 0, 1 }, { -0.0, 0, 0, -1 } }, { dtype = 'f32' })
    for _, fn in ipairs({ F.max, F.min }) do
      for dim = 0, 1 do
        local gv, gi = fn(v:to(DEV), dim)
        local cv, ci = fn(v, dim)
        same_values(flat(gv), flat(cv))
        same_values(flat(gi), flat(ci))
      end
    end
    local big = fsdp.randint(0, 50, { 3, 100000 }, { seed = 2 }) -- many ties, long rows
    local gv, gi = F.max(big:to(DEV), 1)
    local cv, ci = F.max(big, 1)
    same_values(flat(gi), flat(ci))
    same_values(flat(gv), flat(cv))
    gv, gi = F.min(big:to(DEV), 0)
    cv, ci = F.min(big, 0)
    same_values(flat(gi), flat(ci))
  end)

  it('max backward scatters the gradient to the picked index', function()
    local x = fsdp.randn({ 5, 300 }, { seed = 3 })
    local g = x:to(DEV):detach():requires_grad_()
    local c = x:detach():requires_grad_()
    ;(F.max(g, 1)):sum():backward()
    ;(F.max(c, 1)):sum():backward()
    same_values(flat(g.grad), flat(c.grad))
  end)
end)
