-- autograd_spec.lua: the tape and the engine: gradients of the binary ops
-- and views (finite-difference checked), accumulation, grad mode, detach,
-- nodes implemented in Lua, activation checkpointing, and the errors.
local fsdp = require 'fsdp'
local T = require 'fsdp.testing'

local function f64(shape, seed, opts)
  opts = opts or {}
  opts.seed, opts.dtype = seed, 'f64'
  return fsdp.randn(shape, opts):requires_grad_()
end

describe('gradients of binary ops', function()
  local a, b
  before_each(function()
    a = f64({ 2, 3 }, 1)
    b = f64({ 3 }, 2, { mean = 3 }) -- away from 0 for division
  end)

  local cases = {
    add = function(x, y) return x + y end,
    sub = function(x, y) return x - y end,
    mul = function(x, y) return x * y end,
    div = function(x, y) return x / y end,
    scalars = function(x, y) return 2 / y + x * 3 - 1 + (5 - x) / 4 end,
    negate = function(x) return -x end,
    ['same tensor twice'] = function(x) return x * x + x end,
  }
  for name, fn in pairs(cases) do
    it(name .. ' with broadcasting', function()
      assert(T.gradcheck(fn, { a, b }))
    end)
  end

  it('across dtypes (f32 operand, gradient cast back)', function()
    assert(T.gradcheck(function(x, y) return x:to('f32') * y end, { a, b }, { eps = 1e-3, rtol = 1e-3 }))
  end)
end)

describe('gradients of views', function()
  local x
  before_each(function() x = f64({ 3, 4 }, 3) end)
  local cases = {
    view = function(t) return t:view(2, 6) * 2 end,
    reshape_copy = function(t) return t:t():reshape(12) end,
    narrow = function(t) return t:narrow(1, 1, 2) end,
    slice = function(t) return t:slice(0, 0, 3, 2) end,
    select = function(t) return t:select(1, -1) end,
    transpose = function(t) return t:t():contiguous() end,
    permute = function(t) return t:unsqueeze(1):permute(2, 0, 1) end,
    expand = function(t) return t:unsqueeze(0):expand(5, 3, 4) end,
    squeeze = function(t) return t:view(1, 3, 4):squeeze(0):flatten() end,
    clone = function(t) return t:clone() * t end,
    sum_to = function(t) return t:sum_to(1, 4) end,
  }
  for name, fn in pairs(cases) do
    it(name, function() assert(T.gradcheck(fn, { x })) end)
  end
end)

describe('the engine', function()
  it('accumulates gradients across backward calls', function()
    local w = fsdp.tensor({ 1, 2 }):requires_grad_()
    ;(w * 3):sum_to({}):backward()
    ;(w * 3):sum_to({}):backward()
    assert.same({ 6, 6 }, w.grad:tolist())
    w.grad = nil
    assert.is_nil(w.grad)
  end)

  it('records nothing under no_grad, and detach cuts the graph', function()
    local w = fsdp.tensor({ 1, 2 }):requires_grad_()
    local y = fsdp.no_grad(function() return w * 2 end)
    assert.is_false(y.requires_grad)
    assert.is_nil(y.grad_fn)
    assert.is_true(fsdp.is_grad_enabled())
    local d = (w * 2):detach()
    assert.is_false(d.requires_grad)
    assert.equals('MulScalarBackward', (w * 2).grad_fn)
    assert.is_true(w:is_leaf())
  end)

  it('restores grad mode when the function fails', function()
    assert.has_error(function() fsdp.no_grad(function() error('boom') end) end)
    assert.is_true(fsdp.is_grad_enabled())
  end)

  it('takes an explicit gradient for a non-scalar root', function()
    local x = fsdp.tensor({ 1, 2, 3 }):requires_grad_()
    local y = x * x
    y:backward(fsdp.tensor({ 1, 0, 2 }))
    assert.same({ 2, 0, 12 }, x.grad:tolist())
  end)

  it('handles a deep chain without exhausting the stack', function()
    local x = fsdp.tensor({ 1 }):requires_grad_()
    local y = x
    for _ = 1, 20000 do y = y + 0 end
    y:sum_to({}):backward()
    assert.same({ 1 }, x.grad:tolist())
    y = nil
    collectgarbage()
  end)

  it('raises clear errors', function()
    local x = fsdp.tensor({ 1, 2 }):requires_grad_()
    assert.error_matches(function() (x * 2):backward() end,
      'gradient can be implicit only for a scalar; tensor 0 has shape %[2%]')
    assert.error_matches(function() fsdp.tensor({ 1 }):backward() end, 'does not require grad')
    assert.error_matches(function() fsdp.tensor({ 1 }, { dtype = 'i64' }):requires_grad_() end,
      'only floating point tensors can require grad, not i64')
    assert.error_matches(function() x:mul_(2) end, 'mul_: a tensor that requires grad cannot be modified in place')
    assert.error_matches(function() (x * 2):requires_grad_(false) end, 'only leaf tensors')
    assert.error_matches(function() x.grad = fsdp.zeros(3) end,
      'set_grad: gradient of shape %[3%] on cpu for a tensor of shape %[2%] on cpu')
    fsdp.no_grad(function() x:mul_(2) end) -- allowed outside grad mode
    assert.same({ 2, 4 }, x:tolist())
  end)
end)

-- [Note: spent nodes] in core/autograd/engine.c: a second backward through
-- a node whose saved tensors the first one freed is refused by the engine,
-- for every node type; retain_graph keeps them.
describe('gradients added where they land', function()
  -- Narrow, slice and select add their part into a gradient already
  -- waiting for their input instead of summing a zero-filled whole with it
  -- (engine.c, [Note: gradients added where they land]).
  it('a tensor split into parts gets every part\'s gradient (a fused qkv)', function()
    assert(T.gradcheck(function(t)
      local x = t * 2
      local q, k, v = x:narrow(1, 0, 3), x:narrow(1, 3, 3), x:narrow(1, 6, 3)
      return q * k + v
    end, { f64({ 2, 9 }, 4) }))
    -- overlapping parts, strided and selected ones, and parts of a leaf
    assert(T.gradcheck(function(t)
      local x = t * 2
      return x:narrow(1, 0, 5) * x:narrow(1, 4, 5) + x:slice(1, 0, 9, 2) + x:select(1, 8):unsqueeze(1)
    end, { f64({ 2, 9 }, 5) }))
    assert(T.gradcheck(function(t) return t:narrow(0, 0, 2) * t:narrow(0, 1, 2) + t:select(0, 2) end,
      { f64({ 3, 4 }, 6) }))
    local w = fsdp.tensor({ 1, 2, 3, 4 }):requires_grad_()
    local x = w * 1
    local parts = { x:narrow(0, 0, 2), x:narrow(0, 2, 2) }
    ;(parts[1] * 10 + parts[2] * 100):sum_to({}):backward()
    assert.same({ 10, 10, 100, 100 }, w.grad:tolist())
  end)

  it('adds into .grad across backward calls', function()
    local w = fsdp.tensor({ 1, 2, 3, 4 }):requires_grad_()
    w:narrow(0, 1, 2):sum_to({}):backward()
    w:narrow(0, 2, 2):sum_to({}):backward()
    w:select(0, 3):backward()
    assert.same({ 0, 1, 2, 2 }, w.grad:tolist())
  end)

  it('leaves a waiting gradient that something else holds untouched', function()
    local w = fsdp.tensor({ 1, 2, 3, 4 }):requires_grad_()
    local x = w * 1
    local part = x:narrow(0, 1, 2) -- its node is older: it runs after the Lua node
    local out = x:detach()
    local kept
    fsdp.autograd.attach('Keep', { x }, { out }, function(grads)
      kept = grads[1] * 1
      return { kept }
    end)
    ;((out * 10):sum_to({}) + (part * 100):sum_to({})):backward()
    assert.same({ 10, 10, 10, 10 }, kept:tolist())
    assert.same({ 10, 110, 110, 10 }, w.grad:tolist())
  end)
end)

describe('backward twice', function()
  local F = require 'fsdp.functional'
  local ag = require 'fsdp.autograd'
  -- One graph per kind of node that saves something, each ending in a
  -- non-scalar output (so the node itself, not a sum, is the first reached).
  local graphs = {
    exp = function(x) return F.exp(x) end,
    mul = function(x) return x * x end,
    linear = function(x, w) return F.linear(x, w) end,
    matmul = function(x, w) return F.matmul(x, w:transpose(0, 1)) end,
    softmax = function(x) return F.softmax(x, -1) end,
    rms_norm = function(x) return F.rms_norm(x, fsdp.ones({ 3 })) end,
    checkpoint = function(x, w) return ag.checkpoint(function(a, b) return F.linear(a, b) end, x, w) end,
  }
  local names = {}
  for name in pairs(graphs) do names[#names + 1] = name end
  table.sort(names)
  for _, name in ipairs(names) do
    it(name .. ': refused with a clear error, or twice the gradient with retain_graph', function()
      local x = fsdp.randn({ 2, 3 }, { seed = 1, dtype = 'f64' }):requires_grad_()
      local w = fsdp.randn({ 4, 3 }, { seed = 2, dtype = 'f64' }):requires_grad_()
      local y = graphs[name](x, w)
      local g = fsdp.ones(y.shape, { dtype = y.dtype })
      y:backward(g)
      T.raises(function() y:backward(g) end, 'trying to backward through the graph a second time')
      T.raises(function() y:backward(g) end, 'pass retain_graph=true')
      local once = x.grad:clone()
      x.grad = nil
      local y2 = graphs[name](x, w)
      y2:backward(g, { retain_graph = true })
      y2:backward(g, { retain_graph = true })
      y2:backward(g) -- the last one may free
      assert(T.max_abs_diff(x.grad, once * 3) < 1e-12)
      T.raises(function() y2:backward(g) end, 'a second time')
    end)
  end

  it('through nodes that keep only shapes is allowed (as in PyTorch)', function()
    local x = fsdp.tensor({ 1, 2 }):requires_grad_()
    local y = (x + 1):sum_to({})
    y:backward()
    y:backward()
    assert.same({ 2, 2 }, x.grad:tolist())
    x.grad = nil
    local m = F.mean(F.sum(x:view({ 1, 2 }), 1) * 2)
    m:backward()
    m:backward()
    assert.same({ 4, 4 }, x.grad:tolist())
  end)

  it('checks its options', function()
    local y = fsdp.tensor({ 1 }):requires_grad_() * 2
    T.raises(function() y:backward(nil, { retain = true }) end, 'unknown option retain')
    T.raises(function() y:backward(nil, true) end, 'options must be a table')
  end)
end)

describe('Lua nodes', function()
  it('run their backward in Lua and feed the graph', function()
    local autograd = fsdp.autograd
    local x = fsdp.tensor({ 1, 2 }):requires_grad_()
    local h = x * 3
    local out = h:detach()
    local seen
    autograd.attach('Hook', { h }, { out }, function(grads)
      seen = grads[1]:tolist()
      return { grads[1] * 10 }
    end)
    assert.equals('Hook', out.grad_fn)
    ;(out * out):sum_to({}):backward()
    assert.same({ 6, 12 }, seen)
    assert.same({ 180, 360 }, x.grad:tolist())
  end)

  it('name themselves in errors raised by their backward', function()
    local x = fsdp.tensor({ 1 }):requires_grad_()
    local out = x:detach()
    fsdp.autograd.attach('Broken', { x }, { out }, function() error('nope') end)
    -- (pcall, not error_matches: luassert strips text up to a file:line:)
    local ok, err = pcall(function() out:sum_to({}):backward() end)
    assert.is_false(ok)
    assert.matches('^in backward of Broken: .*nope$', err)
  end)
end)

describe('activation checkpointing', function()
  local function block(x, w) return (x * w + x / 2) * w end

  it('gives the same gradients as the plain forward', function()
    local x1, w1 = f64({ 4 }, 5), f64({ 4 }, 6)
    local x2, w2 = x1:detach():clone():requires_grad_(), w1:detach():clone():requires_grad_()
    block(x1, w1):sum_to({}):backward()
    local y = fsdp.autograd.checkpoint(block, x2, w2)
    assert.equals('CheckpointBackward', y.grad_fn)
    y:sum_to({}):backward()
    assert.same(x1.grad:tolist(), x2.grad:tolist())
    assert.same(w1.grad:tolist(), w2.grad:tolist())
  end)

  it('reaches parameters when no input requires grad', function()
    local w = f64({ 3 }, 7)
    local x = fsdp.randn({ 3 }, { seed = 8, dtype = 'f64' })
    local y = fsdp.autograd.checkpoint_with_params({ w }, function(inp) return inp * w end, x)
    y:sum_to({}):backward()
    assert.same(x:tolist(), w.grad:tolist())
  end)

  it('replays the random numbers of the forward', function()
    local x = f64({ 5 }, 9)
    local noise
    local y = fsdp.autograd.checkpoint(function(t)
      noise = fsdp.rand(5, { dtype = 'f64' })
      return t * noise
    end, x)
    local first = noise:tolist()
    y:sum_to({}):backward()
    assert.same(first, noise:tolist()) -- the recompute drew the same values
    assert.same(first, x.grad:tolist())
  end)
end)
