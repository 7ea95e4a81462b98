-- cuda_linear_spec.lua: the CUDA kernels of the linear family and of the
-- fused optimizer updates where backend_ops_spec's small cases do not
-- reach: GEMMs large enough for cuBLASLt's tiled and split-K kernels,
-- transposed, strided and broadcast operands, f64, the bias epilogue and
-- the row sums of its gradient, embedding's id check, padding and rows
-- added into a tied head's gradient, pooling
-- and convolution geometry, and N optimizer steps on cuda:0 against the
-- same steps on the CPU (which the kernels repeat operation for
-- operation). Pending without a GPU.
local fsdp = require 'fsdp'
local F = fsdp.F
local optim = require 'fsdp.optim'
local nn = require 'fsdp.nn'

local CUDA = fsdp.cuda.is_available()
local DEV = 'cuda:0'
-- In the cudasim build (cuBLASLt simulated by plain loops on the CPU) the
-- large product shrinks from 1024x4096x4096 to 256x512x512.
local SIM = fsdp.cuda.simulated()
local M, K, N = SIM and 256 or 1024, SIM and 512 or 4096, SIM and 512 or 4096

local function randn(shape, seed) return fsdp.randn(shape, { seed = seed }) end

local normalised_error = require('fsdp.testing').normalised_error
local max_abs_diff = require('fsdp.testing').max_abs_diff

local function assert_close(got, want, tol, what)
  local e = normalised_error(got, want)
  assert(e <= tol, ('%s: normalised error %.3g > %.3g'):format(what, e, tol))
end

local function error_of(fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok, 'expected an error')
  return tostring(err)
end

describe('cuda linear kernels', function()
  if not CUDA then
    pending('no GPU here (' .. fsdp.cuda.status() .. '): the cuda kernels were not run')
    return
  end

  it(('multiplies %dx%d by %dx%d in bf16 as the CPU does in f32'):format(M, K, K, N), function()
    local a, b = randn({ M, K }, 1):to('bf16'), randn({ K, N }, 2):to('bf16')
    local want = F.matmul(a:to('f32'), b:to('f32'))
    local got = F.matmul(a:to(DEV), b:to(DEV))
    assert.equals('bf16', got.dtype)
    assert_close(got, want, 1e-2, ('bf16 %dx%dx%d'):format(M, K, N))
  end)

  it('multiplies odd sizes and vectors in f32 and f16', function()
    for _, s in ipairs({ { 127, 255, 63 }, { 1, 4096, 1024 }, { 300, 1, 7 }, { 5, 17, 1 } }) do
      local a, b = randn({ s[1], s[2] }, 3), randn({ s[2], s[3] }, 4)
      local want = F.matmul(a:to('f64'), b:to('f64'))
      assert_close(F.matmul(a:to(DEV), b:to(DEV)), want, 1e-5, 'f32 ' .. table.concat(s, 'x'))
      local ah, bh = a:to('f16'), b:to('f16')
      local want_h = F.matmul(ah:to('f64'), bh:to('f64'))
      assert_close(F.matmul(ah:to(DEV), bh:to(DEV)), want_h, 4e-3, 'f16 ' .. table.concat(s, 'x'))
    end
  end)

  it('reads transposed, permuted and strided operands', function()
    local a, b = randn({ 96, 64 }, 5), randn({ 80, 96 }, 6)
    for _, dtype in ipairs({ 'f32', 'bf16' }) do
      local tol = dtype == 'f32' and 1e-5 or 2e-2
      -- dtypes are converted on the CPU: the spec tests products, not casts
      local ac, bc = a:to(dtype):to('f64'), b:to(dtype):to('f64')
      local ad, bd = a:to(dtype):to(DEV), b:to(dtype):to(DEV)
      assert_close(F.matmul(ad:t(), bd:t()), F.matmul(ac:t(), bc:t()), tol, dtype .. ' a^T b^T')
      assert_close(F.matmul(bd, ad), F.matmul(bc, ac), tol, dtype .. ' b a')
      assert_close(F.matmul(ad:t(), ad), F.matmul(ac:t(), ac), tol, dtype .. ' a^T a')
    end
    -- [k, B, m] permuted to [B, m, k]: unit stride across rows, batch stride m
    local x = randn({ 32, 4, 24 }, 7)
    local w = randn({ 4, 32, 16 }, 8)
    local want = F.matmul(x:to('f64'):permute(1, 2, 0), w:to('f64'))
    assert_close(F.matmul(x:to(DEV):permute(1, 2, 0), w:to(DEV)), want, 1e-5, 'permuted batch')
    -- no unit stride on either axis: compacted before the product
    local s = randn({ 24, 32, 2 }, 9)
    local want_s = F.matmul(s:to('f64'):select(2, 1), w:to('f64'):select(0, 1))
    assert_close(F.matmul(s:to(DEV):select(2, 1), w:to(DEV):select(0, 1)), want_s, 1e-5, 'strided')
  end)

  it('broadcasts batch dims on either side', function()
    local a, b = randn({ 2, 3, 20, 12 }, 10), randn({ 3, 12, 9 }, 11)
    assert_close(F.matmul(a:to(DEV), b:to(DEV)), F.matmul(a:to('f64'), b:to('f64')), 1e-5, 'b broadcast')
    local c, d = randn({ 2, 1, 20, 12 }, 12), randn({ 1, 3, 12, 9 }, 13)
    assert_close(F.matmul(c:to(DEV), d:to(DEV)), F.matmul(c:to('f64'), d:to('f64')), 1e-5, 'both broadcast')
    local e = randn({ 12, 9 }, 14)
    assert_close(F.matmul(a:to(DEV), e:to(DEV)), F.matmul(a:to('f64'), e:to('f64')), 1e-5, 'folded rows')
  end)

  it('runs f64 products, with a bias, through cuBLAS', function()
    local x, w, b = randn({ 3, 33, 40 }, 15):to('f64'), randn({ 24, 40 }, 16):to('f64'), randn({ 24 }, 17):to('f64')
    assert_close(F.linear(x:to(DEV), w:to(DEV), b:to(DEV)), F.linear(x, w, b), 1e-12, 'f64 linear')
  end)

  it('adds the bias in the epilogue and sums many rows for its gradient', function()
    for _, dtype in ipairs({ 'f32', 'bf16', 'f16' }) do
      local tol = ({ f32 = 1e-5, bf16 = 2e-2, f16 = 4e-3 })[dtype]
      local x = randn({ 8, 1024, 256 }, 18):to(dtype)
      local w, b = randn({ 3, 256 }, 19):to(dtype), randn({ 3 }, 20):to(dtype)
      local xr, wr, br = x:to('f64'), w:to('f64'), b:to('f64')
      local ref = F.linear(xr, wr, br)
      local bg = b:to(DEV):detach():requires_grad_()
      local out = F.linear(x:to(DEV), w:to(DEV), bg)
      assert_close(out, ref, tol, dtype .. ' linear')
      local gy = randn(out.shape, 21):to(dtype)
      ;(out * gy:to(DEV)):sum():backward()
      -- the bias gradient: column sums of gy over 8192 rows
      local want = F.sum(gy:to('f64'):view(-1, 3), 0)
      assert_close(bg.grad, want, tol, dtype .. ' bias gradient')
    end
  end)

  it('checks embedding ids on the device, skips padding, adds repeats', function()
    local w = randn({ 10, 6 }, 22)
    local bad = fsdp.tensor({ 1, 2, 10, 3 }, { dtype = 'i64' })
    local cpu_err = error_of(F.embedding, bad, w)
    local gpu_err = error_of(F.embedding, bad:to(DEV), w:to(DEV))
    assert.equals(cpu_err, gpu_err)
    assert.truthy(gpu_err:find('id 10 (element 2 of the ids)', 1, true))
    for _, dtype in ipairs({ 'f32', 'bf16' }) do
      local ids = fsdp.tensor({ 3, 3, 0, 7, 3, 0, 9, 3 }, { dtype = 'i32' })
      local wd = w:to(dtype)
      local wg = wd:to(DEV):detach():requires_grad_()
      local out = F.embedding(ids:to(DEV), wg, 0)
      assert.same(F.embedding(ids, wd):to('f32'):tolist(), out:to('cpu'):to('f32'):tolist())
      local gy = randn(out.shape, 23):to(dtype)
      ;(out * gy:to(DEV)):sum():backward()
      local wc = wd:detach():requires_grad_()
      ;(F.embedding(ids, wc, 0) * gy):sum():backward()
      assert_close(wg.grad, wc.grad, dtype == 'f32' and 1e-6 or 1e-2, dtype .. ' embedding gradient')
      assert.same({ 0, 0, 0, 0, 0, 0 }, wg.grad:to('cpu'):to('f32'):select(0, 0):tolist())
    end
  end)

  it('adds embedding rows into a gradient already waiting (a tied head): the CPU bits', function()
    -- the head's product delivers the tied table's gradient first; the
    -- embedding's rows go into it in place (engine.c, [Note: gradients
    -- added where they land]), with the CPU's order and rounding
    local ids = fsdp.tensor({ { 3, 3, 0, 7 }, { 3, 0, 9, 3 } }, { dtype = 'i64' })
    for _, dtype in ipairs({ 'f32', 'bf16' }) do
      local w = randn({ 10, 6 }, 24):to(dtype)
      local gy = randn({ 2, 4, 10 }, 25):to(dtype)
      local wc = w:detach():requires_grad_()
      ;(F.linear(F.embedding(ids, wc), wc) * gy):sum():backward()
      local wg = w:to(DEV):detach():requires_grad_()
      ;(F.linear(F.embedding(ids:to(DEV), wg), wg) * gy:to(DEV)):sum():backward()
      assert_close(wg.grad, wc.grad, dtype == 'f32' and 1e-6 or 1e-2, dtype .. ' tied gradient')
    end
  end)

  it('sums embedding gradients in the CPU order: the CPU bits, the same every run', function()
    -- 20000 positions over 300 rows, row 7 at every third one: the order
    -- of the additions decides the last bits, so atomics would show here
    -- (on a GPU; the simulator runs blocks one after another).
    local n, V, D = 20000, 300, 96
    local ids = fsdp.randint(0, V, { n }, { seed = 40, dtype = 'i64' })
    ids:view(-1, 4):select(1, 0):fill_(7)
    ids:view(-1, 8):select(1, 3):fill_(-1 + V) -- the last row, often
    for _, dtype in ipairs({ 'f32', 'bf16', 'f64' }) do
      local w = randn({ V, D }, 41):to(dtype)
      local gy = randn({ n, D }, 42):mul(1000):to(dtype) -- wide exponents: order matters
      local wc = w:detach():requires_grad_()
      ;(F.embedding(ids, wc, 5) * gy):sum():backward()
      local grads = {}
      for run = 1, 2 do
        local wg = w:to(DEV):detach():requires_grad_()
        ;(F.embedding(ids:to(DEV), wg, 5) * gy:to(DEV)):sum():backward()
        grads[run] = wg.grad:to('cpu')
      end
      assert.equals(0, max_abs_diff(grads[1], wc.grad), dtype .. ': the CPU\'s bits')
      assert.equals(0, max_abs_diff(grads[2], grads[1]), dtype .. ': the same bits on the second run')
      assert.same(fsdp.zeros({ D }, { dtype = dtype }):tolist(), grads[1]:select(0, 5):tolist())
    end
  end)

  it('pools with padding, dilation and overlapping windows as the CPU', function()
    local x = randn({ 2, 3, 11, 13 }, 24)
    for _, o in ipairs({ { 3, 1, { padding = 1 } }, { 3, 2, { dilation = 2, padding = 1 } }, { 2, 2, {} } }) do
      for _, dtype in ipairs({ 'f32', 'bf16', 'f64' }) do
        local xc = x:to(dtype):detach():requires_grad_()
        local xg = x:to(dtype):to(DEV):detach():requires_grad_()
        local oc, ic = F.max_pool2d(xc, o[1], o[2], { padding = o[3].padding, dilation = o[3].dilation, return_indices = true })
        local og, ig = F.max_pool2d(xg, o[1], o[2], { padding = o[3].padding, dilation = o[3].dilation, return_indices = true })
        assert.same(ic:tolist(), ig:to('cpu'):tolist())
        assert.same(oc:to('f64'):tolist(), og:to('cpu'):to('f64'):tolist())
        local gy = randn(oc.shape, 25):to(dtype)
        ;(oc * gy):sum():backward()
        ;(og * gy:to(DEV)):sum():backward()
        assert_close(xg.grad, xc.grad, dtype == 'bf16' and 1e-2 or 1e-6, dtype .. ' pool gradient')
      end
    end
  end)

  it('convolves with stride, padding and dilation through cuDNN', function()
    local x, w, b = randn({ 4, 5, 17, 15 }, 26), randn({ 8, 5, 3, 3 }, 27), randn({ 8 }, 28)
    for _, dtype in ipairs({ 'f32', 'bf16', 'f64' }) do
      local tol = ({ f32 = 1e-5, bf16 = 2e-2, f64 = 1e-12 })[dtype]
      local opts = { stride = { 2, 1 }, padding = { 1, 2 }, dilation = { 1, 2 } }
      local function run(device, ref_dtype)
        local xs = x:to(dtype):to(ref_dtype or dtype):to(device):detach():requires_grad_()
        local ws = w:to(dtype):to(ref_dtype or dtype):to(device):detach():requires_grad_()
        local bs = b:to(dtype):to(ref_dtype or dtype):to(device):detach():requires_grad_()
        local out = F.conv2d(xs, ws, bs, opts)
        local gy = randn(out.shape, 29):to(dtype):to(ref_dtype or dtype):to(device)
        ;(out * gy):sum():backward()
        return out, xs.grad, ws.grad, bs.grad
      end
      local r = { run('cpu', 'f64') }
      local g = { run(DEV) }
      for i, what in ipairs({ 'output', 'x gradient', 'w gradient', 'bias gradient' }) do
        assert_close(g[i], r[i], tol, dtype .. ' conv2d ' .. what)
      end
    end
  end)
end)

describe('cuda optimizer updates', function()
  if not CUDA then
    pending('no GPU here (' .. fsdp.cuda.status() .. '): the cuda updates were not run')
    return
  end

  -- N steps of make(params) on the CPU and on cuda:0 with the same
  -- gradients; params and every state tensor compared.
  local function same_steps(make, dtype, tol, what)
    local n, steps = 4099, 5
    local init = randn({ n }, 30):to(dtype)
    local pc = nn.Parameter(init:clone())
    local pg = nn.Parameter(init:to(DEV))
    local oc, og = make({ { 'w', pc } }), make({ { 'w', pg } })
    for s = 1, steps do
      local g = (randn({ n }, 40 + s) * 0.1):to(dtype)
      pc.grad, pg.grad = g, g:to(DEV)
      oc:step()
      og:step()
    end
    assert_close(pg, pc, tol, what .. ' param')
    for k, v in pairs(oc.state.w) do
      if fsdp.is_tensor(v) then assert_close(og.state.w[k], v, tol, what .. ' ' .. k) end
    end
  end

  it('AdamW matches the CPU', function()
    local make = function(p) return optim.AdamW(p, { lr = 1e-2, weight_decay = 0.1, betas = { 0.9, 0.95 } }) end
    same_steps(make, 'f32', 1e-6, 'AdamW f32')
    same_steps(make, 'bf16', 1e-2, 'AdamW bf16')
    local far = function(p) return optim.AdamW(p, { lr = 1e-2, betas = { 0.3, 0.95 } }) end
    same_steps(far, 'f32', 1e-6, 'AdamW beta1 < 0.5')
  end)

  it('AnyPrecisionAdamW matches the CPU with and without Kahan summation', function()
    for _, kahan in ipairs({ true, false }) do
      local make = function(p)
        return optim.AnyPrecisionAdamW(p, { lr = 1e-3, weight_decay = 0.01, use_kahan_summation = kahan })
      end
      same_steps(make, 'bf16', 1e-2, 'AnyPrecisionAdamW kahan=' .. tostring(kahan))
      same_steps(make, 'f32', 1e-6, 'AnyPrecisionAdamW f32 kahan=' .. tostring(kahan))
    end
  end)

  it('SGD matches the CPU (plain, momentum, nesterov)', function()
    for _, o in ipairs({ { lr = 0.1 }, { lr = 0.1, momentum = 0.9, dampening = 0.1, weight_decay = 1e-2 },
                         { lr = 0.05, momentum = 0.9, nesterov = true } }) do
      same_steps(function(p) return optim.SGD(p, o) end, 'f32', 1e-6, 'SGD')
    end
  end)

  it('Adadelta matches the CPU', function()
    same_steps(function(p) return optim.Adadelta(p, { lr = 1.0, weight_decay = 1e-2 }) end, 'f32', 1e-6, 'Adadelta')
  end)

  it('sums squares of gradients in the CPU order and scales them', function()
    for _, dtype in ipairs({ 'f32', 'bf16', 'f64' }) do
      local g = randn({ 3 * 4096 + 7 }, 50):to(dtype)
      local pc, pg = nn.Parameter(g:clone()), nn.Parameter(g:to(DEV))
      pc.grad, pg.grad = g:clone(), g:to(DEV)
      local nc, ng = optim.clip.grad_sq_norm({ pc }), optim.clip.grad_sq_norm({ pg })
      assert(math.abs(nc - ng) <= 1e-12 * nc, ('%s: %.17g vs %.17g'):format(dtype, ng, nc))
      optim.clip.scale_grads({ pc }, 0.37)
      optim.clip.scale_grads({ pg }, 0.37)
      assert.same(pc.grad:to('f64'):tolist(), pg.grad:to('cpu'):to('f64'):tolist())
    end
  end)

  -- The C updates called directly on operands of chosen dtypes, sizes and
  -- offsets, on the CPU and on cuda:0, compared bit for bit (as f64 lists:
  -- exact for every float dtype). Sizes: a whole number of 8-element packs
  -- (8, 4096), with a tail (37, 4099); offset 1 (every operand misaligned)
  -- and offset 4 (f32 operands 16-byte aligned, bf16 ones not) must take
  -- the per-element kernel, offset 0 with f32/bf16 operands the vector one.
  local ffi = require 'ffi'
  local C = require('fsdp.core').C
  local cptr = require('fsdp.tensor').cptr

  -- A pair {cpu, gpu} of n-element views at element `off` of equal tensors.
  local function pair(n, off, dtype, seed, scale)
    local base = seed and (randn({ n + off }, seed) * (scale or 1)):to(dtype)
      or fsdp.zeros({ n + off }, { dtype = dtype })
    return { base:narrow(0, off, n), base:to(DEV):narrow(0, off, n) }
  end

  local function same_bits(pr, what)
    assert.same(pr[1]:to('f64'):tolist(), pr[2]:to('cpu'):to('f64'):tolist(), what)
  end

  -- steps of call(side, operands, step) on both devices; dts: {param, grad,
  -- state...}; every operand compared after the last.
  local function same_updates(call, dts, n, off, steps, what)
    local ops = { pair(n, off, dts[1], 60) }
    for k = 3, #dts do ops[k] = pair(n, off, dts[k]) end
    for s = 1, steps do
      ops[2] = pair(n, off, dts[2], 60 + s, 0.1)
      for side = 1, 2 do
        local o = {}
        for k = 1, #dts do o[k] = cptr(ops[k][side]) end
        assert(call(o, s) == 0, what .. ': ' .. require('fsdp.core').last_error())
      end
    end
    for k = 1, #dts do same_bits(ops[k], ('%s operand %d'):format(what, k)) end
  end

  local dtype_sets = {
    { 'f32', 'f32', 'f32' }, { 'bf16', 'bf16', 'bf16' }, { 'bf16', 'bf16', 'f32' }, { 'f32', 'bf16', 'f32' },
    { 'bf16', 'f32', 'bf16' }, { 'f16', 'f16', 'f16' }, { 'f32', 'f32', 'bf16' },
  }
  local sizes, offsets = { 8, 37, 4096, 4099 }, { 0, 1, 4 }

  -- fn(dts, n, off, tag) for every dtype set, size and offset.
  local function each_case(fn)
    for _, d in ipairs(dtype_sets) do
      for _, n in ipairs(sizes) do
        for _, off in ipairs(offsets) do
          fn(d, n, off, ('%s/%s/%s n=%d off=%d'):format(d[1], d[2], d[3], n, off))
        end
      end
    end
  end

  it('AdamW is bit-exact on the vector path, its tails and its fallbacks', function()
    local o = ffi.new('fl_adamw_options')
    each_case(function(d, n, off, tag)
      for _, beta1 in ipairs({ 0.9, 0.3 }) do
        o.lr, o.beta1, o.beta2, o.eps, o.weight_decay = 1e-2, beta1, 0.95, 1e-8, 0.1
        same_updates(function(x, s)
          o.step = s
          return C.fl_adamw_step_(x[1], x[2], x[3], x[4], o)
        end, { d[1], d[2], d[3], d[3] }, n, off, 2, 'AdamW ' .. tag)
      end
    end)
  end)

  it('AnyPrecisionAdamW is bit-exact on the vector path, its tails and its fallbacks', function()
    local o = ffi.new('fl_adamw_options')
    o.lr, o.beta1, o.beta2, o.eps, o.weight_decay = 1e-3, 0.9, 0.95, 1e-8, 0.01
    each_case(function(d, n, off, tag)
      same_updates(function(x, s)
        o.step = s
        return C.fl_anyprecision_adamw_step_(x[1], x[2], x[3], x[4], x[5], o)
      end, { d[1], d[2], d[3], d[3], d[3] }, n, off, 2, 'AnyPrecisionAdamW kahan ' .. tag)
      same_updates(function(x, s)
        o.step = s
        return C.fl_anyprecision_adamw_step_(x[1], x[2], x[3], x[4], nil, o)
      end, { d[1], d[2], d[3], d[3] }, n, off, 2, 'AnyPrecisionAdamW ' .. tag)
    end)
    -- moments of two dtypes: the per-element kernel
    same_updates(function(x, s)
      o.step = s
      return C.fl_anyprecision_adamw_step_(x[1], x[2], x[3], x[4], x[5], o)
    end, { 'bf16', 'bf16', 'f32', 'bf16', 'bf16' }, 4099, 0, 2, 'AnyPrecisionAdamW mixed moments')
  end)

  it('SGD is bit-exact on the vector path, its tails and its fallbacks', function()
    local o = ffi.new('fl_sgd_options')
    each_case(function(d, n, off, tag)
      for _, v in ipairs({ { 0.1, 0, 0, 0, false }, { 0.1, 0.9, 0.1, 1e-2, false }, { 0.05, 0.9, 0, 0, true } }) do
        o.lr, o.momentum, o.dampening, o.weight_decay, o.nesterov = v[1], v[2], v[3], v[4], v[5]
        local dts = v[2] ~= 0 and { d[1], d[2], d[3] } or { d[1], d[2] }
        same_updates(function(x, s)
          o.step = s
          return C.fl_sgd_step_(x[1], x[2], x[3], o)
        end, dts, n, off, 3, 'SGD ' .. tag)
      end
    end)
  end)

  it('Adadelta is bit-exact on the vector path, its tails and its fallbacks', function()
    local o = ffi.new('fl_adadelta_options')
    o.lr, o.rho, o.eps, o.weight_decay = 1.0, 0.9, 1e-6, 1e-2
    each_case(function(d, n, off, tag)
      same_updates(function(x) return C.fl_adadelta_step_(x[1], x[2], x[3], x[4], o) end,
        { d[1], d[2], d[3], d[3] }, n, off, 2, 'Adadelta ' .. tag)
    end)
  end)

  -- One fl_adamw_step_multi_ over many tensors of every dtype set, size
  -- and offset above (and more than two of the kernel's batches of 76 of
  -- one kind, so batches, dtype groups and per-tensor fallbacks all occur) against one
  -- fl_adamw_step_ per tensor, on each device, bit for bit; and the cuda
  -- results against the cpu's.
  it('AdamW over many tensors at once gives each tensor its own update, bit for bit', function()
    local o = ffi.new('fl_adamw_options')
    o.lr, o.beta2, o.eps, o.weight_decay = 1e-2, 0.95, 1e-8, 0.1
    local cases = {}
    each_case(function(d, n, off, tag) cases[#cases + 1] = { d = d, n = n, off = off, tag = tag } end)
    -- (more than two batches of the commonest kind: whole bf16 tensors, some
    -- with tails; and an empty one)
    for i = 1, 160 do
      cases[#cases + 1] = { d = { 'bf16', 'bf16', 'bf16' }, n = 16 * i + i % 3, off = 0, tag = 'bf16 x' .. i }
    end
    cases[#cases + 1] = { d = { 'f32', 'f32', 'f32' }, n = 0, off = 0, tag = 'empty' }
    -- operands[case][k] = {cpu, gpu} for each of: one by one, at once
    local function operands(seed)
      local out = {}
      for i, c in ipairs(cases) do
        local dts = { c.d[1], c.d[2], c.d[3], c.d[3] }
        out[i] = {}
        for k = 1, 4 do
          out[i][k] = k == 2 and pair(c.n, c.off, dts[k], seed + i, 0.1)
            or k == 1 and pair(c.n, c.off, dts[k], 5000 + i) or pair(c.n, c.off, dts[k])
        end
      end
      return out
    end
    local single, multi = operands(100), operands(100)
    for step = 1, 2 do
      o.step, o.beta1 = step, step == 1 and 0.9 or 0.3
      if step == 2 then -- new gradients
        local g2 = operands(900)
        for i = 1, #cases do single[i][2], multi[i][2] = g2[i][2], g2[i][2] end
      end
      for side = 1, 2 do
        for i, c in ipairs(cases) do
          local x = single[i]
          assert(C.fl_adamw_step_(cptr(x[1][side]), cptr(x[2][side]), cptr(x[3][side]), cptr(x[4][side]), o) == 0,
            c.tag .. ': ' .. require('fsdp.core').last_error())
        end
        local n = #cases
        local a = { ffi.new('fl_tensor *[?]', n), ffi.new('const fl_tensor *[?]', n),
                    ffi.new('fl_tensor *[?]', n), ffi.new('fl_tensor *[?]', n) }
        for i = 1, n do
          for k = 1, 4 do a[k][i - 1] = cptr(multi[i][k][side]) end
        end
        assert(C.fl_adamw_step_multi_(n, a[1], a[2], a[3], a[4], o) == 0, require('fsdp.core').last_error())
      end
    end
    for i, c in ipairs(cases) do
      for k = 1, 4 do
        for side = 1, 2 do
          local want = single[i][k][side]:to('cpu'):to('f64'):tolist()
          local got = multi[i][k][side]:to('cpu'):to('f64'):tolist()
          assert.same(want, got, ('multi vs single %s operand %d side %d'):format(c.tag, k, side))
        end
        same_bits(multi[i][k], ('multi cpu vs cuda %s operand %d'):format(c.tag, k))
      end
    end
  end)

  it('AdamW over many tensors names the tensor at fault and updates none', function()
    local o = ffi.new('fl_adamw_options')
    o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, o.step = 1e-2, 0.9, 0.95, 1e-8, 0.1, 1
    local ts = {}
    for i = 1, 3 do ts[i] = { p = randn({ 16 }, i):to(DEV), g = randn({ 16 }, 10 + i):to(DEV),
                               m = fsdp.zeros({ 16 }, { device = DEV }), v = fsdp.zeros({ 16 }, { device = DEV }) } end
    local before = ts[1].p:to('cpu'):tolist()
    local function call()
      local a = { ffi.new('fl_tensor *[3]'), ffi.new('const fl_tensor *[3]'), ffi.new('fl_tensor *[3]'),
                  ffi.new('fl_tensor *[3]') }
      for i = 1, 3 do
        a[1][i - 1], a[2][i - 1], a[3][i - 1], a[4][i - 1] = cptr(ts[i].p), cptr(ts[i].g), cptr(ts[i].m), cptr(ts[i].v)
      end
      return C.fl_adamw_step_multi_(3, a[1], a[2], a[3], a[4], o)
    end
    ts[3].g = randn({ 15 }, 20):to(DEV)
    assert.is_not.equal(0, call())
    assert.matches('adamw: tensor 2: grad has 15 elements', require('fsdp.core').last_error(), 1, true)
    ts[3].g = randn({ 16 }, 20)
    assert.is_not.equal(0, call())
    assert.matches('adamw: tensor 2: grad is on cpu but param is on cuda:0', require('fsdp.core').last_error(), 1, true)
    local on_gpu = ts[3]
    ts[3] = { p = randn({ 16 }, 3), g = randn({ 16 }, 13), m = fsdp.zeros({ 16 }), v = fsdp.zeros({ 16 }) }
    assert.is_not.equal(0, call())
    assert.matches("adamw: tensor 2: param is on cpu but tensor 0's is on cuda:0", require('fsdp.core').last_error(),
      1, true)
    ts[3] = on_gpu
    ts[3].g = ts[1].m -- another tensor's state
    assert.is_not.equal(0, call())
    assert.matches("tensor 0's exp_avg and tensor 2's grad share memory", require('fsdp.core').last_error(), 1, true)
    assert.same(before, ts[1].p:to('cpu'):tolist())
  end)

  it('sums squares and scales bit-exactly on the vector path, its tails and its fallbacks', function()
    local sum = ffi.new('double[1]')
    for _, dtype in ipairs({ 'f32', 'bf16', 'f16', 'f64' }) do
      -- (2 * 4096 + 4 + 3: a last chunk with a whole quad past the packs, then a tail)
      for _, n in ipairs({ 8, 37, 4096, 2 * 4096 + 4 + 3, 3 * 4096 + 8 }) do
        for _, off in ipairs({ 0, 1 }) do
          local tag = ('%s n=%d off=%d'):format(dtype, n, off)
          local x = pair(n, off, dtype, 70)
          local r = {}
          for side = 1, 2 do
            assert(C.fl_grad_sq_norm(cptr(x[side]), sum) == 0, tag)
            r[side] = sum[0]
          end
          assert(r[1] == r[2], ('sum of squares %s: %.17g on cuda, %.17g on the cpu'):format(tag, r[2], r[1]))
          for side = 1, 2 do assert(C.fl_grad_scale_(cptr(x[side]), 0.37) == 0, tag) end
          same_bits(x, 'scale ' .. tag)
        end
      end
    end
  end)
end)
