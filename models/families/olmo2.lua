-- models/families/olmo2.lua: OLMo 2 (model_type olmo2): no pre-norms (a
-- norm after attention and one after the MLP, each before the residual
-- add), q/k RMSNorm over the whole flat projection before it is split
-- into heads and before RoPE, and the norm weight multiplied in f32.
local decoder = require 'models.decoder'

return decoder.define({
  name = 'olmo2', class = 'Olmo2', norm = 'rms_wide', norms = 'post', qk_norm = 'flat', activation = 'silu',
  lora_targets = 'q_proj,v_proj',
  configs = {
    ['OLMo-2-1124-7B'] = { dim = 4096, n_layers = 32, n_heads = 32, n_kv_heads = 32, ffn_dim = 11008,
                           vocab_size = 100352, rope_theta = 5e5, norm_eps = 1e-6, max_seq_len = 4096 },
    tiny = { dim = 64, n_layers = 2, n_heads = 4, n_kv_heads = 2, ffn_dim = 176, vocab_size = 256, rope_theta = 5e5,
             max_seq_len = 512 },
  },
  hf = { model_type = 'olmo2', architecture = 'Olmo2ForCausalLM', name = 'OLMo2',
         required = { hidden_act = 'silu', attention_bias = false, attention_dropout = 0 },
         defaults = { rms_norm_eps = 1e-5, max_position_embeddings = 2048, initializer_range = 0.02 } },
})
