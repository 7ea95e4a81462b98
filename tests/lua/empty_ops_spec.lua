-- empty_ops_spec.lua: every op of fsdp.functional on tensors with a
-- zero-size dim, forward and backward. PyTorch's semantics where they are
-- defined (empty outputs, a sum of nothing is 0, a mean of nothing NaN, a
-- product with an empty inner dim zeros); where PyTorch refuses (a max over
-- an empty dim), a clear Lua error. Never a signal: a crash here kills the
-- spec run. The table of cases covers every name fsdp.functional exports,
-- so a new op without a zero-size case fails the first test. The cases run
-- on the CPU and, where one is available (a GPU, or the cudasim build, whose
-- suite runs this spec), on cuda:0.
local fsdp = require 'fsdp'
local F = require 'fsdp.functional'
local T = require 'fsdp.testing'

local device = 'cpu' -- the device the cases run on (set by each describe below)

local function x(shape) return fsdp.randn(shape, { seed = 1 }):to(device):requires_grad_() end
local function ids(n) return fsdp.zeros({ n }, { dtype = 'i64' }):to(device) end

local function shape_of(t)
  local s = {}
  for d = 1, t:dim() do s[d] = t:size(d - 1) end
  return s
end

-- Backward through whatever came out (a tensor or a list of them), so the
-- backward formulas see zero-size gradients too.
local function backprop(out)
  local outs = fsdp.Tensor.is_tensor(out) and { out } or out
  local loss
  for _, o in ipairs(outs) do
    if o.requires_grad then
      local s = o:to('f32'):sum()
      loss = loss and loss + s or s
    end
  end
  if loss then loss:backward() end
end

-- name -> function returning the output (checked in the function) or
-- raising a message that must contain `refuses[name]`.
local cases = {}
local refuses = {}

-- The zero-size dim first, in the middle and last.
local SHAPES = { { 0, 4 }, { 2, 0, 3 }, { 3, 0 } }

local function same_shape(op)
  cases[op] = function()
    local outs = {}
    for _, shape in ipairs(SHAPES) do
      local y = F[op](x(shape))
      assert.same(shape, shape_of(y))
      outs[#outs + 1] = y
    end
    return outs
  end
end
for _, op in ipairs({ 'exp', 'log', 'sqrt', 'rsqrt', 'tanh', 'sigmoid', 'abs', 'relu', 'silu',
                      'square', 'gelu', 'softmax', 'log_softmax' }) do
  same_shape(op)
end

cases.pow = function() return F.pow(x({ 0, 4 }), 2) end
cases.clamp = function() return F.clamp(x({ 2, 0 }), -1, 1) end
cases.silu_mul = function() return F.silu_mul(x({ 0, 4 }), x({ 0, 4 })) end
cases.dropout = function() return F.dropout(x({ 3, 0 }), 0.5, true) end

cases.sum = function()
  local a = x({ 0, 4 })
  local all = F.sum(a)
  assert.equal(0, all:item())
  local rows = F.sum(a, 0)
  assert.same({ 4 }, shape_of(rows))
  assert.same({ 0, 0, 0, 0 }, rows:tolist())
  assert.same({ 0 }, shape_of(F.sum(a, 1)))
  return { all, rows }
end
cases.mean = function()
  local m = F.mean(x({ 0, 4 }))
  assert.is_true(m:item() ~= m:item()) -- NaN, as torch.mean of nothing
  return m
end
cases.var = function() return F.var(x({ 0, 4 }), 1) end
cases.std = function() return F.std(x({ 0, 4 }), 1) end
for _, op in ipairs({ 'max', 'min', 'argmax', 'argmin' }) do
  cases[op] = function()
    local a = x({ 0, 4 })
    local ok = F[op](a, 1) -- over a non-empty dim: empty result
    assert.same({ 0 }, shape_of(fsdp.Tensor.is_tensor(ok) and ok or ok[1]))
    return F[op](a, 0) -- over the empty dim: refused, as in PyTorch
  end
  refuses[op] = 'is empty'
end

for _, op in ipairs({ 'eq', 'ne', 'lt', 'le', 'gt', 'ge' }) do
  cases[op] = function()
    local y = F[op](x({ 0, 4 }), 0)
    assert.same({ 0, 4 }, shape_of(y))
    return y
  end
end
cases.where = function()
  local a = x({ 0, 4 })
  return F.where(F.gt(a, 0), a, 0)
end
cases.masked_fill = function()
  local a = x({ 0, 4 })
  return F.masked_fill(a, F.gt(a, 0), 0)
end

cases.rms_norm = function()
  return { F.rms_norm(x({ 0, 4 }), x({ 4 })), F.rms_norm(x({ 2, 0, 4 }), x({ 4 })), F.rms_norm(x({ 2, 0 }), x({ 0 })) }
end
cases.add_rms_norm = function()
  local out = {}
  for _, shape in ipairs({ { 0, 4 }, { 2, 0, 4 }, { 2, 0 } }) do
    local h, y = F.add_rms_norm(x(shape), x(shape), x({ shape[#shape] }), 1e-5)
    assert.same(shape, shape_of(h))
    assert.same(shape, shape_of(y))
    out[#out + 1], out[#out + 2] = h, y
  end
  return out
end
cases.layer_norm = function()
  return { F.layer_norm(x({ 0, 4 }), x({ 4 }), x({ 4 })), F.layer_norm(x({ 2, 0, 4 }), x({ 4 }), x({ 4 })) }
end
cases.cross_entropy = function()
  local logits = x({ 0, 5 })
  local targets = ids(0)
  local s = F.cross_entropy(logits, targets, { reduction = 'sum' })
  assert.equal(0, s:item())
  local none = F.cross_entropy(logits, targets, { reduction = 'none' })
  assert.same({ 0 }, shape_of(none))
  return { s, none, F.cross_entropy(logits, targets) }
end
cases.linear_cross_entropy = function()
  -- no rows (a sum of nothing, the weight's gradient zeros), and no hidden width (logits all 0)
  local s = F.linear_cross_entropy(x({ 0, 4 }), x({ 5, 4 }), ids(0), { reduction = 'sum' })
  assert.equal(0, s:item())
  local flat = F.linear_cross_entropy(x({ 3, 0 }), x({ 5, 0 }), ids(3), { chunk_rows = 2 })
  assert.is_true(math.abs(flat:item() - math.log(5)) < 1e-6)
  return { s, flat, F.linear_cross_entropy(x({ 0, 4 }), x({ 5, 4 }), ids(0)) }
end
cases.nll_loss = function()
  local lp = F.log_softmax(x({ 0, 5 }), -1)
  return F.nll_loss(lp, ids(0), { reduction = 'sum' })
end
cases.rope_tables = function()
  local cos, sin = F.rope_tables(0, 8, { device = device })
  assert.equal(0, cos:size(0))
  return { cos, sin }
end
cases.apply_rotary = function()
  local cos, sin = F.rope_tables(0, 8, { device = device })
  return F.apply_rotary(x({ 1, 2, 0, 8 }), cos, sin)
end
cases.scaled_dot_product_attention = function()
  local q = x({ 1, 2, 0, 8 })
  local y = F.scaled_dot_product_attention(q, x({ 1, 2, 0, 8 }), x({ 1, 2, 0, 8 }), { causal = true })
  assert.same({ 1, 2, 0, 8 }, shape_of(y))
  -- queries over no keys: PyTorch's rows are NaN; ours must at least not crash
  local z = F.scaled_dot_product_attention(x({ 1, 2, 3, 8 }), x({ 1, 2, 0, 8 }), x({ 1, 2, 0, 8 }))
  assert.same({ 1, 2, 3, 8 }, shape_of(z))
  return y
end

cases.matmul = function()
  local z = F.matmul(x({ 2, 0 }), x({ 0, 3 })) -- empty inner dim: zeros
  assert.same({ { 0, 0, 0 }, { 0, 0, 0 } }, z:tolist())
  local e = F.matmul(x({ 0, 4 }), x({ 4, 3 }))
  assert.same({ 0, 3 }, shape_of(e))
  return { z, e, F.matmul(x({ 4 }), x({ 4, 0 })), F.matmul(x({ 2, 0, 4 }), x({ 4, 3 })),
           F.matmul(x({ 0, 2, 4 }), x({ 0, 4, 3 })) }
end
cases.linear = function()
  local e = F.linear(x({ 0, 4 }), x({ 3, 4 }), x({ 3 }))
  assert.same({ 0, 3 }, shape_of(e))
  local b = fsdp.tensor({ 1, 2, 3 }):to(device):requires_grad_()
  local k0 = F.linear(x({ 2, 0 }), x({ 3, 0 }), b) -- no inputs: the bias alone
  assert.same({ { 1, 2, 3 }, { 1, 2, 3 } }, k0:tolist())
  local mid = F.linear(x({ 2, 0, 4 }), x({ 3, 4 }), x({ 3 })) -- an empty batch dim in the middle
  assert.same({ 2, 0, 3 }, shape_of(mid))
  return { e, k0, mid, F.linear(x({ 2, 5, 4 }), x({ 0, 4 })) }
end
cases.embedding = function()
  local e = F.embedding(ids(0), x({ 10, 4 }))
  assert.same({ 0, 4 }, shape_of(e))
  return e
end
cases.conv2d = function()
  local w, b = x({ 2, 1, 3, 3 }), x({ 2 })
  local y = F.conv2d(x({ 0, 1, 4, 4 }), w, b)
  assert.same({ 0, 2, 2, 2 }, shape_of(y))
  y:sum():backward() -- an empty batch: zero gradients for the weight and bias
  assert.equal(0, w.grad:abs():sum():item())
  assert.equal(0, b.grad:abs():sum():item())
  return {} -- backpropagated already
end
cases.max_pool2d = function()
  local y = F.max_pool2d(x({ 0, 1, 4, 4 }), 2)
  assert.same({ 0, 1, 2, 2 }, shape_of(y))
  return y
end
cases.cat = function()
  local y = F.cat({ x({ 0, 4 }), x({ 2, 4 }), x({ 0, 4 }) }, 0)
  assert.same({ 2, 4 }, shape_of(y))
  return y
end
cases.moe_route = function()
  local w, i = F.moe_route(x({ 0, 8 }), 2, { normalize = true })
  assert.same({ 0, 2 }, shape_of(w))
  assert.same({ 0, 2 }, shape_of(i))
  return w
end
cases.moe_experts = function()
  local k0 = fsdp.zeros({ 0, 2 }, { dtype = 'i64' }):to(device)
  local none = F.moe_experts(x({ 0, 4 }), x({ 0, 2 }), k0, x({ 3, 10, 4 }), x({ 3, 4, 5 }))
  assert.same({ 0, 4 }, shape_of(none))
  -- Experts of width 0: every token gets zeros, the weights zero gradients.
  local i2 = fsdp.zeros({ 2, 1 }, { dtype = 'i64' }):to(device)
  local narrow = F.moe_experts(x({ 2, 4 }), x({ 2, 1 }), i2, x({ 3, 0, 4 }), x({ 3, 4, 0 }))
  assert.same({ { 0, 0, 0, 0 }, { 0, 0, 0, 0 } }, narrow:tolist())
  return { none, narrow }
end
cases.load_balancing_loss = function()
  -- No rows at all: 0 / 0, NaN, as transformers' load_balancing_loss_func.
  local l = F.load_balancing_loss({ x({ 0, 8 }) }, 8, 2)
  assert.is_true(l:item() ~= l:item())
  return l
end
cases.split = function() return F.split(x({ 0, 4 }), 2, 1) end
cases.chunk = function() return F.chunk(x({ 4, 0 }), 2, 0) end

local devices = { 'cpu' }
if fsdp.cuda.is_available() then devices[2] = 'cuda:0' end

for _, dev in ipairs(devices) do
  describe('ops on zero-size tensors on ' .. dev, function()
    before_each(function() device = dev end)

    it('every function of fsdp.functional has a case here', function()
      local missing = {}
      for name, v in pairs(F) do
        if type(v) == 'function' and not cases[name] then missing[#missing + 1] = name end
      end
      table.sort(missing)
      assert.same({}, missing)
    end)

    local names = {}
    for name in pairs(cases) do names[#names + 1] = name end
    table.sort(names)
    for _, name in ipairs(names) do
      it(name, function()
        if refuses[name] then
          T.raises(function() backprop(cases[name]()) end, refuses[name])
        else
          backprop(cases[name]())
        end
      end)
    end
  end)
end
