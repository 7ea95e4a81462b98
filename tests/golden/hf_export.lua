-- tests/golden/hf_export.lua: the fsdp-lua half of check_hf_export.py.
-- Builds tiny Llama, T5 and GPT-2 models with our own initialisation, saves each
-- as a Hugging Face directory (models/hf.lua: config.json and weights
-- under HF names; once in one file, once sharded with an index), and
-- writes the inputs and our float64 logits next to them, for the Python
-- half to load in transformers and compare.
--
--   build/bin/fsdp-lua tests/golden/hf_export.lua OUT_DIR
local fsdp = require 'fsdp'
local hf = require 'models.hf'
local llama = require 'models.llama'
local t5 = require 'models.t5'
local gpt2 = require 'models.gpt2'

local out = assert(arg[1], 'usage: fsdp-lua tests/golden/hf_export.lua OUT_DIR')

local cases = {
  { name = 'llama2', build = function() return llama.build('tiny', { dim = 32, n_heads = 4, n_kv_heads = 4, ffn_dim = 48, vocab_size = 64 }) end },
  { name = 'llama3', build = function()
    return llama.build('tiny', { dim = 32, n_heads = 4, n_kv_heads = 2, ffn_dim = 48, vocab_size = 64, tied = true,
      rope_theta = 5e5, rope_scaling = { rope_type = 'llama3', factor = 32, low_freq_factor = 1, high_freq_factor = 4,
                                         original_max_position_embeddings = 16 } })
  end },
  { name = 't5_v1_0', build = function() return t5.build('tiny', { d_model = 16, d_ff = 32, d_kv = 8, num_heads = 2 }) end },
  { name = 't5_v1_1', build = function()
    return t5.build('tiny', { d_model = 16, d_ff = 24, d_kv = 8, num_heads = 2, num_decoder_layers = 3, gated = true,
                              tied = false, relative_attention_num_buckets = 8, relative_attention_max_distance = 10 })
  end },
  -- transformers 5's own v1.1: the head tied, the output not scaled
  -- (4.x cannot express it: its tie implies the scale).
  { name = 't5_v1_1_tied', build = function()
    return t5.build('tiny', { d_model = 16, d_ff = 24, d_kv = 8, num_heads = 2, gated = true, tied = true,
                              scale_decoder_outputs = false })
  end },
  { name = 'gpt2', build = function()
    return gpt2.build('tiny', { dim = 32, n_heads = 4, vocab_size = 64, max_seq_len = 16 })
  end },
}

for i, case in ipairs(cases) do
  local model = case.build()
  model:init_weights({ seed = 100 + i })
  -- Norm weights off 1.0 so that they matter.
  fsdp.no_grad(function()
    for _, p in ipairs(model:named_parameters()) do
      if p[2]:dim() == 1 then p[2]:copy_(fsdp.randn(p[2].shape, { seed = i, std = 0.1 }) + 1) end
    end
  end)
  hf.save_pretrained(model, out .. '/' .. case.name)
  hf.save_pretrained(model, out .. '/' .. case.name .. '_sharded', { max_shard_size = '20KB' })
  model:to({ dtype = 'f64' })
  local ids = fsdp.randint(2, 64, { 2, 9 }, { seed = i })
  local result = { input_ids = ids }
  if case.name:match('^t5') then
    local dec = fsdp.randint(2, 64, { 2, 5 }, { seed = 50 + i })
    local mask = fsdp.tensor({ { 1, 1, 1, 1, 1, 1, 1, 1, 1 }, { 1, 1, 1, 1, 1, 1, 0, 0, 0 } }, { dtype = 'i64' })
    result.decoder_input_ids, result.attention_mask = dec, mask
    result.logits = model(ids, dec, { attention_mask = mask })
  else
    result.logits = model(ids)
  end
  fsdp.save_safetensors(out .. '/' .. case.name .. '/ours.safetensors', result)
  print(('%s: saved %d parameters'):format(case.name, model:num_parameters()))
end
