-- cuda_fused_spec.lua: the fused family's CUDA kernels (core/cuda/cuda_norm.cu,
-- cuda_softmax.cu, cuda_loss.cu, cuda_rotary.cu, cuda_attention*.cu) at the
-- sizes and layouts backend_ops_spec's small cases do not reach: attention
-- at a realistic size (B=2, 8 query heads over 2 kv heads, T=1024, D=128,
-- bf16, causal and with a trained bias), head dims to 256 and sequence
-- lengths off the 32-row tiles, norms at width 8192, cross-entropy over a
-- 32000 vocabulary, softmax along a strided non-last dim, rotary with
-- per-batch positions, the errors the kernels raise (as the CPU's), and
-- finite-difference checks in f64 along a random direction (run on the GPU
-- whole: no per-element host access).
--
-- Each comparison runs the same (rounded) inputs on the CPU in f32 (or f64)
-- and measures max |gpu - cpu| / max |cpu|. Without a GPU every case is
-- reported pending, naming the reason.
local fsdp = require 'fsdp'
local Tensor = require 'fsdp.tensor'
local F = fsdp.F

local CUDA = fsdp.cuda.is_available()
-- In the cudasim build (kernels run on the CPU) the two large attention
-- cases shrink to sequences of 256 and 192: still many tiles, in seconds.
local SIM = fsdp.cuda.simulated()
local T_LONG, T_BIAS = SIM and 256 or 1024, SIM and 192 or 512
local TOLERANCE = { f64 = 1e-10, f32 = 2e-5, bf16 = 2e-2, f16 = 4e-3 }

local function randn(shape, seed, dtype)
  return fsdp.randn(shape, { seed = seed }):to(dtype or 'f32')
end

local normalised_error = require('fsdp.testing').normalised_error
local cudnn_takes_backward = require('fsdp.testing').cudnn_takes_backward

local function assert_close(got, want, tol, what)
  local e = normalised_error(got, want)
  assert(e <= tol, ('%s: normalised error %.3g exceeds %.3g'):format(what, e, tol))
end

-- Runs fn on copies of `inputs` (tensors, in `dtype`; others as they are)
-- on `device`, float ones requiring grad; returns the output and the
-- gradients of sum(out * w) with fixed weights w.
local function run(fn, inputs, dtype, device)
  local xs = {}
  for i, t in ipairs(inputs) do
    if Tensor.is_tensor(t) and t:is_floating_point() then
      xs[i] = t:to(dtype):to(device):detach():requires_grad_()
    elseif Tensor.is_tensor(t) then
      xs[i] = t:to(device)
    else
      xs[i] = t
    end
  end
  local out = fn(unpack(xs, 1, #inputs))
  local w = fsdp.randn(out.shape, { seed = 99 }):to(out.dtype):to(device)
  ;(out * w):sum():backward()
  local grads = {}
  for i, x in ipairs(xs) do
    if Tensor.is_tensor(x) and x.requires_grad then grads[i] = x.grad end
  end
  return out, grads
end

-- The op on cuda:0 in `dtype` against the CPU in `ref` (f32 or f64) on the
-- same rounded inputs: output and every input gradient.
local function compare(fn, inputs, dtype, ref, what)
  local rounded = {}
  for i, t in ipairs(inputs) do
    rounded[i] = (Tensor.is_tensor(t) and t:is_floating_point()) and t:to(dtype) or t
  end
  local out_g, grads_g = run(fn, rounded, dtype, 'cuda:0')
  local out_c, grads_c = run(fn, rounded, ref, 'cpu')
  assert.are.equal('cuda:0', out_g.device)
  local tol = TOLERANCE[dtype]
  assert_close(out_g, out_c, tol, what .. ' ' .. dtype .. ' output')
  for i in pairs(grads_c) do
    assert(grads_g[i], ('%s: no gradient for input %d on cuda'):format(what, i))
    assert_close(grads_g[i], grads_c[i], tol, ('%s %s gradient %d'):format(what, dtype, i))
  end
end

-- Finite differences along one random direction u per input, on cuda in
-- f64: (f(x + eps u) - f(x - eps u)) / 2 eps against <grad f, u>, with
-- f = sum(out * w).
local function directional_check(fn, inputs, what)
  local xs = {}
  for i, t in ipairs(inputs) do xs[i] = t:to('f64'):to('cuda:0'):detach():requires_grad_() end
  local w = nil
  local function f(args)
    local out = fn(unpack(args, 1, #inputs))
    w = w or fsdp.randn(out.shape, { seed = 5 }):to('f64'):to('cuda:0')
    return (out * w):sum()
  end
  f(xs):backward()
  local eps = 1e-6
  for i, x in ipairs(xs) do
    local u = fsdp.randn(x.shape, { seed = 40 + i }):to('f64'):to('cuda:0')
    local plus, minus = {}, {}
    for j, y in ipairs(xs) do
      plus[j] = j == i and (y:detach() + u * eps) or y:detach()
      minus[j] = j == i and (y:detach() - u * eps) or y:detach()
    end
    local numeric = fsdp.no_grad(function() return (f(plus):item() - f(minus):item()) / (2 * eps) end)
    local analytic = (x.grad * u):sum():item()
    assert(math.abs(analytic - numeric) <= 1e-6 * (1 + math.abs(numeric)),
      ('%s input %d: autograd %.12g, finite difference %.12g'):format(what, i, analytic, numeric))
  end
end

-- Which path attention took (core/cuda/cuda_sdpa.cu): bf16/f16 attention
-- goes through cuDNN's fused attention where it is eligible, the rest
-- through the flash-style kernels. FSDP_CUDNN_SDPA=0 turns cuDNN off, so the
-- same cases then test the kernels alone.
local CUDNN_ON = os.getenv('FSDP_CUDNN_SDPA') ~= '0'

-- Runs fn and asserts how many attention calls took each path in it, e.g.
-- { cudnn_forward = 1, kernel_backward = 1 } (unnamed paths: 0); with cuDNN
-- turned off every cudnn_ count moves to its kernel_ twin.
local function expect_paths(want, what, fn)
  local before = fsdp.cuda.attention_paths()
  fn()
  local after = fsdp.cuda.attention_paths()
  local expected = {}
  for _, dir in ipairs({ 'forward', 'backward' }) do
    local c, k = want['cudnn_' .. dir] or 0, want['kernel_' .. dir] or 0
    if not CUDNN_ON then c, k = 0, c + k end
    expected['cudnn_' .. dir], expected['kernel_' .. dir] = c, k
  end
  for name, n in pairs(expected) do
    local got = after[name] - before[name]
    assert(got == n, ('%s: %d attention calls took the %s path, expected %d'):format(what, got, name, n))
  end
end

-- The message of the error fn raises, without the 'file:line: ' prefix.
local function error_of(fn)
  local ok, err = pcall(fn)
  assert.is_false(ok, 'expected an error')
  return (tostring(err):gsub('^[^:]*:%d+: ', ''))
end

describe('the fused CUDA kernels', function()
  if not CUDA then
    pending('no GPU here (' .. fsdp.cuda.status() .. '): the fused CUDA kernels were not run')
    return
  end

  -- Both directions through cuDNN, the backward where the loaded cuDNN
  -- takes Tk keys (fsdp.testing.cudnn_takes_backward).
  local function cudnn_both(Tk)
    return { cudnn_forward = 1, [cudnn_takes_backward(Tk) and 'cudnn_backward' or 'kernel_backward'] = 1 }
  end

  local function attention(opts)
    return function(q, k, v, bias)
      return F.scaled_dot_product_attention(q, k, v,
        { causal = opts.causal, bias = bias, scale = opts.scale })
    end
  end

  it(('attention B=2, 8/2 heads, T=%d, D=128 in bf16, causal: forward and backward'):format(T_LONG), function()
    local T = T_LONG
    local q, k, v = randn({ 2, 8, T, 128 }, 1), randn({ 2, 2, T, 128 }, 2), randn({ 2, 2, T, 128 }, 3)
    expect_paths(cudnn_both(T), 'causal gqa attention', function()
      compare(attention { causal = true }, { q, k, v }, 'bf16', 'f32', 'causal gqa attention')
    end)
  end)

  it('attention with a trained [1, H, T, T] bias in bf16 (dbias summed over the batch)', function()
    local T = T_BIAS
    local q, k, v = randn({ 2, 8, T, 128 }, 4), randn({ 2, 2, T, 128 }, 5), randn({ 2, 2, T, 128 }, 6)
    local bias = randn({ 1, 8, T, T }, 7)
    -- dbias is the kernels' (cuDNN's forward stats feed their backward)
    expect_paths({ cudnn_forward = 1, kernel_backward = 1 }, 'biased attention', function()
      compare(attention { scale = 1 / 8 }, { q, k, v, bias }, 'bf16', 'f32', 'biased attention')
    end)
  end)

  -- A bias of one value per key shared by every query (the shape of a
  -- padding mask or ALiBi's slopes). (One value per query shared by every
  -- key would be no test: softmax ignores it and its gradient is zero.)
  it('attention with a query-broadcast bias, causal, Tq != Tk, off the tiles, f32', function()
    local q, k, v = randn({ 1, 4, 77, 64 }, 8), randn({ 1, 4, 93, 64 }, 9), randn({ 1, 4, 93, 64 }, 10)
    local bias = randn({ 4, 1, 93 }, 11)
    compare(attention { causal = true }, { q, k, v, bias }, 'f32', 'f32', 'query-broadcast bias')
  end)

  it('attention at head dim 256 and 32 (and Dv != D), f32 and f16', function()
    local q, k, v = randn({ 1, 2, 100, 256 }, 12), randn({ 1, 1, 130, 256 }, 13), randn({ 1, 1, 130, 256 }, 14)
    expect_paths({ kernel_forward = 1, kernel_backward = 1 }, 'D=256 f32', function()
      compare(attention {}, { q, k, v }, 'f32', 'f32', 'D=256')
    end)
    q, k, v = randn({ 2, 4, 65, 32 }, 15), randn({ 2, 2, 65, 32 }, 16), randn({ 2, 2, 65, 80 }, 17)
    expect_paths(cudnn_both(65), 'D=32, Dv=80 f16', function()
      compare(attention { causal = true }, { q, k, v }, 'f16', 'f32', 'D=32, Dv=80')
    end)
  end)

  it('attention on transposed [B, T, H, D] projections (strided rows)', function()
    local q = randn({ 2, 40, 4, 64 }, 18):transpose(1, 2)
    local k = randn({ 2, 40, 2, 64 }, 19):transpose(1, 2)
    local v = randn({ 2, 40, 2, 64 }, 20):transpose(1, 2)
    compare(attention { causal = true }, { q, k, v }, 'f32', 'f32', 'strided attention')
  end)

  it('attention in f64 matches the CPU to 1e-10 and finite differences', function()
    local q, k, v = randn({ 1, 2, 37, 16 }, 21), randn({ 1, 1, 37, 16 }, 22), randn({ 1, 1, 37, 16 }, 23)
    local bias = randn({ 1, 2, 37, 37 }, 24)
    compare(attention { causal = true }, { q, k, v, bias }, 'f64', 'f64', 'f64 attention')
    directional_check(attention { causal = true }, { q, k, v, bias }, 'f64 attention')
  end)

  it('a row whose every key is masked outputs zeros and zero gradients', function()
    local q, k, v = randn({ 1, 1, 8, 16 }, 25), randn({ 1, 1, 8, 16 }, 26), randn({ 1, 1, 8, 16 }, 27)
    local mask = fsdp.zeros({ 8, 8 })
    mask:narrow(0, 3, 1):fill_(-math.huge)
    compare(attention {}, { q, k, v, mask }, 'f32', 'f32', 'masked row')
    local out = F.scaled_dot_product_attention(q:to('cuda:0'), k:to('cuda:0'), v:to('cuda:0'),
      { bias = mask:to('cuda:0') })
    assert.are.equal(0, F.max(F.abs(out:to('cpu'):narrow(2, 3, 1)):view(-1), 0):item())
  end)

  it('rms_norm and layer_norm at width 8192 (bf16 and f32), dweight and dbias', function()
    local x, w, b = randn({ 96, 8192 }, 30), randn({ 8192 }, 31), randn({ 8192 }, 32)
    compare(function(a, c) return F.rms_norm(a, c, 1e-6) end, { x, w }, 'bf16', 'f32', 'rms_norm')
    compare(function(a, c) return F.rms_norm(a, c, 1e-6) end, { x, w }, 'f32', 'f32', 'rms_norm')
    compare(function(a, c, d) return F.layer_norm(a, c, d, 1e-5) end, { x, w, b }, 'f32', 'f32', 'layer_norm')
    compare(function(a, c, d) return F.layer_norm(a, c, d, 1e-5) end, { x, w, b }, 'bf16', 'f32', 'layer_norm')
  end)

  it('norms over a strided x, without weights, and in f64 by finite differences', function()
    local x = randn({ 64, 3, 40 }, 33):transpose(0, 1)
    compare(function(a) return F.rms_norm(a) end, { x }, 'f32', 'f32', 'strided rms_norm')
    compare(function(a) return F.layer_norm(a) end, { x }, 'f32', 'f32', 'strided layer_norm')
    local xs, w, b = randn({ 5, 24 }, 34), randn({ 24 }, 35), randn({ 24 }, 36)
    directional_check(function(a, c) return F.rms_norm(a, c, 1e-5) end, { xs, w }, 'f64 rms_norm')
    directional_check(function(a, c, d) return F.layer_norm(a, c, d, 1e-5) end, { xs, w, b }, 'f64 layer_norm')
  end)

  it('softmax and log_softmax along a strided non-last dim and over 50000 columns', function()
    local x = randn({ 7, 33, 5 }, 40):transpose(0, 2)
    compare(function(a) return F.softmax(a, 1) end, { x }, 'f32', 'f32', 'softmax dim 1')
    compare(function(a) return F.log_softmax(a, 0) end, { x }, 'f32', 'f32', 'log_softmax dim 0')
    local wide = randn({ 4, 50000 }, 41)
    compare(function(a) return F.log_softmax(a, -1) end, { wide }, 'bf16', 'f32', 'log_softmax wide')
    directional_check(function(a) return F.softmax(a, 1) end, { randn({ 3, 9 }, 42) }, 'f64 softmax')
  end)

  it('cross_entropy over a 32000 vocabulary: mean, sum and none, ignore_index, smoothing', function()
    local logits = randn({ 256, 32000 }, 50)
    local t = fsdp.randint(0, 32000, { 256 }, { seed = 51 })
    t:narrow(0, 10, 5):fill_(-100)
    for _, red in ipairs { 'mean', 'sum', 'none' } do
      compare(function(a, tg) return F.cross_entropy(a, tg, { reduction = red, label_smoothing = 0.1 }) end,
        { logits, t }, 'bf16', 'f32', 'cross_entropy ' .. red)
    end
    compare(function(a, tg) return F.cross_entropy(a, tg) end, { logits, t }, 'f32', 'f32', 'cross_entropy f32')
    local small = fsdp.tensor({ 3, -100, 0, 10, 7, 5 }, { dtype = 'i64' })
    directional_check(function(a) return F.cross_entropy(a, small:to(a.device), { label_smoothing = 0.2 }) end,
      { randn({ 6, 11 }, 52) }, 'f64 cross_entropy')
  end)

  -- [Note: losses in f32] in core/ops/cross_entropy.c: on the GPU too,
  -- bf16 logits give an f32 loss (the f64 loss of the bf16 values to a few
  -- f32 ulps) and a bf16 gradient.
  it('cross_entropy of bf16 logits is an f32 loss with a bf16 gradient', function()
    local logits = (randn({ 64, 3000 }, 55) * 3):bfloat16()
    local t = fsdp.randint(0, 3000, { 64 }, { seed = 56 })
    t:narrow(0, 3, 2):fill_(-100)
    for _, red in ipairs { 'mean', 'sum', 'none' } do
      local x = logits:to('cuda:0'):requires_grad_()
      local loss = F.cross_entropy(x, t:to('cuda:0'), { reduction = red })
      assert.equals('f32', loss.dtype)
      local ref = F.cross_entropy(logits:double(), t, { reduction = red })
      local got, want = loss:cpu():double():contiguous():view(-1):tolist(), ref:contiguous():view(-1):tolist()
      for i = 1, #want do
        assert.is_true(math.abs(got[i] - want[i]) <= 4e-7 * math.max(1, math.abs(want[i])),
          ('%s %d: %.9g vs f64 %.9g'):format(red, i, got[i], want[i]))
      end
      loss:sum():backward()
      assert.equals('bf16', x.grad.dtype)
    end
  end)

  it('nll_loss, and the out-of-range target errors name the same row as the CPU', function()
    local lp, t = F.log_softmax(randn({ 9, 13 }, 53), -1), fsdp.randint(0, 13, { 9 }, { seed = 54 })
    compare(function(a, tg) return F.nll_loss(a, tg, { reduction = 'none' }) end, { lp, t }, 'f32', 'f32', 'nll_loss')
    compare(function(a, tg) return F.nll_loss(a, tg) end, { lp, t }, 'f32', 'f32', 'nll_loss mean')
    local bad = fsdp.tensor({ 1, 2, 40, 3, 99, 0, 1, 2, 3 }, { dtype = 'i64' })
    local cpu = error_of(function() F.nll_loss(lp, bad) end)
    local gpu = error_of(function() F.nll_loss(lp:to('cuda:0'), bad:to('cuda:0')) end)
    assert.are.equal(cpu, gpu)
    assert(gpu:find('target 40 (at index 2)', 1, true), gpu)
    cpu = error_of(function() F.cross_entropy(lp, bad) end)
    gpu = error_of(function() F.cross_entropy(lp:to('cuda:0'), bad:to('cuda:0')) end)
    assert.are.equal(cpu, gpu)
  end)

  it('apply_rotary with per-batch positions and its backward; bad positions fail as on the CPU', function()
    local cos, sin = F.rope_tables(64, 128)
    local x = randn({ 2, 8, 20, 128 }, 60)
    local pos = fsdp.randint(0, 64, { 2, 20 }, { seed = 61 })
    local rot = function(a) return F.apply_rotary(a, cos:to(a.device), sin:to(a.device), { positions = pos:to(a.device) }) end
    compare(rot, { x }, 'f32', 'f32', 'rotary positions [B, T]')
    compare(rot, { x }, 'bf16', 'f32', 'rotary positions [B, T]')
    local plain = function(a) return F.apply_rotary(a, cos:to(a.device), sin:to(a.device)) end
    compare(plain, { randn({ 3, 64, 128 }, 62) }, 'f32', 'f32', 'rotary')
    local bad = fsdp.tensor({ 0, 1, 70, 3 }, { dtype = 'i64' })
    local xs = randn({ 1, 4, 128 }, 63)
    local cpu = error_of(function() F.apply_rotary(xs, cos, sin, { positions = bad }) end)
    local gpu = error_of(function()
      F.apply_rotary(xs:to('cuda:0'), cos:to('cuda:0'), sin:to('cuda:0'), { positions = bad:to('cuda:0') })
    end)
    assert.are.equal(cpu, gpu)
  end)

  -- The row kernels' vector path (16-byte loads, core/cuda/cuda_vec.cuh) is
  -- taken where the lanes are contiguous and each starts a vector; the rest
  -- take the scalar kernels. Each case runs fn on the same typed inputs on
  -- cuda:0 and on the CPU (same dtypes) and compares the output and every
  -- input gradient within the dtype's tolerance. fn makes its views (a
  -- narrow starting at element 1, a transpose) itself, on the device.
  local function against_cpu(fn, inputs, dtype, what)
    local function go(device)
      local xs = {}
      for i, t in ipairs(inputs) do
        xs[i] = t:is_floating_point() and t:to(device):detach():requires_grad_() or t:to(device)
      end
      local out = fn(unpack(xs, 1, #inputs))
      local w = fsdp.randn(out.shape, { seed = 98 }):to(out.dtype):to(device)
      ;(out * w):sum():backward()
      return out, xs
    end
    local out_g, xs_g = go('cuda:0')
    local out_c, xs_c = go('cpu')
    local tol = TOLERANCE[dtype]
    assert_close(out_g, out_c, tol, what .. ' ' .. dtype .. ' output')
    for i, x in ipairs(xs_c) do
      if x.requires_grad then
        assert_close(xs_g[i].grad, x.grad, tol, ('%s %s gradient %d'):format(what, dtype, i))
      end
    end
  end

  local function rms(a, c) return F.rms_norm(a, c, 1e-6) end

  it('rms_norm on the vector path and its fallbacks: whole vectors, tails, misaligned and strided rows', function()
    for _, dt in ipairs { 'f32', 'bf16', 'f16' } do
      local function r(shape, seed) return randn(shape, seed, dt) end
      against_cpu(rms, { r({ 5, 64 }, 70), r({ 64 }, 71) }, dt, 'rms_norm whole vectors')
      against_cpu(rms, { r({ 1, 37 }, 72), r({ 37 }, 73) }, dt, 'rms_norm one row with a tail')
      against_cpu(rms, { r({ 3, 4099 }, 74), r({ 4099 }, 75) }, dt, 'rms_norm misaligned rows of 4099')
      against_cpu(rms, { r({ 1, 4099 }, 74), r({ 4099 }, 75) }, dt, 'rms_norm one row of 4099')
      against_cpu(function(a, c) return rms(a:narrow(1, 1, 64), c) end, { r({ 5, 65 }, 76), r({ 64 }, 77) }, dt,
        'rms_norm rows from element 1')
      against_cpu(function(a, c) return rms(a:transpose(0, 1), c) end, { r({ 3, 5, 64 }, 78), r({ 64 }, 79) }, dt,
        'rms_norm aligned non-flat rows')
      against_cpu(function(a) return F.rms_norm(a:transpose(0, 1)) end, { r({ 64, 6 }, 80) }, dt,
        'rms_norm strided rows, no weight')
      against_cpu(function(a) return F.rms_norm(a) end, { r({ 4, 8 }, 81) }, dt, 'rms_norm one vector, no weight')
    end
    -- A row longer than the registers keep (2 chunks of 512 threads) reads x twice.
    against_cpu(rms, { randn({ 2, 8200 }, 82), randn({ 8200 }, 83) }, 'f32', 'rms_norm 8200 wide')
    -- A 16-bit x with an f32 weight: an f32 output (norm.c's promotion).
    for _, dt in ipairs { 'bf16', 'f16' } do
      against_cpu(rms, { randn({ 6, 128 }, 84, dt), randn({ 128 }, 85) }, dt, 'rms_norm f32 weight')
      against_cpu(rms, { randn({ 1, 44 }, 86, dt), randn({ 44 }, 87) }, dt, 'rms_norm f32 weight, tail')
    end
  end)

  it('apply_rotary on the vector path and its fallbacks: head dims, tables, [B, T, H, D] views', function()
    for _, dt in ipairs { 'f32', 'bf16', 'f16' } do
      for _, D in ipairs { 64, 16, 12 } do
        local cos, sin = F.rope_tables(32, D)
        for _, tdt in ipairs { 'f32', dt } do
          local c, s = cos:to(tdt), sin:to(tdt)
          local plain = function(a) return F.apply_rotary(a, c:to(a.device), s:to(a.device)) end
          against_cpu(plain, { randn({ 2, 3, 20, D }, 90, dt) }, dt, ('rotary D=%d %s tables'):format(D, tdt))
          local pos = fsdp.randint(0, 32, { 2, 20 }, { seed = 91 })
          local bthd = function(a)
            return F.apply_rotary(a:transpose(1, 2), c:to(a.device), s:to(a.device), { positions = pos:to(a.device) })
          end
          against_cpu(bthd, { randn({ 2, 20, 3, D }, 92, dt) }, dt,
            ('rotary [B, T, H, D] D=%d %s tables'):format(D, tdt))
        end
        local off = function(a)
          return F.apply_rotary(a:narrow(2, 1, D), cos:to(a.device), sin:to(a.device))
        end
        against_cpu(off, { randn({ 2, 20, D + 1 }, 93, dt) }, dt, ('rotary rows from element 1, D=%d'):format(D))
      end
    end
  end)

  it('cross_entropy on the vector path and its fallbacks: whole vectors, tails, misaligned rows', function()
    for _, dt in ipairs { 'f32', 'bf16', 'f16' } do
      for _, case in ipairs { { 6, 4096 }, { 1, 37 }, { 3, 4099 }, { 5, 8 } } do
        local rows, C = case[1], case[2]
        local t = fsdp.randint(0, C, { rows }, { seed = 94 })
        if rows > 2 then t:narrow(0, 1, 1):fill_(-100) end
        local ce = function(a, tg) return F.cross_entropy(a, tg, { reduction = 'none', label_smoothing = 0.1 }) end
        against_cpu(ce, { randn({ rows, C }, 95, dt) * 3, t }, dt, ('cross_entropy %dx%d'):format(rows, C))
        against_cpu(function(a, tg) return F.cross_entropy(a, tg) end, { randn({ rows, C }, 96, dt), t }, dt,
          ('cross_entropy mean %dx%d'):format(rows, C))
      end
      local t = fsdp.randint(0, 64, { 4 }, { seed = 97 })
      against_cpu(function(a, tg) return F.cross_entropy(a:narrow(1, 1, 64), tg) end,
        { randn({ 4, 65 }, 98, dt), t }, dt, 'cross_entropy rows from element 1')
    end
  end)
end)

-- cuDNN's fused attention (core/cuda/cuda_sdpa.cu) against the flash-style
-- kernels on the same inputs, both on cuda:0: output and dq, dk, dv, with
-- each direction through either path. A forward through one path and a
-- backward through the other agrees only if both keep the same logsumexp
-- (cuDNN's softmax stats are the kernels' lse), so the mixed runs check it.
describe('attention through cuDNN against the flash-style kernels', function()
  if not CUDA then
    pending('no GPU here (' .. fsdp.cuda.status() .. '): cuDNN attention was not run')
    return
  end
  if not CUDNN_ON then
    pending('FSDP_CUDNN_SDPA=0: cuDNN attention is turned off')
    return
  end

  local ffi = require 'ffi'
  pcall(ffi.cdef, 'int setenv(const char *name, const char *value, int overwrite);')
  local function use_cudnn(on) ffi.C.setenv('FSDP_CUDNN_SDPA', on and '1' or '0', 1) end

  -- q, k, v on cuda:0 in dtype requiring grad (bias constant: a mask or a
  -- frozen position bias); forward with cuDNN on or off, then backward of
  -- sum(out * w) likewise.
  local function run_paths(c, dtype, fwd, bwd)
    local xs = {}
    for i, t in ipairs({ c.q, c.k, c.v }) do xs[i] = t:to(dtype):to('cuda:0'):requires_grad_() end
    local bias = c.bias and c.bias:to(dtype):to('cuda:0')
    local out
    use_cudnn(fwd)
    local ok, err = pcall(function()
      out = F.scaled_dot_product_attention(xs[1], xs[2], xs[3],
        { causal = c.causal, bias = bias, scale = c.scale })
      local w = randn(out.shape, 99, dtype):to('cuda:0')
      use_cudnn(bwd)
      ;(out * w):sum():backward()
    end)
    use_cudnn(true)
    assert(ok, err)
    return { out, xs[1].grad, xs[2].grad, xs[3].grad }
  end

  local NAMES = { 'output', 'dq', 'dk', 'dv' }
  local function check(c, dtype)
    local want
    expect_paths({ kernel_forward = 1, kernel_backward = 1 }, c.what .. ' kernels', function()
      want = run_paths(c, dtype, false, false)
    end)
    -- With a cuDNN that does not take this backward (older than 9.16 and
    -- Tk not a multiple of 128) the cuDNN-backward runs take the kernels.
    local bwd = cudnn_takes_backward(c.k.shape[3]) and not c.kernel_backward and 'cudnn_backward'
      or 'kernel_backward'
    local runs = {
      { true, true, { cudnn_forward = 1, [bwd] = 1 }, 'cuDNN both ways' },
      { true, false, { cudnn_forward = 1, kernel_backward = 1 }, 'cuDNN forward, kernel backward' },
      { false, true, { kernel_forward = 1, [bwd] = 1 }, 'kernel forward, cuDNN backward' },
    }
    for _, r in ipairs(runs) do
      local what = ('%s %s, %s'):format(c.what, dtype, r[4])
      local got
      expect_paths(r[3], what, function() got = run_paths(c, dtype, r[1], r[2]) end)
      for i = 1, 4 do assert_close(got[i], want[i], TOLERANCE[dtype], what .. ' ' .. NAMES[i]) end
    end
  end

  local T = SIM and 96 or 512
  local cases = {
    { what = 'causal gqa 8/2 heads', causal = true,
      q = randn({ 2, 8, T, 64 }, 61), k = randn({ 2, 2, T, 64 }, 62), v = randn({ 2, 2, T, 64 }, 63) },
    { what = 'non-causal, Tq != Tk', scale = 0.2,
      q = randn({ 1, 4, 48, 64 }, 64), k = randn({ 1, 4, 80, 64 }, 65), v = randn({ 1, 4, 80, 64 }, 66) },
    { what = 'causal with a [1, H, Tq, Tk] bias', causal = true,
      q = randn({ 2, 4, 64, 32 }, 67), k = randn({ 2, 4, 64, 32 }, 68), v = randn({ 2, 4, 64, 32 }, 69),
      bias = randn({ 1, 4, 64, 64 }, 70) },
    -- its backward is the kernels' (a bias broadcast along heads or queries:
    -- cuDNN 9.19 gave a wrong dq for it on an H100, cuda_sdpa.cu)
    { what = 'gqa 4/1 with a per-batch key bias [B, 1, 1, Tk]', kernel_backward = true,
      q = randn({ 2, 4, 40, 64 }, 71), k = randn({ 2, 1, 56, 64 }, 72), v = randn({ 2, 1, 56, 64 }, 73),
      bias = randn({ 2, 1, 1, 56 }, 74) * 4 },
  }
  for _, c in ipairs(cases) do
    for _, dtype in ipairs({ 'bf16', 'f16' }) do
      it(('%s in %s'):format(c.what, dtype), function() check(c, dtype) end)
    end
  end

  it('configurations cuDNN does not take run through the kernels', function()
    local function causal(q, k, v) return F.scaled_dot_product_attention(q, k, v, { causal = true }) end
    -- a head dim that is not a multiple of 8
    local q, k, v = randn({ 1, 2, 20, 36 }, 75), randn({ 1, 2, 20, 36 }, 76), randn({ 1, 2, 20, 36 }, 77)
    expect_paths({ kernel_forward = 1, kernel_backward = 1 }, 'D=36', function()
      compare(causal, { q, k, v }, 'bf16', 'f32', 'D=36')
    end)
    -- a bias in f32 with bf16 q, k, v
    q, k, v = randn({ 1, 2, 20, 32 }, 78), randn({ 1, 2, 20, 32 }, 79), randn({ 1, 2, 20, 32 }, 80)
    local bias = randn({ 1, 2, 20, 20 }, 81)
    expect_paths({ kernel_forward = 1 }, 'f32 bias', function()
      F.scaled_dot_product_attention(q:to('bf16'):to('cuda:0'), k:to('bf16'):to('cuda:0'),
        v:to('bf16'):to('cuda:0'), { bias = bias:to('cuda:0') })
    end)
  end)

  it('FSDP_CUDNN_DEBUG=1 says once per configuration why cuDNN declined it', function()
    local script = [[
      local fsdp = require 'fsdp'
      local q = fsdp.randn({ 1, 2, 20, 36 }, { seed = 1 }):to('bf16'):to('cuda:0')
      for _ = 1, 3 do fsdp.F.scaled_dot_product_attention(q, q, q, { causal = true }) end]]
    local cmd = ("FSDP_CUDNN_DEBUG=1 '%s' -e \"%s\" 2>&1"):format(require('fsdp.host').exe,
      script:gsub('\n', ' '))
    local f = assert(io.popen(cmd))
    local out = f:read('*a')
    f:close()
    local _, n = out:gsub('cuDNN declines forward bf16 B=1 Hq=2 Hkv=2 Tq=20 Tk=20 D=36 Dv=36 causal: ' ..
      'head dims must be multiples of 8; the flash%-style kernels run it', '')
    assert(n == 1, 'expected one line saying why, got:\n' .. out)
  end)
end)
