-- deepvit_golden_spec.lua: our DeepViT against vit-pytorch's on the state
-- dicts tests/golden/make_hf5_goldens.py saved: today's deepvit.py (patch
-- embedding LayerNorm -> Linear -> LayerNorm) and vit-pytorch 0.35.8's
-- (2022: a Linear alone, Residual/PreNorm wrappers). deepvit.from_vit_pytorch
-- reads the layout and every size off the file.
--
-- Tolerances: float64 is vit-pytorch's model converted to float64:
-- measured 6.7e-16 on logits up to ~3, asserted 1e-12; float32: measured
-- 2.4e-7, asserted 2e-5.
local fsdp = require 'fsdp'
local deepvit = require 'models.deepvit'
local T = require 'fsdp.testing'

local DIR = 'tests/golden/hf/'

for case, layout in pairs({ deepvit_tiny = 'current', deepvit_tiny_2022 = '2022' }) do
  describe('vit-pytorch DeepViT, ' .. layout .. ' layout', function()
    local g = fsdp.load_safetensors(DIR .. case .. '/golden.safetensors')

    it('reads the layout and the sizes off the state dict', function()
      local m, got = deepvit.from_vit_pytorch(DIR .. case, { device = 'meta' })
      assert.equals(layout, got)
      local c = m.config
      assert.same({ 32, 8, 32, 2, 4, 8, 48, 10 }, { c.image_size, c.patch_size, c.dim, c.depth, c.heads, c.dim_head,
                                                 c.mlp_dim, c.num_classes })
      assert.equals(layout == 'current', c.patch_norm == true)
      -- The patch LayerNorms: 2 * patch_dim + 2 * dim more parameters.
      assert.equals(layout == 'current' and 22458 or 22010, m:num_parameters())
    end)

    it('float64 and float32 logits equal vit-pytorch\'s', function()
      local m64 = deepvit.from_vit_pytorch(DIR .. case, { dtype = 'f64' })
      local d = T.max_abs_diff(m64(g.images:to('f64')), g.logits_f64)
      assert(d < 1e-12, ('f64 logits differ by %g'):format(d))
      local m32 = deepvit.from_vit_pytorch(DIR .. case, { dtype = 'f32' })
      d = T.max_abs_diff(m32(g.images), g.logits_f32)
      assert(d < 2e-5, ('f32 logits differ by %g'):format(d))
    end)
  end)
end

describe('DeepViT with patch LayerNorms (patch_norm)', function()
  it('has 8,192 more parameters at 8B (MODELS.md: LayerNorm(3072) and LayerNorm(1024))', function()
    assert.equals(8007494160, deepvit.build('8B', { device = 'meta' }):num_parameters())
    assert.equals(8007494160 + 8192, deepvit.build('8B', { device = 'meta', patch_norm = true }):num_parameters())
  end)
end)

describe('deepvit.from_vit_pytorch', function()
  it('names a file that is not a DeepViT state dict', function()
    assert.error_matches(function() deepvit.from_vit_pytorch(DIR .. 'gpt2_tiny') end,
      'has no to_patch_embedding.1.weight: not a vit%-pytorch DeepViT state dict')
  end)

  it('names channels that do not fit the patch size', function()
    assert.error_matches(function() deepvit.from_vit_pytorch(DIR .. 'deepvit_tiny', { channels = 1 }) end,
      'patch_dim 192 and 17 positions do not fit square 1%-channel images')
  end)
end)
