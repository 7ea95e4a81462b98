-- backend_ops_spec.lua: every op on every backend, compared with the CPU
-- (in the manner of ggml's test-backend-ops).
--
-- One table of cases covers each op family: its inputs (seeded, on the
-- CPU), the call, and which dtypes it takes. Each case then runs
--   * on meta: the output and every input gradient must have the shapes and
--     dtypes the CPU gives (shape inference and backward are shared code,
--     but the meta path allocates nothing and skips the kernels);
--   * on cuda:0 where a GPU exists, in f32, bf16 and f16: the values of
--     the output and of every gradient must match the CPU's f64 result on
--     the same (rounded) inputs within a normalised error per dtype.
-- Without a GPU the cuda half is reported as skipped, naming the reason.
local fsdp = require 'fsdp'
local F = fsdp.F

local CUDA = fsdp.cuda.is_available()
-- max |got - want| / max |want|: tolerant of where the largest values are.
local TOLERANCE = { f32 = 1e-5, bf16 = 2e-2, f16 = 4e-3 }
local FLOATS = { 'f32', 'bf16', 'f16' }

local function randn(shape, seed) return fsdp.randn(shape, { seed = seed }) end
local function positive(shape, seed) return fsdp.rand(shape, { seed = seed }) + 0.5 end
local function ids(shape, n, seed) return fsdp.randint(0, n, shape, { seed = seed }) end

-- Each case: inputs() returns a list of CPU tensors (floats are rounded to
-- the dtype under test; others are used as they are), run(...) the op.
-- grad = false for ops without a useful gradient; constant = {[i] = true}
-- for inputs that take none; dtypes defaults to FLOATS. cudnn = { forward =
-- n, backward = n }: calls that must go through cuDNN's fused attention in
-- bf16/f16 on cuda (core/cuda/cuda_sdpa.cu; unless FSDP_CUDNN_SDPA=0).
local CASES = {
  { 'add broadcast', function() return { randn({ 3, 4 }, 1), randn({ 4 }, 2) } end, function(a, b) return a + b end },
  { 'sub', function() return { randn({ 3, 4 }, 1), randn({ 3, 1 }, 2) } end, function(a, b) return a - b end },
  { 'mul', function() return { randn({ 2, 3, 4 }, 1), randn({ 3, 4 }, 2) } end, function(a, b) return a * b end },
  { 'div', function() return { randn({ 3, 4 }, 1), positive({ 3, 4 }, 2) } end, function(a, b) return a / b end },
  { 'scalar ops', function() return { randn({ 5 }, 1) } end, function(a) return (a * 3 + 1) / 2 - 0.5 end },
  { 'exp', function() return { randn({ 4, 5 }, 3) } end, F.exp },
  { 'log', function() return { positive({ 4, 5 }, 3) } end, F.log },
  { 'sqrt', function() return { positive({ 4, 5 }, 3) } end, F.sqrt },
  { 'rsqrt', function() return { positive({ 4, 5 }, 3) } end, F.rsqrt },
  { 'tanh', function() return { randn({ 4, 5 }, 3) } end, F.tanh },
  { 'sigmoid', function() return { randn({ 4, 5 }, 3) } end, F.sigmoid },
  { 'abs', function() return { randn({ 4, 5 }, 3) } end, F.abs },
  { 'relu', function() return { randn({ 4, 5 }, 3) } end, F.relu },
  { 'silu', function() return { randn({ 4, 5 }, 3) } end, F.silu },
  { 'square', function() return { randn({ 4, 5 }, 3) } end, F.square },
  { 'gelu erf', function() return { randn({ 4, 5 }, 3) } end, function(x) return F.gelu(x) end },
  { 'gelu tanh', function() return { randn({ 4, 5 }, 3) } end, function(x) return F.gelu(x, 'tanh') end },
  { 'pow', function() return { positive({ 4, 5 }, 3) } end, function(x) return F.pow(x, 1.5) end },
  { 'clamp', function() return { randn({ 4, 5 }, 3) } end, function(x) return F.clamp(x, -0.5, 0.7) end },
  { 'silu_mul', function() return { randn({ 3, 8 }, 4), randn({ 3, 8 }, 5) } end, F.silu_mul },
  { 'dropout', function() return { randn({ 6, 7 }, 4) } end,
    function(x) return F.dropout(x, 0.3, true, { seed = 9 }) end },
  { 'where', function() return { randn({ 3, 4 }, 4), randn({ 3, 4 }, 5) } end,
    function(a, b) return F.where(a:gt(0), a, b) end },
  { 'masked_fill', function() return { randn({ 3, 4 }, 4) } end,
    function(a) return F.masked_fill(a, a:lt(-0.3), 2.5) end },
  { 'sum dims', function() return { randn({ 3, 4, 5 }, 6) } end, function(x) return F.sum(x, { 0, 2 }) end },
  { 'mean keepdim', function() return { randn({ 3, 4, 5 }, 6) } end, function(x) return F.mean(x, 1, true) end },
  { 'var', function() return { randn({ 4, 9 }, 6) } end, function(x) return F.var(x, 1) end },
  { 'std', function() return { randn({ 4, 9 }, 6) } end, function(x) return F.std(x, 1) end },
  { 'max', function() return { randn({ 4, 9 }, 6) } end, function(x) return (F.max(x, 1)) end },
  { 'min', function() return { randn({ 4, 9 }, 6) } end, function(x) return (F.min(x, 0)) end },
  { 'argmax', function() return { randn({ 4, 9 }, 6) } end, function(x) return F.argmax(x, 1) end, grad = false },
  { 'argmin', function() return { randn({ 4, 9 }, 6) } end, function(x) return F.argmin(x, 1) end, grad = false },
  { 'rms_norm', function() return { randn({ 3, 16 }, 7), randn({ 16 }, 8) } end,
    function(x, w) return F.rms_norm(x, w, 1e-5) end },
  { 'layer_norm', function() return { randn({ 3, 16 }, 7), randn({ 16 }, 8), randn({ 16 }, 9) } end,
    function(x, w, b) return F.layer_norm(x, w, b, 1e-5) end },
  { 'softmax', function() return { randn({ 3, 10 }, 7) } end, function(x) return F.softmax(x, -1) end },
  { 'log_softmax', function() return { randn({ 3, 10 }, 7) } end, function(x) return F.log_softmax(x, -1) end },
  { 'cross_entropy', function()
      local t = ids({ 6 }, 10, 3)
      return { randn({ 6, 10 }, 7), t }
    end, function(x, t) return F.cross_entropy(x, t) end },
  { 'cross_entropy ignore smoothing', function()
      return { randn({ 2, 3, 10 }, 7), fsdp.tensor({ { 1, -100, 3 }, { 9, 0, -100 } }, { dtype = 'i64' }) }
    end, function(x, t) return F.cross_entropy(x, t, { ignore_index = -100, label_smoothing = 0.1 }) end },
  { 'nll_loss', function() return { randn({ 5, 8 }, 7), ids({ 5 }, 8, 4) } end,
    function(x, t) return F.nll_loss(F.log_softmax(x, -1), t) end },
  { 'apply_rotary', function()
      local cos, sin = F.rope_tables(6, 8)
      return { randn({ 2, 3, 6, 8 }, 7), cos, sin }
    end, function(x, cos, sin) return F.apply_rotary(x, cos, sin) end, constant = { [2] = true, [3] = true } },
  { 'attention causal gqa', function()
      return { randn({ 2, 4, 5, 8 }, 1), randn({ 2, 2, 5, 8 }, 2), randn({ 2, 2, 5, 8 }, 3) }
    end, function(q, k, v) return F.scaled_dot_product_attention(q, k, v, { causal = true }) end,
    -- the backward through cuDNN where the loaded cuDNN takes 5 keys
    cudnn = { forward = 1, backward = 1, tk = 5 } },
  { 'attention bias unscaled', function()
      return { randn({ 1, 2, 4, 8 }, 1), randn({ 1, 2, 6, 8 }, 2), randn({ 1, 2, 6, 8 }, 3), randn({ 1, 2, 4, 6 }, 4) }
    end, function(q, k, v, b) return F.scaled_dot_product_attention(q, k, v, { bias = b, scale = 1 }) end,
    -- 6 keys make 12-byte bias rows, which cuDNN's engines cannot read
    cudnn = { forward = 0, backward = 0 } },
  { 'matmul batched', function() return { randn({ 2, 3, 4 }, 1), randn({ 2, 4, 5 }, 2) } end, F.matmul },
  { 'matmul transposed', function() return { randn({ 4, 3 }, 1), randn({ 5, 4 }, 2) } end,
    function(a, b) return F.matmul(a:t(), b:t()) end },
  { 'linear', function() return { randn({ 2, 3, 8 }, 1), randn({ 6, 8 }, 2), randn({ 6 }, 3) } end, F.linear },
  { 'embedding', function() return { ids({ 2, 5 }, 10, 1), randn({ 10, 4 }, 2) } end,
    function(i, w) return F.embedding(i, w) end },
  { 'conv2d', function() return { randn({ 2, 3, 7, 7 }, 1), randn({ 4, 3, 3, 3 }, 2), randn({ 4 }, 3) } end,
    function(x, w, b) return F.conv2d(x, w, b, { stride = 2, padding = 1 }) end },
  { 'max_pool2d', function() return { randn({ 2, 3, 6, 6 }, 1) } end, function(x) return F.max_pool2d(x, 2) end },
  { 'cat', function() return { randn({ 2, 3 }, 1), randn({ 2, 5 }, 2) } end,
    function(a, b) return F.cat({ a, b }, 1) end },
  { 'split and views', function() return { randn({ 4, 6 }, 1) } end, function(x)
      local a, b = unpack(F.split(x, { 2, 4 }, 1))
      return a:t():contiguous():sum() + b:narrow(0, 1, 2):transpose(0, 1):contiguous() * 2
    end },
  { 'permute reshape', function() return { randn({ 2, 3, 4 }, 1) } end,
    function(x) return x:permute(2, 0, 1):contiguous():view(4, 6) * 1 end },
  { 'cast', function() return { randn({ 3, 4 }, 1) } end, function(x) return x:to('f32') * 2 end },
}

local function is_float(t) return t.dtype == 'f32' or t.dtype == 'f64' or t.dtype == 'bf16' or t.dtype == 'f16' end

-- Inputs in `dtype` on `device`, float ones requiring gradients.
local function place(case, inputs, dtype, device, grad)
  local out = {}
  for i, t in ipairs(inputs) do
    local x = t
    if is_float(t) then x = t:to(dtype) end
    x = x:to(device)
    if grad and is_float(t) and not (case.constant and case.constant[i]) then x = x:detach():requires_grad_() end
    out[i] = x
  end
  return out
end

-- Output and the gradients of sum(output * fixed weights) for each input.
local function evaluate(case, inputs, grad)
  local out = case[3](unpack(inputs))
  local grads = {}
  if grad then
    local w = fsdp.randn(out.shape, { seed = 77 }):to(out.dtype):to(out.device)
    ;(out * w):sum():backward()
    for i, x in ipairs(inputs) do grads[i] = x.grad end
  end
  return out, grads
end

local function describe_shape(t) return t and ('%s %s'):format(table.concat(t.shape, 'x'), t.dtype) or 'nil' end

local normalised_error = require('fsdp.testing').normalised_error
local cudnn_takes_backward = require('fsdp.testing').cudnn_takes_backward

describe('every op on meta matches the CPU in shapes and dtypes', function()
  for _, case in ipairs(CASES) do
    it(case[1], function()
      local grad = case.grad ~= false
      local inputs = case[2]()
      for _, dtype in ipairs(FLOATS) do
        local out_c, grads_c = evaluate(case, place(case, inputs, dtype, 'cpu', grad), grad)
        local out_m, grads_m = evaluate(case, place(case, inputs, dtype, 'meta', grad), grad)
        assert.are.equal('meta', out_m.device)
        assert.are.equal(describe_shape(out_c), describe_shape(out_m), dtype .. ': output')
        for i = 1, #inputs do
          assert.are.equal(describe_shape(grads_c[i]), describe_shape(grads_m[i]),
            ('%s: gradient of input %d'):format(dtype, i))
        end
      end
    end)
  end
end)

describe('every op on cuda:0 matches the CPU in values', function()
  if not CUDA then
    pending('no GPU here (' .. fsdp.cuda.status() .. '): the cuda backend was not run')
    return
  end
  for _, case in ipairs(CASES) do
    it(case[1], function()
      local grad = case.grad ~= false
      local inputs = case[2]()
      for _, dtype in ipairs(case.dtypes or FLOATS) do
        -- The reference: the same rounded inputs, in f64 on the CPU.
        local rounded = {}
        for i, t in ipairs(inputs) do rounded[i] = is_float(t) and t:to(dtype):to('f64') or t end
        local out_r, grads_r = evaluate(case, place(case, rounded, 'f64', 'cpu', grad), grad)
        local before = fsdp.cuda.attention_paths()
        local out_g, grads_g = evaluate(case, place(case, inputs, dtype, 'cuda:0', grad), grad)
        if case.cudnn and dtype ~= 'f32' and os.getenv('FSDP_CUDNN_SDPA') ~= '0' then
          local after = fsdp.cuda.attention_paths()
          for _, dir in ipairs({ 'forward', 'backward' }) do
            local got, want = after['cudnn_' .. dir] - before['cudnn_' .. dir], case.cudnn[dir] or 0
            if dir == 'backward' and case.cudnn.tk and not cudnn_takes_backward(case.cudnn.tk) then want = 0 end
            assert(got == want, ('%s: %d %s calls through cuDNN, expected %d'):format(dtype, got, dir, want))
          end
        end
        local tol = TOLERANCE[dtype]
        if is_float(out_r) then
          local e = normalised_error(out_g, out_r)
          assert.is_true(e <= tol, ('%s: output error %.3g > %.3g'):format(dtype, e, tol))
        else
          assert.are.same(out_r:tolist(), out_g:to('cpu'):tolist())
        end
        for i = 1, #inputs do
          if grads_r[i] then
            local e = normalised_error(grads_g[i], grads_r[i])
            assert.is_true(e <= tol, ('%s: gradient %d error %.3g > %.3g'):format(dtype, i, e, tol))
          end
        end
      end
    end)
  end
end)
