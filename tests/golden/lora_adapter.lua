-- tests/golden/lora_adapter.lua: the LoRA adapter of ours that the PEFT
-- goldens are made from (tests/golden/make_lora_goldens.py loads what
-- this writes with peft and records the logits) and that
-- tests/lua/lora_spec.lua rebuilds to compare with them. The tiny golden
-- Llama (tests/golden/hf/llama3_tiny_v5) with adapters on q_proj, v_proj
-- and down_proj, rank 4, alpha 8; A from its init rule (seed 5), B drawn
-- N(0, 0.05) (a fresh B is zero and would change nothing).
--
--   fsdp-lua tests/golden/lora_adapter.lua OUT_DIR     write OUT_DIR/adapter_*
--   require('tests.golden.lora_adapter').build()       the model, adapters in
local fsdp = require 'fsdp'
local lora = require 'fsdp.lora'
local hf = require 'models.hf'

local M = {}
M.BASE = 'tests/golden/hf/llama3_tiny_v5'
M.TARGETS = { 'q_proj', 'v_proj', 'down_proj' }

function M.build()
  local model = hf.from_pretrained(M.BASE, { dtype = 'f32' })
  lora.apply(model, { rank = 4, alpha = 8, targets = M.TARGETS, seed = 5 })
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
  local out = arg[1] or error('usage: fsdp-lua tests/golden/lora_adapter.lua OUT_DIR', 0)
  lora.save_peft(M.build(), out)
  print('wrote ' .. out)
end

return M
