-- cuda_training_spec.lua: whole training steps on cuda:0 against the same
-- steps on the CPU: a small Llama (embedding, RMSNorm, rotary, grouped-
-- query attention, SwiGLU, cross-entropy) built from one seed on both
-- devices, trained with AdamW on the same tokens, in f32 (losses and
-- parameters agree to rounding) and in bf16 (to bf16's precision), with
-- activation checkpointing on the device giving the plain run's gradients
-- bit for bit; and the device's out-of-memory error (naming the device and
-- the request) after which training goes on. Pending without a GPU; run
-- by the cudasim build on every machine.
local fsdp = require 'fsdp'
local llama = require 'models.llama'
local optim = require 'fsdp.optim'

local CUDA = fsdp.cuda.is_available()
local DEV = 'cuda:0'
local normalised_error = require('fsdp.testing').normalised_error

local VOCAB, B, T = 128, 2, 48

local function build(device, dtype)
  local c = llama.config('tiny', { n_layers = 2, vocab_size = VOCAB })
  local m = llama.build(c, { device = device, dtype = dtype })
  m:init_weights({ seed = 3 })
  return m
end

-- Losses of `steps` AdamW steps on one batch (so the loss falls) and the
-- model after them; the tokens are made on the CPU and moved, so both
-- devices see the same batch.
local function train(device, dtype, steps, prepare)
  local m = build(device, dtype)
  if prepare then prepare(m) end
  local opt = optim.AdamW(m:named_parameters(), { lr = 1e-2, weight_decay = 0.1 })
  local losses = {}
  local ids = fsdp.randint(0, VOCAB, { B, T }, { seed = 10 }):to(device)
  local targets = fsdp.randint(0, VOCAB, { B, T }, { seed = 11 }):to(device)
  for step = 1, steps do
    local loss = m:loss(ids, targets)
    loss:backward()
    opt:step()
    opt:zero_grad()
    losses[step] = loss:item()
  end
  return losses, m
end

local function assert_losses(got, want, tol, what)
  for i = 1, #want do
    local e = math.abs(got[i] - want[i]) / math.abs(want[i])
    assert(e <= tol, ('%s: step %d loss %.8g on cuda, %.8g on cpu (relative %.3g > %.3g)')
      :format(what, i, got[i], want[i], e, tol))
  end
end

local function assert_params(got, want, tol, what)
  local g = {}
  for _, np in ipairs(got:named_parameters()) do g[np[1]] = np[2] end
  for _, np in ipairs(want:named_parameters()) do
    local name, p = np[1], np[2]
    assert(g[name], what .. ': no parameter ' .. name .. ' on cuda')
    local e = normalised_error(g[name], p)
    assert(e <= tol, ('%s: %s differs by %.3g (> %.3g)'):format(what, name, e, tol))
  end
end

describe('training on cuda:0', function()
  if not CUDA then
    pending('no GPU here (' .. fsdp.cuda.status() .. '): training on cuda was not run')
    return
  end

  it('matches the CPU step for step in f32', function()
    local want, cpu_model = train('cpu', 'f32', 6)
    local got, gpu_model = train(DEV, 'f32', 6)
    assert.is_true(want[6] < want[1], 'the loss falls')
    assert_losses(got, want, 1e-5, 'f32')
    -- Adam divides by the root of the second moment, so where a gradient
    -- element is near zero the summation order's rounding moves the step
    -- visibly: parameters agree to 2e-3 of their largest value after six
    -- steps, losses to 1e-5. (When the CPU's attention backward began to
    -- sum its block products in another order, AVX-512 instead of
    -- OpenBLAS, its first-step gradients moved by 3e-7 relative, and the
    -- worst parameter here, the first MLP's down_proj, from under 1e-3
    -- to 1.07e-3.)
    assert_params(gpu_model, cpu_model, 2e-3, 'f32')
  end)

  it('matches the CPU to bf16 precision in bf16', function()
    local want = train('cpu', 'bf16', 4)
    local got = train(DEV, 'bf16', 4)
    assert_losses(got, want, 2e-2, 'bf16')
  end)

  it('gives the same gradients with activation checkpointing', function()
    local function grads(prepare)
      local m = build(DEV, 'f32')
      if prepare then prepare(m) end
      local ids = fsdp.randint(0, VOCAB, { B, T }, { seed = 1 }):to(DEV)
      local targets = fsdp.randint(0, VOCAB, { B, T }, { seed = 2 }):to(DEV)
      m:loss(ids, targets):backward()
      local out = {}
      for _, np in ipairs(m:named_parameters()) do out[np[1]] = np[2].grad:cpu() end
      return out
    end
    local plain = grads()
    local ckpt = grads(function(m)
      fsdp.checkpoint(m, function(x) return x:is_instance_of(llama.DecoderLayer) end)
    end)
    for name, g in pairs(plain) do
      assert.equals(0, normalised_error(ckpt[name], g), name)
    end
  end)

  it('reports running out of device memory, then trains on', function()
    -- 4 PiB: more than any device has
    local ok, err = pcall(fsdp.empty, { 2^20, 2^30 }, { device = DEV })
    assert.is_false(ok)
    err = tostring(err)
    assert.truthy(err:find('out of memory', 1, true), err)
    assert.truthy(err:find('cuda:0', 1, true), err)
    local losses = train(DEV, 'f32', 2)
    assert.is_true(losses[2] == losses[2], 'a finite loss after the error')
  end)
end)
