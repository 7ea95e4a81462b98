-- tests/golden/family_export.lua: writes, for tests/golden/check_family_export.py,
-- each family's golden directory re-exported by models/hf.lua's
-- save_pretrained (OUT/<family>), our float32 logits on its inputs
-- (OUT/<family>_ours.safetensors), and a LoRA model's PEFT adapter on that
-- export (OUT/<family>_peft, the family's default targets, B nonzero) with
-- its logits (OUT/<family>_peft_ours.safetensors).
--
--   build/bin/fsdp-lua tests/golden/family_export.lua OUT
local fsdp = require 'fsdp'
local hf = require 'models.hf'
local lora = require 'fsdp.lora'
local decoders = require 'models.decoders'

local out = assert(arg[1], 'usage: family_export.lua OUT')
for _, family in ipairs({ 'qwen2', 'qwen3', 'olmo2', 'phi3', 'mistral', 'gemma2', 'gemma3_text', 'mixtral',
                         'qwen3_moe' }) do
  local dir = 'tests/golden/hf/' .. family .. '_tiny'
  local g = fsdp.load_safetensors(dir .. '/golden.safetensors')
  local m = hf.from_pretrained(dir, { dtype = 'f32' })
  hf.save_pretrained(m, out .. '/' .. family)
  fsdp.save_safetensors(out .. '/' .. family .. '_ours.safetensors', { logits = m(g.input_ids) })
  lora.apply(m, { rank = 4, alpha = 8, targets = decoders.families[family].lora_targets, seed = 1 })
  fsdp.no_grad(function()
    for _, np in ipairs(m:named_parameters()) do
      if np[1]:find('lora_B') then np[2]:copy_(fsdp.randn(np[2].shape) * 0.1) end
    end
  end)
  lora.save_peft(m, out .. '/' .. family .. '_peft', { base_model_name_or_path = out .. '/' .. family })
  fsdp.save_safetensors(out .. '/' .. family .. '_peft_ours.safetensors', { logits = m(g.input_ids) })
  print(family .. ': written')
end
