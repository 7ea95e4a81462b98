-- linear_spec.lua: the linear family: matmul, linear, embedding, conv2d,
-- max_pool2d, cat, split and chunk. Forward values against references
-- computed here in Lua on tiny tensors, finite-difference gradient checks
-- in f64, bf16 inputs, strided inputs (transposed operands are read in
-- place, not copied), meta tensors (shapes and FLOPs, no memory), errors.
local fsdp = require 'fsdp'
local T = require 'fsdp.testing'
local F = require 'fsdp.functional.linear'

local function f64(shape, seed, opts)
  opts = opts or {}
  opts.seed, opts.dtype = seed, 'f64'
  return fsdp.randn(shape, opts):requires_grad_()
end

local function ref(list) return fsdp.tensor(list, { dtype = 'f64' }) end

-- Row-major flat values of a tensor (tests only).
local function values(t) return t:contiguous():view(-1):tolist() end

-- Reference batched matmul of [..., m, k] @ [..., k, n] tensors with
-- broadcast batch dims, by loops over element reads.
local function ref_matmul(a, b)
  local as, bs = a.shape, b.shape
  local m, k, n = as[#as - 1], as[#as], bs[#bs]
  local nb = math.max(#as, #bs) - 2
  local batch = {}
  for d = 1, nb do
    local da, db = d - (nb - (#as - 2)), d - (nb - (#bs - 2))
    local sa, sb = da >= 1 and as[da] or 1, db >= 1 and bs[db] or 1
    batch[d] = math.max(sa, sb)
  end
  local shape = {}
  for d = 1, nb do shape[d] = batch[d] end
  shape[nb + 1], shape[nb + 2] = m, n
  local out = fsdp.zeros(shape, { dtype = 'f64' })
  local nbatch = 1
  for d = 1, nb do nbatch = nbatch * batch[d] end
  for bi = 0, nbatch - 1 do
    local idx, rem = {}, bi
    for d = nb, 1, -1 do idx[d] = rem % batch[d]; rem = math.floor(rem / batch[d]) end
    local function sub(t, shp)
      local ix = {}
      local off = nb - (#shp - 2)
      for d = 1, #shp - 2 do ix[d] = shp[d] == 1 and 0 or idx[d + off] end
      return ix
    end
    local ia, ib = sub(a, as), sub(b, bs)
    for i = 0, m - 1 do
      for j = 0, n - 1 do
        local s = 0
        for p = 0, k - 1 do
          local xa = { unpack(ia) }; xa[#xa + 1] = i; xa[#xa + 1] = p
          local xb = { unpack(ib) }; xb[#xb + 1] = p; xb[#xb + 1] = j
          s = s + a:get(xa) * b:get(xb)
        end
        local xo = { unpack(idx) }; xo[#xo + 1] = i; xo[#xo + 1] = j
        out:set(s, xo)
      end
    end
  end
  return out
end

local function meta(shape, dtype)
  return fsdp.empty(shape, { device = 'meta', dtype = dtype or 'f32' })
end

-- Run fn and check it allocates nothing on the cpu; returns the FLOPs it counted.
local function flops_without_memory(fn)
  collectgarbage()
  local before = fsdp.memory_stats('cpu').in_use
  fsdp.reset_flops()
  fn()
  local flops = fsdp.flops()
  assert.equals(before, fsdp.memory_stats('cpu').in_use)
  return flops
end

describe('matmul', function()
  local a = fsdp.tensor({ { 1, 2, 3 }, { 4, 5, 6 } })
  local b = fsdp.tensor({ { 1, 0 }, { 0, 1 }, { 2, -1 } })

  it('multiplies matrices, vectors and dot products as torch.matmul', function()
    assert.same({ { 7, -1 }, { 16, -1 } }, F.matmul(a, b):tolist())
    assert.same({ 6, 15 }, a:matmul(fsdp.tensor({ 1, 1, 1 })):tolist())        -- [2,3] @ [3]
    assert.same({ 9, 12, 15 }, fsdp.tensor({ 1, 2 }):matmul(a):tolist())       -- [2] @ [2,3]
    local dot = F.matmul(fsdp.tensor({ 1, 2, 3 }), fsdp.tensor({ 4, 5, 6 }))
    assert.same({}, dot.shape)
    assert.equals(32, dot:item())
    -- empty products: k = 0 gives zeros (plus the bias), m = 0 an empty result
    assert.same({ { 0, 0, 0 }, { 0, 0, 0 } }, F.matmul(fsdp.zeros(2, 0), fsdp.zeros(0, 3)):tolist())
    assert.same({ { 1, 2 } }, F.linear(fsdp.zeros(1, 0), fsdp.zeros(2, 0), fsdp.tensor({ 1, 2 })):tolist())
    assert.same({ 0, 3 }, F.matmul(fsdp.zeros(0, 4), fsdp.zeros(4, 3)).shape)
  end)

  it('broadcasts batch dims', function()
    local x = fsdp.randn({ 2, 1, 3, 4 }, { seed = 1, dtype = 'f64' })
    local y = fsdp.randn({ 5, 4, 2 }, { seed = 2, dtype = 'f64' })
    local z = F.matmul(x, y)
    assert.same({ 2, 5, 3, 2 }, z.shape)
    assert.is_true(T.max_abs_diff(z, ref_matmul(x, y)) < 1e-12)
    -- 1-d operands with batches: [4] @ [5,4,2] -> [5,2]; [2,1,3,4] @ [4] -> [2,1,3]
    local v = fsdp.randn({ 4 }, { seed = 3, dtype = 'f64' })
    assert.same({ 5, 2 }, F.matmul(v, y).shape)
    assert.is_true(T.max_abs_diff(F.matmul(v, y), ref_matmul(v:view(1, 4), y):view(5, 2)) < 1e-12)
    assert.same({ 2, 1, 3 }, F.matmul(x, v).shape)
    assert.is_true(T.max_abs_diff(F.matmul(x, v), ref_matmul(x, v:view(4, 1)):view(2, 1, 3)) < 1e-12)
    -- a 2-d left operand against a batch, and a batch times one matrix (one folded GEMM)
    local w = fsdp.randn({ 3, 4 }, { seed = 4, dtype = 'f64' })
    assert.is_true(T.max_abs_diff(F.matmul(w, y), ref_matmul(w, y)) < 1e-12)
    local m = fsdp.randn({ 4, 6 }, { seed = 5, dtype = 'f64' })
    assert.is_true(T.max_abs_diff(F.matmul(x, m), ref_matmul(x, m)) < 1e-12)
  end)

  it('reads transposed and strided operands correctly', function()
    local x = fsdp.randn({ 6, 5 }, { seed = 6 })
    local y = fsdp.randn({ 4, 6 }, { seed = 7 })
    local want = F.matmul(x:t():contiguous(), y:t():contiguous())
    assert.is_true(T.max_abs_diff(F.matmul(x:t(), y:t()), want) < 1e-5)
    -- no unit stride at all: every other column
    local wide = fsdp.randn({ 5, 12 }, { seed = 8 })
    local s = wide:slice(1, 0, 12, 2) -- [5, 6], strides (12, 2)
    assert.is_true(T.max_abs_diff(F.matmul(s, y:t()), F.matmul(s:contiguous(), y:t():contiguous())) < 1e-5)
    -- batched transposes (attention's q @ k^T) and an expanded (stride 0) operand
    local q = fsdp.randn({ 3, 4, 5 }, { seed = 9, dtype = 'f64' })
    local k = fsdp.randn({ 3, 6, 5 }, { seed = 10, dtype = 'f64' })
    assert.is_true(T.max_abs_diff(F.matmul(q, k:transpose(1, 2)), ref_matmul(q, k:transpose(1, 2):contiguous())) < 1e-12)
    local e = fsdp.randn({ 5, 2 }, { seed = 11, dtype = 'f64' }):expand(3, 5, 2)
    assert.is_true(T.max_abs_diff(F.matmul(q, e), ref_matmul(q, e:contiguous())) < 1e-12)
    -- vectors with strides
    local v = fsdp.randn({ 10 }, { seed = 12, dtype = 'f64' }):slice(0, 0, 10, 2)
    assert.is_true(math.abs(F.matmul(v, v):item() - F.matmul(v:contiguous(), v:contiguous()):item()) < 1e-12)
  end)

  it('uses transposed views in place, without copying them', function()
    local x = fsdp.randn({ 512, 256 }, { seed = 13 }):t() -- [256, 512], transposed storage
    local y = fsdp.randn({ 64, 512 }, { seed = 14 }):t()  -- [512, 64]
    collectgarbage()
    fsdp.reset_memory_stats('cpu')
    local before = fsdp.memory_stats('cpu').in_use
    local z = F.matmul(x, y)
    local peak = fsdp.memory_stats('cpu').peak
    assert.equals(256 * 64 * 4, peak - before) -- only the output was allocated
    assert.same({ 256, 64 }, z.shape)
  end)

  it('computes bf16 and f16 in f32 and rounds once', function()
    local x = fsdp.randn({ 2, 16, 32 }, { seed = 15 })
    local y = fsdp.randn({ 32, 8 }, { seed = 16 })
    local want = F.matmul(x:bfloat16():float(), y:bfloat16():float())
    local got = F.matmul(x:bfloat16(), y:bfloat16())
    assert.equals('bf16', got.dtype)
    assert.is_true(T.max_abs_diff(got, want) < 0.07) -- one bf16 rounding of values ~6
    local h = F.matmul(x:half():transpose(1, 2), x:half())
    assert.equals('f16', h.dtype)
    local hw = F.matmul(x:half():float():transpose(1, 2), x:half():float())
    assert.is_true(T.max_abs_diff(h, hw) < 0.05)
  end)

  it('agrees with f64 on a larger product', function()
    local x = fsdp.randn({ 96, 200 }, { seed = 17 })
    local y = fsdp.randn({ 200, 72 }, { seed = 18 })
    local d = T.max_abs_diff(F.matmul(x, y), F.matmul(x:double(), y:double()))
    assert.is_true(d < 1e-3)
  end)

  describe('gradients', function()
    local cases = {
      ['2-d @ 2-d'] = { { 3, 4 }, { 4, 2 } },
      ['1-d @ 1-d'] = { { 4 }, { 4 } },
      ['1-d @ 2-d'] = { { 3 }, { 3, 2 } },
      ['2-d @ 1-d'] = { { 2, 3 }, { 3 } },
      ['batched with broadcast'] = { { 2, 1, 2, 3 }, { 3, 3, 2 } },
      ['batch @ matrix'] = { { 2, 3, 4 }, { 4, 2 } },
      ['matrix @ batch'] = { { 3, 4 }, { 2, 4, 2 } },
      ['1-d @ batch'] = { { 3 }, { 2, 3, 2 } },
    }
    for name, shapes in pairs(cases) do
      it(name, function()
        local x, y = f64(shapes[1], 1), f64(shapes[2], 2)
        assert(T.gradcheck(F.matmul, { x, y }))
      end)
    end
    it('through transposed operands', function()
      local x, y = f64({ 4, 3 }, 3), f64({ 2, 4 }, 4)
      assert(T.gradcheck(function(p, q) return F.matmul(p:t(), q:t()) end, { x, y }))
    end)
    it('names its node', function()
      local x = fsdp.ones(2, 2):requires_grad_()
      assert.equals('MatmulBackward', F.matmul(x, x).grad_fn)
    end)
  end)

  it('runs on meta tensors: shapes and 2*m*n*k FLOPs per product, no memory', function()
    local z
    local flops = flops_without_memory(function()
      z = F.matmul(meta({ 8, 1, 128, 64 }), meta({ 12, 64, 32 }))
    end)
    assert.same({ 8, 12, 128, 32 }, z.shape)
    assert.equals('meta', z.device)
    assert.equals(2 * 8 * 12 * 128 * 32 * 64, flops)
    -- backward on meta counts dA and dB products
    local x = meta({ 4, 5 }):requires_grad_()
    local y = meta({ 5, 6 }):requires_grad_()
    local out = F.matmul(x, y)
    flops = flops_without_memory(function() out:backward(meta({ 4, 6 })) end)
    assert.equals(2 * (2 * 4 * 5 * 6), flops)
  end)

  it('names the op and shapes in errors', function()
    assert.error_matches(function() F.matmul(a, a) end,
      'matmul: shapes %[2, 3%] and %[2, 3%] cannot be multiplied %(3 vs 2%)')
    assert.error_matches(function() F.matmul(fsdp.zeros(2, 3, 4), fsdp.zeros(5, 4, 2)) end,
      'matmul: batch dims of %[2, 3, 4%] and %[5, 4, 2%] do not broadcast %(dim 0: 2 vs 5%)')
    assert.error_matches(function() F.matmul(a, fsdp.zeros(3, 2, { dtype = 'f64' })) end,
      'matmul: the left operand is f32 but the right operand is f64')
    assert.error_matches(function() F.matmul(fsdp.tensor(2), a) end,
      'matmul: both operands need at least 1 dim, got shapes %[%] and %[2, 3%]')
    assert.error_matches(function() F.matmul(a, fsdp.zeros(3, 2, { dtype = 'i64' })) end,
      'matmul: the right operand must be a floating point tensor, got i64')
    assert.error_matches(function() F.matmul(a, meta({ 3, 2 })) end,
      'matmul: the left operand is on cpu but the right operand is on meta')
  end)
end)

describe('linear', function()
  local x = fsdp.tensor({ { 1, 2, 3 }, { 4, 5, 6 } })
  local w = fsdp.tensor({ { 1, 0, -1 }, { 2, 1, 0 } })
  local b = fsdp.tensor({ 10, 20 })

  it('computes x @ w^T + b over all leading dims', function()
    assert.same({ { 8, 24 }, { 8, 33 } }, F.linear(x, w, b):tolist())
    assert.same({ { -2, 4 }, { -2, 13 } }, F.linear(x, w):tolist())
    assert.same({ -2, 4 }, F.linear(fsdp.tensor({ 1, 2, 3 }), w):tolist())
    local x3 = fsdp.randn({ 2, 3, 4, 5 }, { seed = 1, dtype = 'f64' })
    local w3 = fsdp.randn({ 6, 5 }, { seed = 2, dtype = 'f64' })
    local b3 = fsdp.randn({ 6 }, { seed = 3, dtype = 'f64' })
    local y = F.linear(x3, w3, b3)
    assert.same({ 2, 3, 4, 6 }, y.shape)
    local want = ref_matmul(x3, w3:t():contiguous()) + b3
    assert.is_true(T.max_abs_diff(y, want) < 1e-12)
  end)

  it('takes strided inputs and weights', function()
    local xs = fsdp.randn({ 5, 4 }, { seed = 4 }):t()  -- [4, 5] transposed
    local ws = fsdp.randn({ 5, 3 }, { seed = 5 }):t()  -- [3, 5] transposed
    local want = F.linear(xs:contiguous(), ws:contiguous(), b:narrow(0, 0, 1):expand(3))
    assert.is_true(T.max_abs_diff(F.linear(xs, ws, b:narrow(0, 0, 1):expand(3)), want) < 1e-5)
    -- leading dims that do not flatten into rows (a permuted input)
    local xp = fsdp.randn({ 3, 2, 5 }, { seed = 6 }):transpose(0, 1) -- [2, 3, 5]
    local wp = fsdp.randn({ 4, 5 }, { seed = 7 })
    assert.is_true(T.max_abs_diff(F.linear(xp, wp), F.linear(xp:contiguous(), wp)) < 1e-5)
  end)

  it('accepts bf16 (values close to f32)', function()
    local xb = fsdp.randn({ 3, 64 }, { seed = 8 })
    local wb = fsdp.randn({ 16, 64 }, { seed = 9 })
    local bb = fsdp.randn({ 16 }, { seed = 10 })
    local got = F.linear(xb:bfloat16(), wb:bfloat16(), bb:bfloat16())
    assert.equals('bf16', got.dtype)
    local want = F.linear(xb:bfloat16():float(), wb:bfloat16():float(), bb:bfloat16():float())
    assert.is_true(T.max_abs_diff(got, want) < 0.1) -- values up to ~25: one bf16 rounding
  end)

  describe('gradients', function()
    it('of input, weight and bias', function()
      assert(T.gradcheck(F.linear, { f64({ 2, 3, 4 }, 1), f64({ 5, 4 }, 2), f64({ 5 }, 3) }))
    end)
    it('without bias, 1-d input', function()
      assert(T.gradcheck(F.linear, { f64({ 4 }, 4), f64({ 3, 4 }, 5) }))
    end)
    it('with only the weight requiring grad, and a permuted input', function()
      local xin = fsdp.randn({ 3, 2, 4 }, { seed = 6, dtype = 'f64' })
      assert(T.gradcheck(function(wt) return F.linear(xin:transpose(0, 1), wt) end, { f64({ 2, 4 }, 7) }))
    end)
    it('in bf16 (close to the f32 gradients)', function()
      local xf = fsdp.randn({ 8, 32 }, { seed = 8 })
      local wf = fsdp.randn({ 16, 32 }, { seed = 9 })
      local function grads(dtype)
        local xx = xf:to(dtype):requires_grad_()
        local ww = wf:to(dtype):requires_grad_()
        local bb = fsdp.zeros(16, { dtype = dtype }):requires_grad_()
        F.linear(xx, ww, bb):backward(fsdp.ones(8, 16, { dtype = dtype }))
        return xx.grad, ww.grad, bb.grad
      end
      local gx, gw, gb = grads('bf16')
      local fx, fw, fb = grads('f32')
      assert.equals('bf16', gw.dtype)
      assert.is_true(T.max_abs_diff(gx, fx) < 0.2)
      assert.is_true(T.max_abs_diff(gw, fw) < 0.2)
      assert.same(fb:tolist(), gb:tolist()) -- 8 ones per column: exact
    end)
    it('sums bf16 and f16 bias gradients in double and rounds once (contiguous and strided)', function()
      for _, dt in ipairs({ 'bf16', 'f16' }) do
        for _, strided in ipairs({ false, true }) do
          local g = strided and fsdp.randn({ 24, 700 }, { seed = 11 }):to(dt):transpose(0, 1)
                             or fsdp.randn({ 700, 24 }, { seed = 11 }):to(dt)
          local xx = fsdp.randn({ 700, 8 }, { seed = 12 }):to(dt)
          local ww = fsdp.randn({ 24, 8 }, { seed = 13 }):to(dt)
          local bb = fsdp.zeros(24, { dtype = dt }):requires_grad_()
          F.linear(xx, ww, bb):backward(g)
          -- the reference: every (exact) element summed in double, one rounding
          local rows, sums = g:tolist(), {}
          for j = 1, 24 do
            local acc = 0
            for i = 1, 700 do acc = acc + rows[i][j] end
            sums[j] = acc
          end
          assert.same(fsdp.tensor(sums, { dtype = 'f64' }):to(dt):tolist(), bb.grad:tolist())
        end
      end
    end)
    it('names its node', function()
      assert.equals('LinearBackward', F.linear(x, w:clone():requires_grad_()).grad_fn)
    end)
  end)

  it('runs on meta tensors: FLOPs of forward and backward, no memory', function()
    local xm = meta({ 4, 64, 768 }):requires_grad_()
    local wm = meta({ 2304, 768 }):requires_grad_()
    local bm = meta({ 2304 }):requires_grad_()
    local y
    local rows = 4 * 64
    local flops = flops_without_memory(function() y = F.linear(xm, wm, bm) end)
    assert.same({ 4, 64, 2304 }, y.shape)
    assert.equals(2 * rows * 2304 * 768 + rows * 2304, flops)
    flops = flops_without_memory(function() y:backward(meta({ 4, 64, 2304 })) end)
    assert.equals(2 * (2 * rows * 2304 * 768) + rows * 2304, flops)
    -- fake tensors (a real device, no storage yet) give fake results
    local xf = fsdp.empty({ 8, 768 }, { fake = true })
    local yf
    flops_without_memory(function() yf = F.linear(xf, fsdp.empty({ 16, 768 }, { fake = true })) end)
    assert.equals('cpu', yf.device)
    assert.is_true(yf:is_fake())
    assert.same({ 8, 16 }, yf.shape)
  end)

  it('names the op and shapes in errors', function()
    assert.error_matches(function() F.linear(x, fsdp.zeros(2, 4)) end,
      'linear: input of shape %[2, 3%] does not match weight of shape %[2, 4%] %(last dim 3 vs 4 in%-features%)')
    assert.error_matches(function() F.linear(x, w, fsdp.zeros(3)) end,
      'linear: bias of shape %[3%] does not match weight of shape %[2, 3%] %(expected %[2%]%)')
    assert.error_matches(function() F.linear(x, fsdp.zeros(3)) end,
      'linear: weight must be 2%-d %[out, in%], got shape %[3%]')
    assert.error_matches(function() F.linear(x:bfloat16(), w) end, 'linear: input is bf16 but weight is f32')
  end)
end)

describe('embedding', function()
  local w = fsdp.tensor({ { 0, 1 }, { 10, 11 }, { 20, 21 }, { 30, 31 } })

  it('gathers rows for ids of any shape (i64 and i32)', function()
    local ids = fsdp.tensor({ { 3, 0 }, { 1, 1 }, { 2, 3 } }, { dtype = 'i64' })
    local y = F.embedding(ids, w)
    assert.same({ 3, 2, 2 }, y.shape)
    assert.same({ { { 30, 31 }, { 0, 1 } }, { { 10, 11 }, { 10, 11 } }, { { 20, 21 }, { 30, 31 } } }, y:tolist())
    assert.same({ { 20, 21 } }, F.embedding(fsdp.tensor({ 2 }, { dtype = 'i32' }), w):tolist())
    assert.same({ 21, 11 }, F.embedding(fsdp.tensor({ 2, 1 }, { dtype = 'i64' }), w:t():contiguous():t()):select(1, 1):tolist())
    -- strided ids and weight
    local wt = fsdp.tensor({ { 0, 10, 20, 30 }, { 1, 11, 21, 31 } }):t() -- w, transposed storage
    local sid = fsdp.tensor({ 3, 9, 1, 9, 0 }, { dtype = 'i64' }):slice(0, 0, 5, 2)
    assert.same({ { 30, 31 }, { 10, 11 }, { 0, 1 } }, F.embedding(sid, wt):tolist())
    local bf = F.embedding(fsdp.tensor({ 1 }, { dtype = 'i64' }), w:bfloat16())
    assert.equals('bf16', bf.dtype)
    assert.same({ { 10, 11 } }, bf:tolist())
  end)

  it('rejects an out-of-range id, naming it and the number of rows, before writing', function()
    assert.error_matches(function() F.embedding(fsdp.tensor({ 1, 4 }, { dtype = 'i64' }), w) end,
      'embedding: id 4 %(element 1 of the ids%) is out of range for a weight of 4 rows %(shape %[4, 2%]%)')
    assert.error_matches(function() F.embedding(fsdp.tensor({ -1 }, { dtype = 'i32' }), w) end,
      'embedding: id %-1 .* 4 rows')
  end)

  it('scatter-adds gradients (repeated ids add up; padding_idx gets none)', function()
    local ww = w:clone():requires_grad_()
    local ids = fsdp.tensor({ 1, 3, 1, 1, 0 }, { dtype = 'i64' })
    local g = fsdp.tensor({ { 1, 2 }, { 3, 4 }, { 5, 6 }, { 7, 8 }, { 9, 10 } })
    F.embedding(ids, ww):backward(g)
    assert.same({ { 9, 10 }, { 13, 16 }, { 0, 0 }, { 3, 4 } }, ww.grad:tolist())
    ww.grad = nil
    F.embedding(ids, ww, -3):backward(g) -- padding_idx -3 is row 1
    assert.same({ { 9, 10 }, { 0, 0 }, { 0, 0 }, { 3, 4 } }, ww.grad:tolist())
    assert.equals('EmbeddingBackward', F.embedding(ids, ww).grad_fn)
  end)

  it('passes a gradient check, and sums bf16 gradients before rounding', function()
    local ids = fsdp.tensor({ { 0, 2, 2 }, { 4, 2, 0 } }, { dtype = 'i64' })
    assert(T.gradcheck(function(t) return F.embedding(ids, t) end, { f64({ 5, 3 }, 1) }))
    -- 1000 gradients of 1 on one row: adding them up in bf16 would stall at
    -- 256 (256 + 1 rounds back to 256); summed wider, then rounded once: 1000
    local wb = fsdp.zeros(3, 600, { dtype = 'bf16' }):requires_grad_()
    local many = fsdp.ones(1000, { dtype = 'i64' })
    F.embedding(many, wb):backward(fsdp.ones(1000, 600, { dtype = 'bf16' }))
    assert.equals(1000, wb.grad:get(1, 599))
    assert.equals(0, wb.grad:get(2, 0))
  end)

  it('adds its rows into a gradient already waiting: a tied weight gets the sum of both uses', function()
    -- GPT-2's tied head: the product's gradient reaches the table first,
    -- the embedding's rows are then added into it (engine.c, [Note:
    -- gradients added where they land])
    local ids = fsdp.tensor({ { 0, 2, 2 }, { 4, 2, 0 } }, { dtype = 'i64' })
    local r = fsdp.randn({ 2, 3, 5 }, { seed = 7, dtype = 'f64' })
    local function loss(we, wl) return (F.linear(F.embedding(ids, we), wl) * r):sum_to({}) end
    local wt = f64({ 5, 3 }, 6)
    loss(wt, wt):backward()
    local a, b = wt:detach():clone():requires_grad_(), wt:detach():clone():requires_grad_()
    loss(a, b):backward()
    assert.is_true(T.max_abs_diff(wt.grad, a.grad + b.grad) < 1e-12)
    assert(T.gradcheck(function(t) return F.linear(F.embedding(ids, t), t) end, { f64({ 5, 3 }, 8) }))
    -- a second backward adds its rows into .grad
    local ww = w:clone():requires_grad_()
    local one = fsdp.tensor({ 1, 3, 1 }, { dtype = 'i64' })
    local g = fsdp.tensor({ { 1, 2 }, { 3, 4 }, { 5, 6 } })
    F.embedding(one, ww):backward(g)
    F.embedding(one, ww):backward(g)
    assert.same({ { 0, 0 }, { 12, 16 }, { 0, 0 }, { 6, 8 } }, ww.grad:tolist())
    -- added to the waiting bf16 row in double, then rounded once: 256 + 1000
    -- ones is 1256 (adding them in bf16 would stall at 256)
    local wb = fsdp.zeros(3, 600, { dtype = 'bf16' }):requires_grad_()
    wb.grad = fsdp.full({ 3, 600 }, 256, { dtype = 'bf16' })
    F.embedding(fsdp.ones(1000, { dtype = 'i64' }), wb):backward(fsdp.ones(1000, 600, { dtype = 'bf16' }))
    assert.equals(1256, wb.grad:get(1, 599))
    assert.equals(256, wb.grad:get(2, 0))
  end)

  it('makes no table of zeros when the tied weight\'s gradient is already there', function()
    local V, D = 4096, 64
    local wt = fsdp.randn({ V, D }, { seed = 1 }):requires_grad_()
    local ids = fsdp.randint(0, V, { 2, 8 }, { seed = 2 })
    local budget = fsdp.set_collect_budget(0)
    finally(function() fsdp.set_collect_budget(budget) end)
    local y = F.linear(F.embedding(ids, wt), wt):sum_to({})
    collectgarbage()
    local base = fsdp.memory_stats('cpu').in_use
    fsdp.reset_memory_stats('cpu')
    y:backward()
    local table_bytes = V * D * 4
    -- the head's [V, D] gradient (kept as .grad) and [16, V]-sized
    -- temporaries; a second [V, D] table would double it
    assert.is_true(fsdp.memory_stats('cpu').peak - base < 1.5 * table_bytes)
  end)

  it('runs on meta tensors: shapes, no FLOPs forward, N*D backward, no memory', function()
    local ids = fsdp.empty({ 4, 64 }, { device = 'meta', dtype = 'i64' })
    local wm = meta({ 50257, 768 }):requires_grad_()
    local y
    assert.equals(0, flops_without_memory(function() y = F.embedding(ids, wm) end))
    assert.same({ 4, 64, 768 }, y.shape)
    assert.equals(256 * 768, flops_without_memory(function() y:backward(meta({ 4, 64, 768 })) end))
  end)

  it('names the op and shapes in errors', function()
    assert.error_matches(function() F.embedding(fsdp.tensor({ 1 }), w) end, 'embedding: ids must be i64 or i32, got f32')
    assert.error_matches(function() F.embedding(fsdp.tensor({ 1 }, { dtype = 'i64' }), fsdp.zeros(4)) end,
      'embedding: weight must be 2%-d %[num_embeddings, dim%], got shape %[4%]')
    assert.error_matches(function() F.embedding(fsdp.tensor({ 1 }, { dtype = 'i64' }), w, 4) end,
      'embedding: padding_idx 4 out of range for a weight of 4 rows')
  end)
end)

-- Reference conv2d on tiny tensors, by loops.
local function ref_conv2d(x, w, b, s, p, d)
  local N, Cn, H, W = unpack(x.shape)
  local O, _, kh, kw = unpack(w.shape)
  local Ho = math.floor((H + 2 * p[1] - d[1] * (kh - 1) - 1) / s[1]) + 1
  local Wo = math.floor((W + 2 * p[2] - d[2] * (kw - 1) - 1) / s[2]) + 1
  local xv, wv = values(x), values(w)
  local bv = b and values(b)
  local out = {}
  for n = 0, N - 1 do
    for o = 0, O - 1 do
      for oh = 0, Ho - 1 do
        for ow = 0, Wo - 1 do
          local acc = bv and bv[o + 1] or 0
          for c = 0, Cn - 1 do
            for i = 0, kh - 1 do
              for j = 0, kw - 1 do
                local ih, iw = oh * s[1] - p[1] + i * d[1], ow * s[2] - p[2] + j * d[2]
                if ih >= 0 and ih < H and iw >= 0 and iw < W then
                  acc = acc + xv[((n * Cn + c) * H + ih) * W + iw + 1] * wv[((o * Cn + c) * kh + i) * kw + j + 1]
                end
              end
            end
          end
          out[#out + 1] = acc
        end
      end
    end
  end
  return fsdp.tensor(out, { dtype = 'f64' }):view(N, O, Ho, Wo)
end

describe('conv2d', function()
  it('matches a direct convolution (stride, padding, dilation, bias)', function()
    local x = fsdp.randn({ 2, 3, 7, 6 }, { seed = 1, dtype = 'f64' })
    local w = fsdp.randn({ 4, 3, 3, 2 }, { seed = 2, dtype = 'f64' })
    local b = fsdp.randn({ 4 }, { seed = 3, dtype = 'f64' })
    local cases = {
      { s = { 1, 1 }, p = { 0, 0 }, d = { 1, 1 } },
      { s = { 2, 1 }, p = { 1, 2 }, d = { 1, 1 } },
      { s = { 1, 3 }, p = { 2, 1 }, d = { 2, 2 } },
    }
    for _, c in ipairs(cases) do
      local y = F.conv2d(x, w, b, { stride = c.s, padding = c.p, dilation = c.d })
      local want = ref_conv2d(x, w, b, c.s, c.p, c.d)
      assert.same(want.shape, y.shape)
      assert.is_true(T.max_abs_diff(y, want) < 1e-12)
    end
    local y = F.conv2d(x, w, nil, { padding = 1, stride = 2 })
    assert.is_true(T.max_abs_diff(y, ref_conv2d(x, w, nil, { 2, 2 }, { 1, 1 }, { 1, 1 })) < 1e-12)
  end)

  it('handles 1x1 kernels, unbatched input, same padding and a large image', function()
    local x = fsdp.randn({ 2, 5, 4, 3 }, { seed = 4, dtype = 'f64' })
    local w = fsdp.randn({ 6, 5, 1, 1 }, { seed = 5, dtype = 'f64' })
    assert.is_true(T.max_abs_diff(F.conv2d(x, w), ref_conv2d(x, w, nil, { 1, 1 }, { 0, 0 }, { 1, 1 })) < 1e-12)
    local x3 = fsdp.randn({ 3, 5, 5 }, { seed = 6, dtype = 'f64' })
    local w3 = fsdp.randn({ 2, 3, 3, 3 }, { seed = 7, dtype = 'f64' })
    local y3 = F.conv2d(x3, w3, nil, { padding = 'same' })
    assert.same({ 2, 5, 5 }, y3.shape)
    assert.is_true(T.max_abs_diff(y3, ref_conv2d(x3:view(1, 3, 5, 5), w3, nil, { 1, 1 }, { 1, 1 }, { 1, 1 }):view(2, 5, 5)) < 1e-12)
    -- big enough that images go one at a time through a threaded GEMM
    local xl = fsdp.randn({ 2, 8, 26, 26 }, { seed = 8 })
    local wl = fsdp.randn({ 16, 8, 3, 3 }, { seed = 9 })
    local bl = fsdp.randn({ 16 }, { seed = 10 })
    local yl = F.conv2d(xl, wl, bl)
    assert.is_true(T.max_abs_diff(yl, ref_conv2d(xl, wl, bl, { 1, 1 }, { 0, 0 }, { 1, 1 })) < 1e-4)
  end)

  it('accepts bf16 and strided inputs', function()
    local x = fsdp.randn({ 2, 2, 6, 6 }, { seed = 11 })
    local w = fsdp.randn({ 3, 2, 3, 3 }, { seed = 12 })
    local b = fsdp.randn({ 3 }, { seed = 13 })
    local got = F.conv2d(x:bfloat16(), w:bfloat16(), b:bfloat16(), { padding = 1 })
    assert.equals('bf16', got.dtype)
    local want = F.conv2d(x:bfloat16():float(), w:bfloat16():float(), b:bfloat16():float(), { padding = 1 })
    assert.is_true(T.max_abs_diff(got, want) < 0.05)
    local xt = x:transpose(2, 3)
    assert.is_true(T.max_abs_diff(F.conv2d(xt, w), F.conv2d(xt:contiguous(), w)) < 1e-5)
  end)

  describe('gradients', function()
    local cases = {
      plain = {},
      ['stride and padding'] = { stride = { 2, 1 }, padding = { 1, 2 } },
      dilation = { dilation = 2, padding = 1 },
      pointwise = { kernel = 1 },
    }
    for name, o in pairs(cases) do
      it(name, function()
        local k = o.kernel or 3
        local x, w, b = f64({ 2, 2, 5, 5 }, 1), f64({ 3, 2, k, k }, 2), f64({ 3 }, 3)
        assert(T.gradcheck(function(p, q, r) return F.conv2d(p, q, r, o) end, { x, w, b }))
      end)
    end
    it('of the input only, unbatched', function()
      local w = fsdp.randn({ 2, 2, 2, 2 }, { seed = 4, dtype = 'f64' })
      assert(T.gradcheck(function(p) return F.conv2d(p, w, nil, { stride = 2 }) end, { f64({ 2, 5, 4 }, 5) }))
    end)
    it('of a larger case (images one at a time) against the small path', function()
      local x = fsdp.randn({ 2, 8, 26, 26 }, { seed = 6, dtype = 'f64' }):requires_grad_()
      local w = fsdp.randn({ 16, 8, 3, 3 }, { seed = 7, dtype = 'f64' }):requires_grad_()
      local g = fsdp.randn({ 2, 16, 24, 24 }, { seed = 8, dtype = 'f64' })
      F.conv2d(x, w):backward(g)
      -- per image, in the one-image layout, the same gradients
      for n = 0, 1 do
        local xn = x:detach():narrow(0, n, 1):contiguous():requires_grad_()
        local wn = w:detach():clone():requires_grad_()
        F.conv2d(xn, wn):backward(g:narrow(0, n, 1):contiguous())
        assert.is_true(T.max_abs_diff(xn.grad, x.grad:narrow(0, n, 1)) < 1e-10)
      end
      assert.equals('Conv2dBackward', F.conv2d(x, w).grad_fn)
    end)
  end)

  it('runs on meta tensors: shapes and FLOPs, no memory', function()
    local y
    local flops = flops_without_memory(function()
      y = F.conv2d(meta({ 64, 32, 26, 26 }), meta({ 64, 32, 3, 3 }), meta({ 64 }))
    end)
    assert.same({ 64, 64, 24, 24 }, y.shape)
    local outs = 64 * 64 * 24 * 24
    assert.equals(2 * outs * 32 * 9 + outs, flops)
  end)

  it('names the op and shapes in errors', function()
    local x = fsdp.zeros(1, 3, 5, 5)
    assert.error_matches(function() F.conv2d(x, fsdp.zeros(2, 4, 3, 3)) end,
      'conv2d: weight of shape %[2, 4, 3, 3%] expects 4 input channels but input of shape %[1, 3, 5, 5%] has 3')
    assert.error_matches(function() F.conv2d(x, fsdp.zeros(2, 3, 7, 7)) end,
      'conv2d: kernel 7x7 with dilation %(1, 1%) does not fit input of shape %[1, 3, 5, 5%]')
    assert.error_matches(function() F.conv2d(fsdp.zeros(3, 5), fsdp.zeros(2, 3, 3, 3)) end,
      'conv2d: input must be %[N, C, H, W%] or %[C, H, W%], got shape %[3, 5%]')
    assert.error_matches(function() F.conv2d(x, fsdp.zeros(2, 3, 3, 3), fsdp.zeros(3)) end,
      'conv2d: bias of shape %[3%] does not match 2 output channels')
    assert.error_matches(function() F.conv2d(x, fsdp.zeros(2, 3, 3, 3), nil, { stride = 0 }) end,
      'conv2d: stride %(0, 0%)')
  end)
end)

describe('max_pool2d', function()
  local x = fsdp.tensor({ { { { 1, 5, 2, 0 }, { 3, 4, 8, 1 }, { 0, 2, 7, 6 }, { 9, 1, 3, 2 } } } })

  it('takes window maxima and their flat indices', function()
    local y, idx = F.max_pool2d(x, 2, nil, { return_indices = true })
    assert.same({ { { { 5, 8 }, { 9, 7 } } } }, y:tolist())
    assert.same({ { { { 1, 6 }, { 12, 10 } } } }, idx:tolist())
    assert.equals('i64', idx.dtype)
    -- stride 1, padding, unbatched input
    local y2 = F.max_pool2d(x[0], 3, 1, { padding = 1 })
    assert.same({ 1, 4, 4 }, y2.shape)
    assert.same({ 5, 8, 8, 8 }, y2[0][0]:tolist())
    assert.same({ 9, 9, 7, 7 }, y2[0][3]:tolist())
    -- dilation 2: windows of every other pixel
    assert.same({ { { { 7, 6 }, { 9, 4 } } } }, F.max_pool2d(x, 2, 1, { dilation = 2 }):tolist())
    -- bf16, and a transposed input
    assert.same({ { { { 5, 8 }, { 9, 7 } } } }, F.max_pool2d(x:bfloat16(), { 2, 2 }):tolist())
    assert.same({ { { { 5, 9 }, { 8, 7 } } } }, F.max_pool2d(x:transpose(2, 3), 2):tolist())
  end)

  it('routes gradients to the maxima', function()
    local xx = x:clone():requires_grad_()
    F.max_pool2d(xx, 2):backward(fsdp.tensor({ { { { 1, 2 }, { 3, 4 } } } }))
    assert.same({ { { { 0, 1, 0, 0 }, { 0, 0, 2, 0 }, { 0, 0, 4, 0 }, { 3, 0, 0, 0 } } } }, xx.grad:tolist())
    assert.equals('MaxPool2dBackward', F.max_pool2d(xx, 2).grad_fn)
    -- overlapping windows add up
    local xo = x:clone():requires_grad_()
    F.max_pool2d(xo, 2, 1):backward(fsdp.ones(1, 1, 3, 3))
    assert.equals(4, xo.grad:get(0, 0, 1, 2)) -- 8 is the max of 4 windows
    -- random values have no ties: finite differences apply
    assert(T.gradcheck(function(t) return F.max_pool2d(t, 2, 1, { padding = 1 }) end, { f64({ 2, 2, 4, 5 }, 1) }))
    assert(T.gradcheck(function(t) return F.max_pool2d(t, { 3, 2 }, { 2, 1 }) end, { f64({ 3, 7, 5 }, 2) }))
  end)

  it('runs on meta tensors: shapes and one comparison per window element', function()
    local y
    local flops = flops_without_memory(function() y = F.max_pool2d(meta({ 64, 64, 24, 24 }), 2) end)
    assert.same({ 64, 64, 12, 12 }, y.shape)
    assert.equals(64 * 64 * 12 * 12 * 4, flops)
  end)

  it('names the op and shapes in errors', function()
    assert.error_matches(function() F.max_pool2d(x, 2, 2, { padding = 2 }) end,
      'max_pool2d: padding 2 must be at most half the kernel size 2')
    assert.error_matches(function() F.max_pool2d(x, 5) end,
      'max_pool2d: kernel 5x5 with dilation %(1, 1%) does not fit input of shape %[1, 1, 4, 4%]')
    assert.error_matches(function() F.max_pool2d(fsdp.zeros(4, 4), 2) end,
      'max_pool2d: input must be %[N, C, H, W%] or %[C, H, W%], got shape %[4, 4%]')
    assert.error_matches(function() F.max_pool2d(x, 'x') end, 'max_pool2d: kernel must be a number or a pair')
  end)
end)

describe('cat, split and chunk', function()
  local a = fsdp.tensor({ { 1, 2 }, { 3, 4 } })
  local b = fsdp.tensor({ { 5, 6 } })

  it('cat joins along a dim into a new tensor', function()
    assert.same({ { 1, 2 }, { 3, 4 }, { 5, 6 } }, F.cat({ a, b }):tolist())
    assert.same({ { 1, 2, 1, 3 }, { 3, 4, 2, 4 } }, F.cat({ a, a:t() }, -1):tolist())
    local c = F.cat({ a })
    c:set(9, 0, 0)
    assert.equals(1, a:get(0, 0)) -- a copy, not a view
    assert.same({ 0, 2 }, F.cat({ fsdp.zeros(0, 2), fsdp.zeros(0, 2) }, 0).shape)
    local bf = F.cat({ a:bfloat16(), b:bfloat16() })
    assert.equals('bf16', bf.dtype)
    assert.same({ 3, 2 }, bf.shape)
  end)

  it('cat backward narrows the gradient into each slot', function()
    local x, y, z = f64({ 2, 3 }, 1), f64({ 2, 1 }, 2), f64({ 2, 2 }, 3)
    assert(T.gradcheck(function(p, q, r) return F.cat({ p, q, r }, 1) end, { x, y, z }))
    local c = F.cat({ x, fsdp.zeros(2, 3, { dtype = 'f64' }) }) -- one input without grad
    assert.equals('CatBackward', c.grad_fn)
    assert(T.gradcheck(function(p) return F.cat({ fsdp.ones(1, 3, { dtype = 'f64' }), p, p }, 0) end, { x }))
  end)

  it('split and chunk give views with autograd', function()
    local t = fsdp.arange(10):view(2, 5)
    local parts = t:split(2, 1)
    assert.equals(3, #parts)
    assert.same({ { 0, 1 }, { 5, 6 } }, parts[1]:tolist())
    assert.same({ { 4 }, { 9 } }, parts[3]:tolist())
    parts = F.split(t, { 1, 4 }, -1)
    assert.same({ { 1, 2, 3, 4 }, { 6, 7, 8, 9 } }, parts[2]:tolist())
    parts[1]:fill_(7)
    assert.equals(7, t:get(1, 0)) -- views share storage
    local ch = fsdp.arange(5):chunk(3)
    assert.equals(3, #ch)
    assert.same({ 4 }, ch[3]:tolist())
    assert.equals(2, #fsdp.arange(4):chunk(3, 0)) -- sizes 2, 2: fewer chunks, as in PyTorch
    local x = f64({ 3, 4 }, 4)
    assert(T.gradcheck(function(p)
      local q, k, v = unpack(p:split(1, 0))
      return F.cat({ v, q * 2, k }, 1)
    end, { x }))
    assert(T.gradcheck(function(p) return p:chunk(2, 1)[2] end, { x }))
  end)

  it('work on meta tensors without memory', function()
    local c
    local flops = flops_without_memory(function()
      c = F.cat({ meta({ 4, 64, 768 }), meta({ 4, 64, 768 }) }, 1)
      local parts = c:split(64, 1)
      assert.same({ 4, 64, 768 }, parts[2].shape)
    end)
    assert.same({ 4, 128, 768 }, c.shape)
    assert.equals(0, flops)
  end)

  it('name the op and the odd one out in errors', function()
    assert.error_matches(function() F.cat({ a, b:double() }) end, 'cat: tensor 1 is f64 but tensor 0 is f32')
    assert.error_matches(function() F.cat({ a, a, meta({ 2, 2 }) }) end, 'cat: tensor 2 is on meta but tensor 0 is on cpu')
    assert.error_matches(function() F.cat({ a, b }, 1) end,
      'cat: tensor 1 has shape %[1, 2%] but tensor 0 has shape %[2, 2%] %(sizes must match except in dim 1%)')
    assert.error_matches(function() F.cat({ a, fsdp.zeros(2) }) end, 'cat: tensor 1 has shape %[2%]')
    assert.error_matches(function() F.cat({ a }, 2) end, 'cat: dim 2 out of range for a 2%-d tensor')
    assert.error_matches(function() F.cat({}) end, 'cat: expected at least one tensor')
    assert.error_matches(function() F.cat({ a, 3 }) end, 'cat: element 1 of the list is a number, not a Tensor')
    assert.error_matches(function() a:split({ 1, 2 }, 0) end,
      'split: sizes %[1, 2%] add up to 3 but dim 0 of shape %[2, 2%] has size 2')
    assert.error_matches(function() a:split(0) end, 'split: split size must be a positive integer, got 0')
    assert.error_matches(function() a:chunk(2, 3) end, 'chunk: dim 3 out of range for a 2%-d tensor of shape %[2, 2%]')
  end)
end)
