-- benchmarks/gemm.lua: how close F.linear comes to the machine's sgemm.
--
--   build/bin/fsdp-lua benchmarks/gemm.lua [--reps=N] [--dtype=f32|bf16] [--model=gpt2|llama]
--
-- 1. Raw OpenBLAS sgemm (cblas_sgemm straight through the FFI, no
--    framework) at 1024^3 and at a GPT-2-like 256 x 3072 x 768.
-- 2. F.linear forward + backward (through autograd: dx, dW and db) on the
--    GPT-2-124M shapes at batch 4 x seq 64 (x is [256, in]): c_attn, the
--    attention projection, the MLP up and down projections, and the LM
--    head; or (--model=llama) the small Llama's of benchmarks/train_step.lua
--    at batch 4 x seq 256 (x is [1024, in]): a q/k/v/o projection, gate or
--    up, down, and the head. Each is compared with raw sgemm doing the same three products
--    (y = x W^T, dx = dy W, dW = dy^T x), so the ratio is the framework's
--    overhead: output allocation, bias, row sums, gradient accumulation.
-- 3. Section 2 once with every product on OpenBLAS (bf16 ones converted
--    to f32), then again for oneDNN and MKL where they are installed
--    (each taking what it takes, [Note: GEMM libraries],
--    core/cpu/cpu_gemm.c: oneDNN every large bf16 product from avx512_bf16 and the f32
--    forward's x W^T, MKL the other large f32 products), and with both.
-- Timings are the best of N repetitions (after a warm-up), in GFLOP/s
-- counting 2*m*n*k per product.
local fsdp = require 'fsdp'
local F = require 'fsdp.functional.linear'
local ffi = require 'ffi'

local opts = { reps = 5, dtype = 'f32', model = 'gpt2' }
for _, a in ipairs(arg or {}) do
  local k, v = a:match('^%-%-([%w_]+)=(.+)$')
  if not k or opts[k] == nil then
    error(('unknown option %s (expected --reps=N, --dtype=f32|bf16, --model=gpt2|llama)'):format(a), 0)
  end
  opts[k] = tonumber(v) or v
end

-- The products of each model: weight [out, in] and whether it has a bias,
-- for x of `rows` rows.
local MODELS = {
  gpt2 = { rows = 4 * 64, shapes = {
    { 'c_attn', 2304, 768, true },
    { 'attn.c_proj', 768, 768, true },
    { 'mlp.c_fc', 3072, 768, true },
    { 'mlp.c_proj', 768, 3072, true },
    { 'lm_head', 50257, 768, false },
  } },
  llama = { rows = 4 * 256, shapes = {
    { 'q/k/v/o_proj', 512, 512, false },
    { 'gate/up_proj', 1376, 512, false },
    { 'down_proj', 512, 1376, false },
    { 'lm_head', 32000, 512, false },
  } },
}
if not MODELS[opts.model] then error(('unknown model %s (expected gpt2 or llama)'):format(opts.model), 0) end

ffi.cdef [[
typedef struct { long tv_sec; long tv_nsec; } bench_timespec;
int clock_gettime(int clock, bench_timespec *ts);
void cblas_sgemm(int order, int transa, int transb, int m, int n, int k, float alpha,
                 const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc);
]]
local ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112
local ts = ffi.new('bench_timespec')
local function now()
  ffi.C.clock_gettime(1, ts) -- CLOCK_MONOTONIC
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

-- Best time of fn over opts.reps runs, after one warm-up.
local function best(fn)
  fn()
  local t = math.huge
  for _ = 1, opts.reps do
    collectgarbage()
    local t0 = now()
    fn()
    t = math.min(t, now() - t0)
  end
  return t
end

local function fptr(t) return ffi.cast('float *', t._c.data) end

-- C[m, n] = op(A) op(B) with raw cblas_sgemm on fresh f32 matrices.
local function sgemm_fn(m, n, k, ta, tb)
  local a = fsdp.randn(ta and { k, m } or { m, k }, { seed = 1 })
  local b = fsdp.randn(tb and { n, k } or { k, n }, { seed = 2 })
  local c = fsdp.empty(m, n)
  local pa, pb, pc = fptr(a), fptr(b), fptr(c)
  local lda, ldb = ta and m or k, tb and k or n
  return function()
    local _ = { a, b, c } -- the closure keeps the tensors (and their memory) alive
    ffi.C.cblas_sgemm(ROW_MAJOR, ta and TRANS or NO_TRANS, tb and TRANS or NO_TRANS, m, n, k, 1,
                      pa, lda, pb, ldb, 0, pc, n)
  end
end

local function gflops(flops, t) return flops / t / 1e9 end

print(('fsdp-lua %s, %s'):format(fsdp.version, fsdp.build_info))
print(('OMP_NUM_THREADS=%s OPENBLAS_NUM_THREADS=%s, best of %d'):format(
  os.getenv('OMP_NUM_THREADS') or '-', os.getenv('OPENBLAS_NUM_THREADS') or '-', opts.reps))
print()
print('raw sgemm (cblas_sgemm, f32)')
local sgemm_peak = 0
for _, s in ipairs({ { 1024, 1024, 1024 }, { 256, 3072, 768 } }) do
  local m, n, k = s[1], s[2], s[3]
  local g = gflops(2 * m * n * k, best(sgemm_fn(m, n, k, false, false)))
  sgemm_peak = math.max(sgemm_peak, g)
  print(('  %5d x %5d x %5d  %8.1f GFLOP/s'):format(m, n, k, g))
end

-- The libraries to compare: OpenBLAS alone, then each other one that
-- opens (with OpenBLAS for what it does not take), then all together.
local initial = fsdp.cpu_gemm_use('openblas')
local libraries = { 'openblas' }
for _, library in ipairs({ 'onednn', 'mkl' }) do
  if pcall(fsdp.cpu_gemm_use, library) then libraries[#libraries + 1] = library end
end
if #libraries > 2 then libraries[#libraries + 1] = 'auto' end
for _, library in ipairs(libraries) do
  if library then fsdp.cpu_gemm_use(library) end
  print()
  print(('F.linear forward + backward (%s), x [%d, in], vs raw sgemm of the same 3 products'):format(opts.dtype,
    MODELS[opts.model].rows))
  print('  products on: ' .. fsdp.cpu_gemm_library())
  print(('  %-22s %10s %10s %10s %8s %8s'):format('weight [out, in]', 'fwd GF/s', 'f+b GF/s', 'sgemm 3x', 'ratio', 'vs peak'))
  local rows, shapes = MODELS[opts.model].rows, MODELS[opts.model].shapes
  local total_flops, total_t, total_raw = 0, 0, 0
  for _, s in ipairs(shapes) do
    local name, out, inf, has_bias = s[1], s[2], s[3], s[4]
    local dt = opts.dtype
    local x = fsdp.randn({ rows, inf }, { seed = 3, dtype = dt }):requires_grad_()
    local w = fsdp.randn({ out, inf }, { seed = 4, std = 0.02, dtype = dt }):requires_grad_()
    local b = has_bias and fsdp.zeros(out, { dtype = dt }):requires_grad_() or nil
    local gy = fsdp.randn({ rows, out }, { seed = 5, dtype = dt })
    local prod = 2 * rows * out * inf
    local t_fwd = best(function() fsdp.no_grad(F.linear, x, w, b) end)
    local t_fb = best(function()
      x.grad, w.grad = nil, nil
      if b then b.grad = nil end
      F.linear(x, w, b):backward(gy)
    end)
    local raw = { sgemm_fn(rows, out, inf, false, true), sgemm_fn(rows, inf, out, false, false),
                  sgemm_fn(out, inf, rows, true, false) }
    local t_raw = best(function() raw[1](); raw[2](); raw[3]() end)
    local g_fb = gflops(3 * prod, t_fb)
    print(('  %-11s %5d x %5d %10.1f %10.1f %10.1f %7.0f%% %7.0f%%'):format(name, out, inf,
      gflops(prod, t_fwd), g_fb, gflops(3 * prod, t_raw), 100 * t_raw / t_fb, 100 * g_fb / sgemm_peak))
    total_flops, total_t, total_raw = total_flops + 3 * prod, total_t + t_fb, total_raw + t_raw
    x, w, b, gy, raw = nil, nil, nil, nil, nil
    collectgarbage()
  end
  print(('  %-23s %10s %10.1f %10.1f %7.0f%% %7.0f%%'):format('all', '', gflops(total_flops, total_t),
    gflops(total_flops, total_raw), 100 * total_raw / total_t, 100 * gflops(total_flops, total_t) / sgemm_peak))
end
fsdp.cpu_gemm_use(initial)
print()
print('ratio = raw sgemm time / F.linear time for the same products; vs peak = against the best raw sgemm above')
