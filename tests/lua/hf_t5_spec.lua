-- hf_t5_spec.lua: our T5 against Hugging Face's T5ForConditionalGeneration
-- (v1.0: ReLU, tied; v1.1: gated-GELU, untied, more decoder layers, few
-- buckets) on the checkpoints tests/golden/make_hf_goldens.py saved, with
-- padded sources and targets: attention_mask and decoder_attention_mask
-- in HF's meaning. Also: padding does not change the unpadded rows'
-- results, and masks are checked.
--
-- Tolerances as in hf_llama_spec.lua: float64 against HF's graph in
-- float64 (its float32 norm and softmax islands widened), measured
-- ~1e-14 on logits up to 12, asserted 1e-12; float32 against the stock
-- model, measured 9.5e-6 on logits up to 12, asserted 5e-6 relative to
-- the largest logit.
--
-- The *_v5 cases (tests/golden/make_hf5_goldens.py) are saved by
-- transformers 5, which writes tie_word_embeddings true for every T5 and
-- scale_decoder_outputs for the d_model^-0.5 before the head: v1.0 (tied,
-- scaled), v1.1 (tied, not scaled) and v1.1 with a head of its own in the
-- file (untied, not scaled). Stock float32 models: measured up to 7.2e-6
-- on logits up to ~10; asserted 2e-5 (the issue's bound is 1e-4).
local fsdp = require 'fsdp'
local hf = require 'models.hf'
local t5 = require 'models.t5'
local T = require 'fsdp.testing'
local F = fsdp.F

local DIR = 'tests/golden/hf/'

local function named(model)
  local set = {}
  for _, p in ipairs(model:named_parameters()) do set[p[1]] = p[2] end
  return set
end

for _, case in ipairs({ 't5_v1_0_tiny', 't5_v1_1_tiny' }) do
  describe('Hugging Face ' .. case, function()
    local g = fsdp.load_safetensors(DIR .. case .. '/golden.safetensors')
    local masks = { attention_mask = g.attention_mask, decoder_attention_mask = g.decoder_attention_mask }

    it('builds the config HF saved', function()
      local c = hf.from_pretrained(DIR .. case, { device = 'meta' }).config
      local v11 = case == 't5_v1_1_tiny'
      assert.equals(v11, c.gated)
      assert.equals(not v11, c.tied)
      assert.equals(v11 and 3 or 2, c.num_decoder_layers)
      assert.equals(v11 and 8 or 32, c.relative_attention_num_buckets)
    end)

    it('float64 with padding masks: logits, loss and gradients equal HF\'s to rounding', function()
      local m = hf.from_pretrained(DIR .. case, { dtype = 'f64' })
      local loss, logits = m:loss(g.input_ids, g.labels, masks)
      local d = T.max_abs_diff(logits, g.logits)
      assert(d < 1e-12, ('logits differ by %g'):format(d))
      assert.is_true(math.abs(loss:item() - g.loss:item()) < 1e-12)
      loss:backward()
      local params, n = named(m), 0
      for key, want in pairs(g) do
        local name = key:match('^grad%.(.*)$')
        if name then
          local diff = T.max_abs_diff(params[name].grad, want)
          assert(diff < 1e-12, ('gradient of %s differs by %g'):format(name, diff))
          n = n + 1
        end
      end
      assert.equals(case == 't5_v1_1_tiny' and 8 or 7, n)
    end)

    it('float64 without masks equals HF without masks (and differs from the masked run)', function()
      local m = hf.from_pretrained(DIR .. case, { dtype = 'f64' })
      local logits = m(g.input_ids, t5.shift_right(g.labels))
      assert.is_true(T.max_abs_diff(logits, g.logits_unmasked) < 1e-12)
      assert.is_true(T.max_abs_diff(logits, g.logits) > 1e-3)
    end)

    it('float32: the stock HF model\'s logits and loss within float32 rounding', function()
      local m = hf.from_pretrained(DIR .. case, { dtype = 'f32' })
      local loss, logits = m:loss(g.input_ids, g.labels, masks)
      local scale = F.abs(g.logits_f32):max():item()
      assert.is_true(T.max_abs_diff(logits, g.logits_f32) < 5e-6 * scale)
      assert.is_true(math.abs(loss:item() - g.loss_f32:item()) < 5e-6 * math.abs(g.loss_f32:item()))
    end)
  end)
end

describe('T5 padding masks', function()
  local function model()
    local m = t5.build('tiny', { dtype = 'f64', num_layers = 2 })
    m:init_weights({ seed = 4 })
    return m
  end
  local ids = fsdp.tensor({ { 5, 9, 7, 3, 1 } }, { dtype = 'i64' })
  local dec = fsdp.tensor({ { 0, 11, 12 } }, { dtype = 'i64' })

  it('a padded source gives the unpadded logits, whatever the padding holds', function()
    local m = model()
    local want = m(ids, dec)
    for _, filler in ipairs({ 0, 17 }) do
      local padded = F.cat({ ids, fsdp.full({ 1, 3 }, filler, { dtype = 'i64' }) }, 1)
      local mask = fsdp.tensor({ { 1, 1, 1, 1, 1, 0, 0, 0 } }, { dtype = 'i64' })
      local got = m(padded, dec, { attention_mask = mask })
      assert.is_true(T.max_abs_diff(got, want) < 1e-12)
      -- Without the mask the padding is attended and the result changes.
      assert.is_true(T.max_abs_diff(m(padded, dec), want) > 1e-4)
      -- The encoder's outputs at the real tokens are those of the unpadded source.
      local enc = m:encode(padded, mask):narrow(1, 0, 5)
      assert.is_true(T.max_abs_diff(enc, m:encode(ids)) < 1e-12)
    end
  end)

  it('a batch of different lengths equals each row run alone, forward and loss', function()
    local m = model()
    local short = fsdp.tensor({ { 4, 6, 1 } }, { dtype = 'i64' })
    local batch = fsdp.tensor({ { 5, 9, 7, 3, 1 }, { 4, 6, 1, 0, 0 } }, { dtype = 'i64' })
    local mask = fsdp.tensor({ { 1, 1, 1, 1, 1 }, { 1, 1, 1, 0, 0 } }, { dtype = 'i64' })
    local labels = fsdp.tensor({ { 11, 12, 1 }, { 13, 1, -100 } }, { dtype = 'i64' })
    local dmask = fsdp.tensor({ { 1, 1, 1 }, { 1, 1, 0 } }, { dtype = 'i64' })
    local _, logits = m:loss(batch, labels, { attention_mask = mask, decoder_attention_mask = dmask })
    local _, row0 = m:loss(ids, labels:narrow(0, 0, 1))
    local _, row1 = m:loss(short, labels:narrow(0, 1, 1):narrow(1, 0, 2))
    assert.is_true(T.max_abs_diff(logits:narrow(0, 0, 1), row0) < 1e-12)
    assert.is_true(T.max_abs_diff(logits:narrow(0, 1, 1):narrow(1, 0, 2), row1) < 1e-12)
    -- Greedy generation of a padded batch: each row as if alone.
    local out = t5.generate(m, batch, { attention_mask = mask, max_new_tokens = 4 })
    local alone = t5.generate(m, short, { max_new_tokens = 4 })
    local a, b = alone:tolist()[1], out:tolist()[2]
    for i = 1, #a do assert.equals(a[i], b[i]) end
  end)

  it('gradients flow through the masked bias in float64 (gradcheck)', function()
    local m = t5.build({ d_model = 8, num_heads = 2, d_kv = 4, num_layers = 1, d_ff = 16, vocab_size = 11 },
      { dtype = 'f64' })
    m:init_weights({ seed = 3 })
    local batch = fsdp.tensor({ { 3, 4, 5, 1 }, { 6, 1, 0, 0 } }, { dtype = 'i64' })
    local mask = fsdp.tensor({ { 1, 1, 1, 1 }, { 1, 1, 0, 0 } }, { dtype = 'i64' })
    local labels = fsdp.tensor({ { 7, 8, 1 }, { 9, 1, -100 } }, { dtype = 'i64' })
    local set = named(m)
    local ok, msg = T.gradcheck(function()
      return (m:loss(batch, labels, { attention_mask = mask, decoder_attention_mask = F.ne(labels, -100) }))
    end, { set['encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight'],
           set['decoder.block.0.layer.1.EncDecAttention.k.weight'] })
    assert(ok, msg)
  end)

  it('name a mask of the wrong shape or type', function()
    local m = model()
    assert.error_matches(function() m(ids, dec, { attention_mask = fsdp.ones({ 1, 4 }) }) end,
      't5: attention_mask has shape %[1, 4%], expected %[1, 5%]')
    assert.error_matches(function() m(ids, dec, { decoder_attention_mask = fsdp.ones({ 2, 3 }) }) end,
      't5: decoder_attention_mask has shape %[2, 3%], expected %[1, 3%]')
    assert.error_matches(function() m(ids, dec, { attention_mask = { 1, 1 } }) end,
      't5: attention_mask must be a tensor')
  end)
end)

describe('T5 directories saved by transformers 5', function()
  for case, want in pairs({ t5_v1_0_tiny_v5 = { tied = true, scale = true, gated = false },
                            t5_v1_1_tiny_v5 = { tied = true, scale = false, gated = true },
                            t5_v1_1_untied_v5 = { tied = false, scale = false, gated = true } }) do
    it(case .. ': the head tied and scaled as transformers 5 builds it, float32 logits and loss equal its', function()
      local g = fsdp.load_safetensors(DIR .. case .. '/golden.safetensors')
      local m = hf.from_pretrained(DIR .. case, { dtype = 'f32' })
      assert.equals(want.tied, m.config.tied)
      assert.equals(want.scale, m.config.scale_decoder_outputs)
      assert.equals(want.gated, m.config.gated)
      local loss, logits = m:loss(g.input_ids, g.labels,
        { attention_mask = g.attention_mask, decoder_attention_mask = g.decoder_attention_mask })
      local d = T.max_abs_diff(logits, g.logits_f32)
      assert(d < 2e-5, ('logits differ by %g'):format(d))
      assert.is_true(math.abs(loss:item() - g.loss_f32:item()) < 2e-5)
    end)
  end

  it('v1.1 scaled by mistake would be off by exactly d_model^-0.5 (what the scale key decides)', function()
    local g = fsdp.load_safetensors(DIR .. 't5_v1_1_tiny_v5/golden.safetensors')
    local m = hf.from_pretrained(DIR .. 't5_v1_1_tiny_v5', { dtype = 'f32', scale_decoder_outputs = true })
    local logits = m(g.input_ids, t5.shift_right(g.labels),
      { attention_mask = g.attention_mask, decoder_attention_mask = g.decoder_attention_mask })
    assert.is_true(T.max_abs_diff(logits * (16 ^ 0.5), g.logits_f32) < 1e-4)
    assert.is_true(T.max_abs_diff(logits, g.logits_f32) > 0.1)
  end)
end)
