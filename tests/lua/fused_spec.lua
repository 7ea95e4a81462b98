-- fused_spec.lua: the fused ops (rms_norm, layer_norm, softmax,
-- log_softmax, cross_entropy, nll_loss, rope_tables, apply_rotary,
-- scaled_dot_product_attention): forward values against references
-- computed here in plain Lua on tiny tensors, finite-difference gradient
-- checks in f64, bf16 and strided inputs, meta tensors (shapes and FLOPs,
-- no memory), and the errors.
local fsdp = require 'fsdp'
local T = require 'fsdp.testing'
local F = require 'fsdp.functional.fused'

-- helpers --------------------------------------------------------------------------

local function flat(t) return t:contiguous():view(-1):tolist() end

local function randn(shape, seed, dtype)
  return fsdp.randn(shape, { seed = seed, dtype = dtype or 'f32' })
end

local function f64(shape, seed)
  return randn(shape, seed, 'f64'):requires_grad_()
end

-- Max |a[i] - b[i]| of two flat arrays of the same length.
local function worst(a, b)
  assert.equals(#a, #b)
  local w = 0
  for i = 1, #a do
    local d = math.abs(a[i] - b[i])
    if d ~= d then return math.huge end
    if d > w then w = d end
  end
  return w
end

local function assert_close(expected, got, tol)
  local w = worst(expected, got)
  assert(w <= tol, ('max difference %g exceeds %g'):format(w, tol))
end

local function assert_gradcheck(fn, inputs, opts)
  local ok, msg = T.gradcheck(fn, inputs, opts)
  assert(ok, msg)
end

-- Rows of a flat array (row length n) mapped through fn(row) -> row.
local function by_rows(values, n, fn)
  local out = {}
  for r = 0, #values / n - 1 do
    local row = {}
    for i = 1, n do row[i] = values[r * n + i] end
    for i, v in ipairs(fn(row, r)) do out[r * n + i] = v end
  end
  return out
end

local function mean(row, f)
  local s = 0
  for _, v in ipairs(row) do s = s + (f and f(v) or v) end
  return s / #row
end

local function logsumexp(row)
  local m = -math.huge
  for _, v in ipairs(row) do m = math.max(m, v) end
  local s = 0
  for _, v in ipairs(row) do s = s + math.exp(v - m) end
  return m + math.log(s)
end

-- Memory and FLOPs around fn on meta/fake tensors.
-- (The collector is paused so that freeing earlier tensors cannot move
-- the count.)
local function on_meta(fn)
  collectgarbage()
  collectgarbage('stop')
  fsdp.reset_memory_stats('cpu')
  local before = fsdp.memory_stats('cpu').in_use
  fsdp.reset_flops()
  local r = { pcall(fn) }
  local after = fsdp.memory_stats('cpu').in_use
  collectgarbage('restart')
  assert(r[1], r[2])
  assert.equals(before, after)
  return fsdp.flops(), unpack(r, 2)
end

-- rms_norm ------------------------------------------------------------------------------

local function rms_ref(x, w, eps, n)
  return by_rows(x, n, function(row)
    local r = 1 / math.sqrt(mean(row, function(v) return v * v end) + eps)
    local y = {}
    for i, v in ipairs(row) do y[i] = v * r * (w and w[i] or 1) end
    return y
  end)
end

describe('rms_norm', function()
  local x = randn({ 3, 4, 8 }, 1)
  local w = randn({ 8 }, 2)

  it('matches the reference with and without a weight', function()
    assert_close(rms_ref(flat(x), flat(w), 1e-5, 8), flat(F.rms_norm(x, w, 1e-5)), 1e-5)
    assert_close(rms_ref(flat(x), nil, 1e-6, 8), flat(F.rms_norm(x)), 1e-5)
    local tiny = fsdp.zeros(2, 4)
    assert.same({ 0, 0, 0, 0 }, F.rms_norm(tiny, nil, 1e-6):tolist()[1]) -- eps keeps 0/0 away
  end)

  it('rounds to the input dtype before the weight multiply (Llama semantics)', function()
    local xb, wb = x:bfloat16(), w:bfloat16()
    local y = F.rms_norm(xb, wb, 1e-5)
    assert.equals('bf16', y.dtype)
    -- HF: weight * hidden_states.to(input_dtype), in bf16 arithmetic
    local ref = F.rms_norm(xb:float(), nil, 1e-5):bfloat16() * wb
    assert.same(flat(ref), flat(y))
    assert_close(flat(F.rms_norm(x, w, 1e-5)), flat(y:float()), 0.05)
    -- a weight of another dtype promotes as weight * x does
    assert.equals('f64', F.rms_norm(x, w:double()).dtype)
    assert.equals('f32', F.rms_norm(xb, w).dtype)
  end)

  it('reads strided inputs', function()
    local xt = randn({ 8, 6 }, 3):t() -- [6, 8], last dim strided
    assert.is_false(xt:is_contiguous())
    assert.same(flat(F.rms_norm(xt:contiguous(), w)), flat(F.rms_norm(xt, w)))
  end)

  -- Rows of a multiple of 16, dense, f32 or bf16, go to whole-row AVX-512
  -- functions where the CPU has them (cpu_rows_avx512.c); a strided input
  -- takes the per-row kernel. Same arithmetic, so the same bits (the row
  -- sums in double may add in another order: that changes no result here).
  it('gives the per-row results on its whole-row path (f32 and bf16, with and without weight)', function()
    for _, n in ipairs { 64, 512 } do
      for _, dt in ipairs { 'f32', 'bf16' } do
        for _, weighted in ipairs { true, false } do
          local what = ('n %d, %s, weight %s'):format(n, dt, tostring(weighted))
          local base = randn({ n, 37 }, 6):to(dt)
          local dense, strided = base:t():contiguous(), base:t()
          local wn = weighted and randn({ n }, 7):to(dt):requires_grad_() or nil
          local g = randn({ 37, n }, 8):to(dt)
          local function run(x)
            local xg = x:detach():requires_grad_()
            if wn then wn.grad = nil end
            local y = F.rms_norm(xg, wn, 1e-5)
            y:backward(g)
            return y:float(), xg.grad:float(), wn and wn.grad:float()
          end
          local y1, dx1, dw1 = run(dense)
          local y2, dx2, dw2 = run(strided)
          assert.same(flat(y2), flat(y1), what)
          assert.same(flat(dx2), flat(dx1), what .. ', dx')
          if wn then assert.same(flat(dw2), flat(dw1), what .. ', dw') end
          assert_close(rms_ref(flat(dense:float()), wn and flat(wn:float()), 1e-5, n), flat(y1), dt == 'f32' and 1e-5 or 0.05)
        end
      end
    end
  end)

  it('has gradients for input and weight', function()
    local xd, wd = f64({ 3, 5 }, 4), f64({ 5 }, 5)
    assert_gradcheck(function(a, b) return F.rms_norm(a, b, 1e-5) end, { xd, wd })
    assert_gradcheck(function(a) return F.rms_norm(a) end, { xd })
    assert.equals('RmsNormBackward', F.rms_norm(xd, wd).grad_fn)
    -- weight only: x does not require grad
    assert_gradcheck(function(a, b) return F.rms_norm(a, b) end, { xd:detach(), wd })
  end)

  it('runs on meta tensors: shape and FLOPs, no memory', function()
    local flops, y = on_meta(function()
      return F.rms_norm(fsdp.empty({ 4, 2048, 4096 }, { device = 'meta', dtype = 'bf16' }),
                        fsdp.empty({ 4096 }, { device = 'meta', dtype = 'bf16' }))
    end)
    assert.same({ 4, 2048, 4096 }, y.shape)
    assert.equals('meta', y.device)
    assert.equals('bf16', y.dtype)
    assert.equals(4 * 4 * 2048 * 4096, flops)
    local _, f = on_meta(function() return F.rms_norm(fsdp.empty({ 2, 8 }, { fake = true })) end)
    assert.is_true(f:is_fake())
  end)

  it('names the op and shapes in errors', function()
    assert.error_matches(function() F.rms_norm(fsdp.zeros(2, 3, 8), fsdp.zeros(7)) end,
      'rms_norm: weight of shape %[7%] does not match the last dim of input %[2, 3, 8%]')
    assert.error_matches(function() F.rms_norm(fsdp.zeros(2, { dtype = 'i64' })) end,
      'rms_norm: input must be a floating point tensor, got i64')
    assert.error_matches(function() F.rms_norm(x, nil, -1) end, 'rms_norm: eps must be')
    assert.error_matches(function() F.rms_norm(x, fsdp.zeros(8, { device = 'meta' })) end,
      'rms_norm: weight is on meta but the input is on cpu')
  end)
end)

-- layer_norm ----------------------------------------------------------------------------

local function ln_ref(x, w, b, eps, n)
  return by_rows(x, n, function(row)
    local m = mean(row)
    local var = mean(row, function(v) return (v - m) ^ 2 end)
    local y = {}
    for i, v in ipairs(row) do
      y[i] = (v - m) / math.sqrt(var + eps) * (w and w[i] or 1) + (b and b[i] or 0)
    end
    return y
  end)
end

describe('layer_norm', function()
  local x = randn({ 5, 6 }, 10)
  local w, b = randn({ 6 }, 11), randn({ 6 }, 12)

  it('matches the reference for every combination of weight and bias', function()
    assert_close(ln_ref(flat(x), flat(w), flat(b), 1e-5, 6), flat(F.layer_norm(x, w, b)), 1e-5)
    assert_close(ln_ref(flat(x), nil, nil, 1e-3, 6), flat(F.layer_norm(x, nil, nil, 1e-3)), 1e-5)
    assert_close(ln_ref(flat(x), nil, flat(b), 1e-5, 6), flat(F.layer_norm(x, nil, b)), 1e-5)
    -- a large mean does not swamp the variance
    local shifted = x + 1e4
    assert_close(ln_ref(flat(shifted), nil, nil, 1e-5, 6), flat(F.layer_norm(shifted)), 2e-3)
  end)

  it('accepts bf16 and strided inputs', function()
    local y = F.layer_norm(x:bfloat16(), w:bfloat16(), b:bfloat16())
    assert.equals('bf16', y.dtype)
    assert_close(flat(F.layer_norm(x, w, b)), flat(y:float()), 0.05)
    local xt = x:t():contiguous():t()
    assert.is_false(xt:is_contiguous())
    assert.same(flat(F.layer_norm(x, w, b)), flat(F.layer_norm(xt, w, b)))
  end)

  -- As RMSNorm's: dense rows of a multiple of 16 (f32 or bf16) take the
  -- whole-row AVX-512 functions where the CPU has them, strided ones the
  -- per-row kernel; the same bits, gradients of x, weight and bias too.
  it('gives the per-row results on its whole-row path (f32 and bf16, with and without weight and bias)', function()
    for _, n in ipairs { 64, 768 } do
      for _, dt in ipairs { 'f32', 'bf16' } do
        for _, affine in ipairs { true, false } do
          local what = ('n %d, %s, affine %s'):format(n, dt, tostring(affine))
          local base = (randn({ n, 37 }, 16) + 3):to(dt) -- a mean away from 0
          local dense, strided = base:t():contiguous(), base:t()
          local wn = affine and randn({ n }, 17):to(dt):requires_grad_() or nil
          local bn = affine and randn({ n }, 18):to(dt):requires_grad_() or nil
          local g = randn({ 37, n }, 19):to(dt)
          local function run(xin)
            local xg = xin:detach():requires_grad_()
            if wn then wn.grad, bn.grad = nil, nil end
            local y = F.layer_norm(xg, wn, bn, 1e-5)
            y:backward(g)
            return y:float(), xg.grad:float(), wn and wn.grad:float(), bn and bn.grad:float()
          end
          local y1, dx1, dw1, db1 = run(dense)
          local y2, dx2, dw2, db2 = run(strided)
          assert.same(flat(y2), flat(y1), what)
          assert.same(flat(dx2), flat(dx1), what .. ', dx')
          if wn then
            assert.same(flat(dw2), flat(dw1), what .. ', dw')
            assert.same(flat(db2), flat(db1), what .. ', db')
          end
          assert_close(ln_ref(flat(dense:float()), wn and flat(wn:float()), bn and flat(bn:float()), 1e-5, n), flat(y1),
            dt == 'f32' and 1e-4 or 0.1)
        end
      end
    end
  end)

  it('has gradients for input, weight and bias', function()
    local xd, wd, bd = f64({ 4, 5 }, 13), f64({ 5 }, 14), f64({ 5 }, 15)
    assert_gradcheck(function(a, c, d) return F.layer_norm(a, c, d) end, { xd, wd, bd })
    assert_gradcheck(function(a) return F.layer_norm(a) end, { xd })
    assert_gradcheck(function(a, d) return F.layer_norm(a, nil, d) end, { xd:detach(), bd })
  end)

  it('runs on meta tensors', function()
    local flops, y = on_meta(function()
      local m = { device = 'meta' }
      return F.layer_norm(fsdp.empty({ 65, 1024 }, m), fsdp.empty({ 1024 }, m), fsdp.empty({ 1024 }, m))
    end)
    assert.same({ 65, 1024 }, y.shape)
    assert.equals(7 * 65 * 1024, flops)
  end)

  it('names the op and shapes in errors', function()
    assert.error_matches(function() F.layer_norm(x, nil, fsdp.zeros(5)) end,
      'layer_norm: bias of shape %[5%] does not match the last dim of input %[5, 6%]')
    assert.error_matches(function() F.layer_norm(fsdp.tensor(1)) end,
      'layer_norm: input must have at least 1 dim')
  end)
end)

-- softmax, log_softmax -------------------------------------------------------------

local function softmax_ref(row, log)
  local l = logsumexp(row)
  local y = {}
  for i, v in ipairs(row) do y[i] = log and v - l or math.exp(v - l) end
  return y
end

describe('softmax and log_softmax', function()
  local x = randn({ 3, 4 }, 20)

  it('match the reference along any dim', function()
    local v = flat(x)
    assert_close(by_rows(v, 4, function(r) return softmax_ref(r) end), flat(F.softmax(x, -1)), 1e-6)
    assert_close(by_rows(v, 4, function(r) return softmax_ref(r, true) end), flat(x:log_softmax(1)), 1e-6)
    -- dim 0 is dim 1 of the transpose
    assert_close(flat(F.softmax(x:t():contiguous(), 1):t()), flat(F.softmax(x, 0)), 1e-7)
    assert_close(flat(F.log_softmax(x:t():contiguous(), 1):t()), flat(x:log_softmax(0)), 1e-6)
    assert.equals(1, F.softmax(fsdp.tensor(3.5)):item())
  end)

  it('are stable for large and infinite inputs', function()
    local big = fsdp.tensor({ 1000, 1001, -math.huge })
    assert_close({ 1 / (1 + math.exp(1)), 1 / (1 + math.exp(-1)), 0 }, F.softmax(big):tolist(), 1e-6)
    assert_close({ -1 - math.log(1 + math.exp(-1)), -math.log(1 + math.exp(-1)) },
                 { F.log_softmax(big):get(0), F.log_softmax(big):get(1) }, 1e-5)
    assert.equals(-math.huge, F.log_softmax(big):get(2))
  end)

  it('accept bf16 and strided inputs', function()
    local y = F.softmax(x:bfloat16(), 1)
    assert.equals('bf16', y.dtype)
    assert_close(flat(F.softmax(x, 1)), flat(y:float()), 1e-2)
    local xt = randn({ 4, 3 }, 21):t()
    assert.same(flat(F.softmax(xt:contiguous(), 1)), flat(F.softmax(xt, 1)))
    assert.same(flat(F.log_softmax(xt:contiguous(), 0)), flat(F.log_softmax(xt, 0)))
  end)

  it('have gradients along any dim', function()
    local xd = f64({ 3, 4 }, 22)
    for _, d in ipairs({ 0, 1, -1 }) do
      assert_gradcheck(function(a) return F.softmax(a, d) end, { xd })
      assert_gradcheck(function(a) return F.log_softmax(a, d) end, { xd })
    end
    assert.equals('SoftmaxBackward', F.softmax(xd).grad_fn)
    assert.equals('LogSoftmaxBackward', F.log_softmax(xd).grad_fn)
  end)

  it('run on meta tensors', function()
    local flops, y = on_meta(function()
      return F.softmax(fsdp.empty({ 8, 16, 512, 512 }, { device = 'meta' }), -1)
    end)
    assert.same({ 8, 16, 512, 512 }, y.shape)
    assert.equals(5 * 8 * 16 * 512 * 512, flops)
  end)

  it('name the op in errors', function()
    assert.error_matches(function() F.softmax(x, 2) end,
      'softmax: dim 2 out of range for a 2%-d tensor of shape %[3, 4%]')
    assert.error_matches(function() F.log_softmax(fsdp.zeros(2, { dtype = 'i32' })) end,
      'log_softmax: input must be a floating point tensor, got i32')
  end)
end)

-- cross_entropy, nll_loss ----------------------------------------------------------

-- Per-row losses (nil where ignored) of logits rows against targets.
local function ce_rows(logits, targets, C, smoothing, ignore)
  local out = {}
  for r, t in ipairs(targets) do
    if t ~= (ignore or -100) then
      local row = {}
      for i = 1, C do row[i] = logits[(r - 1) * C + i] end
      local l = logsumexp(row)
      local loss = l - row[t + 1]
      if smoothing and smoothing > 0 then loss = (1 - smoothing) * loss + smoothing * (l - mean(row)) end
      out[r] = loss
    end
  end
  return out
end

local function reduce(rows, n, how)
  local s, c = 0, 0
  for r = 1, n do if rows[r] then s, c = s + rows[r], c + 1 end end
  if how == 'sum' then return s end
  return s / c
end

describe('cross_entropy', function()
  local logits = randn({ 6, 5 }, 30)
  local tlist = { 0, 4, -100, 2, 1, 4 }
  local targets = fsdp.tensor(tlist, { dtype = 'i64' })
  local rows = ce_rows(flat(logits), tlist, 5)

  it('matches the reference for each reduction', function()
    assert.is_true(math.abs(reduce(rows, 6, 'mean') - F.cross_entropy(logits, targets):item()) < 1e-5)
    assert.is_true(math.abs(reduce(rows, 6, 'sum') -
                            F.cross_entropy(logits, targets, { reduction = 'sum' }):item()) < 1e-5)
    local none = F.cross_entropy(logits, targets, { reduction = 'none' })
    assert.same({ 6 }, none.shape)
    local expected = {}
    for r = 1, 6 do expected[r] = rows[r] or 0 end
    assert_close(expected, none:tolist(), 1e-5)
  end)

  it('supports label smoothing, other ignore indices, i32 targets and extra dims', function()
    local sm = ce_rows(flat(logits), tlist, 5, 0.1)
    assert.is_true(math.abs(reduce(sm, 6, 'mean') -
                            F.cross_entropy(logits, targets, { label_smoothing = 0.1 }):item()) < 1e-5)
    local t2 = { 0, 4, 3, 2, 1, 4 }
    local ig = ce_rows(flat(logits), t2, 5, 0, 4)
    assert.is_true(math.abs(reduce(ig, 6, 'mean') -
                            F.cross_entropy(logits, fsdp.tensor(t2, { dtype = 'i32' }),
                                            { ignore_index = 4 }):item()) < 1e-5)
    -- [B, T, V] logits with [B, T] targets: classes on the last dim
    local l3 = logits:view(2, 3, 5)
    local none = F.cross_entropy(l3, targets:view(2, 3), { reduction = 'none' })
    assert.same({ 2, 3 }, none.shape)
    assert.same(flat(F.cross_entropy(logits, targets, { reduction = 'none' })), flat(none))
  end)

  it('gives nan for a mean over no targets, as PyTorch, and 0 for a sum', function()
    local none = fsdp.full({ 6 }, -100, { dtype = 'i64' })
    local m = F.cross_entropy(logits, none):item()
    assert.is_true(m ~= m)
    assert.equals(0, F.cross_entropy(logits, none, { reduction = 'sum' }):item())
  end)

  it('accepts bf16 and strided logits', function()
    local lb = F.cross_entropy(logits:bfloat16(), targets)
    assert.equals('f32', lb.dtype) -- [Note: losses in f32] in core/ops/cross_entropy.c
    assert.is_true(math.abs(lb:item() - reduce(rows, 6, 'mean')) < 0.05)
    local lt = logits:t():contiguous():t()
    assert.is_false(lt:is_contiguous())
    assert.equals(F.cross_entropy(logits, targets):item(), F.cross_entropy(lt, targets):item())
  end)

  -- [Note: losses in f32]: bf16 logits give an f32 loss, the f64 loss of
  -- the bf16 values rounded to f32 (to a few f32 ulps: the kernels sum in
  -- f32), and a bf16 gradient equal to the f64 gradient of those values
  -- rounded to bf16; dense rows (AVX-512 row functions) and strided ones.
  it('computes the loss of bf16 logits in f32, and its gradient in bf16', function()
    local V = 1000
    local base = (randn({ V, 7 }, 33) * 3):bfloat16()
    local tg = fsdp.tensor({ 3, -100, 0, 999, 512, 7, 100 }, { dtype = 'i64' })
    for _, x in ipairs({ base:t():contiguous(), base:t() }) do
      for _, o in ipairs({ {}, { reduction = 'sum' }, { reduction = 'none' }, { label_smoothing = 0.1 } }) do
        local xg = x:detach():requires_grad_()
        local loss = F.cross_entropy(xg, tg, o)
        assert.equals('f32', loss.dtype)
        local x64 = x:double():detach():requires_grad_()
        local ref = F.cross_entropy(x64, tg, o)
        local got, want = flat(loss), flat(ref)
        for i = 1, #want do
          assert.is_true(math.abs(got[i] - want[i]) <= 4e-7 * math.max(math.abs(want[i]), 1),
            ('loss %.9g vs f64 %.9g'):format(got[i], want[i]))
        end
        loss:sum():backward()
        ref:sum():backward()
        assert.equals('bf16', xg.grad.dtype)
        local g, g64 = flat(xg.grad:float()), flat(x64.grad:bfloat16():float())
        local g64f = flat(x64.grad)
        for i = 1, #g64 do
          -- within one bf16 rounding of the f64 gradient
          assert.is_true(math.abs(g[i] - g64f[i]) <= 2 ^ -8 * math.abs(g64f[i]) + 1e-9, ('grad %d: %.9g vs %.9g')
            :format(i, g[i], g64[i]))
        end
      end
    end
  end)

  -- Dense bf16 rows are read and (gradients) written as bf16 by AVX-512
  -- row functions where the CPU has them (cpu_rows_avx512.c); strided
  -- logits take the path through f32 rows. Same bits either way.
  it('gives the same bits on dense bf16 rows as through f32 rows (losses and gradients)', function()
    local V = 1000 -- not a multiple of 16: the last lanes masked
    local base = (randn({ V, 9 }, 32) * 4):bfloat16()
    local dense, strided = base:t():contiguous(), base:t()
    local tg = fsdp.tensor({ 3, -100, 0, 999, 512, 7, 7, 100, 998 }, { dtype = 'i64' })
    for _, o in ipairs({ {}, { reduction = 'sum' }, { reduction = 'none' }, { label_smoothing = 0.2 } }) do
      local function run(x)
        local xg = x:detach():requires_grad_()
        local loss = F.cross_entropy(xg, tg, o)
        loss:sum():backward()
        return flat(loss:float()), flat(xg.grad:float())
      end
      local l1, g1 = run(dense)
      local l2, g2 = run(strided)
      assert.same(l2, l1)
      assert.same(g2, g1)
    end
  end)

  it('has gradients (softmax - onehot, scaled) for every reduction and smoothing', function()
    local ld = f64({ 4, 5 }, 31)
    local tg = fsdp.tensor({ 3, -100, 0, 4 }, { dtype = 'i64' })
    for _, o in ipairs({ {}, { reduction = 'sum' }, { reduction = 'none' }, { label_smoothing = 0.2 },
                         { reduction = 'none', label_smoothing = 0.3 } }) do
      assert_gradcheck(function(a) return F.cross_entropy(a, tg, o) end, { ld })
    end
    -- the gradient of an ignored row is exactly zero
    ld.grad = nil
    F.cross_entropy(ld, tg):backward()
    assert.same({ 0, 0, 0, 0, 0 }, ld.grad:tolist()[2])
    assert.equals('CrossEntropyBackward', F.cross_entropy(ld, tg).grad_fn)
  end)

  it('runs on meta tensors: the [N, C] logits are never copied', function()
    local flops, loss = on_meta(function()
      return F.cross_entropy(fsdp.empty({ 8, 2048, 128256 }, { device = 'meta', dtype = 'bf16' }),
                             fsdp.empty({ 8, 2048 }, { device = 'meta', dtype = 'i64' }))
    end)
    assert.same({}, loss.shape)
    assert.equals(4 * 8 * 2048 * 128256, flops)
  end)

  it('names the target, the class count and the shapes in errors', function()
    assert.error_matches(function() F.cross_entropy(logits, fsdp.tensor({ 0, 1, 2, 7, 0, 0 }, { dtype = 'i64' })) end,
      'cross_entropy: target 7 %(at index 3%) is out of range for 5 classes')
    assert.error_matches(function() F.cross_entropy(logits, fsdp.tensor({ 0, 1, -1, 0, 0, 0 }, { dtype = 'i64' })) end,
      'cross_entropy: target %-1 %(at index 2%) is out of range for 5 classes')
    assert.error_matches(function() F.cross_entropy(logits, fsdp.zeros({ 5 }, { dtype = 'i64' })) end,
      'cross_entropy: targets of shape %[5%] do not match logits of shape %[6, 5%]')
    assert.error_matches(function() F.cross_entropy(logits, fsdp.zeros(6)) end,
      'cross_entropy: targets must be i64')
    assert.error_matches(function() F.cross_entropy(logits, targets, { reduction = 'avg' }) end,
      "cross_entropy: reduction must be 'mean', 'sum' or 'none', got avg")
    assert.error_matches(function() F.cross_entropy(logits, targets, { label_smoothing = 2 }) end,
      'cross_entropy: label_smoothing must be in %[0, 1%]')
  end)
end)

describe('nll_loss', function()
  local logits = randn({ 4, 3 }, 40)
  local targets = fsdp.tensor({ 2, 0, -100, 1 }, { dtype = 'i64' })

  it('with log_softmax equals cross_entropy', function()
    local lp = F.log_softmax(logits, 1)
    for _, red in ipairs({ 'mean', 'sum', 'none' }) do
      assert_close(flat(F.cross_entropy(logits, targets, { reduction = red }):view(-1)),
                   flat(F.nll_loss(lp, targets, { reduction = red }):view(-1)), 1e-6)
    end
    local v = flat(lp)
    assert.is_true(math.abs(F.nll_loss(lp, targets, { reduction = 'sum' }):item() + v[3] + v[4] + v[11]) < 1e-6)
  end)

  it('has gradients, alone and after log_softmax (the MNIST tutorial)', function()
    local ld = f64({ 4, 3 }, 41)
    for _, o in ipairs({ {}, { reduction = 'sum' }, { reduction = 'none' } }) do
      assert_gradcheck(function(a) return F.nll_loss(a, targets, o) end, { ld })
    end
    assert_gradcheck(function(a) return F.nll_loss(F.log_softmax(a, 1), targets) end, { ld })
  end)

  it('runs on meta tensors and names bad targets', function()
    local flops, l = on_meta(function()
      return F.nll_loss(fsdp.empty({ 64, 10 }, { device = 'meta' }),
                        fsdp.empty({ 64 }, { device = 'meta', dtype = 'i64' }), { reduction = 'none' })
    end)
    assert.same({ 64 }, l.shape)
    assert.equals(64, flops)
    assert.error_matches(function() F.nll_loss(logits, fsdp.tensor({ 0, 3, 0, 0 }, { dtype = 'i64' })) end,
      'nll_loss: target 3 %(at index 1%) is out of range for 3 classes')
  end)
end)

-- rotary -----------------------------------------------------------------------------

-- transformers' inverse frequencies (in double; the op mirrors the f32
-- arithmetic, so agreement is to f32 precision).
local function inv_freq(theta, D, s)
  local inv = {}
  for i = 0, D / 2 - 1 do inv[i + 1] = 1 / theta ^ (2 * i / D) end
  if not s then return inv end
  local low_wl, high_wl = s.original / s.low, s.original / s.high
  for i, f in ipairs(inv) do
    local wl = 2 * math.pi / f
    if wl > low_wl then
      inv[i] = f / s.factor
    elseif wl >= high_wl then
      local smooth = (s.original / wl - s.low) / (s.high - s.low)
      inv[i] = (1 - smooth) * f / s.factor + smooth * f
    end
  end
  return inv
end

-- rotate_half reference: x [.., D] rows, angle rows from positions.
local function rotary_ref(x, D, T, inv, positions)
  return by_rows(x, D, function(row, r)
    local t = r % T
    local p = positions and positions[t + 1] or t
    local y, h = {}, D / 2
    for i = 1, D do
      local a = p * inv[(i - 1) % h + 1]
      local rot = i <= h and -row[i + h] or row[i - h]
      y[i] = row[i] * math.cos(a) + rot * math.sin(a)
    end
    return y
  end)
end

describe('rope_tables', function()
  it('build cos/sin from cat(freqs, freqs) as transformers does', function()
    local c, s = F.rope_tables(6, 8)
    assert.same({ 6, 8 }, c.shape)
    local inv = inv_freq(1e4, 8)
    local cv, sv = c:tolist(), s:tolist()
    for t = 0, 5 do
      for i = 1, 8 do
        local a = t * inv[(i - 1) % 4 + 1]
        assert.is_true(math.abs(cv[t + 1][i] - math.cos(a)) < 1e-6)
        assert.is_true(math.abs(sv[t + 1][i] - math.sin(a)) < 1e-6)
      end
    end
  end)

  it('apply Llama 3 frequency scaling', function()
    -- Llama 3.1: theta 5e5, factor 8, low 1, high 4, original 8192, head dim 128
    local D = 128
    local c, s = F.rope_tables(2, D, { theta = 5e5, scaling = { type = 'llama3' } })
    local expect = inv_freq(5e5, D, { factor = 8, low = 1, high = 4, original = 8192 })
    local plain = inv_freq(5e5, D)
    local cv, sv = c:tolist()[2], s:tolist()[2]
    local kept, divided, smoothed = 0, 0, 0
    for i = 1, D / 2 do
      local got = math.atan2(sv[i], cv[i]) -- the angle at position 1 is inv_freq
      assert.is_true(math.abs(got - expect[i]) <= 2e-6 * expect[i] + 1e-9,
        ('inv_freq %d: %g vs %g'):format(i, got, expect[i]))
      if expect[i] == plain[i] then kept = kept + 1
      elseif math.abs(expect[i] - plain[i] / 8) < 1e-15 then divided = divided + 1
      else smoothed = smoothed + 1 end
    end
    assert.is_true(kept > 0 and divided > 0 and smoothed > 0) -- all three bands covered
    local c32 = F.rope_tables(2, D, { theta = 5e5, scaling = { type = 'llama3', factor = 32 } })
    assert.is_true(math.abs(c32:get(1, D / 2 - 1) - math.cos(plain[D / 2] / 32)) < 1e-6)
  end)

  it('take dtype and device, and run on meta', function()
    local c = F.rope_tables(4, 8, { dtype = 'bf16' })
    assert.equals('bf16', c.dtype)
    local flops, cm, sm = on_meta(function() return F.rope_tables(8192, 128, { device = 'meta' }) end)
    assert.same({ 8192, 128 }, cm.shape)
    assert.equals('meta', sm.device)
    assert.equals(8192 * 64, flops)
  end)

  it('reject bad arguments', function()
    assert.error_matches(function() F.rope_tables(4, 7) end, 'rope_tables: head_dim must be even')
    assert.error_matches(function() F.rope_tables(4, 8, { scaling = { type = 'ntk' } }) end,
      'rope_tables: scaling type must be one of default, llama3, linear, dynamic, yarn, longrope, got ntk')
    assert.error_matches(function() F.rope_tables(4, 8, { scaling = { type = 'yarn' } }) end,
      'rope_tables: yarn scaling needs original_max_position_embeddings %(0%) > 0')
    assert.error_matches(function() F.rope_tables(4, 8, { theta = 0 }) end, 'rope_tables: theta must be')
  end)
end)

describe('apply_rotary', function()
  local B, H, Tn, D = 2, 3, 5, 8
  local x = randn({ B, H, Tn, D }, 50)
  local cos, sin = F.rope_tables(16, D)
  local inv = inv_freq(1e4, D)

  it('rotates the two halves (rotate_half) by position', function()
    assert_close(rotary_ref(flat(x), D, Tn, inv), flat(F.apply_rotary(x, cos, sin)), 2e-6)
  end)

  it('takes position offsets, per sequence or per batch', function()
    local pos = { 7, 8, 9, 10, 11 }
    local p = fsdp.tensor(pos, { dtype = 'i64' })
    assert_close(rotary_ref(flat(x), D, Tn, inv, pos), flat(F.apply_rotary(x, cos, sin, { positions = p })), 3e-6)
    local pb = fsdp.tensor({ { 0, 1, 2, 3, 4 }, pos }, { dtype = 'i64' })
    local y = F.apply_rotary(x, cos, sin, { positions = pb })
    assert.same(flat(F.apply_rotary(x[0], cos, sin)), flat(y[0]))
    assert.same(flat(F.apply_rotary(x[1], cos, sin, { positions = p })), flat(y[1]))
  end)

  it('reads strided inputs ([B, T, H, D] transposed) and bf16', function()
    local xt = randn({ B, Tn, H, D }, 51):transpose(1, 2)
    assert.is_false(xt:is_contiguous())
    assert.same(flat(F.apply_rotary(xt:contiguous(), cos, sin)), flat(F.apply_rotary(xt, cos, sin)))
    local yb = F.apply_rotary(x:bfloat16(), cos, sin)
    assert.equals('bf16', yb.dtype)
    assert_close(flat(F.apply_rotary(x, cos, sin)), flat(yb:float()), 0.03)
  end)

  -- Without positions, head dims that are multiples of 32 take a path
  -- without per-row calls (cpu_rotary.c, AVX-512 where the CPU has it);
  -- positions 0 ... T-1 take the per-row kernel: the two must agree bit for
  -- bit, subnormals and rounding ties of bf16 included.
  it('gives the per-row results on its whole-row path (head dims 64 and 128, f32 and bf16)', function()
    for _, d in ipairs { 64, 128 } do
      for _, dt in ipairs { 'f32', 'bf16' } do
        for _, tdt in ipairs { 'f32', 'bf16' } do
          local c, s = F.rope_tables(40, d, { dtype = tdt })
          local xt = randn({ 2, 37, 3, d }, 53):to(dt):transpose(1, 2)
          assert_close(rotary_ref(flat(xt:float()), d, 37, inv_freq(1e4, d)),
                       flat(F.apply_rotary(xt, c, s):float()), dt == 'f32' and tdt == 'f32' and 1e-5 or 0.03)
          xt:select(2, 0):narrow(2, 0, 4):copy_(fsdp.tensor({ 1e-40, -3e-39, 1 + 2^-8, 3e38 }):to(dt):view(1, 1, 4))
          xt:select(2, 5):copy_(xt:select(2, 6) * 1e-39) -- a row of subnormals
          local p = fsdp.arange(37, { dtype = 'i64' })
          local what = ('D %d, %s input, %s tables'):format(d, dt, tdt)
          assert.same(flat(F.apply_rotary(xt, c, s, { positions = p }):float()),
                      flat(F.apply_rotary(xt, c, s):float()), what)
          local xg = xt:detach():requires_grad_()
          local g = randn({ 2, 3, 37, d }, 54):to(dt)
          F.apply_rotary(xg, c, s):backward(g)
          local dense = xg.grad
          xg.grad = nil
          F.apply_rotary(xg, c, s, { positions = p }):backward(g)
          assert.same(flat(xg.grad:float()), flat(dense:float()), what .. ', gradient')
        end
      end
    end
  end)

  it('has the inverse rotation as its gradient', function()
    local xd = f64({ 2, 2, 3, 4 }, 52)
    local c, s = F.rope_tables(8, 4, { dtype = 'f64' })
    assert_gradcheck(function(a) return F.apply_rotary(a, c, s) end, { xd })
    local p = fsdp.tensor({ 5, 2, 7 }, { dtype = 'i64' })
    assert_gradcheck(function(a) return F.apply_rotary(a, c, s, { positions = p }) end, { xd })
    -- a rotation: applying it then its gradient map gives the input back
    local y = F.apply_rotary(xd, c, s)
    xd.grad = nil
    y:backward(y:detach())
    assert.is_true(T.max_abs_diff(xd.grad, xd:detach()) < 1e-6) -- cos^2 + sin^2 = 1 to f32 precision
  end)

  it('runs on meta tensors', function()
    local flops, y = on_meta(function()
      local m = { device = 'meta' }
      return F.apply_rotary(fsdp.empty({ 4, 32, 2048, 128 }, m), fsdp.empty({ 2048, 128 }, m),
                            fsdp.empty({ 2048, 128 }, m))
    end)
    assert.same({ 4, 32, 2048, 128 }, y.shape)
    assert.equals(3 * 4 * 32 * 2048 * 128, flops)
  end)

  it('names shapes and positions in errors', function()
    assert.error_matches(function() F.apply_rotary(randn({ 2, 5, 7 }, 1), cos, sin) end,
      'apply_rotary: input of shape %[2, 5, 7%] must be %[..., T, D%] with an even D')
    assert.error_matches(function() F.apply_rotary(x, F.rope_tables(16, 4), sin) end,
      'apply_rotary: cos of shape %[16, 4%] must be %[positions, 8%]')
    assert.error_matches(function() F.apply_rotary(x, F.rope_tables(3, D)) end,
      'apply_rotary: tables %[3, 8%] cover fewer positions than the 5 of input')
    assert.error_matches(function()
      F.apply_rotary(x, cos, sin, { positions = fsdp.tensor({ 0, 1, 2, 3, 16 }, { dtype = 'i64' }) })
    end, 'apply_rotary: position 16 is out of range for tables of 16 positions')
    assert.error_matches(function()
      F.apply_rotary(x, cos, sin, { positions = fsdp.tensor({ 0, 1 }, { dtype = 'i64' }) })
    end, 'apply_rotary: positions of shape %[2%] must be %[5%] or %[2, 5%]')
  end)
end)

-- attention ----------------------------------------------------------------------------

-- The textbook computation with the whole score matrix: q [B, Hq, Tq, D]
-- etc. as flat arrays; bias a function (b, h, i, j) -> value or nil.
local function attention_ref(q, k, v, dims, opts)
  local B, Hq, Hkv, Tq, Tk, D, Dv = dims.B, dims.Hq, dims.Hkv, dims.Tq, dims.Tk, dims.D, dims.Dv
  local scale = opts.scale or 1 / math.sqrt(D)
  local out = {}
  for b = 0, B - 1 do
    for h = 0, Hq - 1 do
      local hk = math.floor(h / (Hq / Hkv))
      for i = 0, Tq - 1 do
        local s, m = {}, -math.huge
        for j = 0, Tk - 1 do
          local dot = 0
          for d = 0, D - 1 do
            dot = dot + q[((b * Hq + h) * Tq + i) * D + d + 1] * k[((b * Hkv + hk) * Tk + j) * D + d + 1]
          end
          local x = dot * scale + (opts.bias and opts.bias(b, h, i, j) or 0)
          if opts.causal and j > i then x = -math.huge end
          s[j + 1] = x
          m = math.max(m, x)
        end
        local sum = 0
        for j = 1, Tk do
          s[j] = m == -math.huge and 0 or math.exp(s[j] - m)
          sum = sum + s[j]
        end
        for e = 0, Dv - 1 do
          local o = 0
          for j = 0, Tk - 1 do o = o + s[j + 1] * v[((b * Hkv + hk) * Tk + j) * Dv + e + 1] end
          out[((b * Hq + h) * Tq + i) * Dv + e + 1] = sum > 0 and o / sum or 0
        end
      end
    end
  end
  return out
end

local function qkv(dims, seed, dtype)
  return randn({ dims.B, dims.Hq, dims.Tq, dims.D }, seed, dtype),
         randn({ dims.B, dims.Hkv, dims.Tk, dims.D }, seed + 1, dtype),
         randn({ dims.B, dims.Hkv, dims.Tk, dims.Dv }, seed + 2, dtype)
end

describe('scaled_dot_product_attention', function()
  local sdpa = F.scaled_dot_product_attention

  it('matches the materialised reference: plain, causal, GQA, Tq ~= Tk, Dv ~= D', function()
    for _, dims in ipairs({
      { B = 2, Hq = 2, Hkv = 2, Tq = 5, Tk = 5, D = 4, Dv = 4 },
      { B = 1, Hq = 4, Hkv = 2, Tq = 3, Tk = 7, D = 6, Dv = 3 },
      { B = 1, Hq = 2, Hkv = 1, Tq = 130, Tk = 130, D = 8, Dv = 8 }, -- several query blocks
    }) do
      local q, k, v = qkv(dims, 60)
      for _, causal in ipairs({ false, true }) do
        local ref = attention_ref(flat(q), flat(k), flat(v), dims, { causal = causal })
        local got = sdpa(q, k, v, { causal = causal })
        assert.same({ dims.B, dims.Hq, dims.Tq, dims.Dv }, got.shape)
        assert_close(ref, flat(got), 2e-5)
      end
    end
  end)

  it("adds a bias (T5's relative bias, unscaled) and masks with -inf", function()
    local dims = { B = 2, Hq = 3, Hkv = 3, Tq = 4, Tk = 6, D = 5, Dv = 5 }
    local q, k, v = qkv(dims, 70)
    local bias = randn({ 1, 3, 4, 6 }, 73)
    local bv = flat(bias)
    local ref = attention_ref(flat(q), flat(k), flat(v), dims, {
      scale = 1, bias = function(_, h, i, j) return bv[(h * 4 + i) * 6 + j + 1] end })
    assert_close(ref, flat(sdpa(q, k, v, { bias = bias, scale = 1 })), 2e-5)
    -- a padding mask [B, 1, 1, Tk]: batch 1 cannot see its last two keys
    local mask = fsdp.zeros(2, 1, 1, 6)
    mask[1]:view(6):narrow(0, 4, 2):fill_(-math.huge)
    local mref = attention_ref(flat(q), flat(k), flat(v), dims, {
      bias = function(b, _, _, j) return (b == 1 and j >= 4) and -math.huge or 0 end })
    assert_close(mref, flat(sdpa(q, k, v, { attn_mask = mask })), 2e-5)
    -- a row that sees no key at all gives zeros, not nan
    local all = fsdp.full({ 6 }, -math.huge)
    local z = sdpa(q, k, v, { bias = all })
    assert.same(flat(fsdp.zeros(2, 3, 4, 5)), flat(z))
  end)

  it('accepts bf16 and strided ([B, T, H, D] transposed) inputs', function()
    local dims = { B = 2, Hq = 4, Hkv = 2, Tq = 9, Tk = 9, D = 8, Dv = 8 }
    local q, k, v = qkv(dims, 80)
    local y = sdpa(q, k, v, { causal = true })
    local yb = sdpa(q:bfloat16(), k:bfloat16(), v:bfloat16(), { causal = true })
    assert.equals('bf16', yb.dtype)
    assert_close(flat(y), flat(yb:float()), 0.05)
    local qt = q:transpose(1, 2):contiguous():transpose(1, 2)
    local vt = v:transpose(2, 3):contiguous():transpose(2, 3) -- last dim strided: copied
    assert.is_false(qt:is_contiguous())
    assert.is_false(vt:is_contiguous())
    assert_close(flat(y), flat(sdpa(qt, k, vt, { causal = true })), 1e-6)
  end)

  describe('gradients', function()
    local function check(dims, opts, bias_shape)
      local q = f64({ dims.B, dims.Hq, dims.Tq, dims.D }, 90)
      local k = f64({ dims.B, dims.Hkv, dims.Tk, dims.D }, 91)
      local v = f64({ dims.B, dims.Hkv, dims.Tk, dims.Dv }, 92)
      local inputs = { q, k, v }
      if bias_shape then inputs[4] = f64(bias_shape, 93) end
      assert_gradcheck(function(a, b, c, bias)
        local o = {}
        for key, val in pairs(opts) do o[key] = val end
        o.bias = bias
        return sdpa(a, b, c, o)
      end, inputs, { atol = 1e-6 })
    end

    it('for q, k, v: plain and causal', function()
      local dims = { B = 2, Hq = 2, Hkv = 2, Tq = 3, Tk = 4, D = 3, Dv = 2 }
      check(dims, {})
      check(dims, { causal = true, scale = 0.7 })
    end)

    it('with grouped-query heads (dK, dV summed over the group)', function()
      check({ B = 1, Hq = 4, Hkv = 2, Tq = 3, Tk = 3, D = 2, Dv = 3 }, { causal = true })
    end)

    it('to a bias broadcast over batch (T5), over heads, and 2-d', function()
      local dims = { B = 2, Hq = 2, Hkv = 1, Tq = 3, Tk = 4, D = 2, Dv = 2 }
      check(dims, { scale = 1 }, { 1, 2, 3, 4 })
      check(dims, {}, { 2, 1, 3, 4 })
      check(dims, { causal = true }, { 3, 4 })
      check(dims, {}, { 2, 2, 1, 4 })
      check(dims, {}, { 1, 1, 3, 1 })
    end)

    it('across query blocks', function()
      check({ B = 1, Hq = 1, Hkv = 1, Tq = 66, Tk = 66, D = 2, Dv = 1 }, { causal = true })
    end)

    it('only to the inputs that require them', function()
      local q, k, v = qkv({ B = 1, Hq = 2, Hkv = 1, Tq = 3, Tk = 3, D = 2, Dv = 2 }, 95, 'f64')
      k:requires_grad_()
      local y = sdpa(q, k, v, { causal = true })
      assert.equals('ScaledDotProductAttentionBackward', y.grad_fn)
      y:backward(fsdp.ones(y.shape, { dtype = 'f64' }))
      assert.same(k.shape, k.grad.shape)
      assert.is_nil(q.grad)
      assert.is_nil(v.grad)
    end)
  end)

  it('runs on meta tensors: FLOPs forward and backward', function()
    local B, H, Tn, D = 4, 32, 2048, 128
    local flops, y, q = on_meta(function()
      local m = { device = 'meta', dtype = 'bf16' }
      local q = fsdp.empty({ B, H, Tn, D }, m):requires_grad_()
      local k = fsdp.empty({ B, 8, Tn, D }, m)
      return sdpa(q, k, k, { causal = true }), q
    end)
    assert.same({ B, H, Tn, D }, y.shape)
    assert.equals(4 * B * H * Tn * Tn * D / 2, flops)
    local bflops = on_meta(function() y:backward(fsdp.empty(y.shape, { device = 'meta', dtype = 'bf16' })) end)
    assert.equals(2.5 * flops, bflops)
    assert.same(q.shape, q.grad.shape)
  end)

  it('names the shapes in errors', function()
    local q = randn({ 1, 3, 4, 8 }, 1)
    local k = randn({ 1, 2, 4, 8 }, 2)
    assert.error_matches(function() sdpa(q, k, k) end,
      'scaled_dot_product_attention: 3 query heads %(q %[1, 3, 4, 8%]%) are not a multiple of 2 kv heads')
    assert.error_matches(function() sdpa(q, q, q, { bias = fsdp.zeros(3, 5) }) end,
      'scaled_dot_product_attention: bias of shape %[3, 5%] does not broadcast to the scores %[1, 3, 4, 4%]')
    assert.error_matches(function() sdpa(q, q:bfloat16(), q) end,
      'scaled_dot_product_attention: q, k and v must have one dtype, got f32, bf16 and f32')
    assert.error_matches(function() sdpa(q:view(3, 4, 8), q, q) end,
      'must be 4%-d %[batch, heads, seq, dim%]')
    assert.error_matches(function() sdpa(q, randn({ 1, 3, 4, 6 }, 3), q) end,
      'do not fit q %[B, Hq, Tq, D%]')
  end)
end)

-- parallel paths --------------------------------------------------------------------

-- Large inputs take the OpenMP paths (per-thread partial sums for weight
-- gradients, work split by kv head); the same math on slices small enough
-- to stay on one thread must agree.
describe('parallel kernels agree with the single-threaded ones', function()
  local function chunks(x, n, fn)
    local parts = {}
    for i = 0, x:size(0) - 1, n do parts[#parts + 1] = fn(x:narrow(0, i, n)) end
    return parts
  end

  it('for norms, softmax and cross-entropy rows (and the weight gradients)', function()
    local x = randn({ 64, 1024 }, 100) -- 65536 elements: parallel; 8-row slices are not
    local w, b = randn({ 1024 }, 101), randn({ 1024 }, 102)
    local tg = fsdp.arange(64, { dtype = 'i64' })
    local whole = { F.rms_norm(x, w), F.layer_norm(x, w, b), F.softmax(x, 1), F.log_softmax(x, 1),
                    F.cross_entropy(x, tg, { reduction = 'none' }) }
    local parts = { {}, {}, {}, {}, {} }
    for _, xs in ipairs(chunks(x, 8, function(c) return c end)) do
      local i0 = #parts[1] * 8
      local ts = tg:narrow(0, i0, 8)
      local ys = { F.rms_norm(xs, w), F.layer_norm(xs, w, b), F.softmax(xs, 1), F.log_softmax(xs, 1),
                   F.cross_entropy(xs, ts, { reduction = 'none' }) }
      for k, y in ipairs(ys) do parts[k][#parts[k] + 1] = y end
    end
    for k = 1, #whole do
      local expected = {}
      for _, p in ipairs(parts[k]) do for _, v in ipairs(flat(p)) do expected[#expected + 1] = v end end
      assert.same(expected, flat(whole[k]))
    end
    -- weight and bias gradients: summed per thread, then across threads
    local g = randn({ 64, 1024 }, 103)
    local wg, bg = w:clone():requires_grad_(), b:clone():requires_grad_()
    F.layer_norm(x, wg, bg):backward(g)
    local dw, db = wg.grad:clone(), bg.grad:clone()
    local rw = w:clone():requires_grad_()
    F.rms_norm(x, rw):backward(g)
    local sw, sb, sr = fsdp.zeros(1024), fsdp.zeros(1024), fsdp.zeros(1024)
    for i = 0, 63, 8 do
      local w1, b1, r1 = w:clone():requires_grad_(), b:clone():requires_grad_(), w:clone():requires_grad_()
      F.layer_norm(x:narrow(0, i, 8), w1, b1):backward(g:narrow(0, i, 8))
      F.rms_norm(x:narrow(0, i, 8), r1):backward(g:narrow(0, i, 8))
      sw:add_(w1.grad); sb:add_(b1.grad); sr:add_(r1.grad)
    end
    assert_close(flat(sw), flat(dw), 1e-4)
    assert_close(flat(sb), flat(db), 1e-4)
    assert_close(flat(sr), flat(rw.grad), 1e-4)
  end)

  -- B = 4, H = 4, T = 64, D = 8 is parallel; one batch row at a time is not.
  local function attention_case(dims, bias_shape)
    local q, k, v = qkv(dims, 110)
    q:requires_grad_(); k:requires_grad_(); v:requires_grad_()
    local bias = bias_shape and randn(bias_shape, 114):requires_grad_() or nil
    local g = randn({ dims.B, dims.Hq, dims.Tq, dims.Dv }, 115)
    local y = F.scaled_dot_product_attention(q, k, v, { causal = true, bias = bias })
    y:backward(g)
    local dbias = bias and fsdp.zeros(bias.shape)
    for bi = 0, dims.B - 1 do
      local function one(t) return t:detach():narrow(0, bi, 1):contiguous():requires_grad_() end
      local qb, kb, vb = one(q), one(k), one(v)
      local bb = bias and (bias.shape[1] == 1 and bias:detach():clone() or one(bias))
      if bb then bb:requires_grad_() end
      local yb = F.scaled_dot_product_attention(qb, kb, vb, { causal = true, bias = bb })
      assert_close(flat(yb), flat(y:narrow(0, bi, 1)), 1e-6)
      yb:backward(g:narrow(0, bi, 1))
      assert_close(flat(qb.grad), flat(q.grad:narrow(0, bi, 1)), 1e-5)
      assert_close(flat(kb.grad), flat(k.grad:narrow(0, bi, 1)), 1e-5)
      assert_close(flat(vb.grad), flat(v.grad:narrow(0, bi, 1)), 1e-5)
      if bias then
        if bias.shape[1] == 1 then dbias:add_(bb.grad) else dbias:narrow(0, bi, 1):add_(bb.grad) end
      end
    end
    if bias then assert_close(flat(dbias), flat(bias.grad), 1e-4) end
  end

  it('for attention, with grouped-query heads', function()
    attention_case({ B = 4, Hq = 4, Hkv = 2, Tq = 64, Tk = 64, D = 8, Dv = 8 })
  end)

  it('for attention with a batch-broadcast bias (T5) and a head-broadcast one', function()
    attention_case({ B = 4, Hq = 4, Hkv = 4, Tq = 64, Tk = 64, D = 8, Dv = 8 }, { 1, 4, 64, 64 })
    attention_case({ B = 4, Hq = 4, Hkv = 2, Tq = 64, Tk = 64, D = 8, Dv = 8 }, { 4, 1, 64, 64 })
  end)

  -- [Note: attention's f32 block products] (core/cpu/cpu_block_gemm.c):
  -- attentions large enough to spread over threads run their f32 products
  -- on AVX-512 where the CPU has it, in 6-row by 64-column blocks with
  -- masked edges. Sizes that leave every kind of edge (head dims not a
  -- multiple of 16, more than 64 keys, a last query block of 2 rows,
  -- Tq ~= Tk) against the same attention in f64, whose products are
  -- OpenBLAS's dgemm: forward and every gradient.
  it('for f32 attention at awkward sizes, against f64', function()
    for _, c in ipairs({
      { B = 2, Hq = 2, Hkv = 1, Tq = 130, Tk = 130, D = 17, Dv = 33, causal = true },
      { B = 1, Hq = 4, Hkv = 2, Tq = 66, Tk = 97, D = 65, Dv = 7, causal = false },
      { B = 3, Hq = 2, Hkv = 2, Tq = 70, Tk = 70, D = 64, Dv = 64, causal = true },
    }) do
      local q, k, v = qkv(c, 120)
      local g = randn({ c.B, c.Hq, c.Tq, c.Dv }, 123)
      local function run(dtype)
        local function leaf(t) return t:to(dtype):clone():requires_grad_() end
        local qq, kk, vv = leaf(q), leaf(k), leaf(v)
        local y = F.scaled_dot_product_attention(qq, kk, vv, { causal = c.causal })
        y:backward(g:to(dtype))
        return { y, qq.grad, kk.grad, vv.grad }
      end
      local got, want = run('f32'), run('f64')
      for i, name in ipairs({ 'out', 'dq', 'dk', 'dv' }) do
        local scale = fsdp.F.max(fsdp.F.abs(want[i]):view(-1), 0):item()
        local diff = T.max_abs_diff(got[i]:to('f64'), want[i])
        assert(diff <= 2e-5 * scale, ('%s at D=%d, Dv=%d, Tq=%d, Tk=%d: differs by %g (largest %g)')
          :format(name, c.D, c.Dv, c.Tq, c.Tk, diff, scale))
      end
    end
  end)
end)
