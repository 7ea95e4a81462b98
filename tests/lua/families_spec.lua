-- families_spec.lua: the decoder families of models/families/ at their
-- real sizes on meta (parameter counts exactly MODELS_FAMILIES.md's,
-- transformers' own count; the closed form the fit check uses agrees),
-- traced by fsdp.plan on 8 x H100, named through --model, and their
-- declared differences visible in the built tree (class names, children).
local fsdp = require 'fsdp'
local decoders = require 'models.decoders'
local common = require 'models.common'
local clock = require 'fsdp.clock'

-- MODELS_FAMILIES.md, "params computed" (transformers 5.24 on meta).
local COUNTS = {
  { 'Qwen2.5-0.5B', 'qwen2', 494032768 }, { 'Qwen2.5-7B', 'qwen2', 7615616512 },
  { 'Qwen3-0.6B', 'qwen3', 596049920 }, { 'Qwen3-8B', 'qwen3', 8190735360 },
  { 'Mistral-7B-v0.3', 'mistral', 7248023552 }, { 'Gemma-2-2B', 'gemma2', 2614341888 },
  { 'Gemma-2-9B', 'gemma2', 9241705984 }, { 'Gemma-3-1B', 'gemma3_text', 999885952 },
  { 'Phi-3-mini-4k', 'phi3', 3821079552 }, { 'SmolLM2-1.7B', 'llama', 1711376384 },
  { 'OLMo-2-1124-7B', 'olmo2', 7298617344 },
  { 'Mixtral-8x7B-v0.1', 'mixtral', 46702792704, 12879925248 },
  { 'Qwen3-30B-A3B', 'qwen3_moe', 30532122624, 3353032704 },
}

describe('decoder families at their real sizes', function()
  for _, row in ipairs(COUNTS) do
    local name, family, want, active = row[1], row[2], row[3], row[4]
    it(name .. ' has exactly ' .. want .. ' parameters on meta, and fsdp.plan traces it on 8 x H100', function()
      local f, cname = decoders.resolve(name)
      assert.equals(family, f)
      local mod = decoders.families[f].module
      local m = mod.build(cname, { device = 'meta' })
      assert.equals(want, m:num_parameters())
      assert.equals(want, mod.closed_form_parameters(m.config))
      assert.equals(want, (common.size_of(family, m.config)))
      -- a mixture of experts: the active parameters (top_k of its experts) too
      assert.equals(active or want, mod.active_parameters(m.config))
      local t0 = clock.now()
      local p = fsdp.plan(m, { world = 8, device = 'h100-80g', mixed_precision = 'bf16', batch = 1, seq = 2048 })
      assert.is_true(p.memory.peak > 0 and p.time.step > 0)
      print(('  %s: plan %.2f s, peak %.1f GiB/rank, step %.3f s'):format(name, clock.now() - t0,
        p.memory.peak / 2^30, p.time.step))
    end)
  end
end)

describe('--model names of the families', function()
  it('prefix a tiny config Llama also has, and keep unique names as they are', function()
    assert.same({ 'qwen3', 'tiny' }, { decoders.resolve('qwen3-tiny') })
    assert.same({ 'gemma3_text', 'tiny' }, { decoders.resolve('gemma3-tiny') })
    assert.same({ 'llama', 'tiny' }, { decoders.resolve('tiny') })
    assert.same({ 'phi3', 'Phi-3-mini-4k' }, { decoders.resolve('Phi-3-mini-4k') })
    local names = table.concat(decoders.names(), ' ')
    assert.truthy(names:find('olmo2-tiny', 1, true))
    assert.is_nil(decoders.resolve('qwen3-Llama-2-7b'))
  end)
end)

describe('a family\'s declared differences', function()
  local function build(family, over)
    local o = { device = 'meta' }
    for k, v in pairs(over or {}) do o[k] = v end
    return decoders.families[family].module.build('tiny', o)
  end

  it('show in transformers\' class names and children', function()
    local q2 = build('qwen2')
    assert.equals('Qwen2ForCausalLM', q2:class_name())
    assert.equals('Qwen2DecoderLayer', q2.model.layers:children()[1]:class_name())
    assert.is_not_nil(q2.model.layers:children()[1].self_attn.q_proj.bias)
    assert.is_nil(q2.model.layers:children()[1].self_attn.o_proj.bias)
    local o2 = build('olmo2').model.layers:children()[1]
    assert.is_nil(o2.input_layernorm)
    assert.same({ 64 }, o2.self_attn.q_norm.weight.shape)        -- over the flat projection
    assert.same({ 32 }, o2.self_attn.k_norm.weight.shape)
    assert.same({ 32 }, build('qwen3').model.layers:children()[1].self_attn.q_norm.weight.shape) -- per head
    local p3 = build('phi3').model.layers:children()[1]
    assert.same({ 128, 64 }, p3.self_attn.qkv_proj.weight.shape)
    assert.same({ 352, 64 }, p3.mlp.gate_up_proj.weight.shape)
    local g2 = build('gemma2').model.layers:children()[1]
    assert.equals('Gemma2RMSNorm', g2.pre_feedforward_layernorm:class_name())
  end)

  it('slide the layers the config says: Gemma 2 even ones, Gemma 3 all but every sixth', function()
    local spec2 = build('gemma2', { num_layers = 4 }):kv_cache_spec().windows
    assert.same({ 64, false, 64, false }, spec2)
    local g3 = decoders.families.gemma3_text.module
    local spec3 = g3.build('Gemma-3-1B', { device = 'meta', num_layers = 12 }):kv_cache_spec().windows
    assert.same({ 512, 512, 512, 512, 512, false, 512, 512, 512, 512, 512, false }, spec3)
  end)

  it('count a sliding layer\'s attention FLOPs over its window only', function()
    local g2 = decoders.families.gemma2.module
    local c = g2.config('Gemma-2-2B')
    local full = g2.flops_per_token(c, 8192)
    c.sliding_window = nil
    assert.is_true(g2.flops_per_token(c, 8192) > full)
  end)
end)

describe('model names', function()
  it('are the Hugging Face names of the published sizes; the old spellings find them but are not listed', function()
    local decoders = require 'models.decoders'
    local llama = require 'models.llama'
    local names = {}
    for _, n in ipairs(decoders.names()) do names[n] = true end
    assert.is_true(names['Llama-2-7b'] and names['Llama-3.1-8B'] and names['Qwen3-8B'])
    assert.is_nil(names['llama2_7b'])
    assert.is_nil(names['llama2_70b'])
    assert.same(llama.config('Llama-2-70b'), llama.config('llama2_70b'))
    local dr = require 'models.decoder_training'
    assert.equals('Llama-2-7b', dr.MODEL_OPTIONS.model.values.llama2_7b)
  end)
end)
