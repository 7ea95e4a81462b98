-- hf_families_spec.lua: every decoder family of models/families/ against
-- transformers' own model on the tiny directories
-- tests/golden/make_family_goldens.py saved (tests/golden/hf/<family>_tiny:
-- config.json + model.safetensors as save_pretrained wrote them, and
-- golden.safetensors). In float32, ours against the stock model: logits
-- (max error relative to the largest logit <= 1e-4, the issue's bound),
-- loss, the gradient of every parameter (max error relative to that
-- gradient's largest entry <= 1e-3), every parameter after one AdamW step
-- from those gradients (as torch.optim.AdamW, <= 1e-6), greedy generation token for token, and our
-- export loaded back equal.
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
      local loss, logits = m:loss(g.input_ids, g.labels)
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
      for name, p in pairs(params) do
        -- an update is ~lr (1e-2) per element; float32 rounding of the step
        local d = T.max_abs_diff(p, g['adamw.' .. name])
        assert(d <= 1e-6, ('after AdamW %s differs by %g'):format(name, d))
      end
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
