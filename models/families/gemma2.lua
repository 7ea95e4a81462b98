-- models/families/gemma2.lua: Gemma 2 (model_type gemma2): (1+w) RMSNorm
-- in f32, embeddings times sqrt(dim) in their dtype, GeGLU with gelu
-- tanh, sandwich norms (pre and post around attention and MLP),
-- attention scores softcapped (tanh(s/c)*c) and scaled by
-- query_pre_attn_scalar^-0.5, the logits softcapped, and even layers
-- sliding (window 4096), odd ones global; head_dim 256 (n_heads * 256 may
-- differ from dim); tied. Window and softcap are nn.Attention's options.
local decoder = require 'models.decoder'
local shared = require 'models.families.shared'

local M = {}

-- Gemma 2 and 3 share all but their q/k norms, softcaps and RoPE tables.
function M.declaration(over)
  local d = {
    name = 'gemma2', class = 'Gemma2', norm = 'rms_offset', norms = 'sandwich', activation = 'gelu_tanh',
    embed_scale = true, sliding = 'layer_types', lora_targets = 'q_proj,v_proj',
    fields = { sliding_window = true, sliding_pattern = true, layer_types = true, attn_softcap = true,
               final_softcap = true, query_scale = true },
    defaults = { tied = true, norm_eps = 1e-6, sliding_pattern = 2 },
    configs = {
      ['Gemma-2-2B'] = { dim = 2304, n_layers = 26, n_heads = 8, n_kv_heads = 4, head_dim = 256, ffn_dim = 9216,
                         vocab_size = 256000, tied = true, rope_theta = 1e4, norm_eps = 1e-6, max_seq_len = 8192,
                         sliding_window = 4096, attn_softcap = 50, final_softcap = 30, query_scale = 256 },
      ['Gemma-2-9B'] = { dim = 3584, n_layers = 42, n_heads = 16, n_kv_heads = 8, head_dim = 256, ffn_dim = 14336,
                         vocab_size = 256000, tied = true, rope_theta = 1e4, norm_eps = 1e-6, max_seq_len = 8192,
                         sliding_window = 4096, attn_softcap = 50, final_softcap = 30, query_scale = 256 },
      tiny = { dim = 64, n_layers = 2, n_heads = 4, n_kv_heads = 2, head_dim = 16, ffn_dim = 176, vocab_size = 256,
               rope_theta = 1e4, max_seq_len = 512, sliding_window = 64, attn_softcap = 50, final_softcap = 30,
               query_scale = 16 },
    },
    hf = { model_type = 'gemma2', architecture = 'Gemma2ForCausalLM', name = 'Gemma2',
           fields = { attn_logit_softcapping = 'attn_softcap', final_logit_softcapping = 'final_softcap',
                      query_pre_attn_scalar = 'query_scale' },
           -- transformers reads hidden_activation; hub configs also carry hidden_act, which it does not read
           required = { hidden_activation = 'gelu_pytorch_tanh', attention_bias = false, attention_dropout = 0,
                        use_bidirectional_attention = false },
           ignored = { 'hidden_act', 'cache_implementation' },
           -- Gemma2Config's defaults: tied, head_dim 256, the 2B's softcaps and scalar.
           defaults = { rms_norm_eps = 1e-6, max_position_embeddings = 8192, initializer_range = 0.02, head_dim = 256,
                        tie_word_embeddings = true, attn_logit_softcapping = 50, final_logit_softcapping = 30,
                        query_pre_attn_scalar = 256 },
           special = shared.GEMMA_WINDOW_KEYS,
           from_hf = function(h, c, ctx) shared.gemma_window_from_hf(h, c, ctx, 2) end,
           to_hf = shared.gemma_window_to_hf },
  }
  for k, v in pairs(over or {}) do d[k] = v end
  return d
end

for k, v in pairs(decoder.define(M.declaration())) do M[k] = v end
return M
