-- checkpoint_spec.lua: activation checkpointing chosen by a predicate:
-- gradients identical to the plain model, far less activation memory, the
-- every-k-th variant, and nothing changed under no_grad.
local fsdp = require 'fsdp'
local llama = require 'models.llama'

local function build(n_layers)
  local c = llama.config('tiny', { n_layers = n_layers, dim = 64, ffn_dim = 176, vocab_size = 128 })
  local m = llama.build(c)
  m:init_weights({ seed = 5 })
  return m
end

local function is_block(m) return m:is_instance_of(llama.DecoderLayer) end

local ids = fsdp.randint(0, 128, { 4, 96 }, { seed = 1 })
local targets = fsdp.randint(0, 128, { 4, 96 }, { seed = 2 })

-- Peak CPU bytes above the weights during forward + backward, counting
-- only live tensors (collect before every allocation).
local function step(m)
  local budget = fsdp.set_collect_budget(0)
  finally(function() fsdp.set_collect_budget(budget) end)
  fsdp.collect()
  local base = fsdp.memory_stats('cpu').in_use
  fsdp.reset_memory_stats('cpu')
  local loss = m:loss(ids, targets)
  loss:backward()
  return loss:item(), fsdp.memory_stats('cpu').peak - base
end

describe('activation checkpointing', function()
  it('gives the same loss and gradients with far less activation memory', function()
    local plain, ckpt = build(8), build(8)
    local wrapped = fsdp.checkpoint(ckpt, is_block)
    assert.equals(8, #wrapped)
    assert.equals('model.layers.0', wrapped[1])
    local l1, peak_plain = step(plain)
    local l2, peak_ckpt = step(ckpt)
    assert.equals(l1, l2)
    local p2 = ckpt:named_parameters()
    for i, p in ipairs(plain:named_parameters()) do
      assert.same(p[2].grad:tolist(), p2[i][2].grad:tolist())
    end
    assert.is_true(peak_ckpt < 0.5 * peak_plain,
      ('peak %.1f MB checkpointed vs %.1f MB plain'):format(peak_ckpt / 2^20, peak_plain / 2^20))
  end)

  it('can take every k-th match only, and leaves inner matches alone', function()
    local m = build(4)
    assert.same({ 'model.layers.0', 'model.layers.2' }, fsdp.checkpoint(m, is_block, { every = 2 }))
    local outer = build(2)
    local names = fsdp.checkpoint(outer, function(x, name) return name == 'model' or is_block(x) end)
    assert.same({ 'model' }, names)
  end)

  it('does nothing special under no_grad', function()
    local m = build(2)
    fsdp.checkpoint(m, is_block)
    local logits = fsdp.no_grad(function() return m(ids) end)
    assert.is_nil(logits.grad_fn)
  end)
end)
