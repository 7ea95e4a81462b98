-- models/families/mistral.lua: Mistral (model_type mistral): Llama with an
-- optional sliding window on every layer (v0.1: 4096; v0.3: none).
local decoder = require 'models.decoder'

return decoder.define({
  name = 'mistral', class = 'Mistral', norm = 'rms', norms = 'pre', activation = 'silu', sliding = 'all',
  fields = { sliding_window = true }, lora_targets = 'q_proj,v_proj',
  configs = {
    ['Mistral-7B-v0.3'] = { dim = 4096, n_layers = 32, n_heads = 32, n_kv_heads = 8, head_dim = 128, ffn_dim = 14336,
                            vocab_size = 32768, rope_theta = 1e6, norm_eps = 1e-5, max_seq_len = 32768 },
    ['Mistral-7B-v0.1'] = { dim = 4096, n_layers = 32, n_heads = 32, n_kv_heads = 8, head_dim = 128, ffn_dim = 14336,
                            vocab_size = 32000, rope_theta = 1e4, norm_eps = 1e-5, max_seq_len = 32768,
                            sliding_window = 4096 },
    tiny = { dim = 64, n_layers = 2, n_heads = 4, n_kv_heads = 2, ffn_dim = 176, vocab_size = 256, rope_theta = 1e6,
             max_seq_len = 512, sliding_window = 64 },
  },
  hf = { model_type = 'mistral', architecture = 'MistralForCausalLM', name = 'Mistral',
         fields = { sliding_window = 'sliding_window' },
         required = { hidden_act = 'silu', attention_dropout = 0 },
         defaults = { rms_norm_eps = 1e-6, max_position_embeddings = 131072, initializer_range = 0.02,
                      sliding_window = 4096 } },
})
