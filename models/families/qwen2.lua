-- models/families/qwen2.lua: Qwen 2 / 2.5 (model_type qwen2): Llama with
-- biases on the q, k and v projections (not o). Sliding-window support
-- exists in the config (use_sliding_window, max_window_layers) but the
-- released checkpoints turn it off; it is translated all the same
-- (layers >= max_window_layers slide, as transformers builds layer_types).
local decoder = require 'models.decoder'
local shared = require 'models.families.shared'

return decoder.define({
  name = 'qwen2', class = 'Qwen2', norm = 'rms', norms = 'pre', qkv_bias = true, activation = 'silu',
  sliding = 'layer_types', fields = { sliding_window = true, layer_types = true },
  defaults = { norm_eps = 1e-6 }, lora_targets = 'q_proj,v_proj',
  configs = {
    ['Qwen2.5-0.5B'] = { dim = 896, n_layers = 24, n_heads = 14, n_kv_heads = 2, head_dim = 64, ffn_dim = 4864,
                         vocab_size = 151936, tied = true, rope_theta = 1e6, norm_eps = 1e-6, max_seq_len = 32768 },
    ['Qwen2.5-7B'] = { dim = 3584, n_layers = 28, n_heads = 28, n_kv_heads = 4, head_dim = 128, ffn_dim = 18944,
                       vocab_size = 152064, rope_theta = 1e6, norm_eps = 1e-6, max_seq_len = 131072 },
    tiny = { dim = 64, n_layers = 2, n_heads = 4, n_kv_heads = 2, ffn_dim = 176, vocab_size = 256, rope_theta = 1e6,
             max_seq_len = 512 },
  },
  hf = { model_type = 'qwen2', architecture = 'Qwen2ForCausalLM', name = 'Qwen2',
         required = { hidden_act = 'silu', attention_dropout = 0 },
         defaults = { rms_norm_eps = 1e-6, max_position_embeddings = 32768, initializer_range = 0.02 },
         special = shared.QWEN_WINDOW_KEYS, from_hf = shared.qwen_window_from_hf, to_hf = shared.qwen_window_to_hf },
})
