-- elementwise_spec.lua: the elementwise family: unary math and activations,
-- silu_mul, dropout, reductions (sum/mean/var/std, max/min), comparisons
-- and where. Forward values against references computed here in Lua,
-- finite-difference gradient checks in f64, bf16 and strided inputs, meta
-- tensors (shapes and FLOPs, no memory), large inputs (the parallel and
-- split paths), and the errors.
local fsdp = require 'fsdp'
local F = require 'fsdp.functional.elementwise'
local T = require 'fsdp.testing'

local function flat(t) return t:contiguous():view(-1):tolist() end

local function f64(shape, seed, opts)
  opts = opts or {}
  opts.seed, opts.dtype = seed, 'f64'
  return fsdp.randn(shape, opts):requires_grad_()
end

-- Values away from 0 (and from -1, 1): for ops with a kink there.
local function away(shape, seed)
  local x = fsdp.rand(shape, { seed = seed, dtype = 'f64', low = 0.2, high = 2 })
  local s = fsdp.rand(shape, { seed = seed + 100, dtype = 'f64' }):lt(0.5)
  return F.where(s, x, x * -1):detach():requires_grad_()
end

local function close(a, b, tol, what)
  tol = tol or 1e-6
  for i = 1, #a do
    local x, y = a[i], b[i]
    local ok = (x ~= x and y ~= y) or x == y or math.abs(x - y) <= tol * (1 + math.abs(y))
    if not ok then
      error(('%s: element %d: got %.10g, expected %.10g'):format(what or 'values', i - 1, x, y), 2)
    end
  end
  assert.equals(#b, #a)
end

-- erf by its Taylor series: plenty for |x| <= 3 in double.
local function erf(x)
  local sum, term, n = 0, x, 0
  repeat
    local add = term / (2 * n + 1)
    sum = sum + add
    n = n + 1
    term = -term * x * x / n
  until math.abs(add) < 1e-17
  return 2 / math.sqrt(math.pi) * sum
end

local function sigmoid(v) return 1 / (1 + math.exp(-v)) end
local K = math.sqrt(2 / math.pi)

local REF = {
  exp = math.exp, log = math.log, sqrt = math.sqrt,
  rsqrt = function(v) return 1 / math.sqrt(v) end,
  tanh = function(v) return (math.exp(v) - math.exp(-v)) / (math.exp(v) + math.exp(-v)) end,
  sigmoid = sigmoid,
  abs = math.abs,
  relu = function(v) return v > 0 and v or 0 end,
  gelu = function(v) return 0.5 * v * (1 + erf(v / math.sqrt(2))) end,
  gelu_tanh = function(v)
    local u = K * (v + 0.044715 * v ^ 3)
    return 0.5 * v * (1 + (math.exp(u) - math.exp(-u)) / (math.exp(u) + math.exp(-u)))
  end,
  silu = function(v) return v * sigmoid(v) end,
  square = function(v) return v * v end,
}

local function apply(name, x)
  if name == 'gelu_tanh' then return F.gelu(x, 'tanh') end
  return F[name](x)
end

local POSITIVE = { log = true, sqrt = true, rsqrt = true }

describe('unary ops', function()
  local mixed = { -2.5, -1, -0.3, 0, 0.4, 1, 2.75, 3 }
  local positive = { 0.05, 0.3, 0.9, 1, 1.7, 2.5, 4, 9 }

  for name, ref in pairs(REF) do
    it(name .. ' matches the formula in f64 and f32', function()
      local vals = POSITIVE[name] and positive or mixed
      local want = {}
      for i, v in ipairs(vals) do want[i] = ref(v) end
      close(flat(apply(name, fsdp.tensor(vals, { dtype = 'f64' }))), want, 1e-12, name .. ' f64')
      close(flat(apply(name, fsdp.tensor(vals))), want, 2e-6, name .. ' f32')
    end)

    it(name .. ' has the right gradient', function()
      local x = POSITIVE[name] and fsdp.rand({ 3, 4 }, { seed = 5, dtype = 'f64', low = 0.3, high = 3 })
                                      :requires_grad_()
                or away({ 3, 4 }, 6)
      assert(T.gradcheck(function(t) return apply(name, t) end, { x }))
    end)
  end

  it('know the classic GELU values', function()
    local one = fsdp.tensor({ 1 }, { dtype = 'f64' })
    assert.near(0.8413447460685429, F.gelu(one):item(), 1e-15)
    assert.near(0.8411919906082768, F.gelu(one, 'tanh'):item(), 1e-15)
    assert.near(0.8411919906082768, F.gelu(one, { approximate = 'tanh' }):item(), 1e-15)
  end)

  it('stay finite at the extremes', function()
    local x = fsdp.tensor({ -200, -90, 90, 200 })
    assert.same({ 0, 0, 1, 1 }, flat(x:sigmoid()))
    assert.same({ -0, -0, 90, 200 }, flat(x:silu()))
    assert.same({ -1, -1, 1, 1 }, flat(x:tanh()))
    assert.same({ -0, -0, 90, 200 }, flat(x:gelu()))
  end)

  it('take subgradients as PyTorch does at kinks', function()
    local x = fsdp.tensor({ -1, 0, 1 }, { dtype = 'f64' }):requires_grad_()
    x:relu():sum():backward()
    assert.same({ 0, 0, 1 }, flat(x.grad))
    x.grad = nil
    x:abs():sum():backward()
    assert.same({ -1, 0, 1 }, flat(x.grad))
    -- clamp passes the gradient where min <= x <= max, boundaries included
    local c = fsdp.tensor({ -2, -1, 0, 1, 2 }, { dtype = 'f64' }):requires_grad_()
    c:clamp(-1, 1):sum():backward()
    assert.same({ 0, 1, 1, 1, 0 }, flat(c.grad))
  end)

  it('propagate NaN through relu, clamp and max as PyTorch does', function()
    local x = fsdp.tensor({ 0 / 0, 1 })
    local r = flat(x:relu())
    assert.is_true(r[1] ~= r[1])
    local c = flat(x:clamp(0, 0.5))
    assert.is_true(c[1] ~= c[1])
    assert.equals(0.5, c[2])
  end)

  it('pow by a number, and ^', function()
    local x = fsdp.tensor({ 0.5, 1, 2, 3 }, { dtype = 'f64' })
    close(flat(x:pow(3)), { 0.125, 1, 8, 27 }, 1e-15)
    close(flat(x ^ 2), { 0.25, 1, 4, 9 }, 1e-15)
    close(flat(x:pow(0.5)), { math.sqrt(0.5), 1, math.sqrt(2), math.sqrt(3) }, 1e-15)
    close(flat(x:pow(-1.5)), { 0.5 ^ -1.5, 1, 2 ^ -1.5, 3 ^ -1.5 }, 1e-14)
    close(flat(x:pow(1)), flat(x), 0)
    for _, e in ipairs({ 3, 0.5, -1.5, 2, 1, 2.3 }) do
      local p = fsdp.rand({ 2, 3 }, { seed = 3, dtype = 'f64', low = 0.2, high = 2 }):requires_grad_()
      assert(T.gradcheck(function(t) return t:pow(e) end, { p }))
    end
    local z = fsdp.tensor({ 0, 2 }, { dtype = 'f64' }):requires_grad_()
    z:pow(0):sum():backward()
    assert.same({ 0, 0 }, flat(z.grad)) -- PyTorch: x^0 has gradient 0, even at 0
    assert.error_matches(function() return 2 ^ z end, 'the base must be a tensor')
    assert.error_matches(function() return z:pow(z) end, 'pow: the exponent must be a number')
  end)

  it('clamp with one bound, both, or crossed bounds', function()
    local x = fsdp.tensor({ -3, -1, 0, 2, 5 })
    assert.same({ -1, -1, 0, 2, 2 }, flat(x:clamp(-1, 2)))
    assert.same({ 0, 0, 0, 2, 5 }, flat(x:clamp(0)))
    assert.same({ -3, -1, 0, 1, 1 }, flat(x:clamp(nil, 1)))
    assert.same({ 1, 1, 1, 1, 1 }, flat(x:clamp(3, 1))) -- min > max gives max, as PyTorch
    assert(T.gradcheck(function(t) return t:clamp(-0.5, 0.7) end, { away({ 3, 4 }, 8) }))
    assert(T.gradcheck(function(t) return t:clamp(nil, 0.3) end, { away({ 3, 4 }, 9) }))
    assert.error_matches(function() return x:clamp() end, 'clamp: at least one of min and max')
    assert.error_matches(function() return x:clamp('a') end, 'clamp: min must be a number or nil')
  end)

  it('keep integer dtypes where the result is an integer', function()
    local i = fsdp.tensor({ -3, 0, 2 }, { dtype = 'i64' })
    assert.equals('i64', i:relu().dtype)
    assert.same({ 0, 0, 2 }, flat(i:relu()))
    assert.same({ 3, 0, 2 }, flat(i:abs()))
    assert.same({ 9, 0, 4 }, flat(i:square()))
    assert.same({ -1, 0, 1 }, flat(i:clamp(-1, 1)))
    assert.equals('i64', i:clamp(-1, 1).dtype)
    assert.equals('f32', i:clamp(-0.5, 1).dtype)
    assert.same({ -0.5, 0, 1 }, flat(i:clamp(-0.5, 1)))
    assert.equals('f32', i:exp().dtype)
    close(flat(fsdp.tensor({ 1, 4 }, { dtype = 'i32' }):sqrt()), { 1, 2 }, 0)
    local big = -(fsdp.tensor({ 2 ^ 53 }, { dtype = 'i64' }) + 1) -- -(2^53 + 1), exact in i64
    assert.equals(1, (big:abs() - 2 ^ 53):item()) -- a double would give 0
    assert.error_matches(function() return fsdp.tensor({ true }):relu() end,
      'relu: bool tensors are not supported')
  end)

  it('accept bf16 and f16 and return their dtype', function()
    local x32 = fsdp.randn({ 4, 33 }, { seed = 11 })
    for _, dt in ipairs({ 'bf16', 'f16' }) do
      local xl = x32:to(dt)
      local pos = x32:abs():add_(0.1):to(dt)
      local fns = {
        pow = function(t) return t:pow(1.5) end,
        clamp = function(t) return t:clamp(-0.5, 0.5) end,
      }
      for name in pairs(REF) do fns[name] = function(t) return apply(name, t) end end
      for name, fn in pairs(fns) do
        local input = (POSITIVE[name] or name == 'pow') and pos or xl
        local y = fn(input)
        assert.equals(dt, y.dtype)
        local ref = fn(input:to('f32'))
        local scale = 1 + T.max_abs_diff(ref, ref * 0)
        assert.is_true(T.max_abs_diff(y, ref) <= 0.01 * scale, name .. ' ' .. dt)
      end
      -- gradients in bf16/f16 are those of f32, rounded
      local a = xl:detach():requires_grad_()
      a:silu():sum():backward()
      local b = xl:to('f32'):requires_grad_()
      b:silu():sum():backward()
      assert.equals(dt, a.grad.dtype)
      assert.is_true(T.max_abs_diff(a.grad, b.grad) < 0.01)
    end
  end)

  it('read strided inputs', function()
    local base = fsdp.randn({ 6, 5 }, { seed = 12 })
    for _, x in ipairs({ base:t(), base:narrow(1, 1, 3), base:slice(0, 0, 6, 2), base:expand(2, 6, 5) }) do
      for _, name in ipairs({ 'exp', 'gelu', 'silu', 'abs', 'square' }) do
        assert.same(flat(apply(name, x:contiguous())), flat(apply(name, x)))
      end
      assert.same(flat(x:contiguous():clamp(-0.5, 0.5)), flat(x:clamp(-0.5, 0.5)))
    end
    -- gradients through strided views are checked too
    local v = f64({ 4, 3 }, 13)
    assert(T.gradcheck(function(t) return t:t():silu() end, { v }))
    assert(T.gradcheck(function(t) return t:narrow(1, 1, 2):gelu('tanh') end, { v }))
  end)

  it('are the same on large inputs (parallel chunks) as on small ones', function()
    local x = fsdp.randn({ 300, 700 }, { seed = 14 })
    local y = x:silu()
    local row = x:narrow(0, 123, 1):contiguous():silu()
    assert.same(flat(row), flat(y:narrow(0, 123, 1)))
    local g = fsdp.randn({ 300, 700 }, { seed = 15 }):requires_grad_()
    g:gelu():sum():backward()
    local small = fsdp.randn({ 300, 700 }, { seed = 15 }):narrow(0, 299, 1):contiguous():requires_grad_()
    small:gelu():sum():backward()
    assert.same(flat(small.grad), flat(g.grad:narrow(0, 299, 1)))
  end)

  it('name the backward nodes', function()
    local x = f64({ 2 }, 1)
    assert.equals('ExpBackward', x:exp().grad_fn)
    assert.equals('GeluTanhBackward', x:gelu('tanh').grad_fn)
    assert.equals('ClampBackward', x:clamp(0).grad_fn)
  end)

  it('reject a bad gelu form', function()
    assert.error_matches(function() return F.gelu(fsdp.ones(2), 'fast') end,
      "gelu: approximate must be 'none' or 'tanh', got fast")
  end)
end)

describe('silu_mul', function()
  it('is silu(gate) * up', function()
    local a, b = fsdp.randn({ 3, 70 }, { seed = 1 }), fsdp.randn({ 3, 70 }, { seed = 2 })
    assert.is_true(T.max_abs_diff(F.silu_mul(a, b), a:silu() * b) < 1e-6)
    local ab, bb = a:to('bf16'), b:to('bf16')
    local y = F.silu_mul(ab, bb)
    assert.equals('bf16', y.dtype)
    assert.is_true(T.max_abs_diff(y, ab:to('f32'):silu() * bb:to('f32')) < 0.05)
    assert.same(flat(F.silu_mul(a:t():contiguous(), b:t():contiguous())), flat(F.silu_mul(a:t(), b:t())))
  end)

  it('has the right gradients for both inputs', function()
    assert(T.gradcheck(F.silu_mul, { f64({ 3, 5 }, 3), f64({ 3, 5 }, 4) }))
    -- one input only, and a strided view
    local g, u = f64({ 5, 3 }, 5), fsdp.randn({ 3, 5 }, { seed = 6, dtype = 'f64' })
    assert(T.gradcheck(function(x) return F.silu_mul(x:t(), u) end, { g }))
    assert(T.gradcheck(function(x) return F.silu_mul(u, x:t()) end, { g }))
  end)

  it('matches the unfused gradients on a large input', function()
    local a = fsdp.randn({ 200, 600 }, { seed = 7 }):requires_grad_()
    local b = fsdp.randn({ 200, 600 }, { seed = 8 }):requires_grad_()
    F.silu_mul(a, b):sum():backward()
    local a2 = a:detach():clone():requires_grad_()
    local b2 = b:detach():clone():requires_grad_()
    ;(a2:silu() * b2):sum():backward()
    assert.is_true(T.max_abs_diff(a.grad, a2.grad) < 1e-5)
    assert.is_true(T.max_abs_diff(b.grad, b2.grad) < 1e-5)
  end)

  -- bf16 is computed in f32 and rounded once, whether through f32 chunks or
  -- read and written as bf16 (AVX-512, cpu_rows_avx512.c): the result is
  -- the f32 computation on the same values, rounded, bit for bit.
  it('gives bf16 the f32 results rounded once, forward and backward', function()
    -- a million elements: enough that a difference of an f32 ulp shows
    -- after rounding to bf16 (compared in the core, not in Lua tables).
    -- Both paths call glibc's vector expf in the release build; the
    -- sanitized build (-O1) does not vectorise the f32 path, whose scalar
    -- expf may differ in the last bit: there one bf16 step is allowed,
    -- plus 2^-14 of the largest value where the gate's gradient cancels to
    -- near 0 (6 of a million elements differed there, by 2^-11 of 11.5).
    local exact = not fsdp.build_info:find('asan', 1, true)
    local function same(want, got, what)
      if exact then
        assert.equals(0, T.max_abs_diff(want, got), what)
      else
        local w, g = want:to('f64'), got:to('f64')
        local excess = ((w - g):abs() - w:abs() * 2^-8):max():item()
        assert.is_true(excess <= w:abs():max():item() * 2^-14, what)
      end
    end
    for _, n in ipairs { 1000, 1000003 } do
      local a = (fsdp.randn({ n }, { seed = 11 }) * 4):to('bf16')
      local b = fsdp.randn({ n }, { seed = 12 }):to('bf16')
      local g = fsdp.randn({ n }, { seed = 13 }):to('bf16')
      same(F.silu_mul(a:float(), b:float()):bfloat16(), F.silu_mul(a, b), 'silu_mul')
      local function grads(x, y, gy)
        x, y = x:detach():requires_grad_(), y:detach():requires_grad_()
        F.silu_mul(x, y):backward(gy)
        return x.grad:bfloat16(), y.grad:bfloat16()
      end
      local ga, gb = grads(a, b, g)
      local fa, fb = grads(a:float(), b:float(), g:float())
      same(fa, ga, 'gate gradient')
      same(fb, gb, 'up gradient')
    end
  end)

  it('names the shapes or dtypes at fault', function()
    assert.error_matches(function() return F.silu_mul(fsdp.ones(2, 3), fsdp.ones(3, 2)) end,
      'silu_mul: gate of shape %[2, 3%] and up of shape %[3, 2%] differ')
    assert.error_matches(function() return F.silu_mul(fsdp.ones(2), fsdp.ones(2, { dtype = 'bf16' })) end,
      'silu_mul: gate and up must share one float dtype, got f32 and bf16')
  end)
end)

describe('dropout', function()
  it('keeps element i iff the uniform value i of its key is >= p, scaled by 1/(1-p)', function()
    local x = fsdp.randn({ 37, 41 }, { seed = 2 })
    for _, p in ipairs({ 0.1, 0.5, 0.9 }) do
      local key = { seed = 9, stream = 3, offset = 5 }
      local y = F.dropout(x, p, true, key)
      local u = flat(fsdp.rand({ 37, 41 }, key))
      local xs, ys = flat(x), flat(y)
      local kept = 0
      for i = 1, #u do
        local want = u[i] >= p and xs[i] / (1 - p) or 0
        assert.near(want, ys[i], 1e-6 * (1 + math.abs(want)))
        if u[i] >= p then kept = kept + 1 end
      end
      assert.near(1 - p, kept / #u, 0.05)
    end
  end)

  it('gives a slice the mask of the same slice of the whole (offset)', function()
    local x = fsdp.ones(1000)
    local whole = F.dropout(x, 0.3, true, { seed = 4 })
    local part = F.dropout(fsdp.ones(100), 0.3, true, { seed = 4, offset = 400 })
    assert.same(flat(whole:narrow(0, 400, 100)), flat(part))
    -- across the 2^32-block boundary of the counter's low word
    local key = { seed = 3, stream = 2, offset = 2 ^ 34 - 37 }
    local u = flat(fsdp.rand({ 80 }, key))
    local d = flat(F.dropout(fsdp.ones(80), 0.5, true, key))
    for i = 1, 80 do assert.equals(u[i] >= 0.5 and 2 or 0, d[i]) end
  end)

  it('returns x itself when not training or p = 0, zeros for p = 1', function()
    local x = fsdp.randn({ 3, 4 }, { seed = 1 })
    assert.is_true(rawequal(x, F.dropout(x, 0.5, false)))
    assert.is_true(rawequal(x, F.dropout(x, 0, true)))
    assert.same({ 0, 0, 0 }, flat(F.dropout(fsdp.ones(3), 1, true, { seed = 1 })))
    local w = f64({ 3 }, 2)
    F.dropout(w, 1, true, { seed = 1 }):sum():backward()
    assert.same({ 0, 0, 0 }, flat(w.grad))
  end)

  it('backpropagates through the same mask without storing it', function()
    local x = f64({ 20, 30 }, 3)
    local y = F.dropout(x, 0.4, true, { seed = 5 })
    assert.equals('DropoutBackward', y.grad_fn)
    y:sum():backward()
    local ys, xs, gs = flat(y), flat(x:detach()), flat(x.grad)
    for i = 1, #gs do
      assert.near(ys[i] ~= 0 and 1 / 0.6 or 0, gs[i], 1e-12)
      if ys[i] ~= 0 then assert.near(xs[i] / 0.6, ys[i], 1e-12) end
    end
    assert(T.gradcheck(function(t) return F.dropout(t, 0.3, true, { seed = 6 }) end, { f64({ 4, 5 }, 4) }))
    -- a broadcast gradient (stride 0) meets the mask element by element
    local z = f64({ 2, 3 }, 5)
    local dz = F.dropout(z, 0.5, true, { seed = 8 })
    dz:backward(fsdp.ones(1, { dtype = 'f64' }):expand(2, 3))
    assert.same(flat(dz:ne(0):to('f64') * 2), flat(z.grad))
  end)

  it('draws unseeded keys from the global generator, replayed by checkpointing', function()
    local function block(t) return F.dropout(t, 0.5, true) * 3 end
    fsdp.manual_seed(7)
    local a = fsdp.randn({ 8, 8 }, { seed = 1 }):requires_grad_()
    local ya = block(a)
    local yb = block(a)
    assert.is_true(T.max_abs_diff(ya, yb) > 0) -- successive calls differ
    ya:sum():backward()
    fsdp.manual_seed(7)
    local b = fsdp.randn({ 8, 8 }, { seed = 1 }):requires_grad_()
    local yc = fsdp.autograd.checkpoint(block, b)
    assert.same(flat(ya), flat(yc))
    yc:sum():backward()
    assert.same(flat(a.grad), flat(b.grad))
  end)

  it('works on bf16, strided and large inputs', function()
    local x = fsdp.randn({ 500, 300 }, { seed = 3 })
    local y = F.dropout(x:to('bf16'), 0.2, true, { seed = 2 })
    assert.equals('bf16', y.dtype)
    local ref = F.dropout(x:to('bf16'):to('f32'), 0.2, true, { seed = 2 })
    assert.is_true(T.max_abs_diff(y, ref) < 0.05)
    local t = x:t()
    assert.same(flat(F.dropout(t:contiguous(), 0.3, true, { seed = 1 })),
                flat(F.dropout(t, 0.3, true, { seed = 1 })))
  end)

  it('rejects bad probabilities and integer tensors', function()
    assert.error_matches(function() return F.dropout(fsdp.ones(2), 1.5, true, { seed = 1 }) end,
      'dropout: probability must be in %[0, 1%], got 1.5')
    local i = fsdp.ones(2, { dtype = 'i64' })
    assert.error_matches(function() return F.dropout(i, 0.5, true, { seed = 1 }) end,
      'dropout: expects a float tensor, got i64')
  end)
end)

-- Reference reduction in Lua over a contiguous tensor given as a flat list.
local function ref_reduce(vals, shape, reduce, combine, init)
  local nd = #shape
  local strides, out_shape = {}, {}
  local s = 1
  for d = nd, 1, -1 do strides[d] = s; s = s * shape[d] end
  for d = 1, nd do out_shape[d] = reduce[d] and 1 or shape[d] end
  local out = {}
  for i = 0, #vals - 1 do
    local rem, o, os = i, 0, 1
    local idx = {}
    for d = 1, nd do idx[d] = math.floor(rem / strides[d]); rem = rem % strides[d] end
    for d = nd, 1, -1 do
      if not reduce[d] then o = o + idx[d] * os end
      os = os * out_shape[d]
    end
    out[o + 1] = combine(out[o + 1] == nil and init or out[o + 1], vals[i + 1])
  end
  return out
end

describe('sum and mean', function()
  local shape = { 3, 4, 5 }
  local x = fsdp.randn(shape, { seed = 21, dtype = 'f64' })
  local vals = flat(x)
  local cases = { { 0 }, { 1 }, { 2 }, { -1 }, { 0, 2 }, { 1, 2 }, { 0, 1 }, { 2, 0 }, { 0, 1, 2 } }

  for _, dims in ipairs(cases) do
    it('over dims {' .. table.concat(dims, ', ') .. '} match a reference', function()
      local reduce, count = {}, 1
      for _, d in ipairs(dims) do
        local w = d < 0 and d + 3 or d
        reduce[w + 1] = true
        count = count * shape[w + 1]
      end
      local want = ref_reduce(vals, shape, reduce, function(a, b) return a + b end, 0)
      local s = x:sum(dims)
      close(flat(s), want, 1e-12)
      local k = x:sum(dims, true)
      for d = 1, 3 do assert.equals(reduce[d] and 1 or shape[d], k:size(d - 1)) end
      local means = {}
      for i, v in ipairs(want) do means[i] = v / count end
      close(flat(x:mean(dims)), means, 1e-12)
      close(flat(x:to('f32'):sum(dims)), want, 1e-5)
      assert(T.gradcheck(function(t) return t:sum(dims) end, { f64(shape, 2) }))
      assert(T.gradcheck(function(t) return t:mean(dims, true) end, { f64(shape, 3) }))
    end)
  end

  it('over all dims by default, giving a 0-d tensor', function()
    local s = x:sum()
    assert.same({}, s.shape)
    local total = 0
    for _, v in ipairs(vals) do total = total + v end
    assert.near(total, s:item(), 1e-12)
    assert.same({ 1, 1, 1 }, x:mean(nil, true).shape)
    assert(T.gradcheck(function(t) return t:mean() end, { f64({ 2, 3 }, 4) }))
    assert.equals(5, fsdp.tensor(5):sum():item()) -- a 0-d tensor
    assert.equals(5, fsdp.tensor(5):sum(0):item())
  end)

  it('keep integer sums exact in i64 and count booleans', function()
    local big = fsdp.tensor({ 2 ^ 53, 1, 1 }, { dtype = 'i64' })
    local s = big:sum()
    assert.equals('i64', s.dtype)
    assert.equals(2, (s - 2 ^ 53):item()) -- a double accumulator would lose the ones
    local b = fsdp.tensor({ { true, false, true }, { true, true, true } })
    assert.same({ 2, 3 }, flat(b:sum(1)))
    assert.equals('i64', fsdp.tensor({ 1, 2 }, { dtype = 'i32' }):sum().dtype)
    assert.error_matches(function() return fsdp.tensor({ 1, 2 }, { dtype = 'i64' }):mean() end,
      'mean: expects a float tensor, got i64')
  end)

  it('accumulate accurately (f64 accumulation of f32 values)', function()
    local t = fsdp.full({ 1000000 }, 0.1)
    local want = 1000000 * 0.100000001490116119384765625 -- the f32 nearest 0.1
    assert.near(want, t:sum():item(), 0.01)
    assert.near(want / 1000000, t:mean():item(), 1e-9)
    local h = fsdp.full({ 100000 }, 1, { dtype = 'bf16' })
    assert.equals(100000, h:to('f32'):sum():item())
    assert.equals(99840, h:sum():item()) -- stored as bf16: 100000 rounds to 99840
  end)

  it('handle large and lopsided shapes (split and tiled paths)', function()
    local n = 200000
    local a = fsdp.arange(n, { dtype = 'f64' })
    local exact = n * (n - 1) / 2
    assert.equals(exact, a:sum():item())
    assert.same({ exact, exact + n }, flat(fsdp.arange(2 * n, { dtype = 'f64' }):view(2, n):sum(1) -
      fsdp.tensor({ 0, n * n - n }, { dtype = 'f64' })))
    -- outer reduction with few columns: [n, 3] over dim 0
    local c = fsdp.arange(3 * n, { dtype = 'f64' }):view(n, 3)
    local col = flat(c:sum(0))
    for j = 0, 2 do assert.equals(3 * exact + j * n, col[j + 1]) end
    -- many columns (several tiles), a middle dim reduced, then outer and inner
    local m = fsdp.randn({ 7, 50, 600 }, { seed = 9, dtype = 'f64' })
    local r = ref_reduce(flat(m), { 7, 50, 600 }, { false, true, false }, function(p, q) return p + q end, 0)
    close(flat(m:sum(1)), r, 1e-12)
    local r2 = ref_reduce(flat(m), { 7, 50, 600 }, { true, false, true }, function(p, q) return p + q end, 0)
    close(flat(m:sum({ 0, 2 })), r2, 1e-12)
    -- bf16 and f32 bias-gradient shaped sums
    local g = fsdp.randn({ 64, 32, 96 }, { seed = 10 })
    assert.is_true(T.max_abs_diff(g:sum({ 0, 1 }), g:to('f64'):sum({ 0, 1 })) < 1e-4)
    assert.is_true(T.max_abs_diff(g:to('bf16'):sum({ 0, 1 }), g:to('bf16'):to('f64'):sum({ 0, 1 })) < 0.5)
  end)

  it('read strided inputs', function()
    local base = fsdp.randn({ 5, 6 }, { seed = 22 })
    for _, v in ipairs({ base:t(), base:narrow(1, 2, 3), base:expand(4, 5, 6) }) do
      assert.same(flat(v:contiguous():sum(0)), flat(v:sum(0)))
      assert.same(flat(v:contiguous():mean(-1, true)), flat(v:mean(-1, true)))
    end
  end)

  it('give NaN for the mean of nothing and 0 for its sum', function()
    local e = fsdp.zeros(0, 3)
    assert.same({ 0, 0, 0 }, flat(e:sum(0)))
    local m = flat(e:mean(0))
    assert.is_true(m[1] ~= m[1])
    assert.same({ 0 }, e:sum(1).shape)
  end)

  it('var and std, unbiased by default', function()
    local v = fsdp.tensor({ { 1, 2, 3, 4 }, { 2, 2, 2, 10 } }, { dtype = 'f64' })
    close(flat(v:var(1)), { 5 / 3, 16 }, 1e-14)
    close(flat(v:var(1, false, 0)), { 1.25, 12 }, 1e-14)
    close(flat(v:std(1, { correction = 0 })), { math.sqrt(1.25), math.sqrt(12) }, 1e-14)
    assert.same({ 2, 1 }, v:var(1, true).shape)
    assert(T.gradcheck(function(t) return t:var(0) end, { f64({ 4, 3 }, 7) }))
    assert(T.gradcheck(function(t) return t:std(nil) end, { f64({ 4, 3 }, 8) }))
  end)

  it('name the op, the dims and the shape in errors', function()
    assert.error_matches(function() return x:sum(3) end,
      'sum: dim 3 out of range for a 3%-d tensor of shape %[3, 4, 5%]')
    assert.error_matches(function() return x:mean({ 1, -2 }) end, 'mean: dim 1 appears twice in the dims list')
    assert.error_matches(function() return x:sum({}) end, 'sum: empty dims list')
    assert.error_matches(function() return x:sum('a') end, 'sum: dims must be a number, a table or nil')
    assert.error_matches(function() return x:var(0, false, -1) end, 'var: correction must be >= 0')
  end)
end)

describe('max and min', function()
  it('give values and first indices along a dim', function()
    local x = fsdp.tensor({ { 1, 5, 5, 0 }, { 7, -1, 7, 3 }, { 2, 2, 2, 2 } })
    local v, i = x:max(1)
    assert.same({ 5, 7, 2 }, flat(v))
    assert.same({ 1, 0, 0 }, flat(i))
    assert.equals('i64', i.dtype)
    v, i = x:min(0, true)
    assert.same({ 1, 4 }, v.shape)
    assert.same({ 1, -1, 2, 0 }, flat(v))
    assert.same({ 0, 1, 2, 0 }, flat(i))
    v, i = x:max(-1, true)
    assert.same({ 3, 1 }, i.shape)
    assert.equals(7, x:max():item())
    assert.equals(-1, x:min():item())
    assert.equals(4, x:argmax():item()) -- first 7 in row-major order
    assert.same({ 1, 0, 0 }, flat(x:argmax(1)))
    assert.same({ 3, 1, 0 }, flat(x:argmin(1)))
  end)

  it('match a reference on random data, for each dim', function()
    local shape = { 4, 5, 6 }
    local x = fsdp.randn(shape, { seed = 31 })
    local vals = flat(x)
    for d = 0, 2 do
      local reduce = { d == 0, d == 1, d == 2 }
      local mx = ref_reduce(vals, shape, reduce, math.max, -math.huge)
      local mn = ref_reduce(vals, shape, reduce, math.min, math.huge)
      local v, i = x:max(d)
      assert.same(mx, flat(v))
      assert.same(flat(v), flat(F.max(x, d)))
      -- the index points at the value
      local gathered = flat(x:max(d, true))
      assert.same(mx, gathered)
      local idx = flat(i)
      assert.equals(#mx, #idx)
      local mnv = flat(x:min(d))
      assert.same(mn, mnv)
    end
  end)

  it('propagate NaN and keep integer values exact', function()
    local x = fsdp.tensor({ 1, 0 / 0, 3, 0 / 0 })
    local v, i = x:max(0)
    assert.is_true(v:item() ~= v:item())
    assert.equals(1, i:item())
    v, i = x:min(0)
    assert.equals(1, i:item())
    local big = fsdp.tensor({ 2 ^ 53, 2 ^ 53, 5 }, { dtype = 'i64' }) +
      fsdp.tensor({ 0, 1, 0 }, { dtype = 'i64' }) -- 2^53 + 1: not a double
    v, i = big:max(0)
    assert.equals(1, i:item())
    assert.equals('i64', v.dtype)
  end)

  it('route the gradient to the chosen elements', function()
    local x = fsdp.tensor({ { 1, 5, 2 }, { 7, 0, 3 } }, { dtype = 'f64' }):requires_grad_()
    local v = x:max(1)
    v:sum():backward()
    assert.same({ 0, 1, 0, 1, 0, 0 }, flat(x.grad))
    assert.equals('MaxBackward', v.grad_fn)
    assert(T.gradcheck(function(t) return (t:max(0)) end, { f64({ 3, 4 }, 5) }))
    assert(T.gradcheck(function(t) return (t:min(1, true)) end, { f64({ 3, 4 }, 6) }))
    assert(T.gradcheck(function(t) return t:max() end, { f64({ 3, 4 }, 7) }))
  end)

  it('accept bf16 and strided inputs', function()
    local x = fsdp.randn({ 6, 9 }, { seed = 12 })
    local v, i = x:to('bf16'):max(1)
    assert.equals('bf16', v.dtype)
    assert.same(flat(x:to('bf16'):to('f32'):max(1)), flat(v:to('f32')))
    assert.same(flat(x:to('bf16'):to('f32'):argmax(1)), flat(i))
    local t = x:t()
    local tv, ti = t:min(1, true)
    local cv, ci = t:contiguous():min(1, true)
    assert.same(flat(cv), flat(tv))
    assert.same(flat(ci), flat(ti))
  end)

  it('handle long rows and many columns (split and tiled paths)', function()
    local n = 300000
    local x = fsdp.randn({ n }, { seed = 9 })
    x:set(100, 234567)
    x:set(100, 250000) -- a later tie: the first index wins across blocks
    local v, i = x:max(0)
    assert.equals(100, v:item())
    assert.equals(234567, i:item())
    local m = fsdp.randn({ 3, 40, 700 }, { seed = 10 })
    local vm, im = m:max(1)
    local ref = ref_reduce(flat(m), { 3, 40, 700 }, { false, true, false }, math.max, -math.huge)
    assert.same(ref, flat(vm))
    assert.equals(im:max():item() < 40, true)
  end)

  it('name the op and shape in errors', function()
    assert.error_matches(function() return fsdp.zeros(2, 0):max(1) end,
      'max: dim 1 of shape %[2, 0%] is empty')
    assert.error_matches(function() return fsdp.zeros(2, 3):min(2) end,
      'min: dim 2 out of range for a 2%-d tensor of shape %[2, 3%]')
    assert.error_matches(function() return fsdp.tensor({ true }):max(0) end,
      'max: bool tensors are not supported')
  end)
end)

describe('comparisons and where', function()
  local a = fsdp.tensor({ { 1, 2, 3 }, { 4, 5, 6 } })
  local b = fsdp.tensor({ 3, 2, 1 })

  it('compare with broadcasting and scalars, giving bool', function()
    local x, y = flat(a), { 3, 2, 1, 3, 2, 1 }
    local ops = {
      eq = function(p, q) return p == q end, ne = function(p, q) return p ~= q end,
      lt = function(p, q) return p < q end, le = function(p, q) return p <= q end,
      gt = function(p, q) return p > q end, ge = function(p, q) return p >= q end,
    }
    for name, op in pairs(ops) do
      local want, want_s, want_r = {}, {}, {}
      for k = 1, 6 do
        want[k] = op(x[k], y[k])
        want_s[k] = op(x[k], 3)
        want_r[k] = op(3, x[k])
      end
      local r = a[name](a, b)
      assert.equals('bool', r.dtype)
      assert.same(want, flat(r), name)
      assert.same(want_s, flat(a[name](a, 3)), name .. ' scalar')
      assert.same(want_r, flat(F[name](3, a)), name .. ' reversed scalar')
    end
  end)

  it('compare mixed dtypes exactly, NaN as IEEE says', function()
    local i = fsdp.tensor({ 1, 2, 3 }, { dtype = 'i64' })
    assert.same({ false, true, false }, flat(i:eq(fsdp.tensor({ 1.5, 2, 2.5 }))))
    assert.same({ false, false, true }, flat(i:gt(2.5)))
    local big = fsdp.tensor({ 2 ^ 53 }, { dtype = 'i64' }) + 1 -- not a double
    assert.same({ false }, flat(big:eq(fsdp.tensor({ 2 ^ 53 }, { dtype = 'i64' }))))
    local n = fsdp.tensor({ 0 / 0 })
    assert.same({ false }, flat(n:eq(n)))
    assert.same({ true }, flat(n:ne(n)))
    assert.same({ false }, flat(n:lt(1)))
    local h = fsdp.tensor({ 0.5, 1 }, { dtype = 'bf16' })
    assert.same({ true, false }, flat(h:lt(fsdp.tensor({ 0.75, 0.75 }, { dtype = 'f64' }))))
  end)

  it('where selects with three-way broadcasting and promotion', function()
    local cond = fsdp.tensor({ true, false, true })
    local y = F.where(cond, a, fsdp.zeros(2, 1))
    assert.same({ { 1, 0, 3 }, { 4, 0, 6 } }, y:tolist())
    local ii = F.where(cond, fsdp.tensor({ 1, 2, 3 }, { dtype = 'i64' }),
                       fsdp.tensor({ 0.5 }, { dtype = 'f64' }))
    assert.equals('f64', ii.dtype)
    assert.same({ 1, 0.5, 3 }, flat(ii))
    local m = F.where(a:gt(3), a, -math.huge)
    assert.same({ -math.huge, -math.huge, -math.huge, 4, 5, 6 }, flat(m))
    assert.same(flat(m), flat(a:masked_fill(a:le(3), -math.huge)))
    local s = F.where(cond, 1, 0)
    assert.same({ 1, 0, 1 }, flat(s))
    assert.equals('f32', s.dtype)
    local ai = F.where(cond, fsdp.tensor({ 4, 5, 6 }, { dtype = 'i64' }), -1)
    assert.equals('i64', ai.dtype)
    assert.same({ 4, -1, 6 }, flat(ai))
    -- strided operands
    local at = a:t():contiguous()
    assert.same(flat(F.where(a:t():gt(2), a:t(), 0)), flat(F.where(at:gt(2), at, 0)))
    local h = F.where(cond, fsdp.ones(3, { dtype = 'bf16' }), fsdp.zeros(3, { dtype = 'bf16' }))
    assert.equals('bf16', h.dtype)
    assert.same({ 1, 0, 1 }, flat(h))
  end)

  it('where sends gradients to the selected side', function()
    local cond = fsdp.rand({ 3, 4 }, { seed = 1 }):lt(0.5)
    assert(T.gradcheck(function(p, q) return F.where(cond, p, q) end, { f64({ 3, 4 }, 2), f64({ 4 }, 3) }))
    assert(T.gradcheck(function(p) return F.where(cond, 0, p) end, { f64({ 3, 1 }, 4) }))
    local x = fsdp.tensor({ 1, 2, 3 }, { dtype = 'f64' }):requires_grad_()
    F.where(fsdp.tensor({ true, false, true }), x, 0):sum():backward()
    assert.same({ 1, 0, 1 }, flat(x.grad))
  end)

  it('name the op and shapes in errors', function()
    assert.error_matches(function() return a:lt(fsdp.zeros(4)) end,
      'lt: shapes %[2, 3%] and %[4%] do not broadcast')
    assert.error_matches(function() return F.where(a:gt(0), a, fsdp.zeros(2, 2)) end,
      'where: shapes %[2, 3%], %[2, 3%] and %[2, 2%] do not broadcast')
    assert.error_matches(function() return F.where(a, a, a) end,
      'where: the condition must be a bool tensor, got f32')
    assert.error_matches(function() return a:eq(fsdp.zeros(3, { device = 'meta' })) end,
      'eq: tensors on different devices %(cpu and meta%)')
  end)
end)

describe('on meta tensors', function()
  it('infer shapes and count FLOPs without allocating', function()
    collectgarbage()
    collectgarbage()
    fsdp.reset_memory_stats('cpu')
    local before = fsdp.memory_stats('cpu').in_use
    local x = fsdp.empty({ 8, 1024, 4096 }, { device = 'meta' })
    local n = 8 * 1024 * 4096
    local function flops(fn)
      fsdp.reset_flops()
      local r = fn()
      return fsdp.flops(), r
    end
    local f, y = flops(function() return x:gelu() end)
    assert.equals(n, f)
    assert.equals('meta', y.device)
    assert.same({ 8, 1024, 4096 }, y.shape)
    f, y = flops(function() return F.silu_mul(x, x) end)
    assert.equals(2 * n, f)
    f, y = flops(function() return F.dropout(x, 0.1, true, { seed = 1 }) end)
    assert.equals(n, f)
    assert.same({ 8, 1024, 4096 }, y.shape)
    f, y = flops(function() return x:sum({ 0, 1 }, true) end)
    assert.equals(n, f)
    assert.same({ 1, 1, 4096 }, y.shape)
    f, y = flops(function() return x:mean(-1) end)
    assert.same({ 8, 1024 }, y.shape)
    local v, i = x:max(1)
    assert.same({ 8, 4096 }, v.shape)
    assert.equals('i64', i.dtype)
    assert.equals('meta', i.device)
    f, y = flops(function() return x:lt(fsdp.empty({ 4096 }, { device = 'meta' })) end)
    assert.equals(n, f)
    assert.equals('bool', y.dtype)
    y = F.where(y, x, 0)
    assert.same({ 8, 1024, 4096 }, y.shape)
    assert.equals('meta', x:pow(3).device)
    assert.equals(before, fsdp.memory_stats('cpu').peak)
    assert.same({}, x:var().shape) -- (its division makes a 0-d scalar on the cpu)
    assert.equals(before, fsdp.memory_stats('cpu').in_use)
  end)

  it('infer shapes of fake tensors without allocating', function()
    local before = fsdp.memory_stats('cpu').in_use
    local x = fsdp.empty({ 1024, 1024 }, { fake = true })
    local y = x:silu():sum(0)
    assert.is_true(y:is_fake())
    assert.same({ 1024 }, y.shape)
    assert.equals(before, fsdp.memory_stats('cpu').in_use)
  end)

  it('run backward on meta tensors', function()
    local x = fsdp.empty({ 4, 8 }, { device = 'meta' }):requires_grad_()
    local y = F.silu_mul(x:gelu(), x:exp()):sum(1):max(0)
    local z = F.dropout(y, 0.1, true, { seed = 1 })
    F.where(z:gt(0), z, 0):pow(2):clamp(0, 1):mean():backward()
    assert.equals('meta', x.grad.device)
    assert.same({ 4, 8 }, x.grad.shape)
  end)

  it('check shapes on meta too', function()
    local m = fsdp.empty({ 2, 3 }, { device = 'meta' })
    assert.error_matches(function() return F.silu_mul(m, fsdp.empty({ 3, 2 }, { device = 'meta' })) end,
      'silu_mul: gate of shape %[2, 3%] and up of shape %[3, 2%] differ')
    assert.error_matches(function() return m:sum(2) end, 'sum: dim 2 out of range')
  end)
end)
