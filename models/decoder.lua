-- models/decoder.lua: the decoder-only transformer every family of
-- models/families/ declares (Llama, Qwen 2/3, Mistral, Gemma 2/3, Phi-3,
-- OLMo 2), with Hugging Face parameter names, so a family is a short
-- table of choices over these shared parts, not a copy of a model file.
--
--   local decoder = require 'models.decoder'
--   local qwen2 = decoder.define(require 'models.families.qwen2_decl')   -- (families/qwen2.lua does this)
--   local model = qwen2.build('Qwen2.5-0.5B', {device = 'meta'})
--
-- [Note: a family declaration] (see models/families/llama.lua for one):
--   name        family name: messages ("qwen2 config: ..."), --model, the fit check
--   class       class-name prefix: <class>DecoderLayer, <class>ForCausalLM, ... as in transformers
--   norm        'rms' | 'rms_wide' | 'rms_offset' ([Note: RMSNorm variants] in models/decoder_parts.lua)
--   norm_class  false: the norms print as nn.RMSNorm (Llama's trees as they always were)
--   norms       'pre' (x + f(norm(x))), 'sandwich' (x + post(f(pre(x))), Gemma),
--               'post' (x + norm(f(x)), OLMo 2)
--   qkv_bias    biases on q/k/v (not o): Qwen 2
--   qk_norm     nil | 'head' (over each head's hd, Qwen 3, Gemma 3) | 'flat' (over the
--               whole projection, OLMo 2); the norm kind is `norm`'s
--   activation  'silu' | 'gelu_tanh' of the gated MLP
--   embed_scale the embeddings times sqrt(dim), rounded to their dtype (Gemma)
--   fused       qkv_proj and gate_up_proj instead of q/k/v_proj and gate/up_proj (Phi-3)
--   mlp         'dense' | 'moe' (nn.MoE with n_experts, top_k, moe_ffn_dim, norm_topk_prob;
--               router_aux_loss_coef times the load-balancing loss joins the loss when
--               output_router_logits, as transformers adds it)
--   moe_keys    the per-expert names checkpoints store ('mixtral' | 'qwen3_moe': models/moe_keys.lua),
--               read into and written from the fused experts ([Note: checkpoint pieces])
--   sliding     nil (no window) | 'all' (sliding_window on every layer: Mistral, Phi-3) |
--               'layer_types' (per layer: layer_types, else sliding_pattern: Gemma, Qwen)
--   rope        'default' | 'local_global' (sliding layers use rope_local_theta: Gemma 3)
--   fields      extra config fields -> fsdp.validate rule (sliding_window, attn_softcap, ...)
--   defaults    config defaults over the shared ones; configs: named configs (real sizes, tiny)
--   lora_targets PEFT's default target_modules for the family
--   hf          its config.json key map (models/hf.lua reads it)
-- Config fields every family has: dim, n_layers, n_heads, n_kv_heads,
-- head_dim (dim / n_heads unless given), ffn_dim, vocab_size, tied,
-- rope_theta, rope_scaling, norm_eps, max_seq_len, init_std. The optional
-- ones a declaration may allow: sliding_window, sliding_pattern (period p:
-- layer i is global iff (i+1) % p == 0), layer_types (a list of
-- 'sliding_attention' / 'full_attention'), attn_softcap, final_softcap,
-- query_scale (HF's query_pre_attn_scalar: scores scaled by its ^-0.5),
-- rope_local_theta, and the MoE ones.
--
-- A layer's window and softcap are nn.Attention's options (the fused
-- kernel applies them, and with a KV cache nn.Attention adds its window
-- to the decoding mask), set only where the family has them.
local nn = require 'fsdp.nn'
local F = require 'fsdp.functional'
local common = require 'models.common'
local validate = require 'fsdp.validate'
local parts = require 'models.decoder_parts'
local hf_rope = require 'models.hf_rope'
local autograd = require 'fsdp.autograd'
local factories = require 'fsdp.factories'

local M = {}

-- Override keys as the recipes spell them.
local ALIASES = { num_layers = 'n_layers', hidden_width = 'dim', num_heads = 'n_heads',
                  num_kv_heads = 'n_kv_heads', vocab = 'vocab_size', ffn = 'ffn_dim' }

local DEFAULTS = { n_kv_heads = nil, tied = false, rope_theta = 1e4, rope_scaling = nil,
                   norm_eps = 1e-5, max_seq_len = 4096, init_std = 0.02 }

local BASE_FIELDS = { 'dim', 'n_layers', 'n_heads', 'n_kv_heads', 'head_dim', 'ffn_dim', 'vocab_size', 'tied',
                      'rope_theta', 'rope_scaling', 'norm_eps', 'max_seq_len', 'init_std' }

-- The rules of the optional fields (a declaration lists the ones it has).
M.FIELD_RULES = {
  sliding_window = validate.COUNT, sliding_pattern = validate.COUNT, attn_softcap = validate.POSITIVE,
  final_softcap = validate.POSITIVE, query_scale = validate.POSITIVE, rope_local_theta = validate.POSITIVE,
  layer_types = 'layer_types', n_experts = validate.COUNT, top_k = validate.COUNT, moe_ffn_dim = validate.COUNT,
  norm_topk_prob = 'boolean', router_aux_loss_coef = validate.NONNEGATIVE, output_router_logits = 'boolean',
}

local LAYER_TYPES = { sliding_attention = true, full_attention = true }

-- A family's config: name_or_config a key of decl.configs or a table,
-- overrides applied (recipe spellings too), shapes checked together.
-- (Errors are raised at the caller of the returned function, as
-- models/common.lua's helpers expect.)
local function config_function(decl)
  return function(name_or_config, overrides)
    local fields, defaults = {}, {}
    for _, k in ipairs(BASE_FIELDS) do fields[k] = true end
    for k in pairs(decl.fields or {}) do fields[k] = true end
    for k, v in pairs(DEFAULTS) do defaults[k] = v end
    for k, v in pairs(decl.defaults or {}) do defaults[k] = v end
    local who = decl.name
    local c = common.merge_config(who, decl.configs, defaults, ALIASES, name_or_config, overrides, fields)
    c.n_kv_heads = c.n_kv_heads or c.n_heads
    local reals = { head_dim = validate.COUNT, norm_eps = validate.NONNEGATIVE, rope_theta = validate.POSITIVE,
                    init_std = validate.NONNEGATIVE }
    for k in pairs(decl.fields or {}) do
      local rule = M.FIELD_RULES[k]
      if type(rule) == 'table' then reals[k] = rule end
    end
    common.check_fields(who, c, { 'dim', 'n_layers', 'n_heads', 'n_kv_heads', 'ffn_dim', 'vocab_size', 'max_seq_len' },
      nil, reals)
    local function need(ok, msg) if not ok then error(who .. ' config: ' .. msg, 3) end end
    if c.rope_scaling ~= nil then
      -- transformers' rope types and their keys (models/hf_rope.lua); the
      -- decoder rotates whole heads (apply_rotary_pos_emb has no partial path).
      local why = hf_rope.check_scaling(c.rope_scaling)
      need(not why, 'rope_scaling ' .. (why or ''):gsub('^%.', ''))
      local prf = c.rope_scaling.partial_rotary_factor
      need(prf == nil or prf == 1, ('rope_scaling.partial_rotary_factor %s: the decoder rotates the whole head '
        .. '(1 only)'):format(validate.show(prf)))
    end
    c.head_dim = c.head_dim or c.dim / c.n_heads
    need(c.head_dim == math.floor(c.head_dim), ('dim %d is not a multiple of n_heads %d'):format(c.dim, c.n_heads))
    need(c.head_dim % 2 == 0, ('head_dim %d must be even for rotary embeddings'):format(c.head_dim))
    need(c.n_heads % c.n_kv_heads == 0,
      ('n_heads %d is not a multiple of n_kv_heads %d'):format(c.n_heads, c.n_kv_heads))
    for _, k in ipairs({ 'tied', 'norm_topk_prob', 'output_router_logits' }) do
      need(c[k] == nil or type(c[k]) == 'boolean', ('%s must be true or false, got %s'):format(k, validate.show(c[k])))
    end
    if c.layer_types ~= nil then
      need(type(c.layer_types) == 'table' and #c.layer_types == c.n_layers,
        ('layer_types must list one type per layer (%d), got %s'):format(c.n_layers, validate.show(c.layer_types)))
      for i, t in ipairs(c.layer_types) do
        need(LAYER_TYPES[t], ("layer_types[%d] is %s; only 'sliding_attention' and 'full_attention' are supported")
          :format(i, validate.show(t)))
      end
    end
    if decl.mlp == 'moe' then
      for _, k in ipairs({ 'n_experts', 'top_k', 'moe_ffn_dim' }) do need(c[k] ~= nil, k .. ' is missing') end
      need(c.top_k <= c.n_experts, ('top_k %d is more than n_experts %d'):format(c.top_k, c.n_experts))
    end
    return c
  end
end

-- The window of layer i (0-based) of config c of a family, or nil.
local function window_of(decl, c, i)
  if not decl.sliding or not c.sliding_window then return nil end
  if decl.sliding == 'all' then return c.sliding_window end
  local kind
  if c.layer_types then
    kind = c.layer_types[i + 1]
  elseif c.sliding_pattern then
    kind = (i + 1) % c.sliding_pattern == 0 and 'full_attention' or 'sliding_attention'
  else
    kind = 'sliding_attention'
  end
  return kind == 'sliding_attention' and c.sliding_window or nil
end
M.window_of = window_of

-- Parameters from the closed form (a check on the build; the fit check's count).
local function closed_form_parameters(decl, c)
  local q, kv = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
  local attn = 2 * c.dim * q + 2 * c.dim * kv
  if decl.qkv_bias then attn = attn + q + 2 * kv end
  if decl.qk_norm == 'head' then attn = attn + 2 * c.head_dim
  elseif decl.qk_norm == 'flat' then attn = attn + q + kv end
  local mlp
  if decl.mlp == 'moe' then
    mlp = c.n_experts * (3 * c.dim * c.moe_ffn_dim + c.dim)
  else
    mlp = 3 * c.dim * c.ffn_dim
  end
  local norms = (decl.norms == 'sandwich' and 4 or 2) * c.dim
  return c.n_layers * (attn + mlp + norms) + c.dim + (c.tied and 1 or 2) * c.vocab_size * c.dim
end

-- The parameters a token passes through: all but the experts the router
-- did not pick (total - (E - top_k) experts' weights per layer; the
-- embeddings and head included, as MODELS_FAMILIES.md counts "active").
local function active_parameters(decl, c)
  local total = closed_form_parameters(decl, c)
  if decl.mlp ~= 'moe' then return total end
  return total - c.n_layers * (c.n_experts - c.top_k) * 3 * c.dim * c.moe_ffn_dim
end

-- Training FLOPs per token (PaLM appendix B): 6N + 12 L H hd T, where N
-- counts the weights that multiply (an untied input embedding is a
-- lookup; a mixture of experts counts top_k experts, the active ones) and
-- a sliding layer attends to at most its window.
local function flops_per_token(decl, c, seq_len, n_params)
  n_params = n_params or closed_form_parameters(decl, c)
  local n = n_params - (c.tied and 0 or c.vocab_size * c.dim)
  if decl.mlp == 'moe' then n = n - c.n_layers * (c.n_experts - c.top_k) * 3 * c.dim * c.moe_ffn_dim end
  local attn = 0
  for i = 0, c.n_layers - 1 do
    local w = window_of(decl, c, i)
    attn = attn + 12 * c.n_heads * c.head_dim * (w and math.min(w, seq_len) or seq_len)
  end
  return 6 * n + attn
end

-- The classes and functions of a family from its declaration (see the
-- Note at the top). Returns the family module: name, decl, configs,
-- config, build, closed_form_parameters, flops_per_token, lora_targets,
-- and the classes Attention, MLP, DecoderLayer, Model, CausalLM.
function M.define(decl)
  local P = decl.class
  local fam = { name = decl.name, decl = decl, configs = decl.configs, lora_targets = decl.lora_targets }
  -- What sizes it, for the bound on a config before building (common.size_of).
  common.add_sizes(decl.name, decl.mlp == 'moe')

  local Attention = nn.Attention:extend(P .. 'Attention')
  if decl.qk_norm then Attention.project = parts.qk_norm_project(decl.qk_norm) end
  fam.Attention = Attention
  local MLP
  if decl.mlp == 'moe' then
    MLP = nn.MoE and nn.MoE:extend(P .. 'SparseMoeBlock') -- (nn.MoE: h-moe's; checked at build)
  elseif decl.fused then
    MLP = parts.FusedGatedMLP:extend(P .. 'MLP')
  else
    MLP = nn.GatedMLP:extend(P .. 'MLP')
  end
  fam.MLP = MLP
  local Norm = parts.NORMS[decl.norm or 'rms']
  if decl.norm_class ~= false then Norm = Norm:extend(P .. 'RMSNorm') end
  fam.Norm = Norm

  local function norm(dim, c, opts)
    return Norm(dim, { eps = c.norm_eps, device = opts.device, dtype = opts.dtype })
  end

  local function attention(c, opts, i)
    local o = { n_kv_heads = c.n_kv_heads, head_dim = c.head_dim, bias = false, causal = true,
                init = nn.init.normal(c.init_std), device = opts.device, dtype = opts.dtype }
    if decl.qkv_bias then o.bias, o.out_bias, o.bias_init = true, false, nn.init.zeros() end
    if decl.fused then o.fused_qkv = true end
    if c.query_scale then o.scale = c.query_scale ^ -0.5 end
    o.window, o.softcap = window_of(decl, c, i), c.attn_softcap
    local a = Attention(c.dim, c.n_heads, o)
    if decl.qk_norm then
      local n = decl.qk_norm == 'head' and c.head_dim
      a.q_norm = norm(n or c.n_heads * c.head_dim, c, opts)
      a.k_norm = norm(n or c.n_kv_heads * c.head_dim, c, opts)
    end
    a.layer_local = o.window ~= nil -- a sliding layer (Gemma 3: the local RoPE table)
    return a
  end

  local function mlp(c, opts)
    if decl.mlp == 'moe' then
      if not MLP then error(decl.name .. ': a mixture-of-experts MLP needs nn.MoE, which this build lacks', 4) end
      return MLP(c.dim, c.moe_ffn_dim, c.n_experts, c.top_k, { norm_topk_prob = c.norm_topk_prob,
        activation = decl.activation or 'silu', init = nn.init.normal(c.init_std), device = opts.device,
        dtype = opts.dtype })
    end
    return MLP(c.dim, c.ffn_dim, { activation = decl.activation or 'silu', bias = false,
                                   init = nn.init.normal(c.init_std), device = opts.device, dtype = opts.dtype })
  end

  -- The transformer layer: the class wrap and checkpoint policies name.
  local DecoderLayer = nn.Module:extend(P .. 'DecoderLayer')
  fam.DecoderLayer = DecoderLayer
  local placement = decl.norms or 'pre'

  function DecoderLayer:__init(c, opts, i)
    self.self_attn = attention(c, opts, i or 0)
    self.mlp = mlp(c, opts)
    if placement ~= 'post' then self.input_layernorm = norm(c.dim, c, opts) end
    self.post_attention_layernorm = norm(c.dim, c, opts)
    if placement == 'sandwich' then self.pre_feedforward_layernorm = norm(c.dim, c, opts) end
    if placement ~= 'pre' then self.post_feedforward_layernorm = norm(c.dim, c, opts) end
  end

  -- [Note: the layer's add and norm fused] In a pre-norm layer the residual
  -- add after attention and post_attention_layernorm run as one op,
  -- F.add_rms_norm (the same bits as the two; one backward pass for h's
  -- gradient: [Note: residual add fused with RMSNorm] in core/ops/norm.c),
  -- when that norm is the plain RMSNorm (Llama, Qwen 2/3, Mistral, Mixtral,
  -- Qwen3-MoE, Phi-3: not OLMo 2's or Gemma's variants, whose forward is
  -- their own) and has no hooks or forward of its own (a unit's, observe's,
  -- checkpoint's), which calling the op directly would skip. The layer's
  -- output h + m stays an add: the next layer's input norm is across the
  -- layer's boundary (its own unit, its own checkpoint). Set
  -- DecoderLayer.fuse_add_norm = false for the two ops.
  DecoderLayer.fuse_add_norm = true
  local function plain_rms_norm(norm)
    if rawget(norm, 'forward') ~= nil or norm.forward ~= nn.RMSNorm.forward then return false end
    local pre, post = rawget(norm, '_forward_pre_hooks'), rawget(norm, '_forward_hooks')
    return pre ~= nil and post ~= nil and #pre == 0 and #post == 0
  end

  -- rope = {cos, sin} of [T, head_dim] (and positions when decoding or
  -- packed); mask, kv_cache and segments as nn.Attention's (decoding:
  -- fsdp.generate; segments: packed training batches). A
  -- mixture of experts returns its router logits [B*T, E] second: an
  -- output of the layer, so that activation checkpointing and the sharded
  -- units' hooks carry their gradient (the load-balancing loss) like the
  -- hidden states'.
  function DecoderLayer:forward(x, rope, mask, kv_cache, segments)
    local a = { rope = rope, mask = mask, kv_cache = kv_cache, segments = segments }
    local h, m, logits
    if placement == 'pre' then
      local o, n2 = self.self_attn(self.input_layernorm(x), a), self.post_attention_layernorm
      if self.fuse_add_norm and o.dtype == x.dtype and plain_rms_norm(n2) then
        local y
        h, y = F.add_rms_norm(x, o, n2.weight, n2.eps)
        m, logits = self.mlp(y)
      else
        h = x + o
        m, logits = self.mlp(n2(h))
      end
    elseif placement == 'sandwich' then
      h = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), a))
      m, logits = self.mlp(self.pre_feedforward_layernorm(h))
      m = self.post_feedforward_layernorm(m)
    else
      h = x + self.post_attention_layernorm(self.self_attn(x, a))
      m, logits = self.mlp(h)
      m = self.post_feedforward_layernorm(m)
    end
    if logits ~= nil then return h + m, logits end
    return h + m
  end

  local Model = nn.Module:extend(P .. 'Model')
  fam.Model = Model

  function Model:__init(c, opts)
    self.config = c
    self.embed_tokens = nn.Embedding(c.vocab_size, c.dim, { device = opts.device, dtype = opts.dtype })
    self.embed_tokens.weight.init = nn.init.normal(c.init_std)
    self.layers = nn.ModuleList()
    for i = 1, c.n_layers do self.layers:append(DecoderLayer(c, opts, i - 1)) end
    self.norm = norm(c.dim, c, opts)
    self._rope_cache = {}
  end

  -- cos/sin tables for a sequence length and a layer's theta (sliding
  -- layers of a 'local_global' family use rope_local_theta, unscaled),
  -- computed once per (length, theta, dtype, device) in f32 and cast like
  -- Hugging Face does.
  function Model:rope(T, like, is_local)
    local c = self.config
    local theta, scaling = c.rope_theta, c.rope_scaling
    if is_local then theta, scaling = c.rope_local_theta, nil end
    local key = T .. '/' .. like.dtype .. '/' .. like.device .. (is_local and '/local' or '')
    local r = self._rope_cache[key]
    if not r then
      -- (dynamic and longrope: frequencies for a forward of T positions)
      local cos, sin = F.rope_tables(T, c.head_dim, { theta = theta, scaling = scaling,
                                                      max_position_embeddings = c.max_seq_len,
                                                      dtype = like.dtype, device = like.device })
      r = { cos = cos, sin = sin }
      self._rope_cache[key] = r
    end
    return r
  end

  local local_rope = decl.rope == 'local_global'

  -- ids i64 [B, T] -> hidden states [B, T, dim], and with a mixture of
  -- experts the list of every layer's router logits. opts (decoding,
  -- fsdp.generate): positions i64 [B, T], rope_len, mask (bool, broadcast
  -- to [B, H, T, S]), cache (its layer(i) is layer i's); (packed training
  -- batches, fsdp.data.packing) positions restarting at 0 per document and
  -- segments i64 [B, T] ([Note: packed sequences] in core/ops/attention.c).
  function Model:forward(ids, opts)
    local h = self.embed_tokens(ids)
    if decl.embed_scale then
      -- sqrt(dim) as an f32 tensor cast to the embeddings' dtype, as HF does
      local s = factories.tensor({ math.sqrt(self.config.dim) }, { dtype = 'f32' })
      h = h * s:to(h.dtype):item()
    end
    local layers = self.layers:children()
    local T = ids:size(1)
    local len = opts and opts.rope_len or T
    local global = self:rope(len, h)
    local lcl = local_rope and self:rope(len, h, true)
    local router = decl.mlp == 'moe' and {} or nil
    for i, layer in ipairs(layers) do
      local t = (lcl and layer.self_attn.layer_local) and lcl or global
      local logits
      if opts == nil then
        h, logits = layer(h, t)
      else
        h, logits = layer(h, { cos = t.cos, sin = t.sin, positions = opts.positions }, opts.mask,
          opts.cache and opts.cache:layer(i), opts.segments)
      end
      if router then router[#router + 1] = logits end
    end
    if router then return self.norm(h), router end
    return self.norm(h)
  end

  local CausalLM = nn.Module:extend(P .. 'ForCausalLM')
  fam.CausalLM = CausalLM

  function CausalLM:__init(c, opts)
    self.config = c
    self.model = Model(c, opts)
    if c.tied then
      -- One tensor under two modules: counted once, named model.embed_tokens.weight.
      self.lm_head = nn.Linear(c.dim, c.vocab_size, { bias = false, device = 'meta' })
      self.lm_head:register_parameter('weight', self.model.embed_tokens.weight)
    else
      self.lm_head = nn.Linear(c.dim, c.vocab_size, { bias = false, device = opts.device, dtype = opts.dtype })
      self.lm_head.weight.init = nn.init.normal(c.init_std)
    end
  end

  -- ids: i64 [B, T] -> logits [B, T, vocab] (final_softcap: tanh(z/c)*c).
  -- opts: Model:forward's, and last_only (the last position's alone).
  -- A mixture of experts keeps the forward's router logits for loss().
  -- ce (loss()'s fused path): {targets =, ignore_index =, chunk_rows =}:
  -- the mean cross-entropy of the head's logits instead of the logits,
  -- through the head's call (a sharded head's hooks run as for logits).
  function CausalLM:forward(ids, opts, ce)
    local h, router = self.model(ids, opts)
    if router then rawset(self, '_router_logits', router) end
    if ce then return self.lm_head(h, ce) end
    if opts and opts.last_only then h = h:narrow(1, h:size(1) - 1, 1) end
    local logits = self.lm_head(h)
    local cap = self.config.final_softcap
    if cap then logits = F.tanh(logits / cap) * cap end
    return logits
  end

  -- What fsdp.generate's KV cache holds per layer; RoPE extrapolates
  -- ([Note: positions past the model's limit] in models/decoders.lua).
  -- windows: each layer's sliding window or false.
  -- (fam.kv_cache_spec(c): the same from a config, before a model is built)
  function CausalLM:kv_cache_spec() return fam.kv_cache_spec(self.config) end

  -- [Note: the fused loss] The head and the cross-entropy run as one
  -- chunked op (F.linear_cross_entropy: [Note: the fused head and loss] in
  -- core/ops/linear_cross_entropy.c) where the math is exactly
  -- cross_entropy(h W^T): a plain bias-free nn.Linear head (tied or not),
  -- no final softcap. A LoRA head (LoRALinear) or a softcapped family
  -- (Gemma 2) takes the unfused path. Default: fused while autograd
  -- records (training), where the logits and their gradient would be the
  -- step's largest tensors; unfused under no_grad, where the logits come
  -- back for inspection. model.fused_loss = false (the recipes'
  -- --fused_loss=false) or opts.fused_loss = false turns it off, true forces
  -- it; model.loss_chunk_rows / opts.loss_chunk_rows set the rows per chunk.
  local function fusable(self)
    local head = self.lm_head
    return not self.config.final_softcap and head:class_name() == 'Linear' and head.bias == nil
  end
  local LOSS_KEYS = { fused_loss = true, loss_chunk_rows = true }

  -- Mean cross-entropy of next-token predictions; targets i64 [B, T] (the
  -- ids shifted by one; -100 entries are ignored). Returns loss, logits
  -- (nil on the fused path: [Note: the fused loss]).
  -- opts: forward's (a packed batch: {positions =, segments =}), and
  -- fused_loss, loss_chunk_rows.
  -- A mixture of experts whose config outputs router logits adds
  -- router_aux_loss_coef times the load-balancing loss of all its layers'
  -- logits (transformers' load_balancing_loss_func, with no attention mask,
  -- as its training forward of ids alone computes it).
  function CausalLM:loss(ids, targets, opts)
    local fused, rows = rawget(self, 'fused_loss'), rawget(self, 'loss_chunk_rows')
    if opts then
      local fwd = {}
      for k, v in pairs(opts) do if not LOSS_KEYS[k] then fwd[k] = v end end
      if opts.fused_loss ~= nil then fused = opts.fused_loss end
      rows = opts.loss_chunk_rows or rows
      opts = next(fwd) ~= nil and fwd or nil
    end
    if fused == nil then fused = autograd.is_grad_enabled() end
    local loss, logits
    if fused and fusable(self) then
      loss = self(ids, opts, { targets = targets, ignore_index = -100, chunk_rows = rows })
    else
      loss, logits = common.causal_lm_loss(self, ids, targets, opts)
    end
    local router = rawget(self, '_router_logits')
    rawset(self, '_router_logits', nil)
    local c = self.config
    if router and c.output_router_logits then
      local aux = F.load_balancing_loss(router, c.n_experts, c.top_k)
      loss = loss + aux:to(loss.dtype) * (c.router_aux_loss_coef or 0)
    end
    return loss, logits
  end

  if decl.moe_keys then parts.checkpoint_pieces(CausalLM, decl.moe_keys) end

  -- [Note: the decoder's TP plan] The tensor-parallel plan of every family
  -- (fsdp.tp.parallelize(model, model:tp_plan(), {mesh =})): attention heads
  -- split (q/k/v colwise, o rowwise), the gated MLP's gate/up colwise and
  -- down rowwise, embeddings and head split by vocabulary (tied ones share
  -- the split), norms replicated. With sequence parallelism the attention
  -- and the MLP are the regions whose input is gathered along the sequence
  -- and the layer norms and the final norm run on this rank's rows
  -- ('sequence'; a q/k norm per head is inside the attention). Fused
  -- projections (Phi-3), experts and a q/k norm over the whole projection
  -- (OLMo 2) are refused for now.
  function CausalLM:tp_plan()
    local why = decl.mlp == 'moe' and 'its mixture-of-experts MLP'
      or decl.fused and 'its fused qkv_proj and gate_up_proj'
      or decl.qk_norm == 'flat' and 'its q/k norm over the whole projection'
    if why then error(('%s: no tensor-parallel plan for %s yet'):format(decl.name, why), 2) end
    return {
      { match = '^model%.embed_tokens$', style = 'vocab_embedding' },
      { match = '%.self_attn$', style = 'attention' },
      { match = '%.self_attn%.[qkv]_proj$', style = 'colwise' },
      { match = '%.self_attn%.o_proj$', style = 'rowwise' },
      { match = '%.mlp%.gate_proj$', style = 'colwise' },
      { match = '%.mlp%.up_proj$', style = 'colwise' },
      { match = '%.mlp%.down_proj$', style = 'rowwise' },
      { match = '%.mlp$', style = 'region' },
      { match = '^model%.layers%.%d+%.[%w_]*layernorm$', style = 'sequence' },
      { match = '^model%.norm$', style = 'sequence' },
      { match = '^lm_head$', style = 'vocab_head' },
    }
  end

  -- fsdp.plan's example batch (common.causal_lm_batch).
  function CausalLM:example_batch(batch, seq) return common.causal_lm_batch(self, batch, seq) end

  fam.config = config_function(decl)
  -- windows: each layer's sliding window or false (fsdp.generate keeps a
  -- sliding layer's cache as a ring of its window: [Note: the KV cache]).
  function fam.kv_cache_spec(c)
    local windows = {}
    for i = 1, c.n_layers do windows[i] = window_of(decl, c, i - 1) or false end
    return { n_layers = c.n_layers, n_kv_heads = c.n_kv_heads, head_dim = c.head_dim, max_positions = c.max_seq_len,
             extrapolates = true, windows = windows }
  end
  function fam.closed_form_parameters(c) return closed_form_parameters(decl, c) end
  function fam.active_parameters(c) return active_parameters(decl, c) end
  function fam.flops_per_token(c, seq_len, n_params) return flops_per_token(decl, c, seq_len, n_params) end
  -- Build a model: name_or_config as in config; opts: device ('cpu' or
  -- 'meta'), dtype, and config overrides (num_layers=, dim=, ...).
  function fam.build(name_or_config, opts)
    local placement_, overrides = common.split_build_opts(opts)
    return CausalLM(fam.config(name_or_config, overrides), placement_)
  end
  return fam
end

return M
