-- models/families/gemma3_text.lua: Gemma 3's text model (model_type
-- gemma3_text): Gemma 2's declaration with a (1+w) RMSNorm on each head of
-- q and k, no softcaps (the config may still set them), five sliding
-- layers to one global (sliding_window_pattern 6, window 512), and two
-- RoPE tables: global rope_theta (1e6, with any scaling) and local
-- rope_local_base_freq (1e4) for the sliding layers.
local decoder = require 'models.decoder'
local shared = require 'models.families.shared'
local gemma2 = require 'models.families.gemma2'
local json = require 'fsdp.io.json'

local function null(v) return v == nil or v == json.null end

-- Global and local RoPE from either layout: 5.x rope_parameters =
-- {full_attention = {...}, sliding_attention = {...}}; 4.x rope_theta,
-- rope_scaling (global) and rope_local_base_freq.
local function rope_from_hf(h, c, ctx)
  local p = h.rope_parameters
  local global, lcl
  if not null(p) and type(p) == 'table' and (p.full_attention ~= nil or p.sliding_attention ~= nil) then
    for k in pairs(p) do
      if k ~= 'full_attention' and k ~= 'sliding_attention' then
        ctx.fail("unknown key 'rope_parameters.%s' (a Gemma 3 config holds full_attention and sliding_attention)", k)
      end
    end
    global = { rope_parameters = p.full_attention, rope_theta = null(h.rope_theta) and 1e6 or h.rope_theta,
               rope_scaling = h.rope_scaling, max_position_embeddings = h.max_position_embeddings }
    lcl = { rope_parameters = p.sliding_attention,
            rope_theta = null(h.rope_local_base_freq) and 1e4 or h.rope_local_base_freq }
  else
    global = { rope_parameters = p, rope_theta = null(h.rope_theta) and 1e6 or h.rope_theta,
               rope_scaling = h.rope_scaling, max_position_embeddings = h.max_position_embeddings }
    lcl = { rope_theta = null(h.rope_local_base_freq) and 1e4 or h.rope_local_base_freq }
  end
  -- (the translator names keys rope_parameters.KEY: in the 5.x layout
  -- they are a sub-table's, rope_parameters.full_attention.KEY)
  local function rope(t, sub)
    local ok, a, b = pcall(ctx.rope, t)
    if ok then return a, b end
    if global.rope_parameters == p or type(a) ~= 'string' then error(a, 0) end
    error((a:gsub('rope_parameters', 'rope_parameters.' .. sub)), 0)
  end
  c.rope_theta, c.rope_scaling = rope(global, 'full_attention')
  local scaling
  c.rope_local_theta, scaling = rope(lcl, 'sliding_attention')
  if scaling then ctx.fail('the sliding layers\' RoPE must be unscaled (rope_type default)') end
end

local d = gemma2.declaration({
  name = 'gemma3_text', class = 'Gemma3', qk_norm = 'head', rope = 'local_global',
  fields = { sliding_window = true, sliding_pattern = true, layer_types = true, attn_softcap = true,
             final_softcap = true, query_scale = true, rope_local_theta = true },
  defaults = { tied = true, norm_eps = 1e-6, sliding_pattern = 6, rope_theta = 1e6, rope_local_theta = 1e4 },
  configs = {
    ['Gemma-3-1B'] = { dim = 1152, n_layers = 26, n_heads = 4, n_kv_heads = 1, head_dim = 256, ffn_dim = 6912,
                       vocab_size = 262144, tied = true, rope_theta = 1e6, rope_local_theta = 1e4, norm_eps = 1e-6,
                       max_seq_len = 32768, sliding_window = 512, sliding_pattern = 6, query_scale = 256 },
    tiny = { dim = 64, n_layers = 3, n_heads = 4, n_kv_heads = 1, head_dim = 16, ffn_dim = 176, vocab_size = 256,
             rope_theta = 1e6, rope_local_theta = 1e4, max_seq_len = 512, sliding_window = 64, sliding_pattern = 3,
             query_scale = 16 },
  },
})
d.hf = {
  model_type = 'gemma3_text', architecture = 'Gemma3ForCausalLM', name = 'Gemma3',
  fields = { attn_logit_softcapping = 'attn_softcap', final_logit_softcapping = 'final_softcap',
             query_pre_attn_scalar = 'query_scale' },
  required = { hidden_activation = 'gelu_pytorch_tanh', attention_bias = false, attention_dropout = 0,
               use_bidirectional_attention = false },
  ignored = { 'hidden_act', 'cache_implementation' },
  defaults = { rms_norm_eps = 1e-6, max_position_embeddings = 131072, initializer_range = 0.02, head_dim = 256,
               tie_word_embeddings = true, query_pre_attn_scalar = 256 },
  special = (function()
    local s = { rope_local_base_freq = true }
    for k in pairs(shared.GEMMA_WINDOW_KEYS) do s[k] = true end
    return s
  end)(),
  -- (the rope keys are read by rope_from_hf above, not the shared translator)
  own_rope = true,
  from_hf = function(h, c, ctx)
    rope_from_hf(h, c, ctx)
    shared.gemma_window_from_hf(h, c, ctx, 6)
  end,
  to_hf = function(c, out, ctx)
    shared.gemma_window_to_hf(c, out, ctx)
    local F = ctx.float
    out.rope_local_base_freq = F(c.rope_local_theta)
    local global = ctx.rope_to_hf(c.rope_theta, c.rope_scaling)
    out.rope_theta, out.rope_scaling = global.rope_theta, global.rope_scaling
    out.rope_parameters = { full_attention = global.rope_parameters,
                            sliding_attention = { rope_type = 'default', rope_theta = F(c.rope_local_theta) } }
  end,
}
return decoder.define(d)
