-- cuda_elem_spec.lua: the CUDA element kernels (core/cuda/cuda_copy.cu,
-- cuda_binary.cu, cuda_unary.cu, cuda_reduce.cu, cuda_compare.cu) where
-- backend_ops_spec does not reach: random fills and dropout masks that must
-- equal the CPU's bit for bit, dtype conversions with special values,
-- strided and broadcast layouts, integer arithmetic, and reductions large
-- enough to take the chunked paths; the 16-byte vector paths (dense, aligned
-- operands) against the element-by-element ones they must equal. Needs a
-- GPU; pending otherwise.
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

-- The vector paths (core/cuda/cuda_vec.cuh) serve dense operands of one float
-- dtype that start on 16 bytes; the same values one element into their
-- storage (misaligned) or strided take the element-by-element kernels.
-- Sizes: one whole vector, vectors plus a tail, many blocks plus a tail.
describe('cuda 16-byte vector paths', function()
  local FLOATS = { 'f32', 'bf16', 'f16' }
  local SIZES = { 8, 37, 4099 }
  local TOLERANCE = { f32 = 1e-5, bf16 = 2e-2, f16 = 4e-3 } -- backend_ops_spec's, vs f64

  -- n seeded values (f64, on the CPU), positive ones for log/sqrt/pow.
  local function values(n, seed, positive)
    local v = fsdp.randn({ n }, { seed = seed })
    return positive and F.abs(v) + 0.5 or v
  end

  -- On the device in dtype, requiring gradients: a fresh (aligned) tensor,
  -- and a leaf one element longer whose narrow view holds the same values
  -- (misaligned). Returns aligned, view, leaf.
  local function placed(v, dtype)
    local n = v.shape[1]
    local a = v:to(dtype):to(DEV):detach():requires_grad_()
    local leaf = F.cat({ fsdp.zeros({ 1 }), v }, 0):to(dtype):to(DEV):detach():requires_grad_()
    return a, leaf:narrow(0, 1, n), leaf
  end

  local UNARY = {
    { 'exp', F.exp }, { 'log', F.log, true }, { 'sqrt', F.sqrt, true }, { 'rsqrt', F.rsqrt, true },
    { 'tanh', F.tanh }, { 'sigmoid', F.sigmoid }, { 'abs', F.abs }, { 'relu', F.relu },
    { 'gelu', function(x) return F.gelu(x) end }, { 'gelu tanh', function(x) return F.gelu(x, 'tanh') end },
    { 'silu', F.silu }, { 'square', F.square }, { 'pow', function(x) return F.pow(x, 1.5) end, true },
    { 'clamp', function(x) return F.clamp(x, -0.5, 0.7) end },
  }

  it('unary forward and backward: the generic kernels\' bits, the CPU within rounding', function()
    for _, case in ipairs(UNARY) do
      local name, fn, positive = case[1], case[2], case[3]
      for _, n in ipairs(SIZES) do
        local v = values(n, n, positive)
        local w = fsdp.randn({ n }, { seed = 77 })
        for _, dt in ipairs(FLOATS) do
          local what = ('%s %s n=%d'):format(name, dt, n)
          local a, view, leaf = placed(v, dt)
          local wd = w:to(dt):to(DEV)
          local ya, yv = fn(a), fn(view)
          same_values(flat(ya), flat(yv))
          ;(ya * wd):sum():backward()
          ;(yv * wd):sum():backward()
          same_values(flat(a.grad), flat(leaf.grad:narrow(0, 1, n)))
          -- a strided input (every other element): the generic forward
          local m = F.cat({ v:view(n, 1), v:view(n, 1) }, 1):to(dt):to(DEV)
          same_values(flat(fn(m:narrow(1, 0, 1))), flat(ya))
          -- the CPU in f64 on the same rounded values
          local r = v:to(dt):to('f64'):detach():requires_grad_()
          local yr = fn(r)
          ;(yr * w:to(dt):to('f64')):sum():backward()
          local e = rel_error(ya, yr)
          assert(e <= TOLERANCE[dt], ('%s: output error %.3g'):format(what, e))
          e = rel_error(a.grad, r.grad)
          assert(e <= TOLERANCE[dt], ('%s: gradient error %.3g'):format(what, e))
        end
      end
    end
  end)

  it('silu_mul forward and backward (either gradient alone too)', function()
    for _, n in ipairs(SIZES) do
      local g, u, w = values(n, 1), values(n, 2), fsdp.randn({ n }, { seed = 3 })
      for _, dt in ipairs(FLOATS) do
        for _, wants in ipairs({ { true, true }, { true, false }, { false, true } }) do
          local what = ('silu_mul %s n=%d wants %s %s'):format(dt, n, tostring(wants[1]), tostring(wants[2]))
          local ga, gview, gleaf = placed(g, dt)
          local ua, uview, uleaf = placed(u, dt)
          for _, t in ipairs({ ga, gleaf }) do t:requires_grad_(wants[1]) end
          for _, t in ipairs({ ua, uleaf }) do t:requires_grad_(wants[2]) end
          if not wants[1] then gview = gleaf:narrow(0, 1, n) end
          if not wants[2] then uview = uleaf:narrow(0, 1, n) end
          local wd = w:to(dt):to(DEV)
          local ya, yv = F.silu_mul(ga, ua), F.silu_mul(gview, uview)
          same_values(flat(ya), flat(yv))
          ;(ya * wd):sum():backward()
          ;(yv * wd):sum():backward()
          if wants[1] then same_values(flat(ga.grad), flat(gleaf.grad:narrow(0, 1, n))) end
          if wants[2] then same_values(flat(ua.grad), flat(uleaf.grad:narrow(0, 1, n))) end
          local gr = g:to(dt):to('f64'):detach():requires_grad_()
          local ur = u:to(dt):to('f64'):detach():requires_grad_()
          local yr = F.silu_mul(gr, ur)
          ;(yr * w:to(dt):to('f64')):sum():backward()
          assert(rel_error(ya, yr) <= TOLERANCE[dt], what .. ': output')
          if wants[1] then assert(rel_error(ga.grad, gr.grad) <= TOLERANCE[dt], what .. ': dgate') end
          if wants[2] then assert(rel_error(ua.grad, ur.grad) <= TOLERANCE[dt], what .. ': dup') end
        end
      end
    end
  end)

  it('dense casts between f32, bf16 and f16 equal the CPU, aligned and not', function()
    local specials = { 0, -0.0, 1 / 0, -1 / 0, 0 / 0, 65504, 65520, 1e-8, 6e-8, 1e-40, 3.4e38,
                       1 + 2 ^ -8, 1 + 3 * 2 ^ -9, -7.9 }
    for _, n in ipairs(SIZES) do
      local list = (fsdp.randn({ n + 1 }, { seed = n }) * 300):tolist()
      for i, s in ipairs(specials) do list[(i * 7) % (n + 1) + 1] = s end
      local src = fsdp.tensor(list, { dtype = 'f64' })
      for _, from in ipairs(FLOATS) do
        local c = src:to(from)
        local g = c:to(DEV)
        for _, to in ipairs(FLOATS) do
          if to ~= from then
            local want = flat(c:narrow(0, 1, n):to(to))
            same_values(flat(g:narrow(0, 1, n):clone():to(to)), want) -- vector path
            same_values(flat(g:narrow(0, 1, n):to(to)), want)         -- misaligned
            same_values(flat(g:to(to)), flat(c:to(to)))
          end
        end
      end
    end
  end)

  it('strided copies with a contiguous innermost dim (head transposes) equal the CPU', function()
    local x = fsdp.randn({ 2, 5, 3, 64 }, { seed = 4 }) * 100
    for _, dt in ipairs({ 'f32', 'bf16', 'f16', 'f64', 'i64', 'i32', 'u8' }) do
      for _, d in ipairs({ 64, 12, 8 }) do -- 12: whole f32 vectors only
        local c = x:narrow(3, 0, d):contiguous():to(dt)
        local g = c:to(DEV)
        -- [B,T,H,D] -> [B,H,T,D], and back into a permuted destination
        same_values(flat(g:permute(0, 2, 1, 3):contiguous()), flat(c:permute(0, 2, 1, 3):contiguous()))
        local back_g = fsdp.zeros({ 2, 5, 3, d }, { device = DEV, dtype = dt })
        local back_c = fsdp.zeros({ 2, 5, 3, d }, { dtype = dt })
        back_g:permute(0, 2, 1, 3):copy_(g:permute(0, 2, 1, 3):contiguous())
        back_c:permute(0, 2, 1, 3):copy_(c:permute(0, 2, 1, 3):contiguous())
        same_values(flat(back_g), flat(c))
        same_values(flat(back_g), flat(back_c))
        -- transposes that convert
        for _, to in ipairs(FLOATS) do
          if to ~= dt then
            same_values(flat(g:permute(0, 2, 1, 3):to(to)), flat(c:permute(0, 2, 1, 3):to(to)))
          end
        end
      end
      -- column blocks: aligned (from element 16) and misaligned (from 1)
      local m = fsdp.randn({ 5, 40 }, { seed = 5 }):to(dt)
      local mg = m:to(DEV)
      for _, start in ipairs({ 16, 1 }) do
        same_values(flat(mg:narrow(1, start, 16):contiguous()), flat(m:narrow(1, start, 16):contiguous()))
        if dt == 'f32' then
          same_values(flat(mg:narrow(1, start, 16):to('bf16')), flat(m:narrow(1, start, 16):to('bf16')))
        end
      end
      -- a broadcast source (stride 0 outside the rows)
      local row = fsdp.randn({ 1, 64 }, { seed = 6 }):to(dt)
      same_values(flat(row:to(DEV):expand(5, 64):contiguous()), flat(row:expand(5, 64):contiguous()))
    end
  end)

  it('dense fills equal the CPU, aligned and not', function()
    for _, dt in ipairs({ 'f32', 'bf16', 'f16', 'f64', 'i64', 'i32', 'i16', 'u8' }) do
      local v = (dt == 'f32' or dt == 'bf16' or dt == 'f16' or dt == 'f64') and -1 / 3 or 7
      for _, n in ipairs(SIZES) do
        same_values(flat(fsdp.zeros({ n }, { device = DEV, dtype = dt }):fill_(v)),
                    flat(fsdp.zeros({ n }, { dtype = dt }):fill_(v)))
        local g = fsdp.zeros({ n + 1 }, { device = DEV, dtype = dt })
        g:narrow(0, 1, n):fill_(v)
        local c = fsdp.zeros({ n + 1 }, { dtype = dt })
        c:narrow(0, 1, n):fill_(v)
        same_values(flat(g), flat(c))
      end
    end
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
