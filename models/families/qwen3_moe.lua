-- models/families/qwen3_moe.lua: Qwen3-MoE (model_type qwen3_moe): Qwen 3's
-- attention (per-head q/k RMSNorm, explicit head_dim) with a sparse mixture
-- of experts in every layer: a softmax router over num_experts SwiGLU
-- experts of moe_intermediate_size, the top num_experts_per_tok of them,
-- renormalised when norm_topk_prob (the class default is false; the
-- released checkpoints set true). intermediate_size makes no weights (no
-- layer is dense: decoder_sparse_step 1, mlp_only_layers []). With
-- output_router_logits the load-balancing loss times router_aux_loss_coef
-- joins the loss. Checkpoints store mlp.experts.E.gate_proj/up_proj/
-- down_proj: read into and written from the fused experts ([Note:
-- checkpoint pieces] in models/decoder_parts.lua).
local decoder = require 'models.decoder'
local json = require 'fsdp.io.json'
local validate = require 'fsdp.validate'

local function null(v) return v == nil or v == json.null end

return decoder.define({
  name = 'qwen3_moe', class = 'Qwen3Moe', norm = 'rms', norms = 'pre', qk_norm = 'head', activation = 'silu',
  mlp = 'moe', moe_keys = 'qwen3_moe',
  fields = { n_experts = true, top_k = true, moe_ffn_dim = true, norm_topk_prob = true,
             router_aux_loss_coef = true, output_router_logits = true },
  defaults = { norm_eps = 1e-6, norm_topk_prob = false, router_aux_loss_coef = 0.001, output_router_logits = false },
  lora_targets = 'q_proj,v_proj',
  configs = {
    ['Qwen3-30B-A3B'] = { dim = 2048, n_layers = 48, n_heads = 32, n_kv_heads = 4, head_dim = 128, ffn_dim = 6144,
                          moe_ffn_dim = 768, n_experts = 128, top_k = 8, norm_topk_prob = true, vocab_size = 151936,
                          rope_theta = 1e6, norm_eps = 1e-6, max_seq_len = 40960 },
    tiny = { dim = 64, n_layers = 2, n_heads = 4, n_kv_heads = 2, head_dim = 32, ffn_dim = 176, moe_ffn_dim = 48,
             n_experts = 8, top_k = 2, norm_topk_prob = true, vocab_size = 256, rope_theta = 1e6, max_seq_len = 512 },
  },
  hf = { model_type = 'qwen3_moe', architecture = 'Qwen3MoeForCausalLM', name = 'Qwen3Moe',
         fields = { num_experts_per_tok = 'top_k', moe_intermediate_size = 'moe_ffn_dim',
                    norm_topk_prob = 'norm_topk_prob', router_aux_loss_coef = 'router_aux_loss_coef',
                    output_router_logits = 'output_router_logits' },
         required = { hidden_act = 'silu', attention_bias = false, attention_dropout = 0, decoder_sparse_step = 1,
                      use_sliding_window = false },
         -- sliding_window counts only with use_sliding_window (refused above);
         -- max_window_layers is read by no Qwen3-MoE layer
         ignored = { 'sliding_window', 'max_window_layers' },
         defaults = { rms_norm_eps = 1e-6, max_position_embeddings = 32768, initializer_range = 0.02,
                      num_experts_per_tok = 8, moe_intermediate_size = 768, norm_topk_prob = false,
                      router_aux_loss_coef = 0.001, output_router_logits = false },
         -- num_experts (4.x and the hub's files) or num_local_experts
         -- (transformers 5's attribute); mlp_only_layers must be empty
         special = { num_experts = true, num_local_experts = true, mlp_only_layers = true },
         from_hf = function(h, c, ctx)
           local a, b = h.num_experts, h.num_local_experts
           if null(a) then a = nil end
           if null(b) then b = nil end
           if a and b and a ~= b then
             ctx.fail('num_experts (%s) and num_local_experts (%s) disagree', validate.show(a), validate.show(b))
           end
           local n = a or b or 128
           local why = validate.problem(n, validate.COUNT)
           if why then ctx.fail('%s %s', a and 'num_experts' or 'num_local_experts', why) end
           c.n_experts = n
           local dense = h.mlp_only_layers
           if not null(dense) and (type(dense) ~= 'table' or #dense > 0 or next(dense) ~= nil) then
             ctx.fail('mlp_only_layers is %s; only [] (every layer a mixture of experts) is supported',
               validate.show(dense))
           end
         end,
         to_hf = function(c, out)
           out.num_experts = c.n_experts
           out.mlp_only_layers = json.array({})
           out.decoder_sparse_step = 1
           out.use_sliding_window = false
         end },
})
