-- models/families/qwen3.lua: Qwen 3 dense (model_type qwen3): Llama with a
-- per-head RMSNorm on q and k (weights [head_dim]) before RoPE, and an
-- explicit head_dim (n_heads * head_dim may differ from dim).
local decoder = require 'models.decoder'
local shared = require 'models.families.shared'

return decoder.define({
  name = 'qwen3', class = 'Qwen3', norm = 'rms', norms = 'pre', qk_norm = 'head', activation = 'silu',
  sliding = 'layer_types', fields = { sliding_window = true, layer_types = true },
  defaults = { norm_eps = 1e-6 }, lora_targets = 'q_proj,v_proj',
  configs = {
    ['Qwen3-0.6B'] = { dim = 1024, n_layers = 28, n_heads = 16, n_kv_heads = 8, head_dim = 128, ffn_dim = 3072,
                       vocab_size = 151936, tied = true, rope_theta = 1e6, norm_eps = 1e-6, max_seq_len = 40960 },
    ['Qwen3-8B'] = { dim = 4096, n_layers = 36, n_heads = 32, n_kv_heads = 8, head_dim = 128, ffn_dim = 12288,
                     vocab_size = 151936, rope_theta = 1e6, norm_eps = 1e-6, max_seq_len = 40960 },
    tiny = { dim = 64, n_layers = 2, n_heads = 4, n_kv_heads = 2, head_dim = 32, ffn_dim = 176, vocab_size = 256,
             rope_theta = 1e6, max_seq_len = 512 },
  },
  hf = { model_type = 'qwen3', architecture = 'Qwen3ForCausalLM', name = 'Qwen3',
         required = { hidden_act = 'silu', attention_bias = false, attention_dropout = 0 },
         -- Qwen3Config's head_dim default is 128, not hidden_size / heads.
         defaults = { rms_norm_eps = 1e-6, max_position_embeddings = 32768, initializer_range = 0.02, head_dim = 128 },
         special = shared.QWEN_WINDOW_KEYS, from_hf = shared.qwen_window_from_hf, to_hf = shared.qwen_window_to_hf },
})
