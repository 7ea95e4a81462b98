-- models/families/llama.lua: the Llama 2 / Llama 3 family (also SmolLM2,
-- TinyLlama) as a declaration over models/decoder.lua, with Hugging Face
-- parameter names (model.layers.N.self_attn.q_proj.weight, ...).
--
--   local llama = require 'models.llama'           -- (this module)
--   local model = llama.build('Llama-2-7b', {device = 'meta'})
--   print(model:num_parameters())                  -- 6738415616
--   local small = llama.build('tiny', {num_layers = 2})
--   small:init_weights({seed = 0})
--   local logits = small(ids)                      -- ids: i64 [B, T]
--   local loss = small:loss(ids, targets)
--
-- The math (MODELS.md): RMSNorm in fp32 cast back before the weight,
-- rotate-half RoPE (theta, optional llama3 frequency scaling), grouped-query
-- attention with a causal mask, SwiGLU MLP down(silu(gate(x)) * up(x)), no
-- biases, untied lm_head except where the config ties it to the embedding:
-- every choice of the declaration at its default ([Note: a family
-- declaration] in models/decoder.lua).
local decoder = require 'models.decoder'

local LLAMA3_8K = { type = 'llama3', factor = 8, low_freq_factor = 1, high_freq_factor = 4,
                    original_max_position_embeddings = 8192 }
local LLAMA3_32 = { type = 'llama3', factor = 32, low_freq_factor = 1, high_freq_factor = 4,
                    original_max_position_embeddings = 8192 }

-- Every row of MODELS.md plus small configs for tests and CPU training.
local configs = {
  ['Llama-2-7b'] = { dim = 4096, n_layers = 32, n_heads = 32, n_kv_heads = 32, ffn_dim = 11008,
                     vocab_size = 32000, rope_theta = 1e4, max_seq_len = 4096 },
  ['Llama-2-13b'] = { dim = 5120, n_layers = 40, n_heads = 40, n_kv_heads = 40, ffn_dim = 13824,
                      vocab_size = 32000, rope_theta = 1e4, max_seq_len = 4096 },
  ['Llama-2-70b'] = { dim = 8192, n_layers = 80, n_heads = 64, n_kv_heads = 8, ffn_dim = 28672,
                      vocab_size = 32000, rope_theta = 1e4, max_seq_len = 4096 },
  ['Llama-3.1-8B'] = { dim = 4096, n_layers = 32, n_heads = 32, n_kv_heads = 8, ffn_dim = 14336,
                       vocab_size = 128256, rope_theta = 5e5, rope_scaling = LLAMA3_8K,
                       max_seq_len = 131072 },
  ['Llama-3.1-70B'] = { dim = 8192, n_layers = 80, n_heads = 64, n_kv_heads = 8, ffn_dim = 28672,
                        vocab_size = 128256, rope_theta = 5e5, rope_scaling = LLAMA3_8K,
                        max_seq_len = 131072 },
  ['Llama-3.2-1B'] = { dim = 2048, n_layers = 16, n_heads = 32, n_kv_heads = 8, ffn_dim = 8192,
                       vocab_size = 128256, tied = true, rope_theta = 5e5, rope_scaling = LLAMA3_32,
                       max_seq_len = 131072 },
  ['Llama-3.2-3B'] = { dim = 3072, n_layers = 28, n_heads = 24, n_kv_heads = 8, ffn_dim = 8192,
                       vocab_size = 128256, tied = true, rope_theta = 5e5, rope_scaling = LLAMA3_32,
                       max_seq_len = 131072 },
  -- TinyLlama-1.1B's shapes: a 1B Llama with Llama 2's 32000-token
  -- vocabulary (issue 7's GPU benchmark, --model=TinyLlama-1.1B).
  ['TinyLlama-1.1B'] = { dim = 2048, n_layers = 22, n_heads = 32, n_kv_heads = 4, ffn_dim = 5632,
                         vocab_size = 32000, rope_theta = 1e4, max_seq_len = 2048 },
  -- SmolLM2-1.7B (MODELS_FAMILIES.md): plain Llama, MHA, theta 130000, tied.
  ['SmolLM2-1.7B'] = { dim = 2048, n_layers = 24, n_heads = 32, n_kv_heads = 32, ffn_dim = 8192,
                       vocab_size = 49152, tied = true, rope_theta = 130000, norm_eps = 1e-5, max_seq_len = 8192 },
  -- The benchmark's small Llama (issue 3): dim 512, 8 layers, 8 heads.
  ['small'] = { dim = 512, n_layers = 8, n_heads = 8, n_kv_heads = 8, ffn_dim = 1376,
                vocab_size = 32000, rope_theta = 1e4, max_seq_len = 2048 },
  -- Seconds-long CPU training and tests.
  ['tiny'] = { dim = 64, n_layers = 2, n_heads = 4, n_kv_heads = 2, ffn_dim = 176,
               vocab_size = 256, rope_theta = 1e4, max_seq_len = 512 },
}
-- Model names are the Hugging Face names of the published sizes; the
-- project's first spellings still find them but are listed nowhere (an
-- index, not keys: pairs() and --model's choices show one name per model).
local OLD_NAMES = { llama2_7b = 'Llama-2-7b', llama2_70b = 'Llama-2-70b' }
setmetatable(configs, { __index = function(_, k) return OLD_NAMES[k] and configs[OLD_NAMES[k]] end })

local M = decoder.define({
  name = 'llama', class = 'Llama', norm = 'rms', norm_class = false, norms = 'pre', activation = 'silu',
  configs = configs, lora_targets = 'q_proj,v_proj',
  -- config.json: the keys every decoder shares (models/hf.lua's base map) and these.
  hf = { model_type = 'llama', architecture = 'LlamaForCausalLM', name = 'Llama',
         required = { hidden_act = 'silu', attention_bias = false, mlp_bias = false, attention_dropout = 0 },
         -- pretraining_tp > 1 splits the projections into slices summed in
         -- turn: the same products in another order.
         ignored = { 'pretraining_tp' },
         -- LlamaConfig's defaults (ours differ: norm eps 1e-5, 4096 positions).
         defaults = { rms_norm_eps = 1e-6, max_position_embeddings = 2048, initializer_range = 0.02 } },
})
-- The old spellings and the names they stand for (--model takes them too).
M.old_names = OLD_NAMES

return M
