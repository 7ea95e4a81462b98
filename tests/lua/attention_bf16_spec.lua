-- attention_bf16_spec.lua: bf16 attention on AMX tiles and on AVX512-BF16
-- dot products ([Note: bf16 attention kernels],
-- core/cpu/cpu_attention_native.c) against the f32 kernels on the same
-- bf16 inputs, in one process (fsdp.cpu_attention_use). Outputs and the
-- three gradients must agree within bf16 rounding: the bf16 kernels round
-- the probabilities (and dS) to bf16 before their products, as
-- FlashAttention does, the f32 kernels do not. Shapes cover causal and
-- full attention, grouped-query heads, query and key lengths that are not
-- multiples of a tile, head dims 32, 64 and 128 with Dv != D, strided q,
-- k, v (the models' transposed views) and single rows. Calls the bf16
-- kernels decline (a bias, f16, a head dim not a multiple of 32) must come
-- out bit for bit as on the f32 kernels. Each kernel the CPU lacks is
-- reported as skipped, with the reason.
local fsdp = require 'fsdp'
local T = require 'fsdp.testing'
local F = require 'fsdp.functional'
local ffi = require 'ffi'

ffi.cdef [[
void omp_set_num_threads(int n);
int omp_get_max_threads(void);
]]

-- Each bf16 kernel, and whether this CPU runs it (or why not).
local KERNELS = { { 'amx', 'AMX bf16 tiles' }, { 'avx512_bf16', 'AVX512-BF16 dot products' } }
for _, k in ipairs(KERNELS) do
  k.available, k.why = pcall(fsdp.cpu_attention_use, k[1])
end
fsdp.cpu_attention_use('auto')
local initial = fsdp.cpu_attention_kernel()
local function restore() fsdp.cpu_attention_use('auto') end

-- o, dq, dk, dv of attention on `kernel`, as f64.
local function run(kernel, q, k, v, g, opts)
  fsdp.cpu_attention_use(kernel)
  local qq, kk, vv = q:detach():requires_grad_(), k:detach():requires_grad_(), v:detach():requires_grad_()
  local o = F.scaled_dot_product_attention(qq, kk, vv, opts)
  o:backward(g)
  return { o:to('f64'), qq.grad:to('f64'), kk.grad:to('f64'), vv.grad:to('f64') }
end

local NAMES = { 'out', 'dq', 'dk', 'dv' }

-- got within bf16 rounding of want: one bf16 step (2^-8) of each element,
-- plus 2^-7 of the largest for the sums whose terms were rounded.
local function assert_close(got, want, what)
  local scale = want:abs():max():item()
  local worst = ((got - want):abs() - want:abs() * 2^-8):max():item()
  assert.is_true(worst <= scale * 2^-7,
    ('%s: differs by %.3g beyond bf16 rounding (largest value %.3g)'):format(what, worst, scale))
end

local function inputs(B, Hq, Hkv, Tq, Tk, D, Dv, dtype)
  dtype = dtype or 'bf16'
  return fsdp.randn({ B, Hq, Tq, D }, { seed = 1 }):to(dtype),
         fsdp.randn({ B, Hkv, Tk, D }, { seed = 2 }):to(dtype),
         fsdp.randn({ B, Hkv, Tk, Dv }, { seed = 3 }):to(dtype),
         fsdp.randn({ B, Hq, Tq, Dv }, { seed = 4 }):to(dtype)
end

describe('CPU attention kernels', function()
  it('reject an unknown kernel by name', function()
    T.raises(function() fsdp.cpu_attention_use('flash') end,
      "unknown kernel 'flash' (known: auto, amx, avx512_bf16, f32)")
  end)

  it('say which kernel runs, and why not the better ones', function()
    fsdp.cpu_attention_use('f32')
    local text = fsdp.cpu_attention_kernel()
    restore()
    assert.truthy(text:match("^f32 blocks %(cpu_attention_use%('f32'%); AMX: .+; AVX512%-BF16: .+%)$"), text)
  end)

  it('take the best kernel the CPU offers by default', function()
    local want = KERNELS[1].available and 'AMX bf16 tiles' or KERNELS[2].available and 'AVX512-BF16 dot products' or 'f32 blocks'
    assert.equal(want, initial:sub(1, #want))
    assert.equal(initial, fsdp.cpu_attention_kernel())
  end)

  it('refuse a kernel the CPU (or the ISA level in force) lacks, naming what is missing', function()
    for _, k in ipairs(KERNELS) do
      if not k.available then
        assert.truthy(tostring(k.why):match("'" .. k[1] .. "' is not available: the CPU has no") or
                      tostring(k.why):match("'" .. k[1] .. "' is not available: the kernel refused") or
                      tostring(k.why):match("'" .. k[1] .. "' is not available: FSDP_CPU_ISA=" ..
                                            fsdp.cpu_isa().level .. " caps it"), k.why)
      end
    end
    assert.equal(initial, fsdp.cpu_attention_kernel())
  end)

  it('keep the choice made at start when the first request is refused', function()
    -- In a fresh process, so that the refusals are its first calls: a
    -- kernel the CPU lacks, a missing name, an unknown one. The kernel in
    -- use must stay the default one (the text before its first '(').
    local calls = { "pcall(f.cpu_attention_use, nil)", "pcall(f.cpu_attention_use, 'flash')" }
    for _, k in ipairs(KERNELS) do
      if not k.available then table.insert(calls, 1, ("pcall(f.cpu_attention_use, '%s')"):format(k[1])) end
    end
    local code = "local f = require 'fsdp'; " .. table.concat(calls, '; ') .. "; io.write(f.cpu_attention_kernel())"
    local p = assert(io.popen(('%q -e %q 2>&1'):format(require('fsdp.host').exe, code)))
    local out = p:read('*a')
    p:close()
    assert.equal(initial:match('^[^(]*'), out:match('^[^(]*'), out)
    T.raises(function() fsdp.cpu_attention_use(nil) end, "unknown kernel '(null)'")
  end)
end)

for _, kernel in ipairs(KERNELS) do
describe('bf16 attention on ' .. kernel[2], function()
  if not kernel.available then
    pending(kernel[1] .. ' is not available here, its comparisons were skipped: ' ..
            tostring(kernel.why):gsub('^.-:%d+: ', ''))
    return
  end
  local name = kernel[1]
  after_each(restore)

  it('names the kernel when it runs', function()
    fsdp.cpu_attention_use(name)
    local text = fsdp.cpu_attention_kernel()
    restore()
    assert.equal(kernel[2], text:sub(1, #kernel[2]))
  end)

  -- B, Hq, Hkv, Tq, Tk, D, Dv, causal
  local cases = {
    { 2, 4, 2, 70, 70, 64, 64, true },     -- GQA, a partial last block
    { 2, 8, 8, 256, 256, 64, 64, true },   -- the small Llama's blocks
    { 1, 2, 2, 33, 50, 32, 64, false },    -- Tq < Tk, Dv > D
    { 1, 2, 1, 130, 97, 64, 32, false },   -- Tq > Tk, Dv < D
    { 1, 4, 1, 17, 17, 128, 128, true },   -- multi-query, head dim 128
    { 1, 2, 2, 40, 100, 64, 64, true },    -- causal with Tq < Tk (top-left)
    { 1, 1, 1, 1, 1, 32, 32, true },       -- one query, one key
  }
  for _, c in ipairs(cases) do
    local B, Hq, Hkv, Tq, Tk, D, Dv, causal = unpack(c)
    it(('agree with the f32 kernels: q [%d, %d, %d, %d], k [%d, %d, %d, %d], Dv %d, causal %s')
       :format(B, Hq, Tq, D, B, Hkv, Tk, D, Dv, tostring(causal)), function()
      local q, k, v, g = inputs(B, Hq, Hkv, Tq, Tk, D, Dv)
      local want = run('f32', q, k, v, g, { causal = causal })
      local got = run(name, q, k, v, g, { causal = causal })
      for i, name in ipairs(NAMES) do assert_close(got[i], want[i], name) end
    end)
  end

  it('take strided q, k, v (heads transposed out of [B, T, H, D])', function()
    local function bthd(seed, H) return fsdp.randn({ 2, 48, H, 64 }, { seed = seed }):to('bf16'):transpose(1, 2) end
    local q, k, v, g = bthd(1, 4), bthd(2, 2), bthd(3, 2), bthd(4, 4):contiguous()
    assert.is_false(q:is_contiguous())
    local want = run('f32', q, k, v, g, { causal = true })
    local got = run(name, q, k, v, g, { causal = true })
    for i, name in ipairs(NAMES) do assert_close(got[i], want[i], name) end
  end)

  it('run on it (results not bit for bit the f32 kernels)', function()
    local q, k, v, g = inputs(1, 2, 2, 64, 64, 64, 64)
    local want = run('f32', q, k, v, g, { causal = true })
    local got = run(name, q, k, v, g, { causal = true })
    assert.is_true((got[1] - want[1]):abs():max():item() > 0)
  end)

  it('give the same results on one thread and on several', function()
    local q, k, v, g = inputs(2, 4, 2, 96, 96, 64, 64)
    local many = run(name, q, k, v, g, { causal = true })
    local threads = ffi.C.omp_get_max_threads()
    ffi.C.omp_set_num_threads(1)
    local ok, one = pcall(run, name, q, k, v, g, { causal = true })
    ffi.C.omp_set_num_threads(threads)
    assert(ok, one)
    for i, name in ipairs(NAMES) do
      assert.equal(0, (one[i] - many[i]):abs():max():item(), name)
    end
  end)

  -- What the bf16 kernels decline runs the f32 kernels, bit for bit.
  local declined = {
    { 'a bias', function()
      local q, k, v, g = inputs(1, 2, 2, 40, 40, 64, 64)
      return q, k, v, g, { bias = fsdp.randn({ 1, 2, 40, 40 }, { seed = 5 }):to('bf16') }
    end },
    { 'f16', function()
      local q, k, v, g = inputs(1, 2, 2, 40, 40, 64, 64, 'f16')
      return q, k, v, g, { causal = true }
    end },
    { 'head dim 48', function()
      local q, k, v, g = inputs(1, 2, 2, 40, 40, 48, 48)
      return q, k, v, g, { causal = true }
    end },
  }
  for _, d in ipairs(declined) do
    it('leave ' .. d[1] .. ' to the f32 kernels', function()
      local q, k, v, g, opts = d[2]()
      local want = run('f32', q, k, v, g, opts)
      local got = run(name, q, k, v, g, opts)
      for i, name in ipairs(NAMES) do
        assert.equal(0, (got[i] - want[i]):abs():max():item(), name)
      end
    end)
  end
end)
end
