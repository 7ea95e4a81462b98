-- attention_window_spec.lua: sliding-window causal masks and logit
-- softcapping in scaled_dot_product_attention ([Note: attention window and
-- softcap], core/ops/attention.c) against an f64 reference built here from
-- plain tensor ops (scores materialised, tanh, an explicit band mask),
-- forward and the q, k, v and bias gradients. Every kernel: the CPU's f64
-- and f32 blocks, its bf16 kernels (AMX tiles or AVX512-BF16 dot products,
-- whichever the ISA level in force runs; tests/isa/run.sh reruns this spec
-- capped), and on CUDA (a GPU, or the cudasim build) the flash-style kernels,
-- which must take every windowed or softcapped call that cuDNN would
-- otherwise get. Cases: grouped-query heads, Tq != Tk both ways (rows that
-- see no key give zeros), several query blocks, window >= T (no-op),
-- window 1, softcap with and without a window, a trained bias; meta shapes
-- and the FLOPs of the visible band; the refusals.
local fsdp = require 'fsdp'
local F = fsdp.F

-- max |got - want| over the largest |want|, floored at 0.1: window 1's dq
-- and dk are zero (a softmax over one key has no gradient) up to rounding.
local function normalised_error(got, want)
  local diff = (got - want):abs():max():item()
  return diff / math.max(want:abs():max():item(), 0.1)
end

local CUDA = fsdp.cuda.is_available()
local SIM = CUDA and fsdp.cuda.simulated()

-- The error each dtype's kernels may have against f64 (normalised by the
-- largest value): f64 exact to rounding, f32 blocks, bf16 inputs whose
-- kernels round the probabilities to bf16 as FlashAttention does.
local TOLERANCE = { f64 = 1e-10, f32 = 2e-5, bf16 = 2e-2 }

local function randn(shape, seed) return fsdp.randn(shape, { seed = seed, dtype = 'f64' }) end

-- Visible (query, key) pairs of [T, S] as a bool tensor: causal and window
-- as fsdp.h's fl_attention_options say.
local function visible(T, S, causal, window)
  local rows = fsdp.arange(T, { dtype = 'i64' }):view(T, 1)
  local cols = fsdp.arange(S, { dtype = 'i64' }):view(1, S)
  local vis = fsdp.ones({ T, S }, { dtype = 'bool' })
  if causal then vis = F.where(F.le(cols, rows), vis, false) end
  if window and window > 0 then vis = F.where(F.gt(cols, rows - window), vis, false) end
  return vis
end

-- The reference in f64 on the CPU: scores materialised; masked scores a
-- finite -1e300 and the probabilities times the mask, so a row that sees
-- no key gives zeros (and finite gradients) as the kernels do.
local function reference(q, k, v, bias, o)
  local B, H, T, D = q:size(0), q:size(1), q:size(2), q:size(3)
  local KV, S, Dv = k:size(1), k:size(2), v:size(3)
  local rep = H / KV
  local s = F.matmul(q:reshape(B, KV, rep, T, D), k:unsqueeze(2):transpose(3, 4)):view(B, H, T, S) * o.scale
  if o.softcap and o.softcap > 0 then s = F.tanh(s / o.softcap) * o.softcap end
  if bias then s = s + bias end
  local vis = visible(T, S, o.causal, o.window)
  local p = F.softmax(F.where(vis, s, -1e300), -1) * vis:to('f64')
  return F.matmul(p:view(B, KV, rep, T, S), v:unsqueeze(2)):view(B, H, T, Dv)
end

-- out, dq, dk, dv (and dbias) of fn on copies of xs in dtype on device,
-- as f64 on the CPU, with g as the output's gradient.
local function grads_of(fn, xs, g, dtype, device)
  local ins = {}
  for i, x in ipairs(xs) do ins[i] = x:to(dtype):to(device):detach():requires_grad_() end
  local out = fn(unpack(ins))
  out:backward(g:to(dtype):to(device))
  local r = { out:to('cpu'):to('f64') }
  for i, x in ipairs(ins) do r[i + 1] = x.grad:to('cpu'):to('f64') end
  return r
end

local NAMES = { 'out', 'dq', 'dk', 'dv', 'dbias' }

-- A case: shapes, options, and whether a trained bias [1, Hq, Tq, Tk] is added.
local function inputs(c)
  local xs = { randn({ c.B, c.Hq, c.Tq, c.D }, 1), randn({ c.B, c.Hkv, c.Tk, c.D }, 2),
               randn({ c.B, c.Hkv, c.Tk, c.Dv or c.D }, 3) }
  if c.bias then xs[4] = randn({ 1, c.Hq, c.Tq, c.Tk }, 4) end
  return xs, randn({ c.B, c.Hq, c.Tq, c.Dv or c.D }, 5)
end

local function opts_of(c)
  return { causal = c.causal, window = c.window, softcap = c.softcap, scale = c.scale or 1 / math.sqrt(c.D) }
end

-- Compares the op on dtype/device with the f64 reference on the same
-- (rounded) inputs.
local function check(c, dtype, device)
  local xs, g = inputs(c)
  local o = opts_of(c)
  -- the reference sees the inputs as the kernel does: rounded to dtype
  local rounded = {}
  for i, x in ipairs(xs) do rounded[i] = x:to(dtype):to('f64') end
  local want = grads_of(function(q, k, v, b) return reference(q, k, v, b, o) end, rounded,
    g:to(dtype):to('f64'), 'f64', 'cpu')
  local got = grads_of(function(q, k, v, b)
    return F.scaled_dot_product_attention(q, k, v, { causal = o.causal, window = o.window, softcap = o.softcap,
                                                     scale = o.scale, bias = b })
  end, xs, g, dtype, device)
  for i = 1, #want do
    local err = normalised_error(got[i], want[i])
    assert(err <= TOLERANCE[dtype], ('%s %s on %s: %s differs from the f64 reference by %.3g (tolerance %g)')
      :format(c.name, dtype, device, NAMES[i], err, TOLERANCE[dtype]))
  end
  return got
end

local CASES = {
  { name = 'window 16, GQA, several query blocks', B = 2, Hq = 4, Hkv = 2, Tq = 150, Tk = 150, D = 32,
    causal = true, window = 16 },
  { name = 'window 40 and softcap 5', B = 1, Hq = 4, Hkv = 2, Tq = 130, Tk = 130, D = 32, causal = true,
    window = 40, softcap = 5, scale = 1 },
  { name = 'softcap 3 without a window, not causal, trained bias, Dv != D', B = 2, Hq = 2, Hkv = 1, Tq = 70,
    Tk = 45, D = 32, Dv = 64, softcap = 3, scale = 0.5, bias = true },
  { name = 'window 8 with a causal bias and softcap, Tq < Tk', B = 1, Hq = 2, Hkv = 2, Tq = 40, Tk = 100, D = 32,
    causal = true, window = 8, softcap = 20, bias = true },
  { name = 'window 8, Tq > Tk (late rows see no key)', B = 1, Hq = 4, Hkv = 1, Tq = 100, Tk = 40, D = 32,
    causal = true, window = 8 },
  { name = 'window 1', B = 1, Hq = 2, Hkv = 1, Tq = 70, Tk = 70, D = 32, causal = true, window = 1 },
  { name = 'window >= T', B = 1, Hq = 2, Hkv = 2, Tq = 50, Tk = 50, D = 32, causal = true, window = 64 },
}

describe('attention with a sliding window and softcap on the CPU', function()
  for _, c in ipairs(CASES) do
    for _, dtype in ipairs({ 'f64', 'f32', 'bf16' }) do
      it(('%s in %s: forward and gradients against f64'):format(c.name, dtype), function()
        check(c, dtype, 'cpu')
      end)
    end
  end

  it('window >= T is plain causal attention, bit for bit, and window 1 returns each own value', function()
    local q, k, v = randn({ 1, 2, 50, 32 }, 1):to('f32'), randn({ 1, 2, 50, 32 }, 2):to('f32'),
                    randn({ 1, 2, 50, 32 }, 3):to('f32')
    local a = F.scaled_dot_product_attention(q, k, v, { causal = true, window = 50 })
    local b = F.scaled_dot_product_attention(q, k, v, { causal = true })
    assert.equals(0, (a - b):abs():max():item())
    local one = F.scaled_dot_product_attention(q, k, v, { causal = true, window = 1 })
    assert.equals(0, (one - v):abs():max():item())
  end)

  it('gives zeros (and zero dq) for rows that see no key', function()
    local q = randn({ 1, 1, 20, 32 }, 1):to('f32'):requires_grad_()
    local k, v = randn({ 1, 1, 6, 32 }, 2):to('f32'), randn({ 1, 1, 6, 32 }, 3):to('f32')
    local y = F.scaled_dot_product_attention(q, k, v, { causal = true, window = 3 })
    y:sum():backward()
    -- query i sees keys i - 2 ... min(i, 5): none from i = 8 on
    assert.equals(0, y:narrow(2, 8, 12):abs():max():item())
    assert.equals(0, q.grad:narrow(2, 8, 12):abs():max():item())
    assert.is_true(y:narrow(2, 7, 1):abs():max():item() > 0)
  end)

  it('runs on meta: shapes, and FLOPs of the visible band only', function()
    local m = { device = 'meta', dtype = 'bf16' }
    local q, k = fsdp.empty({ 2, 8, 1024, 64 }, m), fsdp.empty({ 2, 4, 1024, 64 }, m)
    local function flops(o)
      fsdp.reset_flops()
      local y = F.scaled_dot_product_attention(q, k, k, o)
      assert.same({ 2, 8, 1024, 64 }, y.shape)
      assert.equals('meta', y.device)
      return fsdp.flops()
    end
    local causal = flops({ causal = true })
    assert.equals(2 * 2 * 8 * 1024 * 1024 * 128 / 2, causal)
    -- window 256: rows 0 ... 255 see i + 1 keys, the other 768 rows 256
    local pairs = 256 * 257 / 2 + 768 * 256
    assert.equals(2 * 2 * 8 * pairs * 128, flops({ causal = true, window = 256 }))
    assert.equals(causal, flops({ causal = true, window = 1024 }))
    assert.equals(causal, flops({ causal = true, softcap = 50 }))
  end)

  it('refuses a window without causal, a negative or fractional window and a bad softcap, in one line', function()
    local q = randn({ 1, 1, 4, 8 }, 1)
    local function err(o)
      local ok, e = pcall(F.scaled_dot_product_attention, q, q, q, o)
      assert.is_false(ok)
      return tostring(e)
    end
    assert.truthy(err({ window = 4 }):find('scaled_dot_product_attention: window 4 needs causal attention', 1, true))
    assert.truthy(err({ causal = true, window = -1 }):find('window must be 0 (none) or a positive integer, got -1',
      1, true))
    assert.truthy(err({ causal = true, window = 2.5 }):find('got 2.5', 1, true))
    assert.truthy(err({ softcap = -1 }):find('softcap must be 0 (none) or positive and finite, got -1', 1, true))
    assert.truthy(err({ softcap = 1 / 0 }):find('softcap must be 0 (none) or positive and finite', 1, true))
  end)
end)

describe('attention with a sliding window and softcap on CUDA', function()
  if not CUDA then
    pending('no CUDA device here (' .. fsdp.cuda.status() .. ')')
    return
  end
  -- cudasim runs the kernels on the CPU: the smaller cases there
  local cases = SIM and { CASES[2], CASES[3], CASES[5], CASES[6] } or CASES
  for _, c in ipairs(cases) do
    for _, dtype in ipairs({ 'f64', 'f32' }) do
      it(('%s in %s: forward and gradients against f64'):format(c.name, dtype), function()
        check(c, dtype, 'cuda:0')
      end)
    end
  end

  -- bf16 goes to cuDNN where it is eligible (cuda_sdpa.cu); a window or a
  -- softcap must keep it on the flash-style kernels.
  it('takes windowed and softcapped bf16 calls off cuDNN, onto the kernels', function()
    local function paths(o)
      local before = fsdp.cuda.attention_paths()
      local q = fsdp.randn({ 1, 2, 128, 64 }, { seed = 1 }):to('bf16'):to('cuda:0'):requires_grad_()
      local y = F.scaled_dot_product_attention(q, q, q, o)
      y:sum():backward()
      local after, d = fsdp.cuda.attention_paths(), {}
      for name, n in pairs(after) do d[name] = n - before[name] end
      return d
    end
    for _, o in ipairs({ { causal = true, window = 16 }, { causal = true, softcap = 30 } }) do
      local d = paths(o)
      assert.equals(0, d.cudnn_forward)
      assert.equals(0, d.cudnn_backward)
      assert.equals(1, d.kernel_forward)
      assert.equals(1, d.kernel_backward)
    end
    check(CASES[2], 'bf16', 'cuda:0')
  end)
end)

describe('nn.Attention with a window and softcap', function()
  local nn = fsdp.nn

  local function layer(o)
    local a = nn.Attention(32, 4, { n_kv_heads = 2, window = o.window, softcap = o.softcap, dropout = o.dropout })
    for i, p in ipairs(a:parameters()) do p:copy_(fsdp.randn(p.shape, { seed = 10 + i }) * 0.3) end
    return a
  end

  local function x_of(T) return fsdp.randn({ 2, T, 32 }, { seed = 7 }) end

  -- The layer's output from its own projections through the fused op.
  local function by_hand(a, x, o)
    local q, k, v = a:project(x)
    local y = F.scaled_dot_product_attention(q, k, v, o)
    return a.o_proj(y:transpose(1, 2):reshape(x:size(0), x:size(1), 32))
  end

  it('stores window and softcap and passes them to the kernel', function()
    local a = layer({ window = 3, softcap = 2 })
    assert.equals(3, a.window)
    assert.equals(2, a.softcap)
    local x = x_of(12)
    local want = by_hand(a, x, { causal = true, window = 3, softcap = 2, scale = a.scale })
    assert.equals(0, (a(x) - want):abs():max():item())
    local plain = by_hand(a, x, { causal = true, scale = a.scale })
    assert.is_true((a(x) - plain):abs():max():item() > 1e-3)
  end)

  it('honours them on the dropout path that materialises the scores', function()
    local a = layer({ window = 3, softcap = 2, dropout = 1e-12 })
    a:train()
    local x = x_of(12)
    local want = by_hand(a, x, { causal = true, window = 3, softcap = 2, scale = a.scale })
    local err = (a(x) - want):abs():max():item()
    assert(err < 1e-5, ('the dropout path differs from the fused kernel by %g'):format(err))
  end)

  it('keeps the window when decoding with a kv cache (the mask carries it)', function()
    local a = layer({ window = 3, softcap = 2 })
    local x = x_of(9)
    local full = a(x)
    -- a cache as fsdp.generate's: keys and values appended, all returned
    local cache = { length = 0 }
    function cache:update(k, v)
      self.k = self.k and F.cat({ self.k, k }, 2) or k
      self.v = self.v and F.cat({ self.v, v }, 2) or v
      return self.k, self.v
    end
    -- a prompt of 5 (its causal mask given), then one token at a time
    local mask = visible(5, 5, true)
    local got = { a(x:narrow(1, 0, 5), { kv_cache = cache, mask = mask }) }
    for t = 5, 8 do got[#got + 1] = a(x:narrow(1, t, 1), { kv_cache = cache }) end
    local err = (F.cat(got, 1) - full):abs():max():item()
    assert(err < 1e-5, ('cached decoding differs from the full sequence by %g'):format(err))
  end)

  it('refuses a window without causal and a bad window or softcap', function()
    local function err(o)
      local ok, e = pcall(nn.Attention, 32, 4, o)
      assert.is_false(ok)
      return tostring(e)
    end
    assert.truthy(err({ window = 4, causal = false }):find('Attention: window 4 needs causal attention', 1, true))
    assert.truthy(err({ window = 1.5 }):find('Attention: window must be 0 (none) or a positive integer', 1, true))
    assert.truthy(err({ softcap = -2 }):find('Attention: softcap must be 0 (none) or a positive number', 1, true))
    assert.truthy(err({ softcap = 0 / 0 }):find('Attention: softcap must be', 1, true))
  end)
end)
