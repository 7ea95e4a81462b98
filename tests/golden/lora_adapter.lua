-- tests/golden/lora_adapter.lua: the LoRA adapters of ours that the PEFT
-- goldens are made from (tests/golden/make_lora_goldens.py loads what
-- this writes with peft and records the logits) and that
-- tests/lua/lora_spec.lua rebuilds to compare with them: a golden tiny
-- model of each family with adapters of rank 4, alpha 8 on the targets
-- below; A from its init rule (seed 5), B drawn N(0, 0.05) (a fresh B is
-- zero and would change nothing).
--
--   fsdp-lua tests/golden/lora_adapter.lua CASE OUT_DIR    write OUT_DIR/adapter_*
--   require('tests.golden.lora_adapter').build(CASE)      the model, adapters in
local fsdp = require 'fsdp'
local lora = require 'fsdp.lora'
local hf = require 'models.hf'

local M = {}
-- CASE -> the base directory and the targets (GPT-2's Linears are
-- Conv1D in Hugging Face's files: peft's fan_in_fan_out).
M.CASES = {
  llama = { base = 'tests/golden/hf/llama3_tiny_v5', targets = { 'q_proj', 'v_proj', 'down_proj' } },
  gpt2 = { base = 'tests/golden/hf/gpt2_tiny', targets = { 'c_attn', 'c_proj' } },
  t5 = { base = 'tests/golden/hf/t5_v1_1_tiny_v5', targets = { 'q', 'v', 'wo' } },
}

function M.build(case)
  local c = M.CASES[case] or error('lora_adapter: no case ' .. tostring(case), 2)
  local model = hf.from_pretrained(c.base, { dtype = 'f32' })
  lora.apply(model, { rank = 4, alpha = 8, targets = c.targets, seed = 5 })
  fsdp.autograd.no_grad(function()
    for _, np in ipairs(model:named_parameters()) do
      if np[1]:match('lora_B') then
        fsdp.nn.init_fill(np[2], fsdp.nn.init.normal(0.05), { seed = 5, name = np[1] })
      end
    end
  end)
  return model
end

if arg and arg[0] and arg[0]:match('lora_adapter%.lua$') then
  local case, out = arg[1], arg[2]
  if not (case and out) then error('usage: fsdp-lua tests/golden/lora_adapter.lua CASE OUT_DIR', 0) end
  lora.save_peft(M.build(case), out)
  print('wrote ' .. out)
end

return M
