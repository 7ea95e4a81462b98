-- add_rms_norm_spec.lua: the residual add fused with RMSNorm
-- (fl_add_rms_norm, [Note: residual add fused with RMSNorm] in
-- core/ops/norm.c) against the two ops it replaces, h = x + a and
-- y = F.rms_norm(h, w), on every device at hand: the CPU (at the ISA level
-- in force: tests/isa/run.sh reruns it capped at avx2), cuda:0 (a GPU or
-- the cudasim build: the vector path and its scalar fallbacks) and meta
-- (shapes, dtypes and the bytes counted). h, y must be the same bits; the
-- gradients (one pass: dh = g_h + rms_norm's dx) agree within a rounding of
-- the gradient's dtype (f32: the same bits where the arithmetic is), with
-- and without h's own gradient, and without y's.
local fsdp = require 'fsdp'
local F = fsdp.F
local T = require 'fsdp.testing'

local DEVICES = { 'cpu' }
if fsdp.cuda.is_available() then DEVICES[#DEVICES + 1] = 'cuda:0' end
-- gradient tolerance (normalised error against the two ops): f32 and f64
-- add the same terms once; 16-bit dh is rounded once where the two ops
-- rounded dx and then the sum
local TOL = { f64 = 1e-12, f32 = 1e-6, bf16 = 1e-2, f16 = 2e-3 }

local function r(shape, seed, dtype) return fsdp.randn(shape, { seed = seed }):to(dtype) end

-- Layouts of x and a [rows, n]: dense (whole vectors, the AVX-512 rows),
-- a tail, misaligned (starting at element 1), strided rows (transposed).
local function layouts(dtype)
  return {
    { 'dense 4x64', function(s) return r({ 4, 64 }, s, dtype) end },
    { 'tail 3x37', function(s) return r({ 3, 37 }, s, dtype) end },
    { 'one row of 4099', function(s) return r({ 1, 4099 }, s, dtype) end },
    { 'misaligned 3x64', function(s) return r({ 193 }, s, dtype):narrow(0, 1, 192):view(3, 64) end },
    { 'strided 6x64', function(s) return r({ 64, 6 }, s, dtype):transpose(0, 1) end },
  }
end

-- Forward and gradients of the fused op or the two ops on a device.
-- use: 'both' (loss of h and y), 'y' (y only), 'h' (h only).
local function run(fused, x0, a0, w0, device, use)
  local x = x0:to(device):detach():requires_grad_()
  local a = a0:to(device):detach():requires_grad_()
  local w = w0 and w0:to(device):detach():requires_grad_() or nil
  local h, y
  if fused then
    h, y = F.add_rms_norm(x, a, w, 1e-5)
  else
    h = x + a
    y = F.rms_norm(h, w, 1e-5)
  end
  local gh = fsdp.randn(h.shape, { seed = 91 }):to(h.dtype):to(device)
  local gy = fsdp.randn(y.shape, { seed = 92 }):to(y.dtype):to(device)
  local loss
  if use == 'both' then loss = (h * gh):sum():to('f64') + (y * gy):sum():to('f64')
  elseif use == 'y' then loss = (y * gy):sum()
  else loss = (h * gh):sum() end
  loss:backward()
  return h, y, x.grad, a.grad, w and w.grad
end

local function same_bits(got, want, what)
  assert.equals(want.dtype, got.dtype, what .. ' dtype')
  assert.same(want.shape, got.shape, what .. ' shape')
  local d = T.max_abs_diff(got:to('cpu'), want:to('cpu'))
  assert(d == 0, ('%s: differs from the two ops by %.3g'):format(what, d))
end

local function close(got, want, tol, what)
  local e = T.normalised_error(got, want)
  assert(e <= tol, ('%s: normalised error %.3g exceeds %.3g'):format(what, e, tol))
end

describe('F.add_rms_norm', function()
  for _, device in ipairs(DEVICES) do
    for _, dw in ipairs({ { 'f32' }, { 'bf16' }, { 'f16' }, { 'f64' }, { 'bf16', 'f32' }, { 'bf16', false } }) do
      local dtype, wdtype = dw[1], dw[2] == nil and dw[1] or dw[2]
      local label = ('%s %s, weight %s'):format(device, dtype, wdtype or 'none')
      it(label .. ': h and y bits, gradients as x + a then rms_norm', function()
        for i, lay in ipairs(layouts(dtype)) do
          local x, a = lay[2](10 * i), lay[2](10 * i + 1)
          local n = x.shape[2]
          local w = wdtype and r({ n }, 10 * i + 2, wdtype) or nil
          for _, use in ipairs({ 'both', 'y', 'h' }) do
            local what = ('%s %s (loss of %s)'):format(label, lay[1], use)
            local h1, y1, gx1, ga1, gw1 = run(true, x, a, w, device, use)
            local h2, y2, gx2, ga2, gw2 = run(false, x, a, w, device, use)
            same_bits(h1, h2, what .. ': h')
            same_bits(y1, y2, what .. ': y')
            close(gx1, gx2, TOL[dtype], what .. ': dx')
            same_bits(ga1, gx1, what .. ': da (the same gradient as dx)')
            if use == 'h' then
              -- the norm gets no gradient: neither does its weight
              assert.is_nil(gw1, what .. ': dw')
              assert.is_nil(gw2, what .. ': dw of the two ops')
            elseif w then
              close(gw1, gw2, TOL[wdtype] * 10, what .. ': dw')
            end
          end
        end
      end)
    end
  end

  it('gives f32 gradients the bits of the two ops on dense rows (one pass adds what the add would)', function()
    for _, device in ipairs(DEVICES) do
      local x, a, w = r({ 4, 64 }, 1, 'f32'), r({ 4, 64 }, 2, 'f32'), r({ 64 }, 3, 'f32')
      local _, _, gx1, _, gw1 = run(true, x, a, w, device, 'both')
      local _, _, gx2, _, gw2 = run(false, x, a, w, device, 'both')
      same_bits(gx1, gx2, device .. ' dx')
      same_bits(gw1, gw2, device .. ' dw')
    end
  end)

  it('infers shapes and dtypes on meta and counts its bytes once per kernel', function()
    local m = { device = 'meta', dtype = 'bf16' }
    local x = fsdp.empty({ 2, 8, 64 }, m):requires_grad_()
    local a = fsdp.empty({ 2, 8, 64 }, m):requires_grad_()
    local w = fsdp.empty({ 64 }, { device = 'meta', dtype = 'f32' }):requires_grad_()
    fsdp.reset_bytes_moved()
    local h, y = F.add_rms_norm(x, a, w, 1e-5)
    assert.same({ 2, 8, 64 }, h.shape)
    assert.equals('bf16', h.dtype)
    assert.equals('f32', y.dtype) -- bf16 x with an f32 weight: as weight * x
    assert.equals('meta', y.device)
    local by = {}
    for _, e in ipairs(fsdp.bytes_moved_by_op()) do by[e.op] = e end
    local el, rows = 2 * 8 * 64, 2 * 8
    -- x, a, h in bf16, y in f32, w in f32, rstd f32
    assert.same({ op = 'add_rms_norm', calls = 1, bytes = el * 2 * 3 + el * 4 + 64 * 4 + rows * 4 },
                by.add_rms_norm)
    fsdp.reset_bytes_moved()
    ;((h:to('f32') + y):sum()):backward()
    by = {}
    for _, e in ipairs(fsdp.bytes_moved_by_op()) do by[e.op] = e end
    -- g_h, h, dh in bf16, g_y f32, w and dw f32, rstd f32
    assert.same({ op = 'add_rms_norm backward', calls = 1, bytes = el * 2 * 3 + el * 4 + 2 * 64 * 4 + rows * 4 },
                by['add_rms_norm backward'])
    assert.same({ 2, 8, 64 }, x.grad.shape)
    assert.same({ 64 }, w.grad.shape)
  end)

  -- The decoder's pre-norm layers ([Note: the layer's add and norm fused] in
  -- models/decoder.lua): a tiny Llama's loss and gradients with the fusion
  -- and with the two ops.
  local llama = require 'models.llama'
  local function tiny_step(fuse, device, hook)
    llama.DecoderLayer.fuse_add_norm = fuse
    local c = llama.config('tiny')
    local model = llama.build(c, { device = device })
    model:init_weights({ seed = 1 })
    if hook then
      model.model.layers:children()[1].post_attention_layernorm:register_forward_hook(function() end)
    end
    local ids = fsdp.randint(0, c.vocab_size, { 2, 16 }, { seed = 3 }):to(device)
    local targets = fsdp.randint(0, c.vocab_size, { 2, 16 }, { seed = 4 }):to(device)
    fsdp.reset_bytes_moved()
    local loss = model:loss(ids, targets)
    loss:backward()
    local calls = 0
    for _, e in ipairs(fsdp.bytes_moved_by_op()) do
      if e.op == 'add_rms_norm' then calls = e.calls end
    end
    llama.DecoderLayer.fuse_add_norm = true
    return loss, model:named_parameters(), calls
  end

  it('gives a tiny Llama the loss and gradients of the two ops, fused in every layer without hooks', function()
    for _, device in ipairs(DEVICES) do
      local l1, p1, calls = tiny_step(true, device)
      local l2, p2, none = tiny_step(false, device)
      local _, _, hooked = tiny_step(true, device, true)
      assert.equals(llama.config('tiny').n_layers, calls, device .. ': layers fused')
      assert.equals(0, none, device .. ': fusion off')
      assert.equals(llama.config('tiny').n_layers - 1, hooked, device .. ': a norm with a hook runs as itself')
      assert.equals(l2:item(), l1:item(), device .. ': loss')
      for i, np in ipairs(p1) do
        close(np[2].grad, p2[i][2].grad, 1e-6, device .. ' gradient of ' .. np[1])
      end
    end
  end)

  it('refuses a branch of another shape or dtype, and a weight of another size, naming them', function()
    local x = fsdp.randn({ 2, 8 })
    T.raises(function() F.add_rms_norm(x, fsdp.randn({ 8, 2 }), nil, 1e-5) end,
             'add_rms_norm: branch [8, 2] f32 must have the input\'s shape and dtype, [2, 8] f32')
    T.raises(function() F.add_rms_norm(x, fsdp.randn({ 2, 8 }, { dtype = 'bf16' }), nil, 1e-5) end,
             'add_rms_norm: branch [2, 8] bf16')
    T.raises(function() F.add_rms_norm(x, fsdp.randn({ 2, 8 }), fsdp.randn({ 7 }), 1e-5) end,
             'add_rms_norm: weight of shape [7] does not match the last dim of input [2, 8]')
    T.raises(function() F.add_rms_norm(x, fsdp.randn({ 2, 8 }), nil, -1) end, 'add_rms_norm: eps')
  end)
end)
