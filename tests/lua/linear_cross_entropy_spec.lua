-- linear_cross_entropy_spec.lua: the LM head and cross-entropy as one
-- chunked op (F.linear_cross_entropy, core/ops/linear_cross_entropy.c) and
-- the decoders' fused loss built on it ([Note: the fused loss] in
-- models/decoder.lua): the loss and every gradient against the unfused
-- F.cross_entropy(F.linear(h, w), t) on the CPU and on CUDA (cudasim
-- here; pending without a GPU), f32 within 1e-6 (chunks change only the
-- order of the weight gradient's sum) and bf16 within bf16 rounding, over
-- chunk sizes (one row, uneven tails, one chunk), both reductions,
-- ignored targets and label smoothing; which inputs get gradients; meta
-- shapes and counted bytes; the errors; and a model's loss, tied and
-- untied, against its unfused path, with the fallbacks (softcap, LoRA head,
-- no_grad) and the peak memory it saves.
local fsdp = require 'fsdp'
local F = fsdp.F
local T = require 'fsdp.testing'
local llama = require 'models.llama'

local CUDA = fsdp.cuda and fsdp.cuda.is_available()
local DEVICES = { 'cpu', CUDA and 'cuda:0' or nil }

local N, D, V = 37, 16, 53

-- Inputs on `device` in `dtype`: h [N, D], w [V, D] requiring grad, and
-- targets [N] with every fifth ignored.
local function inputs(dtype, device)
  local h = fsdp.randn({ N, D }, { seed = 1 }):to(dtype):to(device):detach():requires_grad_()
  local w = (fsdp.randn({ V, D }, { seed = 2 }) * 0.5):to(dtype):to(device):detach():requires_grad_()
  local t = {}
  for i = 1, N do t[i] = i % 5 == 0 and -100 or (i * 7) % V end
  return h, w, fsdp.tensor(t, { dtype = 'i64' }):to(device)
end

-- loss, dh, dw of fn(h, w, t), backpropagating 2.5 (not 1: the scale must reach both).
local function run(fn, dtype, device)
  local h, w, t = inputs(dtype, device)
  local loss = fn(h, w, t)
  ;(loss * 2.5):backward()
  return loss, h.grad, w.grad
end

local function close(got, want, tol, what)
  local e = T.normalised_error(got:to('cpu'), want:to('cpu'))
  assert(e <= tol, ('%s: normalised error %.3g exceeds %.3g'):format(what, e, tol))
end

local TOL = { f32 = 1e-6, bf16 = 1e-2 }

describe('F.linear_cross_entropy', function()
  for _, device in ipairs(DEVICES) do
    for _, dtype in ipairs({ 'f32', 'bf16' }) do
      for _, red in ipairs({ 'mean', 'sum' }) do
        for _, ls in ipairs({ 0, 0.1 }) do
          it(('equals head then cross_entropy on %s, %s, %s, label_smoothing %g'):format(device, dtype, red, ls),
            function()
              local opts = { reduction = red, label_smoothing = ls }
              local l0, dh0, dw0 = run(function(h, w, t) return F.cross_entropy(F.linear(h, w), t, opts) end,
                dtype, device)
              for _, rows in ipairs({ 1, 5, 36, 37, 0 }) do
                local o = { reduction = red, label_smoothing = ls, chunk_rows = rows }
                local l, dh, dw = run(function(h, w, t) return F.linear_cross_entropy(h, w, t, o) end, dtype, device)
                local what = ('%s %s %s rows %d'):format(device, dtype, red, rows)
                assert.equal(l0.dtype, l.dtype)
                assert.is_true(math.abs(l:item() - l0:item()) <= (dtype == 'f32' and 1e-6 or 1e-3)
                  * math.abs(l0:item()), what .. ': loss ' .. l:item() .. ' vs ' .. l0:item())
                close(dh, dh0, TOL[dtype], what .. ' dh')
                close(dw, dw0, TOL[dtype], what .. ' dw')
                assert.equal(dtype, dh.dtype)
                assert.equal(dtype, dw.dtype)
              end
            end)
        end
      end
    end

    it('gives the gradient only to what requires it, and none under no_grad, on ' .. device, function()
      local h, w, t = inputs('f32', device)
      local loss = F.linear_cross_entropy(h:detach(), w, t, { chunk_rows = 4 })
      loss:backward()
      assert.is_nil(h.grad)
      local _, _, dw0 = run(function(hh, ww, tt) return F.linear_cross_entropy(hh:detach(), ww, tt) end, 'f32', device)
      close(w.grad * 2.5, dw0, 1e-6, 'dw alone')
      local h2, w2, t2 = inputs('f32', device)
      F.linear_cross_entropy(h2, w2:detach(), t2, { chunk_rows = 4 }):backward()
      assert.is_nil(w2.grad)
      assert.is_not_nil(h2.grad)
      local l = fsdp.autograd.no_grad(function() return F.linear_cross_entropy(h2, w2, t2, { chunk_rows = 4 }) end)
      assert.is_false(l.requires_grad)
    end)

    it('gives nan and zero gradients when every target is ignored, as cross_entropy, on ' .. device, function()
      local h, w = inputs('f32', device)
      local t = fsdp.full({ N }, -100, { dtype = 'i64' }):to(device)
      local loss = F.linear_cross_entropy(h, w, t, { chunk_rows = 8 })
      assert.is_true(loss:item() ~= loss:item())
      loss:backward()
      assert.equal(0, h.grad:abs():max():item())
      assert.equal(0, w.grad:abs():max():item())
    end)
  end

  it('takes [B, T, D] hidden states and [B, T] targets', function()
    local h, w, t = inputs('f32', 'cpu')
    local a = F.linear_cross_entropy(h, w, t)
    local b = F.linear_cross_entropy(h:view(1, N, D), w, t:view(1, N))
    assert.equal(a:item(), b:item())
  end)

  it('infers shapes on meta, counting the GEMMs and its chunks\' bytes', function()
    local h = fsdp.empty({ 64, 8 }, { device = 'meta' }):requires_grad_()
    local w = fsdp.empty({ 100, 8 }, { device = 'meta' }):requires_grad_()
    local t = fsdp.empty({ 64 }, { dtype = 'i64', device = 'meta' })
    fsdp.reset_bytes_moved()
    local f0 = fsdp.flops()
    local loss = F.linear_cross_entropy(h, w, t, { chunk_rows = 16 })
    local fwd = fsdp.flops() - f0
    -- logits, then dh and dw, each 2 N V D; 4 + 4 per logit for the loss and its gradient
    assert.equal(3 * 2 * 64 * 100 * 8 + 8 * 64 * 100, fwd)
    assert.same({}, loss.shape)
    local by = {}
    for _, r in ipairs(fsdp.bytes_moved_by_op()) do by[r.op] = r.bytes end
    -- per chunk: logits (16 x 100 f32), targets, lse; the gradient pass also writes dlogits
    assert.equal(4 * (16 * 100 * 4 + 16 * 8 + 16 * 4), by['linear_cross_entropy'])
    assert.equal(4 * (2 * 16 * 100 * 4 + 16 * 8 + 16 * 4), by['linear_cross_entropy grad'])
    loss:backward()
    assert.same({ 64, 8 }, h.grad.shape)
    assert.same({ 100, 8 }, w.grad.shape)
  end)

  it('refuses what it does not compute, naming it', function()
    local h, w, t = inputs('f32', 'cpu')
    T.raises(function() F.linear_cross_entropy(h, w, t, { reduction = 'none' }) end, 'reduction must be mean')
    T.raises(function() F.linear_cross_entropy(h, w:narrow(1, 0, 8), t) end, 'must be [N, D] and [V, D]')
    T.raises(function() F.linear_cross_entropy(h, w:to('bf16'), t) end, 'hidden is f32 but weight is bf16')
    T.raises(function() F.linear_cross_entropy(h, w, t:narrow(0, 0, 5)) end, 'do not match hidden')
    T.raises(function() F.linear_cross_entropy(h, w, t:to('f32')) end, 'targets must be i64')
    T.raises(function() F.linear_cross_entropy(h, w, t, { label_smoothing = 2 }) end, 'label_smoothing')
    local bad = fsdp.tensor({ 0, 1, 99 }, { dtype = 'i64' })
    T.raises(function() F.linear_cross_entropy(h:narrow(0, 0, 3), w, bad) end, '99')
  end)
end)

-- A model's loss fused and unfused: the loss and every parameter's gradient.
local function both_paths(build, dtype, tol)
  local ids = fsdp.randint(0, 96, { 2, 9 }, { seed = 5, dtype = 'i64' })
  local targets = fsdp.randint(0, 96, { 2, 9 }, { seed = 6, dtype = 'i64' })
  targets:narrow(1, 0, 2):fill_(-100)
  local out = {}
  for k, fused in ipairs({ false, true }) do
    local m = build()
    if dtype then m:to({ dtype = dtype }) end
    local loss, logits = m:loss(ids, targets, { fused_loss = fused, loss_chunk_rows = 5 })
    assert.equal(fused, logits == nil)
    loss:backward()
    local grads = {}
    for _, np in ipairs(m:named_parameters()) do grads[np[1]] = np[2].grad end
    out[k] = { loss = loss:item(), grads = grads }
  end
  assert.is_true(math.abs(out[1].loss - out[2].loss) <= tol * math.abs(out[1].loss))
  local n = 0
  for name, g in pairs(out[1].grads) do
    close(out[2].grads[name], g, tol, name)
    n = n + 1
  end
  return n
end

describe('the decoders\' fused loss', function()
  local function tiny(over)
    return function()
      local o = { num_layers = 2, dim = 32, n_heads = 4, n_kv_heads = 2, ffn_dim = 48, vocab_size = 96 }
      for k, v in pairs(over or {}) do o[k] = v end
      return llama.build('tiny', o):init_weights({ seed = 3 })
    end
  end

  it('gives the unfused loss and gradients, untied and tied, f32 and bf16', function()
    assert.is_true(both_paths(tiny(), nil, 1e-6) > 5)
    assert.is_true(both_paths(tiny({ tied = true }), nil, 1e-6) > 5)
    both_paths(tiny(), 'bf16', 2e-2)
  end)

  it('is the default while autograd records, and off under no_grad or when asked', function()
    local m = tiny()()
    local ids = fsdp.randint(0, 96, { 1, 6 }, { seed = 1, dtype = 'i64' })
    local _, logits = m:loss(ids, ids)
    assert.is_nil(logits)
    _, logits = fsdp.autograd.no_grad(function() return m:loss(ids, ids) end)
    assert.same({ 1, 6, 96 }, logits.shape)
    m.fused_loss = false
    _, logits = m:loss(ids, ids)
    assert.is_not_nil(logits)
    _, logits = m:loss(ids, ids, { fused_loss = true })
    assert.is_nil(logits)
  end)

  it('falls back where the math is not head then cross-entropy: a softcap, a LoRA head', function()
    local gemma = require('models.decoders').families.gemma2.module
    local g = gemma.build('tiny', {}):init_weights({ seed = 1 })
    local ids = fsdp.randint(0, 64, { 1, 6 }, { seed = 1, dtype = 'i64' })
    local _, logits = g:loss(ids, ids)
    assert.is_not_nil(logits)
    local m = tiny()()
    require('fsdp.lora').apply(m, { targets = { 'lm_head' }, rank = 2 })
    _, logits = m:loss(ids, ids)
    assert.is_not_nil(logits)
  end)

  it('lowers the peak memory of a training step', function()
    local peaks = {}
    local ids = fsdp.randint(0, 2000, { 4, 64 }, { seed = 1, dtype = 'i64' })
    for k, fused in ipairs({ false, true }) do
      local m = tiny({ vocab_size = 2000 })()
      collectgarbage()
      fsdp.reset_memory_stats('cpu')
      local base = fsdp.memory_stats('cpu').in_use
      m:loss(ids, ids, { fused_loss = fused, loss_chunk_rows = 64 }):backward()
      peaks[k] = fsdp.memory_stats('cpu').peak - base
    end
    -- unfused: logits and their gradient, 256 x 2000 f32 each (2 MB apart)
    assert.is_true(peaks[2] < peaks[1] - 2e6, ('peak %d fused vs %d'):format(peaks[2], peaks[1]))
  end)
end)
