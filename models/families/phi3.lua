-- models/families/phi3.lua: Phi-3 (model_type phi3): one fused qkv_proj
-- [(H + 2 KV) * hd, dim] (rows q, k, v) and one gate_up_proj [2 ff, dim]
-- (gate rows first), the sliding window (2047 on mini-4k) on every layer,
-- untied. partial_rotary_factor must be 1 (RoPE on all of head_dim).
local decoder = require 'models.decoder'
local json = require 'fsdp.io.json'

local function null(v) return v == nil or v == json.null end

return decoder.define({
  name = 'phi3', class = 'Phi3', norm = 'rms', norms = 'pre', fused = true, activation = 'silu', sliding = 'all',
  fields = { sliding_window = true }, lora_targets = 'qkv_proj',
  configs = {
    ['Phi-3-mini-4k'] = { dim = 3072, n_layers = 32, n_heads = 32, n_kv_heads = 32, ffn_dim = 8192,
                          vocab_size = 32064, rope_theta = 1e4, norm_eps = 1e-5, max_seq_len = 4096,
                          sliding_window = 2047 },
    tiny = { dim = 64, n_layers = 2, n_heads = 4, n_kv_heads = 2, ffn_dim = 176, vocab_size = 256, rope_theta = 1e4,
             max_seq_len = 512, sliding_window = 64 },
  },
  hf = { model_type = 'phi3', architecture = 'Phi3ForCausalLM', name = 'Phi3',
         fields = { sliding_window = 'sliding_window' },
         required = { hidden_act = 'silu', attention_dropout = 0, resid_pdrop = 0, embd_pdrop = 0,
                      partial_rotary_factor = 1 },
         -- original_max_position_embeddings is read by longrope scaling only
         -- (which the RoPE translator refuses); default RoPE ignores it.
         ignored = { 'original_max_position_embeddings' },
         defaults = { rms_norm_eps = 1e-5, max_position_embeddings = 4096, initializer_range = 0.02 },
         own_rope = true,
         from_hf = function(h, c, ctx)
           -- 5.x keeps partial_rotary_factor inside rope_parameters
           local p = h.rope_parameters
           if not null(p) and type(p) == 'table' and p.partial_rotary_factor ~= nil then
             if p.partial_rotary_factor ~= 1 then
               ctx.fail('rope_parameters.partial_rotary_factor is %s; only 1.0 is supported',
                 tostring(p.partial_rotary_factor))
             end
             local copy = {}
             for k, v in pairs(h) do copy[k] = v end
             copy.rope_parameters = {}
             for k, v in pairs(p) do if k ~= 'partial_rotary_factor' then copy.rope_parameters[k] = v end end
             h = copy
           end
           c.rope_theta, c.rope_scaling = ctx.rope(h)
         end },
})
