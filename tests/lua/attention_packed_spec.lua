-- attention_packed_spec.lua: packed sequences in scaled_dot_product_attention
-- ([Note: packed sequences], core/ops/attention.c): segments [B, T] confine
-- each query to the keys of its own document (a run of equal ids; negative
-- ids padding), checked against an f64 reference built here from plain
-- tensor ops with the block-diagonal causal mask materialised, forward and
-- the q, k, v gradients. Every kernel: the CPU's f64 and f32 blocks, its
-- bf16 kernels (AMX tiles or AVX512-BF16 dot products, whichever the ISA
-- level in force runs; tests/isa/run.sh reruns this spec capped), and on
-- CUDA (a GPU, or the cudasim build) the flash-style kernels, which must
-- take every packed call. Cases: grouped-query heads, documents of one
-- token, documents across the kernels' block boundaries (32, 64), tail
-- padding and a row all padding, a repeated id in two runs (two
-- documents), window and softcap with documents; each document alone
-- gives the same result as packed; meta shapes, FLOPs of the documents'
-- triangles; the refusals.
local fsdp = require 'fsdp'
local F = fsdp.F

local function normalised_error(got, want)
  local diff = (got - want):abs():max():item()
  return diff / math.max(want:abs():max():item(), 0.1)
end

local CUDA = fsdp.cuda.is_available()
local SIM = CUDA and fsdp.cuda.simulated()

local TOLERANCE = { f64 = 1e-10, f32 = 2e-5, bf16 = 2e-2 }

local function randn(shape, seed) return fsdp.randn(shape, { seed = seed, dtype = 'f64' }) end

-- Segment ids of a row from document lengths (ids 0, 1, ...), then `pad`
-- ids -1; `ids` overrides the id of each document (a repeated id).
local function row_of(lengths, pad, ids)
  local r = {}
  for d, n in ipairs(lengths) do
    for _ = 1, n do r[#r + 1] = ids and ids[d] or d - 1 end
  end
  for _ = 1, pad or 0 do r[#r + 1] = -1 end
  return r
end

-- The documents of a row as fsdp.h defines them: runs of equal
-- non-negative ids, numbered; -1 for padding (plain Lua: the reference's
-- own reading of the rule, on a few hundred ids).
local function runs_of(row)
  local out, n = {}, -1
  for i, id in ipairs(row) do
    if id < 0 then
      out[i] = -1
    else
      if i == 1 or row[i - 1] ~= id then n = n + 1 end
      out[i] = n
    end
  end
  return out
end

-- Visible (query, key) pairs [B, 1, T, T] as a bool tensor: one document,
-- causal, not padding, and the window.
local function visible(rows, window)
  local B, T = #rows, #rows[1]
  local runs = {}
  for b = 1, B do runs[b] = runs_of(rows[b]) end
  local doc = fsdp.tensor(runs, { dtype = 'i64' })
  local same = F.eq(doc:view(B, 1, T, 1), doc:view(B, 1, 1, T))
  local real = F.ge(doc:view(B, 1, T, 1), 0)
  local i = fsdp.arange(T, { dtype = 'i64' }):view(1, 1, T, 1)
  local j = fsdp.arange(T, { dtype = 'i64' }):view(1, 1, 1, T)
  local vis = F.where(F.where(same, real, false), F.le(j, i), false)
  if window and window > 0 then vis = F.where(vis, F.gt(j, i - window), false) end
  return vis
end

-- The f64 reference: scores materialised, the mask applied explicitly;
-- masked rows give zeros (and finite gradients) as the kernels do.
local function reference(q, k, v, o, vis)
  local B, H, T, D = q:size(0), q:size(1), q:size(2), q:size(3)
  local KV, Dv = k:size(1), v:size(3)
  local rep = H / KV
  local s = F.matmul(q:reshape(B, KV, rep, T, D), k:unsqueeze(2):transpose(3, 4)):view(B, H, T, T) * o.scale
  if o.softcap and o.softcap > 0 then s = F.tanh(s / o.softcap) * o.softcap end
  local p = F.softmax(F.where(vis, s, -1e300), -1) * vis:to('f64')
  return F.matmul(p:view(B, KV, rep, T, T), v:unsqueeze(2)):view(B, H, T, Dv)
end

local function grads_of(fn, xs, g, dtype, device)
  local ins = {}
  for i, x in ipairs(xs) do ins[i] = x:to(dtype):to(device):detach():requires_grad_() end
  local out = fn(unpack(ins))
  out:backward(g:to(dtype):to(device))
  local r = { out:to('cpu'):to('f64') }
  for i, x in ipairs(ins) do r[i + 1] = x.grad:to('cpu'):to('f64') end
  return r
end

local NAMES = { 'out', 'dq', 'dk', 'dv' }

local function inputs(c)
  local B, T = #c.rows, #c.rows[1]
  local xs = { randn({ B, c.Hq, T, c.D }, 1), randn({ B, c.Hkv, T, c.D }, 2), randn({ B, c.Hkv, T, c.D }, 3) }
  return xs, randn({ B, c.Hq, T, c.D }, 5)
end

local function opts_of(c, segments)
  return { causal = true, window = c.window, softcap = c.softcap, scale = 1 / math.sqrt(c.D), segments = segments }
end

-- The op on dtype/device against the reference on the same rounded inputs;
-- returns the op's out and gradients (f64 on the CPU).
local function check(c, dtype, device, seg_dtype)
  local xs, g = inputs(c)
  local o = opts_of(c)
  local rounded = {}
  for i, x in ipairs(xs) do rounded[i] = x:to(dtype):to('f64') end
  local vis = visible(c.rows, c.window)
  local want = grads_of(function(q, k, v) return reference(q, k, v, o, vis) end, rounded, g:to(dtype):to('f64'),
    'f64', 'cpu')
  local segments = fsdp.tensor(c.rows, { dtype = seg_dtype or 'i64' }):to(device)
  local got = grads_of(function(q, k, v)
    return F.scaled_dot_product_attention(q, k, v, opts_of(c, segments))
  end, xs, g, dtype, device)
  for i = 1, #want do
    local err = normalised_error(got[i], want[i])
    assert(err <= TOLERANCE[dtype], ('%s %s on %s: %s differs from the f64 reference by %.3g (tolerance %g)')
      :format(c.name, dtype, device, NAMES[i], err, TOLERANCE[dtype]))
  end
  return got
end

-- Rows of 150 tokens: documents across the 32- and 64-row block edges,
-- documents of one token, tail padding, a row of padding only.
local ROWS = {
  row_of({ 40, 1, 30, 1, 1, 60 }, 17),           -- 40+1+30+1+1+60 = 133, then 17 padding
  row_of({ 63, 2, 70, 15 }),                      -- one document from 63 to 64 (a block edge)
  row_of({}, 150),                                -- all padding
}

local CASES = {
  { name = 'documents, GQA, tail padding, a row of padding', rows = ROWS, Hq = 4, Hkv = 2, D = 32 },
  { name = 'documents with window 16 and softcap 5', rows = { ROWS[1], ROWS[2] }, Hq = 4, Hkv = 1, D = 32,
    window = 16, softcap = 5 },
  { name = 'an id repeated in two runs is two documents', rows = { row_of({ 20, 30, 25, 25 }, 0, { 3, 7, 3, 3 }) },
    Hq = 2, Hkv = 2, D = 64 },
  { name = 'one document of the whole row', rows = { row_of({ 100 }) }, Hq = 2, Hkv = 1, D = 32 },
}

describe('packed attention (segments) on the CPU', function()
  for _, c in ipairs(CASES) do
    for _, dtype in ipairs({ 'f64', 'f32', 'bf16' }) do
      it(('%s in %s: forward and gradients against f64'):format(c.name, dtype), function()
        check(c, dtype, 'cpu')
      end)
    end
  end

  it('takes i32 segments as i64', function()
    local a = check(CASES[2], 'f32', 'cpu', 'i32')
    local b = check(CASES[2], 'f32', 'cpu', 'i64')
    for i = 1, #a do assert.equals(0, (a[i] - b[i]):abs():max():item()) end
  end)

  it('gives exact zeros and zero gradients for padding, and each document as if alone', function()
    for _, dtype in ipairs({ 'f32', 'bf16' }) do
      local xs, g = inputs(CASES[1])
      local seg = fsdp.tensor(ROWS, { dtype = 'i64' })
      local got = grads_of(function(q, k, v)
        return F.scaled_dot_product_attention(q, k, v, opts_of(CASES[1], seg))
      end, xs, g, dtype, 'cpu')
      -- row 0's tail padding (tokens 133 ...) and row 2: out and every gradient zero
      for i = 1, 4 do
        assert.equals(0, got[i]:select(0, 0):narrow(1, 133, 17):abs():max():item())
        assert.equals(0, got[i]:select(0, 2):abs():max():item())
      end
      -- document 2 of row 0 (tokens 41 ... 70) run alone, without segments
      local alone = grads_of(function(q, k, v)
        return F.scaled_dot_product_attention(q, k, v, { causal = true, scale = 1 / math.sqrt(32) })
      end, { xs[1]:narrow(0, 0, 1):narrow(2, 41, 30), xs[2]:narrow(0, 0, 1):narrow(2, 41, 30),
             xs[3]:narrow(0, 0, 1):narrow(2, 41, 30) }, g:narrow(0, 0, 1):narrow(2, 41, 30), dtype, 'cpu')
      for i = 1, 4 do
        local packed = got[i]:narrow(0, 0, 1):narrow(2, 41, 30)
        local err = normalised_error(packed, alone[i])
        assert(err <= (dtype == 'bf16' and 1e-2 or 1e-6), ('%s: %s of a document packed and alone differ by %g')
          :format(dtype, NAMES[i], err))
      end
    end
  end)

  it('runs on meta with the causal bound, and counts the documents\' triangles on the CPU', function()
    local m = { device = 'meta', dtype = 'bf16' }
    local q = fsdp.empty({ 2, 8, 1024, 64 }, m)
    local seg = fsdp.empty({ 2, 1024 }, { device = 'meta', dtype = 'i64' })
    fsdp.reset_flops()
    local y = F.scaled_dot_product_attention(q, q, q, { causal = true, segments = seg })
    assert.same({ 2, 8, 1024, 64 }, y.shape)
    assert.equals('meta', y.device)
    assert.equals(2 * 2 * 8 * 1024 * 1024 * 128 / 2, fsdp.flops())
    -- CPU: row 0 documents of 40, 1, 30, 1, 1, 60 and 17 padding; row 1 of 63, 2, 70, 15; row 2 padding;
    -- a document of n tokens counts n * n / 2 pairs (the causal convention of unpacked calls)
    local function tri(n) return n * n / 2 end
    local pairs = tri(40) + tri(1) + tri(30) + tri(1) + tri(1) + tri(60) + tri(63) + tri(2) + tri(70) + tri(15)
    local x = fsdp.randn({ 3, 2, 150, 32 })
    local q, k, v = x:clone():requires_grad_(), x:clone():requires_grad_(), x:clone():requires_grad_()
    fsdp.reset_flops()
    local segments = fsdp.tensor(ROWS, { dtype = 'i64' })
    local out = F.scaled_dot_product_attention(q, k, v, { causal = true, segments = segments })
    assert.equals(2 * 2 * pairs * 64, fsdp.flops())
    local g = fsdp.randn({ 3, 2, 150, 32 })
    fsdp.reset_flops()
    out:backward(g)
    assert.equals(2.5 * 2 * 2 * pairs * 64, fsdp.flops())
    -- with window 16: a document of n > 16 tokens has 16 * 17 / 2 + (n - 16) * 16 pairs (exact, as
    -- unpacked windowed calls count), a shorter one n * n / 2
    local function band(n) return n <= 16 and tri(n) or 16 * 17 / 2 + (n - 16) * 16 end
    local wpairs = band(40) + 3 * band(1) + band(30) + band(60) + band(63) + band(2) + band(70) + band(15)
    fsdp.reset_flops()
    F.scaled_dot_product_attention(x, x, x, { causal = true, window = 16, segments = segments })
    assert.equals(2 * 2 * wpairs * 64, fsdp.flops())
    -- one document filling the row counts as the unpacked call, with and without a window
    local one = fsdp.zeros({ 3, 150 }, { dtype = 'i64' })
    for _, w in ipairs({ 0, 16, 150 }) do
      fsdp.reset_flops()
      F.scaled_dot_product_attention(x, x, x, { causal = true, window = w })
      local unpacked = fsdp.flops()
      fsdp.reset_flops()
      F.scaled_dot_product_attention(x, x, x, { causal = true, window = w, segments = one })
      assert.equals(unpacked, fsdp.flops())
    end
  end)

  it('refuses segments without causal, cross-attention, a wrong shape or dtype, in one line', function()
    local q = randn({ 2, 1, 4, 8 }, 1)
    local seg = fsdp.zeros({ 2, 4 }, { dtype = 'i64' })
    local function err(k, o)
      local ok, e = pcall(F.scaled_dot_product_attention, q, k, k, o)
      assert.is_false(ok)
      return tostring(e)
    end
    assert.truthy(err(q, { segments = seg }):find('segments (packed sequences) need causal attention', 1, true))
    assert.truthy(err(randn({ 2, 1, 6, 8 }, 2), { causal = true, segments = seg })
      :find('segments need as many keys as queries (self-attention), got 4 queries and 6 keys', 1, true))
    assert.truthy(err(q, { causal = true, segments = fsdp.zeros({ 2, 5 }, { dtype = 'i64' }) })
      :find('segments of shape [2, 5] must be [batch, seq] = [2, 4]', 1, true))
    assert.truthy(err(q, { causal = true, segments = fsdp.zeros({ 2, 4 }) })
      :find('segments must be i64 (or i32) document ids, got f32', 1, true))
  end)
end)

describe('packed attention (segments) on CUDA', function()
  if not CUDA then
    pending('no CUDA device here (' .. fsdp.cuda.status() .. ')')
    return
  end
  -- cudasim runs the kernels on the CPU: the smaller cases there
  local cases = SIM and { CASES[1], CASES[2], CASES[3] } or CASES
  for _, c in ipairs(cases) do
    for _, dtype in ipairs({ 'f64', 'f32' }) do
      it(('%s in %s: forward and gradients against f64'):format(c.name, dtype), function()
        check(c, dtype, 'cuda:0')
      end)
    end
  end

  -- bf16 goes to cuDNN where it is eligible (cuda_sdpa.cu); segments must
  -- keep it on the flash-style kernels.
  it('takes packed bf16 calls off cuDNN, onto the kernels', function()
    local before = fsdp.cuda.attention_paths()
    local q = fsdp.randn({ 1, 2, 128, 64 }, { seed = 1 }):to('bf16'):to('cuda:0'):requires_grad_()
    local seg = fsdp.tensor({ row_of({ 50, 78 }) }, { dtype = 'i64' }):to('cuda:0')
    local y = F.scaled_dot_product_attention(q, q, q, { causal = true, segments = seg })
    y:sum():backward()
    local after, d = fsdp.cuda.attention_paths(), {}
    for name, n in pairs(after) do d[name] = n - before[name] end
    assert.equals(0, d.cudnn_forward)
    assert.equals(0, d.cudnn_backward)
    assert.equals(1, d.kernel_forward)
    assert.equals(1, d.kernel_backward)
    check(CASES[3], 'bf16', 'cuda:0')
  end)
end)

describe('nn.Attention with segments', function()
  local nn = fsdp.nn

  local function layer(o)
    local a = nn.Attention(32, 4, { n_kv_heads = 2, dropout = o and o.dropout })
    for i, p in ipairs(a:parameters()) do p:copy_(fsdp.randn(p.shape, { seed = 10 + i }) * 0.3) end
    return a
  end

  it('passes segments to the kernel: each document as if alone', function()
    local a = layer()
    local x = fsdp.randn({ 1, 12, 32 }, { seed = 7 })
    local seg = fsdp.tensor({ row_of({ 5, 7 }) }, { dtype = 'i64' })
    local y = a(x, { segments = seg })
    local first, second = a(x:narrow(1, 0, 5)), a(x:narrow(1, 5, 7))
    local err = math.max((y:narrow(1, 0, 5) - first):abs():max():item(),
                         (y:narrow(1, 5, 7) - second):abs():max():item())
    assert(err < 1e-5, ('packed and alone differ by %g'):format(err))
  end)

  it('refuses segments with a kv_cache or with attention dropout in training', function()
    local seg = fsdp.zeros({ 1, 4 }, { dtype = 'i64' })
    local x = fsdp.randn({ 1, 4, 32 })
    local ok, e = pcall(layer(), x, { segments = seg, kv_cache = { update = function(_, k, v) return k, v end },
                                      mask = fsdp.ones({ 4, 4 }, { dtype = 'bool' }) })
    assert.is_false(ok)
    assert.truthy(tostring(e):find('Attention: segments (packed sequences) are for training, not with a kv_cache', 1,
      true))
    local d = layer({ dropout = 0.1 })
    d:train()
    ok, e = pcall(d, x, { segments = seg })
    assert.is_false(ok)
    assert.truthy(tostring(e):find('with attention dropout 0.1', 1, true))
  end)
end)
