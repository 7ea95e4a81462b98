-- deepvit_spec.lua: DeepViT's parameter counts for every MODELS.md config,
-- re-attention against a direct element-by-element reference, gradients by
-- finite differences, and a tiny DeepViT learning synthetic image classes.
local fsdp = require 'fsdp'
local deepvit = require 'models.deepvit'
local T = require 'fsdp.testing'
local F = fsdp.F

describe('DeepViT', function()
  local counts = { ['60M'] = 76463664, ['1B'] = 1004322768, ['3B'] = 3011226800, ['8B'] = 8007494160 }
  for name, n in pairs(counts) do
    it(name .. ' has ' .. n .. ' parameters on meta', function()
      assert.equals(n, deepvit.build(name, { device = 'meta' }):num_parameters())
    end)
  end

  it('counts 8,397,088 parameters per 16-head block and 3.17 TFLOP per 8B image', function()
    local c = deepvit.config('1B')
    assert.equals(8397088, deepvit.Block(c, {}):num_parameters())
    assert.is_true(math.abs(deepvit.flops_per_image(deepvit.config('8B')) / 1e12 - 3.17) < 0.005)
  end)

  local c = deepvit.config('tiny', { depth = 1, heads = 2, dim = 8, dim_head = 4, mlp_dim = 16,
                                     image_size = 8, patch_size = 4, num_classes = 3 })

  it('re-attends as the paper says (against an element-by-element reference)', function()
    local m = deepvit.build(c, { dtype = 'f64' })
    m:init_weights({ seed = 3 })
    local attn = m.layers[1].attn
    local x = fsdp.randn({ 1, 5, 8 }, { seed = 4, dtype = 'f64' })
    local got = attn(x)
    -- reference: plain loops over heads and positions
    local H, D, N = 2, 4, 5
    local qkv = attn.to_qkv(attn.norm(x)):view(N, 3, H, D)
    local theta = attn.reattn_weights
    local probs = {}
    for h = 0, H - 1 do
      probs[h] = {}
      for i = 0, N - 1 do
        local row, mx = {}, -math.huge
        for j = 0, N - 1 do
          local s = 0
          for d = 0, D - 1 do s = s + qkv:get(i, 0, h, d) * qkv:get(j, 1, h, d) end
          row[j] = s / math.sqrt(D)
          mx = math.max(mx, row[j])
        end
        local z = 0
        for j = 0, N - 1 do row[j] = math.exp(row[j] - mx); z = z + row[j] end
        for j = 0, N - 1 do row[j] = row[j] / z end
        probs[h][i] = row
      end
    end
    local w, b = attn.reattn_norm.weight, attn.reattn_norm.bias
    local out = fsdp.zeros({ N, H * D }, { dtype = 'f64' })
    for i = 0, N - 1 do
      for j = 0, N - 1 do
        local mixed, mean, var = {}, 0, 0
        for g = 0, H - 1 do
          local s = 0
          for h = 0, H - 1 do s = s + probs[h][i][j] * theta:get(h, g) end
          mixed[g] = s
          mean = mean + s / H
        end
        for g = 0, H - 1 do var = var + (mixed[g] - mean) ^ 2 / H end
        for g = 0, H - 1 do
          local a = (mixed[g] - mean) / math.sqrt(var + 1e-5) * w:get(g) + b:get(g)
          for d = 0, D - 1 do
            out:set(out:get(i, g * D + d) + a * qkv:get(j, 2, g, d), i, g * D + d)
          end
        end
      end
    end
    local expected = attn.to_out(out:unsqueeze(0))
    assert.is_true(T.max_abs_diff(got, expected) < 1e-12)
  end)

  it('has gradients that match finite differences', function()
    local m = deepvit.build(c, { dtype = 'f64' })
    m:init_weights({ seed = 5 })
    local img = fsdp.randn({ 2, 3, 8, 8 }, { seed = 6, dtype = 'f64' }):requires_grad_()
    assert(T.gradcheck(function(x) return m(x) end, { img }))
    local theta = m.layers[1].attn.reattn_weights
    assert(T.gradcheck(function() return m(img:detach()) end, { theta }))
  end)

  it('learns synthetic image classes far below chance', function()
    local cfg = deepvit.config('tiny')
    local m = deepvit.build(cfg)
    m:init_weights({ seed = 1 })
    local opt = fsdp.optim.AdamW(m:named_parameters(), { lr = 3e-3, weight_decay = 0 })
    local templates = fsdp.randn({ 10, 3 * 32 * 32 }, { seed = 7 })
    local last
    for step = 0, 59 do
      local y = fsdp.randint(0, 10, { 32 }, { seed = 8, offset = step * 32 })
      local noise = fsdp.randn({ 32, 3, 32, 32 }, { seed = 9, offset = step * 32 * 3072 })
      local x = F.embedding(y, templates):view(32, 3, 32, 32) + noise
      local loss = F.cross_entropy(m(x), y)
      loss:backward()
      opt:step()
      opt:zero_grad()
      last = loss:item()
    end
    assert.is_true(last < 0.3 * math.log(10), ('final loss %.3f vs chance %.3f'):format(last, math.log(10)))
  end)

  it('names a wrong image size', function()
    local m = deepvit.build('tiny', { device = 'meta' })
    assert.error_matches(function() m(fsdp.empty({ 1, 3, 16, 16 }, { device = 'meta' })) end,
      'expected images %[B, 3, 32, 32%], got %[1, 3, 16, 16%]')
  end)
end)
