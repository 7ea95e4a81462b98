-- models/families/mixtral.lua: Mixtral (model_type mixtral): Mistral's
-- attention (sliding window when set: null on 8x7B) with a sparse mixture
-- of experts for the MLP: a softmax router over num_local_experts SwiGLU
-- experts of intermediate_size, the top num_experts_per_tok of them
-- renormalised (always), no shared expert. With output_router_logits the
-- load-balancing loss times router_aux_loss_coef joins the loss.
-- Checkpoints store one tensor per expert (block_sparse_moe.experts.E.w1
-- = gate, w3 = up, w2 = down; the router block_sparse_moe.gate): read
-- into and written from the fused experts ([Note: checkpoint pieces] in
-- models/decoder_parts.lua).
local decoder = require 'models.decoder'

return decoder.define({
  name = 'mixtral', class = 'Mixtral', norm = 'rms', norms = 'pre', activation = 'silu', mlp = 'moe',
  moe_keys = 'mixtral', sliding = 'all',
  fields = { sliding_window = true, n_experts = true, top_k = true, moe_ffn_dim = true, norm_topk_prob = true,
             router_aux_loss_coef = true, output_router_logits = true },
  defaults = { norm_topk_prob = true, router_aux_loss_coef = 0.001, output_router_logits = false },
  lora_targets = 'q_proj,v_proj',
  configs = {
    ['Mixtral-8x7B-v0.1'] = { dim = 4096, n_layers = 32, n_heads = 32, n_kv_heads = 8, head_dim = 128,
                              ffn_dim = 14336, moe_ffn_dim = 14336, n_experts = 8, top_k = 2, vocab_size = 32000,
                              rope_theta = 1e6, norm_eps = 1e-5, max_seq_len = 32768, router_aux_loss_coef = 0.02 },
    tiny = { dim = 64, n_layers = 2, n_heads = 4, n_kv_heads = 2, ffn_dim = 96, moe_ffn_dim = 96, n_experts = 4,
             top_k = 2, vocab_size = 256, rope_theta = 1e6, max_seq_len = 512 },
  },
  hf = { model_type = 'mixtral', architecture = 'MixtralForCausalLM', name = 'Mixtral',
         fields = { sliding_window = 'sliding_window', num_local_experts = 'n_experts',
                    num_experts_per_tok = 'top_k', router_aux_loss_coef = 'router_aux_loss_coef',
                    output_router_logits = 'output_router_logits' },
         -- router_jitter_noise (noise on the router's input in training) must be 0: any other value is refused
         required = { hidden_act = 'silu', attention_dropout = 0, router_jitter_noise = 0 },
         defaults = { rms_norm_eps = 1e-5, max_position_embeddings = 131072, initializer_range = 0.02,
                      num_local_experts = 8, num_experts_per_tok = 2, router_aux_loss_coef = 0.001,
                      output_router_logits = false },
         -- the experts' width is intermediate_size (no dense MLP exists)
         from_hf = function(_, c) c.moe_ffn_dim, c.norm_topk_prob = c.ffn_dim, true end },
})
