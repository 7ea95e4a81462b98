-- hf_families_spec.lua: every decoder family of models/families/ against
-- transformers' own model on the tiny directories
-- tests/golden/make_family_goldens.py saved (tests/golden/hf/<family>_tiny:
-- config.json + model.safetensors as save_pretrained wrote them, and
-- golden.safetensors). In float32, ours against the stock model: logits
-- (max error relative to the largest logit <= 1e-4, the issue's bound),
-- loss, the gradient of every parameter (max error relative to that
-- gradient's largest entry <= 1e-3), every parameter after one AdamW step
-- from those gradients (as torch.optim.AdamW, <= 1e-6), greedy generation token for token, and our
-- export loaded back equal. In bfloat16: the embeddings and the final norm
-- bit for bit, the logits no farther from f32 than twice transformers' own
-- bf16 (see the case).
--
-- The windowed families (mistral, phi3, gemma2, gemma3_text: window 4 <
-- the 9 tokens and the 14 generated positions) and gemma2's softcaps run
-- through nn.Attention's window and softcap options (the fused kernel,
-- and the decoding mask with a KV cache).
local fsdp = require 'fsdp'
local hf = require 'models.hf'
local generate = require 'fsdp.generate'
local optim = require 'fsdp.optim'
local T = require 'fsdp.testing'
local F = fsdp.F

local DIR = 'tests/golden/hf/'
local FAMILIES = { 'qwen2', 'qwen3', 'olmo2', 'phi3', 'mistral', 'gemma2', 'gemma3_text', 'mixtral', 'qwen3_moe' }

local function named(model)
  local set = {}
  for _, p in ipairs(model:named_parameters()) do set[p[1]] = p[2] end
  return set
end

-- max |a - b| / max |b| (0 when both are 0)
local function rel(a, b)
  local scale = F.abs(b):max():item()
  local d = T.max_abs_diff(a, b)
  if scale == 0 then return d end
  return d / scale
end


for _, family in ipairs(FAMILIES) do
  local case = family .. '_tiny'
  describe('Hugging Face ' .. case, function()
    local g = fsdp.load_safetensors(DIR .. case .. '/golden.safetensors')

    it('reads config.json as the family ' .. family, function()
      local c, name = hf.read_config(DIR .. case)
      assert.equals(family, name)
      local m = hf.from_pretrained(DIR .. case, { device = 'meta' })
      assert.equals(family, hf.family_of_model(m).name)
      local golden_names = {}
      for key in pairs(g) do
        local n = key:match('^grad%.(.*)$')
        if n then golden_names[n] = true end
      end
      -- our parameters are transformers' (a tied head once, as HF's named_parameters)
      for n in pairs(named(m)) do assert.is_true(golden_names[n] ~= nil, n) end
      for n in pairs(golden_names) do assert.is_true(named(m)[n] ~= nil, n) end
      assert.equals(32, c.dim)
    end)

    it('float32: logits, loss, every gradient and one AdamW step equal transformers\'', function()
      local m = hf.from_pretrained(DIR .. case, { dtype = 'f32' })
      -- the loss through the fused head ([Note: the fused loss] in models/decoder.lua)
      local loss = m:loss(g.input_ids, g.labels)
      local logits = fsdp.no_grad(function() return m(g.input_ids) end)
      local e = rel(logits, g.logits_f32)
      assert(e <= 1e-4, ('logits: max relative error %g'):format(e))
      local dl = math.abs(loss:item() - g.loss_f32:item()) / math.abs(g.loss_f32:item())
      assert(dl <= 1e-5, ('loss differs by %g relative'):format(dl))
      loss:backward()
      local params, n, worst = named(m), 0, 0
      for name, p in pairs(params) do
        local eg = rel(p.grad, g['grad.' .. name])
        assert(eg <= 1e-3, ('gradient of %s: max relative error %g'):format(name, eg))
        worst, n = math.max(worst, eg), n + 1
      end
      assert.is_true(n > 10)
      -- The step from transformers' gradients (ours are checked above; an
      -- element whose gradient is ~0 has an Adam update of +-lr either way)
      fsdp.no_grad(function()
        for name, p in pairs(params) do p.grad:copy_(g['grad.' .. name]) end
      end)
      local opt = optim.AdamW(m:named_parameters(), { lr = 1e-2, betas = { 0.9, 0.999 }, eps = 1e-8,
                                                      weight_decay = 0.1 })
      opt:step()
      local worst_step = 0
      for name, p in pairs(params) do
        -- an update is ~lr (1e-2) per element; float32 rounding of the step
        local d = T.max_abs_diff(p, g['adamw.' .. name])
        assert(d <= 1e-6, ('after AdamW %s differs by %g'):format(name, d))
        worst_step = math.max(worst_step, d)
      end
      print(('  %s f32 against transformers: logits %.2g, loss %.2g, worst gradient %.2g (relative), AdamW step '
        .. '%.2g (absolute)'):format(family, e, dl, worst, worst_step))
    end)

    it('greedy generation equals transformers\' generate, token for token', function()
      local m = hf.from_pretrained(DIR .. case, { dtype = 'f32' })
      local ids, mask = g.gen_input_ids:tolist(), g.gen_attention_mask:tolist()
      local prompts = {}
      for b = 1, #ids do
        prompts[b] = {}
        for t = 1, #ids[b] do
          if mask[b][t] == 1 then prompts[b][#prompts[b] + 1] = ids[b][t] end
        end
      end
      local want = g.gen_greedy:tolist()
      local L = #ids[1]
      local rows = generate.generate(m, prompts, { max_new_tokens = #want[1] - L, pad_id = 0 })
      for b = 1, #prompts do
        local expect = {}
        for t = L + 1, #want[b] do expect[#expect + 1] = want[b][t] end
        assert.equals(table.concat(expect, ','), table.concat(rows[b], ','), 'row ' .. b)
      end
    end)

    -- bf16 ([Note: RMSNorm variants] in models/decoder_parts.lua): the
    -- same weights rounded to bf16 as transformers' model.to(bfloat16).
    -- The logits' rounding accumulates over every product of the layers
    -- (1-3% of the largest logit here, in transformers as in ours), so they
    -- are held to transformers' own distance: ours from the f32 logits no
    -- more than twice transformers' bf16 from them (measured: 0.56x-1.50x).
    -- That bound cannot see a cast order (a wrong one moves the logits by
    -- less than the accumulated rounding), so the places where one is
    -- decided are compared exactly: what the first layer receives (the
    -- embeddings, Gemma's sqrt(h) rounded to bf16 times them) bit for bit,
    -- and the final norm of a random bf16 input, where at most 1% of the
    -- elements may differ by one rounding (f32 sums in another order; 0
    -- measured at every ISA level), while a wrong cast order changes 24-40%.
    it('bfloat16: the embeddings and the norm bit for bit, the logits as close as transformers\' own', function()
      local m = hf.from_pretrained(DIR .. case, { dtype = 'bf16' })
      m:eval()
      local layer0 = m.model.layers:children()[1]
      local h0
      local forward = layer0.forward
      layer0.forward = function(self, x, ...)
        h0 = x
        return forward(self, x, ...)
      end
      local logits = fsdp.no_grad(function() return m(g.input_ids) end)
      layer0.forward = nil
      assert.equals('bf16', logits.dtype)
      assert.equals(0, T.max_abs_diff(h0:to('f32'), g.h0_bf16:to('f32')))
      local theirs = rel(g.logits_bf16:to('f32'), g.logits_f32)
      local ours = rel(logits:to('f32'), g.logits_f32)
      print(('  %s bf16 logits from f32: ours %.3g, transformers %.3g (%.2fx)'):format(family, ours, theirs,
        ours / theirs))
      assert(ours <= 2 * theirs, ('bf16 logits %.3g from f32, transformers\' %.3g'):format(ours, theirs))
      local y = fsdp.no_grad(function() return m.model.norm(g.norm_x_bf16) end)
      local want = g.norm_y_bf16
      assert.equals('bf16', y.dtype)
      local differ = F.sum(F.ne(y, want):to('f32')):item() / want:numel()
      assert(differ <= 0.01, ('the bf16 norm differs from transformers\' in %.1f%% of the elements'):format(100 * differ))
      local d = F.abs(y:to('f32') - want:to('f32')) / F.clamp(F.abs(want:to('f32')), 1e-30)
      assert(d:max():item() <= 2 ^ -7, ('the bf16 norm differs by %g relative'):format(d:max():item()))
    end)

    it('our export loads back with the same config and weights', function()
      local m = hf.from_pretrained(DIR .. case, { dtype = 'f32' })
      local dir = T.tmpdir() .. '/export'
      hf.save_pretrained(m, dir)
      local back = hf.from_pretrained(dir, { dtype = 'f32' })
      assert.same(m.config, back.config)
      local a, b = named(m), named(back)
      for name, p in pairs(a) do assert.equals(0, T.max_abs_diff(p, b[name]), name) end
      local la = m(g.input_ids)
      assert.equals(0, T.max_abs_diff(la, back(g.input_ids)))
    end)
  end)
end
