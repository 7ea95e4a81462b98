-- gemm_library_spec.lua: the CPU backend's GEMM libraries ([Note: GEMM
-- libraries], core/cpu/cpu_gemm.c). Large bf16 products where the CPU has
-- bf16 dot products (the avx512_bf16 level; below it they are converted
-- to f32 and take the f32 route: [Note: the bf16 routes],
-- core/cpu/cpu_matmul.c), and large f32
-- ones laid out as x W^T, run on oneDNN where it is installed (and every
-- large f32 product where OpenBLAS's kernels are narrower than the CPU:
-- OPENBLAS_CORETYPE=Haswell on a CPU with AVX-512); the other large f32
-- products with B as stored (NN, TN) on MKL where it is installed;
-- everything else on OpenBLAS. The same products are run here
-- on each library and on OpenBLAS alone in one process
-- (fsdp.cpu_gemm_use) and must agree within rounding of the output: all
-- accumulate in f32, so only the order of the sums differs. Every bf16
-- product below has at least 2^20 multiply-adds per matrix (the size from
-- which oneDNN and MKL take them): NN, NT and TN layouts, batched and
-- broadcast batches, a strided operand compacted in bf16, a bias, and a
-- linear forward and backward with gradients accumulated over two
-- backwards; the planner's meta model follows the library. What a library
-- does not take must come out bit for bit as on OpenBLAS. Where oneDNN or
-- MKL is missing (MKL is Debian's non-free libmkl-rt, which CI does not
-- install) its comparisons are reported as skipped, with the reason.
local fsdp = require 'fsdp'
local T = require 'fsdp.testing'
local F = require 'fsdp.functional.linear'

local function randn(shape, seed, dtype)
  return fsdp.randn(shape, { seed = seed, std = 0.5 }):to(dtype or 'bf16')
end

-- Run fn() with the products on `library`; returns its results.
local function on(library, fn)
  fsdp.cpu_gemm_use(library)
  return fn()
end

-- got and want (16-bit results of the same product on the two libraries)
-- agree within one bf16 step of each element, plus a sliver of the largest
-- value for elements that cancel to near zero (their f32 sums may differ
-- in the last bits before rounding). slack (default 2^-12) is that sliver;
-- a gradient accumulated over two backwards is rounded twice, its terms
-- each once, so a cancelling sum may lose a step of its terms: 2^-8.
local function assert_bf16_close(got, want, what, slack)
  assert.same(want.shape, got.shape, what)
  local g, w = got:to('f64'), want:to('f64')
  local scale = fsdp.F.max(fsdp.F.abs(w):view(-1), 0):item()
  local excess = fsdp.F.abs(g - w) - fsdp.F.abs(w) * 2^-7
  local worst = fsdp.F.max(excess:view(-1), 0):item()
  assert.is_true(worst <= scale * (slack or 2^-12),
    ('%s: differs by %.3g beyond bf16 rounding (largest value %.3g)'):format(what, worst, scale))
end

-- What the process started with (FSDP_CPU_GEMM may have chosen), to go
-- back to after each test.
local initial = fsdp.cpu_gemm_use('openblas')
fsdp.cpu_gemm_use(initial)
local function restore() fsdp.cpu_gemm_use(initial) end
local dnn_available, dnn_why = pcall(fsdp.cpu_gemm_use, 'onednn')
local mkl_available, mkl_why = pcall(fsdp.cpu_gemm_use, 'mkl')
restore()
local function reason(err) return tostring(err):gsub('^.-:%d+: ', '') end

-- OpenBLAS's kernels, and whether they are narrower than the vectors of
-- the CPU level in force ([Note: CPU ISA levels], core/base/cpu_isa.c;
-- tests/lua/cpu_isa_spec.lua checks the level against /proc/cpuinfo):
-- the core's name read here from OpenBLAS itself.
local ffi = require 'ffi'
ffi.cdef 'char *openblas_get_corename(void);'
local core = ffi.string(ffi.C.openblas_get_corename())
local rank = {}
for i, name in ipairs(fsdp.cpu_isa_levels) do rank[name] = i end
local level = rank[fsdp.cpu_isa().level]
local wide_cores = { skylakex = true, cooperlake = true, sapphirerapids = true }
local narrow = level >= rank.avx512 and not wide_cores[core:lower()]
-- oneDNN multiplies bf16 as bf16 where the CPU has bf16 dot products
-- (avx512_bf16 and up). Below, its bf16 kernels are reference loops
-- (avx2) or emulate bf16 at a third of the f32 route's rate (avx512): the
-- products are converted to f32 and go where an f32 product of their
-- layout goes ([Note: the bf16 routes], core/cpu/cpu_matmul.c).
local dnn_bf16 = level >= rank.avx512_bf16

-- f32 results of the same sums in another order: within a few f32 steps
-- of the largest value (256 or 512 terms of about 0.25). Returns the
-- largest difference.
local function assert_f32_close(got, want, what)
  assert.same(want.shape, got.shape, what)
  local scale = fsdp.F.max(fsdp.F.abs(want:to('f64')):view(-1), 0):item()
  local diff = T.max_abs_diff(got, want)
  assert.is_true(diff <= scale * 2^-18,
    ('%s: differs by %.3g (largest value %.3g)'):format(what, diff, scale))
  return diff
end

describe('CPU GEMM libraries', function()
  after_each(restore)

  it('reject an unknown library by name', function()
    T.raises(function() fsdp.cpu_gemm_use('blis') end,
      "unknown library 'blis' (known: auto, openblas, onednn, mkl)")
  end)

  it('say which library runs the products, and why the others do not', function()
    fsdp.cpu_gemm_use('openblas')
    assert.equals("OpenBLAS " .. core .. " (the rest" ..
      (narrow and "; its kernels are narrower than this CPU's AVX-512" or "") ..
      "; oneDNN: not chosen ('openblas'); MKL: not chosen ('openblas'))",
      fsdp.cpu_gemm_library())
    assert.equals('openblas', fsdp.cpu_gemm_use('auto'))
    local text = fsdp.cpu_gemm_library()
    assert.truthy(text:find('OpenBLAS ' .. core .. ' (the rest', 1, true), text)
    assert.equals(dnn_available, text:match('^oneDNN ') ~= nil, text)
    assert.equals(mkl_available, text:match('MKL %d+%.%d+%.%d+ %(the other f32 products') ~= nil, text)
  end)
end)

describe('oneDNN', function()
  if not dnn_available then
    pending('oneDNN is not available here, its comparisons were skipped: ' .. reason(dnn_why))
    return
  end
  after_each(restore)

  it('names oneDNN and its version when it runs the bf16 products', function()
    fsdp.cpu_gemm_use('onednn')
    local text = fsdp.cpu_gemm_library()
    local f32_layouts = narrow and 'in every layout' or 'as x W%^T'
    if dnn_bf16 then
      assert.truthy(text:match('^oneDNN %d+%.%d+%.%d+ %(bf16 products, and f32 ones ' .. f32_layouts), text)
    else
      assert.truthy(text:match('^oneDNN %d+%.%d+%.%d+ %(f32 products ' .. f32_layouts
        .. ', of %d+ multiply%-adds and more; bf16 ones converted to f32 below the avx512_bf16 level%)'), text)
    end
    assert.truthy(text:match("MKL: not chosen %('onednn'%)%)$"), text)
  end)

  local M, K, N = 128, 256, 64 -- 2^21 multiply-adds per matrix
  local cases = {
    { 'NN', function() return randn({ M, K }, 1), randn({ K, N }, 2) end },
    { 'NT', function() return randn({ M, K }, 1), randn({ N, K }, 2):t() end },
    { 'TN', function() return randn({ K, M }, 1):t(), randn({ K, N }, 2) end },
    { 'TT', function() return randn({ K, M }, 1):t(), randn({ N, K }, 2):t() end },
    { 'batched', function() return randn({ 3, M, K }, 1), randn({ 3, K, N }, 2) end },
    { 'a batch times one matrix (folded rows)', function() return randn({ 3, M, K }, 1), randn({ K, N }, 2) end },
    { 'one matrix times a batch (broadcast a)', function() return randn({ M, K }, 1), randn({ 2, 3, K, N }, 2) end },
    { 'broadcast batch dims on both sides', function()
      return randn({ 2, 1, M, K }, 1), randn({ 1, 3, K, N }, 2) end },
    { 'a strided operand (compacted in bf16)', function()
      return randn({ M, 2 * K }, 1):slice(1, 0, nil, 2), randn({ K, N }, 2) end },
  }
  for _, case in ipairs(cases) do
    it('agree on bf16 matmul: ' .. case[1], function()
      local a, b = case[2]()
      local want = on('openblas', function() return F.matmul(a, b) end)
      local got = on('onednn', function() return F.matmul(a, b) end)
      assert.equals('bf16', got.dtype)
      assert_bf16_close(got, want, case[1])
    end)
  end

  it('agree on a bf16 linear with a bias', function()
    local x, w, bias = randn({ 2, 64, K }, 1), randn({ 2 * N, K }, 2), randn({ 2 * N }, 3)
    local want = on('openblas', function() return F.linear(x, w, bias) end)
    local got = on('onednn', function() return F.linear(x, w, bias) end)
    assert_bf16_close(got, want, 'linear with bias')
  end)

  it('agree on a bf16 linear forward and backward, gradients accumulated twice', function()
    local function grads(library)
      fsdp.cpu_gemm_use(library)
      local x = randn({ 4, 64, K }, 1):requires_grad_()
      local w = randn({ 2 * K, K }, 2):requires_grad_()
      local bias = randn({ 2 * K }, 3):requires_grad_()
      local y
      for step = 1, 2 do
        y = F.linear(x, w, bias)
        y:backward(randn({ 4, 64, 2 * K }, 10 + step))
      end
      return { y = y, x = x.grad, w = w.grad, b = bias.grad }
    end
    local want, got = grads('openblas'), grads('onednn')
    for _, name in ipairs({ 'y', 'x', 'w', 'b' }) do
      assert.equals('bf16', got[name].dtype, name)
      assert_bf16_close(got[name], want[name], 'linear backward: ' .. name, name ~= 'y' and 2^-8 or nil)
    end
  end)

  it('are what the planner counts: a meta product on oneDNN stages only the f32 bias' ..
     (dnn_bf16 and '' or ' (below avx512_bf16: all that the conversion to f32 stages)'), function()
    -- The meta device imitating the CPU (fsdp.plan does this while it
    -- traces) raises its peak by what the CPU's matmul would stage;
    -- tests/mpi/plan_memory.lua checks whole plans against runs.
    local C = require('fsdp.core').C
    local function staged(library)
      fsdp.cpu_gemm_use(library)
      local was = C.fl_meta_set_f32_gemm(true)
      local x = fsdp.empty({ M, K }, { device = 'meta', dtype = 'bf16' })
      local w = fsdp.empty({ N, K }, { device = 'meta', dtype = 'bf16' })
      local bias = fsdp.empty({ N }, { device = 'meta', dtype = 'bf16' })
      fsdp.reset_memory_stats('meta')
      local ok, err = pcall(F.linear, x, w, bias)
      C.fl_meta_set_f32_gemm(was)
      assert(ok, err)
      local s = fsdp.memory_stats('meta')
      return s.peak - s.in_use
    end
    -- OpenBLAS: f32 copies of x and w, the f32 result and bias.
    assert.equals((M * K + N * K + M * N + N) * 4, staged('openblas'))
    assert.equals(dnn_bf16 and N * 4 or (M * K + N * K + M * N + N) * 4, staged('onednn'))
  end)

  -- [Note: long sums in pieces]: 16384 terms over 512 rows are summed in
  -- pieces of 4096 into an f32 accumulator (bf16 C rounded once from it).
  it('agree on a long sum in pieces (bf16, and f32 with a bias), and stage its f32 accumulator', function()
    local LM, LK, LN = 512, 16384, 64
    local a, b = randn({ LM, LK }, 1), randn({ LK, LN }, 2)
    local want = on('openblas', function() return F.matmul(a, b) end)
    local got = on('onednn', function() return F.matmul(a, b) end)
    assert.equals('bf16', got.dtype)
    assert_bf16_close(got, want, 'bf16 NN of 16384 terms')
    local x, w, bias = randn({ LM, LK }, 3, 'f32'), randn({ LN, LK }, 4, 'f32'), randn({ LN }, 5, 'f32')
    local want32 = on('openblas', function() return F.linear(x, w, bias) end)
    local got32 = on('onednn', function() return F.linear(x, w, bias) end)
    local scale = fsdp.F.max(fsdp.F.abs(want32:to('f64')):view(-1), 0):item()
    local diff = T.max_abs_diff(got32, want32)
    assert.is_true(diff > 0 and diff <= scale * 2^-14, ('f32 linear of 16384 terms: differs by %.3g (largest %.3g)'):format(diff, scale))
    -- The meta model counts the accumulator ([M, N] f32) besides the bias.
    local C = require('fsdp.core').C
    fsdp.cpu_gemm_use('onednn')
    local was = C.fl_meta_set_f32_gemm(true)
    local ma = fsdp.empty({ LM, LK }, { device = 'meta', dtype = 'bf16' })
    local mb = fsdp.empty({ LK, LN }, { device = 'meta', dtype = 'bf16' })
    fsdp.reset_memory_stats('meta')
    local ok, err = pcall(F.matmul, ma, mb)
    C.fl_meta_set_f32_gemm(was)
    assert(ok, err)
    local s = fsdp.memory_stats('meta')
    -- Below avx512_bf16 the bf16 product is converted: f32 copies of both
    -- operands and the f32 result (oneDNN's f32 product then writes f32,
    -- in pieces straight into that result).
    assert.equals(dnn_bf16 and LM * LN * 4 or (LM * LK + LK * LN + LM * LN) * 4, s.peak - s.in_use)
  end)

  -- [Note: oneDNN's two matmul kernels] (core/cpu/cpu_onednn.c): a
  -- vocabulary head's weight gradient over few tokens, and (where OpenBLAS
  -- is narrow, so oneDNN takes f32 NN products) an f32 input gradient of
  -- few rows against a B of 4 MB and more, run on oneDNN's packed GEMM;
  -- the others on brgemm. Below avx512_bf16 a bf16 product reaches oneDNN
  -- only converted, as the f32 product of its layout ([Note: the bf16
  -- routes], core/cpu/cpu_matmul.c): x W^T at every level, the others
  -- where OpenBLAS is narrow. Which kernel ran, and on which dtype, is read
  -- from oneDNN's own log (ONEDNN_VERBOSE, in a child process: it is read
  -- when oneDNN loads).
  local head_tn = { 'bf16 TN of a head', function(d) return randn({ 256, 4096 }, 1, d):t(), randn({ 256, 64 }, 2, d) end }
  local blocks_tn = { 'bf16 TN of blocks', function(d) return randn({ 256, 768 }, 1, d):t(), randn({ 256, 768 }, 2, d) end }
  local forward_nt = { 'x W^T', function(d) return randn({ 256, 768 }, 1, d), randn({ 768, 768 }, 2, d):t() end }
  local few_rows = { 'f32 NN of few rows', function(d) return randn({ 64, 1024 }, 1, d), randn({ 1024, 1024 }, 2, d) end }
  -- The source of a fresh operand shaped and laid out as t.
  local function operand_code(t, dtype)
    local shape = t:is_contiguous() and t.shape or { t.shape[2], t.shape[1] }
    return ("f.randn({%s}, { dtype = '%s' })%s"):format(table.concat(shape, ', '), dtype,
      t:is_contiguous() and '' or ':t()')
  end
  it('run each product on the oneDNN kernel and in the dtype their rule gives at the ' .. fsdp.cpu_isa().level ..
     ' level, and agree', function()
    -- { case, operands' dtype, kernel (prefix; nil: any but a reference
    -- loop), the dtype oneDNN reads }
    local chosen
    if dnn_bf16 then
      chosen = { { head_tn, 'bf16', 'gemm:jit', 'bf16' }, { blocks_tn, 'bf16', 'brg:', 'bf16' },
                 { forward_nt, 'bf16', 'brg:', 'bf16' } }
    else
      chosen = { { forward_nt, 'bf16', nil, 'f32' } }
      if narrow then
        chosen[#chosen + 1] = { head_tn, 'bf16', 'gemm:jit', 'f32' }
        chosen[#chosen + 1] = { blocks_tn, 'bf16', 'brg:', 'f32' }
      end
    end
    if narrow then
      chosen[#chosen + 1] = { head_tn, 'f32', 'gemm:jit', 'f32' }
      chosen[#chosen + 1] = { few_rows, 'f32', 'gemm:jit', 'f32' }
    end
    for _, c in ipairs(chosen) do
      local case, dtype, kernel, read = c[1], c[2], c[3], c[4]
      local what = case[1] .. ' ' .. dtype
      local a, b = case[2](dtype)
      local want = on('openblas', function() return F.matmul(a, b) end)
      local got = on('onednn', function() return F.matmul(a, b) end)
      if dtype == 'bf16' then assert_bf16_close(got, want, what) else assert_f32_close(got, want, what) end
      local code = ("local f = require 'fsdp'; f.cpu_gemm_use('onednn'); f.F.matmul(%s, %s)"):format(
        operand_code(a, dtype), operand_code(b, dtype))
      local p = assert(io.popen(('ONEDNN_VERBOSE=1 %q -e %q 2>&1'):format(require('fsdp.host').exe, code)))
      local out = p:read('*a')
      p:close()
      local ran, src = out:match('onednn_verbose,exec,cpu,matmul,([^,]+),[^,]*,src_(%w+)')
      assert.is_truthy(ran, what .. ': no oneDNN product in\n' .. out)
      assert.equals(read, src, what .. ': the dtype oneDNN read')
      if kernel then assert.equals(kernel, ran:sub(1, #kernel), what) end
      assert.is_true(ran:sub(1, 3) ~= 'ref', what .. ': ' .. ran)
    end
  end)

  -- [Note: the bf16 routes]: a 16-bit product oneDNN does not read as it
  -- is (every one below avx512_bf16, f16 always, and every one on
  -- OpenBLAS alone) is its operands' f32 product on the route an f32
  -- product of that layout takes, rounded once: bit for bit the f32
  -- product of the same values, rounded.
  local function rounded_cases(half)
    local function r(shape, seed, d) return randn(shape, seed, half):to(d) end
    local L = 2 * K
    return {
      { 'NN', function(d) return r({ M, L }, 1, d), r({ L, N }, 2, d) end },
      { 'NT', function(d) return r({ M, L }, 1, d), r({ N, L }, 2, d):t() end },
      { 'TN', function(d) return r({ L, M }, 1, d):t(), r({ L, N }, 2, d) end },
      { 'TT', function(d) return r({ L, M }, 1, d):t(), r({ N, L }, 2, d):t() end },
      { 'a batch times one matrix (folded rows)', function(d) return r({ 3, M, L }, 1, d), r({ L, N }, 2, d) end },
      { 'broadcast batch dims', function(d) return r({ 2, 1, M, L }, 1, d), r({ 1, 3, L, N }, 2, d) end },
      { 'a strided operand', function(d) return r({ M, 2 * L }, 1, d):slice(1, 0, nil, 2), r({ L, N }, 2, d) end },
      { 'a long sum (in pieces on oneDNN)', function(d) return r({ 512, 16384 }, 1, d), r({ 16384, N }, 2, d) end },
      { 'linear with a bias', function(d) return r({ 2, 64, L }, 1, d), r({ N, L }, 2, d), r({ N }, 3, d) end, true },
    }
  end
  for _, library in ipairs({ 'openblas', 'onednn' }) do
    for _, half in ipairs({ 'bf16', 'f16' }) do
      local applies = library == 'openblas' or half == 'f16' or not dnn_bf16
      local test = applies and it or function(name)
        pending(name .. ': at the ' .. fsdp.cpu_isa().level .. ' level oneDNN reads bf16 as it is')
      end
      test(('compute %s products on %s as their f32 product on the f32 route, rounded once'):format(half, library),
        function()
          fsdp.cpu_gemm_use(library)
          for _, case in ipairs(rounded_cases(half)) do
            local a, b, bias = case[2](half)
            local a32, b32, bias32 = case[2]('f32')
            local got = case[3] and F.linear(a, b, bias) or F.matmul(a, b)
            local want = (case[3] and F.linear(a32, b32, bias32) or F.matmul(a32, b32)):to(half)
            assert.equals(half, got.dtype)
            assert.equals(0, T.max_abs_diff(got, want), half .. ' ' .. case[1])
          end
        end)
    end
  end

  it('agree on f32 x W^T products (oneDNN) within f32 rounding, and differ in bits', function()
    -- 512 terms: oneDNN splits them in blocks where OpenBLAS sums them in
    -- one run (at 256 both sum in the same order, bit for bit).
    local a, b = randn({ M, 2 * K }, 1, 'f32'), randn({ N, 2 * K }, 2, 'f32'):t()
    local want = on('openblas', function() return F.matmul(a, b) end)
    local got = on('onednn', function() return F.matmul(a, b) end)
    assert.equals('f32', got.dtype)
    -- The other order shows in some of the 8192 sums: oneDNN ran.
    assert.is_true(assert_f32_close(got, want, 'NT') > 0, 'NT: bit for bit, so oneDNN did not run')
  end)

  it('agree on an f32 linear: forward on oneDNN, gradients on OpenBLAS bit for bit' ..
     (narrow and ' (here on oneDNN: OpenBLAS runs narrow kernels)' or ''), function()
    local function run(library)
      fsdp.cpu_gemm_use(library)
      local x = randn({ 4, 64, K }, 1, 'f32'):requires_grad_()
      local w = randn({ 2 * K, K }, 2, 'f32'):requires_grad_()
      local bias = randn({ 2 * K }, 3, 'f32'):requires_grad_()
      local y = F.linear(x, w, bias)
      y:backward(randn({ 4, 64, 2 * K }, 11, 'f32'))
      return { y = y, x = x.grad, w = w.grad, b = bias.grad }
    end
    local want, got = run('openblas'), run('onednn')
    assert_f32_close(got.y, want.y, 'linear forward')
    -- dx = dy W (NN) and dW = dy^T x (TN) stay on OpenBLAS, unless its
    -- kernels are narrow; the bias gradient is row sums, no product.
    for _, name in ipairs({ 'x', 'w' }) do
      if narrow then
        assert.is_true(assert_f32_close(got[name], want[name], 'gradient of ' .. name) > 0,
          'gradient of ' .. name .. ': bit for bit, so oneDNN did not run')
      else
        assert.equals(0, T.max_abs_diff(got[name], want[name]), 'gradient of ' .. name)
      end
    end
    assert.equals(0, T.max_abs_diff(got.b, want.b), 'gradient of b')
  end)

  -- (16-bit products below the avx512_bf16 level take these f32 routes:
  -- see 'compute ... as their f32 product on the f32 route' above.)
  it(narrow and 'run f32 NN, TN and TT products too, as OpenBLAS runs narrow kernels'
             or 'leave f32 NN, TN and TT products on OpenBLAS, bit for bit', function()
    -- 512 terms, where oneDNN's order would show (see above).
    local L = 2 * K
    local cases = {
      { 'f32', 'NN', function(d) return randn({ M, L }, 1, d), randn({ L, N }, 2, d) end },
      { 'f32', 'TN', function(d) return randn({ L, M }, 1, d):t(), randn({ L, N }, 2, d) end },
      { 'f32', 'TT', function(d) return randn({ L, M }, 1, d):t(), randn({ N, L }, 2, d):t() end },
    }
    for _, case in ipairs(cases) do
      local a, b = case[3](case[1])
      local want = on('openblas', function() return F.matmul(a, b) end)
      local got = on('onednn', function() return F.matmul(a, b) end)
      local what = case[1] .. ' ' .. case[2]
      if narrow then
        assert.is_true(assert_f32_close(got, want, what) > 0, what .. ': bit for bit, so oneDNN did not run')
      else
        assert.equals(0, T.max_abs_diff(got, want), what)
      end
    end
  end)

end)

describe('MKL', function()
  if not mkl_available then
    pending('MKL is not available here, its comparisons were skipped: ' .. reason(mkl_why))
    return
  end
  after_each(restore)
  local M, L, N = 128, 1024, 64 -- 1024 terms: MKL's order shows there (8 * 2^20 multiply-adds)
  local function f32(shape, seed) return randn(shape, seed, 'f32') end

  it('names MKL and its version when it runs the f32 products', function()
    fsdp.cpu_gemm_use('mkl')
    local text = fsdp.cpu_gemm_library()
    assert.truthy(text:match('^MKL %d+%.%d+%.%d+ %(the other f32 products with B untransposed'), text)
    assert.truthy(text:match("oneDNN: not chosen %('mkl'%)%)$"), text)
  end)

  for _, case in ipairs({
    { 'NN', function() return f32({ M, L }, 1), f32({ L, N }, 2) end },
    { 'TN', function() return f32({ L, M }, 1):t(), f32({ L, N }, 2) end },
    { 'a batch times one matrix (folded rows)', function() return f32({ 3, M, L }, 1), f32({ L, N }, 2) end },
  }) do
    it('agree on f32 ' .. case[1] .. ' products within f32 rounding, and differ in bits', function()
      local a, b = case[2]()
      local want = on('openblas', function() return F.matmul(a, b) end)
      local got = on('mkl', function() return F.matmul(a, b) end)
      assert.is_true(assert_f32_close(got, want, case[1]) > 0, case[1] .. ': bit for bit, so MKL did not run')
    end)
  end

  it('leave products with B transposed and small ones to OpenBLAS, bit for bit', function()
    local cases = {
      { 'f32 NT', f32({ M, L }, 1), f32({ N, L }, 2):t() },
      { 'f32 TT', f32({ L, M }, 1):t(), f32({ N, L }, 2):t() },
      { 'f32 NN of 2^18 multiply-adds', f32({ 64, 64 }, 1), f32({ 64, 64 }, 2) },
    }
    for _, case in ipairs(cases) do
      local want = on('openblas', function() return F.matmul(case[2], case[3]) end)
      local got = on('mkl', function() return F.matmul(case[2], case[3]) end)
      assert.equals(0, T.max_abs_diff(got, want), case[1])
    end
  end)

  it('run an f32 linear: the gradients on MKL, and with auto the forward on oneDNN', function()
    local function run(library)
      fsdp.cpu_gemm_use(library)
      local x = f32({ 4, 64, 256 }, 1):requires_grad_()
      local w = f32({ L, 256 }, 2):requires_grad_()
      local bias = f32({ L }, 3):requires_grad_()
      local y = F.linear(x, w, bias)
      y:backward(f32({ 4, 64, L }, 11))
      return { y = y, x = x.grad, w = w.grad, b = bias.grad }
    end
    local want, got = run('openblas'), run('mkl')
    -- The forward's x W^T stays on OpenBLAS under 'mkl'.
    assert.equals(0, T.max_abs_diff(got.y, want.y), 'forward')
    assert_f32_close(got.x, want.x, 'dx = dy W (NN)')
    assert_f32_close(got.w, want.w, 'dW = dy^T x (TN)')
    assert.equals(0, T.max_abs_diff(got.b, want.b), 'bias gradient (row sums)')
    if dnn_available then
      local auto, dnn = run('auto'), run('onednn')
      assert.equals(0, T.max_abs_diff(auto.y, dnn.y), 'auto: forward as on oneDNN')
      -- oneDNN takes them first where OpenBLAS runs narrow kernels.
      local grads = narrow and dnn or got
      assert.equals(0, T.max_abs_diff(auto.x, grads.x), 'auto: dx as on ' .. (narrow and 'oneDNN' or 'MKL'))
      assert.equals(0, T.max_abs_diff(auto.w, grads.w), 'auto: dW as on ' .. (narrow and 'oneDNN' or 'MKL'))
    end
  end)
end)
