-- models/llama.lua: the Llama 2 / Llama 3 family, with Hugging Face
-- parameter names (model.layers.N.self_attn.q_proj.weight, ...), so that
-- Hugging Face checkpoints load unchanged and our exports load in HF.
--
--   local llama = require 'models.llama'
--   local model = llama.build('Llama-2-7b', {device = 'meta'})
--   print(model:num_parameters())                  -- 6738415616
--   local small = llama.build('tiny', {num_layers = 2})
--   small:init_weights({seed = 0})
--   local logits = small(ids)                      -- ids: i64 [B, T]
--   local loss = small:loss(ids, targets)
--
-- The math (MODELS.md): RMSNorm in fp32 cast back before the weight,
-- rotate-half RoPE (theta, transformers' rope scalings: models/hf_rope.lua),
-- grouped-query attention with a causal mask, SwiGLU MLP down(silu(gate(x)) * up(x)), no
-- biases, untied lm_head except where the config ties it to the embedding.
local fsdp = require 'fsdp'
local nn = require 'fsdp.nn'
local F = require 'fsdp.functional'
local common = require 'models.common'
local validate = require 'fsdp.validate'

local M = {}

local LLAMA3_8K = { type = 'llama3', factor = 8, low_freq_factor = 1, high_freq_factor = 4,
                    original_max_position_embeddings = 8192 }
local LLAMA3_32 = { type = 'llama3', factor = 32, low_freq_factor = 1, high_freq_factor = 4,
                    original_max_position_embeddings = 8192 }

-- Every row of MODELS.md plus small configs for tests and CPU training.
-- Fields: dim, n_layers, n_heads, n_kv_heads, ffn_dim, vocab_size, tied,
-- rope_theta, rope_scaling, norm_eps, max_seq_len; head_dim defaults to
-- dim / n_heads.
M.configs = {
  ['Llama-2-7b'] = { dim = 4096, n_layers = 32, n_heads = 32, n_kv_heads = 32, ffn_dim = 11008,
                     vocab_size = 32000, rope_theta = 1e4, max_seq_len = 4096 },
  ['Llama-2-13b'] = { dim = 5120, n_layers = 40, n_heads = 40, n_kv_heads = 40, ffn_dim = 13824,
                      vocab_size = 32000, rope_theta = 1e4, max_seq_len = 4096 },
  ['Llama-2-70b'] = { dim = 8192, n_layers = 80, n_heads = 64, n_kv_heads = 8, ffn_dim = 28672,
                      vocab_size = 32000, rope_theta = 1e4, max_seq_len = 4096 },
  ['Llama-3.1-8B'] = { dim = 4096, n_layers = 32, n_heads = 32, n_kv_heads = 8, ffn_dim = 14336,
                       vocab_size = 128256, rope_theta = 5e5, rope_scaling = LLAMA3_8K,
                       max_seq_len = 131072 },
  ['Llama-3.1-70B'] = { dim = 8192, n_layers = 80, n_heads = 64, n_kv_heads = 8, ffn_dim = 28672,
                        vocab_size = 128256, rope_theta = 5e5, rope_scaling = LLAMA3_8K,
                        max_seq_len = 131072 },
  ['Llama-3.2-1B'] = { dim = 2048, n_layers = 16, n_heads = 32, n_kv_heads = 8, ffn_dim = 8192,
                       vocab_size = 128256, tied = true, rope_theta = 5e5, rope_scaling = LLAMA3_32,
                       max_seq_len = 131072 },
  ['Llama-3.2-3B'] = { dim = 3072, n_layers = 28, n_heads = 24, n_kv_heads = 8, ffn_dim = 8192,
                       vocab_size = 128256, tied = true, rope_theta = 5e5, rope_scaling = LLAMA3_32,
                       max_seq_len = 131072 },
  -- TinyLlama-1.1B's shapes: a 1B Llama with Llama 2's 32000-token
  -- vocabulary (issue 7's GPU benchmark, --model=TinyLlama-1.1B).
  ['TinyLlama-1.1B'] = { dim = 2048, n_layers = 22, n_heads = 32, n_kv_heads = 4, ffn_dim = 5632,
                         vocab_size = 32000, rope_theta = 1e4, max_seq_len = 2048 },
  -- The benchmark's small Llama (issue 3): dim 512, 8 layers, 8 heads.
  ['small'] = { dim = 512, n_layers = 8, n_heads = 8, n_kv_heads = 8, ffn_dim = 1376,
                vocab_size = 32000, rope_theta = 1e4, max_seq_len = 2048 },
  -- Seconds-long CPU training and tests.
  ['tiny'] = { dim = 64, n_layers = 2, n_heads = 4, n_kv_heads = 2, ffn_dim = 176,
               vocab_size = 256, rope_theta = 1e4, max_seq_len = 512 },
}
M.configs['llama2_7b'] = M.configs['Llama-2-7b']
M.configs['llama2_70b'] = M.configs['Llama-2-70b']

-- Override keys as the recipes spell them.
local ALIASES = { num_layers = 'n_layers', hidden_width = 'dim', num_heads = 'n_heads',
                  num_kv_heads = 'n_kv_heads', vocab = 'vocab_size', ffn = 'ffn_dim' }

local DEFAULTS = { n_kv_heads = nil, tied = false, rope_theta = 1e4, rope_scaling = nil,
                   norm_eps = 1e-5, max_seq_len = 4096, init_std = 0.02 }

-- Every field a config or an override may set (anything else is a typo).
local FIELDS = common.set({ 'dim', 'n_layers', 'n_heads', 'n_kv_heads', 'head_dim', 'ffn_dim', 'vocab_size',
                            'tied', 'rope_theta', 'rope_scaling', 'norm_eps', 'max_seq_len', 'init_std' })

-- A full config from a name or a table, with overrides applied (override
-- keys as the recipes spell them are accepted too: num_layers, hidden_width,
-- num_heads, vocab). Checks the shapes fit together.
function M.config(name_or_config, overrides)
  local c = common.merge_config('llama', M.configs, DEFAULTS, ALIASES, name_or_config, overrides, FIELDS)
  c.n_kv_heads = c.n_kv_heads or c.n_heads
  common.check_fields('llama', c, { 'dim', 'n_layers', 'n_heads', 'n_kv_heads', 'ffn_dim', 'vocab_size', 'max_seq_len' },
    nil, { head_dim = validate.COUNT, norm_eps = validate.NONNEGATIVE, rope_theta = validate.POSITIVE,
           init_std = validate.NONNEGATIVE })
  local function need(ok, msg) if not ok then error('llama config: ' .. msg, 3) end end
  if c.rope_scaling ~= nil then
    -- transformers' rope types and their keys (models/hf_rope.lua); Llama
    -- rotates whole heads (its apply_rotary_pos_emb has no partial path).
    local why = require('models.hf_rope').check_scaling(c.rope_scaling)
    need(not why, 'rope_scaling ' .. (why or ''):gsub('^%.', ''))
    local prf = c.rope_scaling.partial_rotary_factor
    need(prf == nil or prf == 1, ('rope_scaling.partial_rotary_factor %s: Llama rotates the whole head (1 only)')
      :format(validate.show(prf)))
  end
  c.head_dim = c.head_dim or c.dim / c.n_heads
  need(c.head_dim == math.floor(c.head_dim), ('dim %d is not a multiple of n_heads %d'):format(c.dim, c.n_heads))
  need(c.head_dim % 2 == 0, ('head_dim %d must be even for rotary embeddings'):format(c.head_dim))
  need(c.n_heads % c.n_kv_heads == 0, ('n_heads %d is not a multiple of n_kv_heads %d'):format(c.n_heads, c.n_kv_heads))
  return c
end

-- Parameters from the closed form of MODELS.md (a check on the build).
function M.closed_form_parameters(c)
  local per_layer = 2 * c.dim * c.n_heads * c.head_dim + 2 * c.dim * c.n_kv_heads * c.head_dim
                    + 3 * c.dim * c.ffn_dim + 2 * c.dim
  return c.n_layers * per_layer + c.dim + (c.tied and 1 or 2) * c.vocab_size * c.dim
end

-- Training FLOPs per token (PaLM appendix B): 6N + 12 L H hd T, where N
-- counts the weights that multiply: an untied input embedding is a lookup
-- and is left out (28% of the small Llama's parameters), a tied one counts
-- once, as the head.
function M.flops_per_token(c, seq_len, n_params)
  n_params = n_params or M.closed_form_parameters(c)
  local n = n_params - (c.tied and 0 or c.vocab_size * c.dim)
  return 6 * n + 12 * c.n_layers * c.n_heads * c.head_dim * seq_len
end

-- layers ---------------------------------------------------------------------------------

local function linear(in_f, out_f, c, opts)
  local l = nn.Linear(in_f, out_f, { bias = false, device = opts.device, dtype = opts.dtype })
  l.weight.init = nn.init.normal(c.init_std)
  return l
end

-- The shared blocks under Hugging Face's class names, so printed trees
-- and class-based wrap policies read as in transformers: nn.Attention with
-- q/k/v/o_proj, grouped-query heads, causal, rotary tables passed per call;
-- nn.GatedMLP's SwiGLU with gate/up/down_proj. No biases; every weight
-- N(0, init_std) as HF's _init_weights.
local Attention = nn.Attention:extend('LlamaAttention')
M.Attention = Attention
local MLP = nn.GatedMLP:extend('LlamaMLP')
M.MLP = MLP

local function attention(c, opts)
  return Attention(c.dim, c.n_heads, { n_kv_heads = c.n_kv_heads, head_dim = c.head_dim, bias = false,
                                       causal = true, init = nn.init.normal(c.init_std),
                                       device = opts.device, dtype = opts.dtype })
end

local function mlp(c, opts)
  return MLP(c.dim, c.ffn_dim, { activation = 'silu', bias = false, init = nn.init.normal(c.init_std),
                                 device = opts.device, dtype = opts.dtype })
end

-- The transformer layer: the class wrap and checkpoint policies name.
local DecoderLayer = nn.Module:extend('LlamaDecoderLayer')
M.DecoderLayer = DecoderLayer

function DecoderLayer:__init(c, opts)
  self.self_attn = attention(c, opts)
  self.mlp = mlp(c, opts)
  self.input_layernorm = nn.RMSNorm(c.dim, { eps = c.norm_eps, device = opts.device, dtype = opts.dtype })
  self.post_attention_layernorm = nn.RMSNorm(c.dim, { eps = c.norm_eps, device = opts.device,
                                                      dtype = opts.dtype })
end

-- rope = {cos, sin} of [T, head_dim] (and positions when decoding),
-- shared by every layer; mask and kv_cache as nn.Attention's (decoding:
-- fsdp.generate).
function DecoderLayer:forward(x, rope, mask, kv_cache)
  local h = x + self.self_attn(self.input_layernorm(x), { rope = rope, mask = mask, kv_cache = kv_cache })
  return h + self.mlp(self.post_attention_layernorm(h))
end

local Model = nn.Module:extend('LlamaModel')

function Model:__init(c, opts)
  self.config = c
  self.embed_tokens = nn.Embedding(c.vocab_size, c.dim, { device = opts.device, dtype = opts.dtype })
  self.embed_tokens.weight.init = nn.init.normal(c.init_std)
  self.layers = nn.ModuleList()
  for _ = 1, c.n_layers do self.layers:append(DecoderLayer(c, opts)) end
  self.norm = nn.RMSNorm(c.dim, { eps = c.norm_eps, device = opts.device, dtype = opts.dtype })
  self._rope_cache = {}
end

-- cos/sin tables for a sequence length, computed once per (length, dtype,
-- device) in f32 and cast like Hugging Face does.
function Model:rope(T, like)
  local key = T .. '/' .. like.dtype .. '/' .. like.device
  local r = self._rope_cache[key]
  if not r then
    local c = self.config
    -- (dynamic and longrope: frequencies for a forward of T positions)
    local cos, sin = F.rope_tables(T, c.head_dim, { theta = c.rope_theta, scaling = c.rope_scaling,
                                                    max_position_embeddings = c.max_seq_len,
                                                    dtype = like.dtype, device = like.device })
    r = { cos = cos, sin = sin }
    self._rope_cache[key] = r
  end
  return r
end

-- ids i64 [B, T] -> hidden states [B, T, dim]. opts (decoding, fsdp.generate):
-- positions i64 [B, T] (each row's own RoPE positions: left-padded rows
-- start later), rope_len (the tables' length, > every position), mask
-- (bool, broadcast to [B, H, T, S]: padding and causality), cache (a
-- fsdp.generate KV cache; its layer(i) is layer i's).
function Model:forward(ids, opts)
  local h = self.embed_tokens(ids)
  local layers = self.layers:children()
  if opts == nil then
    local rope = self:rope(ids:size(1), h)
    for _, layer in ipairs(layers) do h = layer(h, rope) end
    return self.norm(h)
  end
  local tables = self:rope(opts.rope_len or ids:size(1), h)
  local rope = { cos = tables.cos, sin = tables.sin, positions = opts.positions }
  for i, layer in ipairs(layers) do h = layer(h, rope, opts.mask, opts.cache and opts.cache:layer(i)) end
  return self.norm(h)
end

local CausalLM = nn.Module:extend('LlamaForCausalLM')
M.CausalLM = CausalLM

function CausalLM:__init(c, opts)
  self.config = c
  self.model = Model(c, opts)
  if c.tied then
    -- One tensor under two modules: counted once, named model.embed_tokens.weight.
    self.lm_head = nn.Linear(c.dim, c.vocab_size, { bias = false, device = 'meta' })
    self.lm_head:register_parameter('weight', self.model.embed_tokens.weight)
  else
    self.lm_head = linear(c.dim, c.vocab_size, c, opts)
  end
end

-- ids: i64 [B, T] -> logits [B, T, vocab]. opts: Model:forward's, and
-- last_only (logits of the last position alone, [B, 1, vocab]: decoding
-- needs no others, and the head is the largest product).
function CausalLM:forward(ids, opts)
  local h = self.model(ids, opts)
  if opts and opts.last_only then h = h:narrow(1, h:size(1) - 1, 1) end
  return self.lm_head(h)
end

-- What fsdp.generate's KV cache holds per layer, and the positions the
-- model was trained to: RoPE has no table to run out of, so generation
-- may go past them when asked ([Note: positions past the model's limit]
-- in models/decoders.lua).
function CausalLM:kv_cache_spec()
  local c = self.config
  return { n_layers = c.n_layers, n_kv_heads = c.n_kv_heads, head_dim = c.head_dim, max_positions = c.max_seq_len,
           extrapolates = true }
end

-- Mean cross-entropy of next-token predictions; targets i64 [B, T] (the
-- ids shifted by one; -100 entries are ignored). Returns loss, logits.
function CausalLM:loss(ids, targets)
  return common.causal_lm_loss(self, ids, targets)
end

-- fsdp.plan's example batch (common.causal_lm_batch).
function CausalLM:example_batch(batch, seq) return common.causal_lm_batch(self, batch, seq) end

-- Build a model: name_or_config as in M.config; opts: device ('cpu' or
-- 'meta'), dtype, and config overrides (num_layers=, dim=, ...).
function M.build(name_or_config, opts)
  local placement, overrides = common.split_build_opts(opts)
  return CausalLM(M.config(name_or_config, overrides), placement)
end

return M
