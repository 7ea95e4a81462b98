-- models/t5.lua: T5 (Raffel et al. 2020), the encoder-decoder, with Hugging
-- Face T5ForConditionalGeneration's structure and parameter names
-- (shared.weight, encoder.block.N.layer.0.SelfAttention.q.weight, ...), so
-- that Hugging Face checkpoints load unchanged and our exports load in HF.
-- v1.0 (t5-small ... t5-11b) and v1.1 (t5-v1_1-xl, t5-v1_1-xxl).
--
--   local t5 = require 'models.t5'
--   local model = t5.build('t5-small', {device = 'meta'})
--   print(model:num_parameters())                  -- 60506624
--   local tiny = t5.build('tiny')
--   tiny:init_weights({seed = 0})
--   local logits = tiny(input_ids, decoder_input_ids)   -- i64 [B, S], [B, T]
--   local loss = tiny:loss(input_ids, labels)           -- decoder input = shift_right(labels)
--   local out = t5.generate(tiny, input_ids, {max_new_tokens = 8})
--   -- padded batches, Hugging Face's masks (1 = attend, 0 = padding):
--   tiny(input_ids, decoder_input_ids, {attention_mask = m, decoder_attention_mask = dm})
--   tiny:loss(input_ids, labels, {attention_mask = m})
--
-- The math (MODELS.md): T5LayerNorm is RMS only (eps 1e-6); pre-norm
-- residual blocks; no biases; attention scores q k^T with no 1/sqrt(d)
-- scaling (it is folded into the init) plus a learned relative position
-- bias that block 0 of each stack owns and every later block of the stack
-- reuses (encoder: bidirectional buckets; decoder: causal buckets and a
-- causal mask); cross-attention has no position bias. v1.0: ReLU MLP
-- wi/wo, lm_head tied to the embedding with the decoder output scaled by
-- d_model^-0.5; v1.1: gated-GELU (tanh) wi_0/wi_1/wo, untied lm_head.
--
-- The encoder and decoder do not register embed_tokens: Hugging Face's
-- encoder.embed_tokens.weight and decoder.embed_tokens.weight are aliases
-- of shared.weight, so the tensor appears once, as shared.weight.
local fsdp = require 'fsdp'
local core = require 'fsdp.core'
local nn = require 'fsdp.nn'
local F = require 'fsdp.functional'
local common = require 'models.common'
local validate = require 'fsdp.validate'
local generate = require 'fsdp.generate'

local M = {}

-- Every row of MODELS.md plus a small config for tests and CPU training.
-- Fields (Hugging Face T5Config names): d_model, d_ff, d_kv, num_heads,
-- num_layers (encoder), num_decoder_layers (default num_layers),
-- vocab_size, gated (v1.1's gated-GELU MLP), tied (tie_word_embeddings),
-- relative_attention_num_buckets, relative_attention_max_distance,
-- norm_eps (layer_norm_epsilon), dropout (dropout_rate), init_factor
-- (initializer_factor), scale_decoder_outputs (the decoder output times
-- d_model^-0.5 before lm_head; default: tied, v1.0's pairing, which
-- transformers 5 decouples: its v1.1 ties the head without the scale).
M.configs = {
  ['t5-small'] = { d_model = 512, d_ff = 2048, d_kv = 64, num_heads = 8, num_layers = 6 },
  ['t5-base'] = { d_model = 768, d_ff = 3072, d_kv = 64, num_heads = 12, num_layers = 12 },
  ['t5-large'] = { d_model = 1024, d_ff = 4096, d_kv = 64, num_heads = 16, num_layers = 24 },
  ['t5-3b'] = { d_model = 1024, d_ff = 16384, d_kv = 128, num_heads = 32, num_layers = 24 },
  ['t5-11b'] = { d_model = 1024, d_ff = 65536, d_kv = 128, num_heads = 128, num_layers = 24 },
  ['t5-v1_1-xl'] = { d_model = 2048, d_ff = 5120, d_kv = 64, num_heads = 32, num_layers = 24,
                     gated = true, tied = false },
  ['t5-v1_1-xxl'] = { d_model = 4096, d_ff = 10240, d_kv = 64, num_heads = 64, num_layers = 24,
                      gated = true, tied = false },
  -- Seconds-long CPU training and tests.
  ['tiny'] = { d_model = 32, d_ff = 64, d_kv = 8, num_heads = 4, num_layers = 2, vocab_size = 64 },
}

-- T5's dropout_rate is 0.1; here it defaults to 0, as the other models do
-- for pre-training and benchmarks, and is set per run.
local DEFAULTS = { vocab_size = 32128, gated = false, tied = true, relative_attention_num_buckets = 32,
                   relative_attention_max_distance = 128, norm_eps = 1e-6, dropout = 0, init_factor = 1.0,
                   decoder_start_token_id = 0, pad_token_id = 0, eos_token_id = 1 }

-- Every field a config or an override may set (anything else is a typo).
local FIELDS = common.set({ 'd_model', 'd_ff', 'd_kv', 'num_heads', 'num_layers', 'num_decoder_layers', 'vocab_size',
                            'gated', 'tied', 'relative_attention_num_buckets', 'relative_attention_max_distance',
                            'norm_eps', 'dropout', 'init_factor', 'decoder_start_token_id', 'pad_token_id',
                            'eos_token_id', 'scale_decoder_outputs' })

-- Override keys as Hugging Face's T5Config and the recipes spell them.
local ALIASES = {
  layer_norm_epsilon = 'norm_eps', dropout_rate = 'dropout',
  initializer_factor = 'init_factor', tie_word_embeddings = 'tied', n_layers = 'num_layers',
  hidden_width = 'd_model', dim = 'd_model', n_heads = 'num_heads', vocab = 'vocab_size', ffn = 'd_ff',
  ffn_dim = 'd_ff', head_dim = 'd_kv',
}

-- A full config from a name or a table, with overrides applied. Checks
-- the shapes fit together.
function M.config(name_or_config, overrides)
  local c = common.merge_config('t5', M.configs, DEFAULTS, ALIASES, name_or_config, overrides, FIELDS)
  c.num_decoder_layers = c.num_decoder_layers or c.num_layers
  if c.scale_decoder_outputs == nil then c.scale_decoder_outputs = c.tied end
  common.check_fields('t5', c, { 'd_model', 'd_ff', 'd_kv', 'num_heads', 'num_layers', 'num_decoder_layers',
                                 'vocab_size', 'relative_attention_num_buckets', 'relative_attention_max_distance' },
    { 'dropout' }, { norm_eps = validate.NONNEGATIVE, init_factor = validate.NONNEGATIVE,
                     decoder_start_token_id = validate.INDEX, pad_token_id = validate.INDEX,
                     eos_token_id = validate.INDEX })
  local function need(ok, msg) if not ok then error('t5 config: ' .. msg, 3) end end
  need(c.relative_attention_num_buckets % 4 == 0, ('relative_attention_num_buckets %d must be a multiple of 4 '
    .. '(two directions, each half exact and half log-spaced)'):format(c.relative_attention_num_buckets))
  return c
end

-- Parameters in closed form (a check on the build): per encoder block
-- attention 4 d H d_kv, the MLP (2 or 3) d d_ff, two norms; decoder blocks
-- add cross-attention and a third norm; one [buckets, H] bias table per
-- stack, two final norms, the embedding, and an untied head.
function M.closed_form_parameters(c)
  local d, inner = c.d_model, c.num_heads * c.d_kv
  local attn = 4 * d * inner
  local mlp = (c.gated and 3 or 2) * d * c.d_ff
  local enc = c.num_layers * (attn + mlp + 2 * d)
  local dec = c.num_decoder_layers * (2 * attn + mlp + 3 * d)
  local rel = 2 * c.relative_attention_num_buckets * c.num_heads
  return enc + dec + rel + 2 * d + (c.tied and 1 or 2) * c.vocab_size * d
end

-- relative positions --------------------------------------------------------------------

-- Hugging Face's T5Attention._relative_position_bucket, in tensor ops:
-- relative_position (i64, memory position minus query position) -> bucket
-- ids (i64). Bidirectional: half the buckets for keys after the query,
-- half for keys at or before it; causal: only the past (later keys map
-- to bucket 0, the causal mask hides them anyway). In each half the first
-- max_exact buckets are exact distances, the rest log-spaced up to
-- max_distance, beyond which everything shares the last bucket. The
-- log-spaced part is computed in f32 and truncated, as HF does, so the
-- bucket edges match its checkpoints exactly.
function M.relative_position_bucket(relative_position, bidirectional, num_buckets, max_distance)
  num_buckets, max_distance = num_buckets or 32, max_distance or 128
  local buckets, n = nil, nil
  if bidirectional then
    num_buckets = num_buckets / 2
    buckets = F.gt(relative_position, 0):to('i64') * num_buckets
    n = F.abs(relative_position)
  else
    n = -F.clamp(relative_position, nil, 0)
  end
  local max_exact = num_buckets / 2
  local is_small = F.lt(n, max_exact)
  -- Clamped to max_exact before the log: those positions are the exact
  -- ones and discarded by the where, and log(0) would be -inf.
  local nf = F.clamp(n:to('f32'), max_exact, nil)
  local large = (F.log(nf / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)):to('i64')
  large = F.clamp(large + max_exact, nil, num_buckets - 1)
  local b = F.where(is_small, n, large)
  if buckets ~= nil then b = buckets + b end
  return b
end
M._relative_position_bucket = M.relative_position_bucket

-- padding masks ---------------------------------------------------------------------------

-- The most negative finite value of each float dtype (torch.finfo(dtype).min).
local LOWEST = { f64 = -1.7976931348623157e308, f32 = -3.4028234663852886e38,
                 bf16 = -3.3895313892515355e38, f16 = -65504 }

-- Hugging Face's extended attention mask: mask [B, S] (any dtype; 1 =
-- attend to this key, 0 = padding) -> an additive bias [B, 1, 1, S] in
-- like's dtype, 0 where kept and the dtype's lowest finite value where
-- padded: (1 - mask) * finfo.min, as HF computes it. Finite rather than
-- -inf, so a query whose keys are all padding still gets a distribution
-- (uniform) instead of NaN, as in HF. `what` names the argument in errors.
function M.mask_bias(mask, B, S, like, what)
  what = what or 'attention_mask'
  if not fsdp.is_tensor(mask) then
    core.fail(('t5: %s must be a tensor [batch, length] of 1 (attend) and 0 (padding), got a %s')
      :format(what, type(mask)))
  end
  if mask:dim() ~= 2 or mask:size(0) ~= B or mask:size(1) ~= S then
    core.fail(('t5: %s has shape %s, expected [%d, %d] (batch, length of its sequence)')
      :format(what, core.format_shape(mask.shape), B, S))
  end
  local lowest = LOWEST[like.dtype]
  if not lowest then core.fail(('t5: masks need a float dtype, the model computes in %s'):format(like.dtype)) end
  local keep = mask:to({ dtype = like.dtype, device = like.device })
  return ((1 - keep) * lowest):view(B, 1, 1, S)
end

-- layers ---------------------------------------------------------------------------------

-- nn.Attention under HF's class name with T5's child names q, k, v, o; no
-- scaling, no biases. The first block of each stack also owns
-- relative_attention_bias ([buckets, H]) and computes the position bias.
local Attention = nn.Attention:extend('T5Attention')
M.Attention = Attention

-- Init as HF's _init_weights (factor * ...): q ~ N(0, (d d_kv)^-1/2), k and
-- v ~ N(0, d^-1/2), o ~ N(0, (H d_kv)^-1/2), the bias table ~ N(0, d^-1/2).
local function attention(c, opts, causal, has_relative_bias)
  local d, f = c.d_model, c.init_factor
  local a = Attention(d, c.num_heads, {
    head_dim = c.d_kv, bias = false, causal = causal, scale = 1, dropout = c.dropout,
    names = { q = 'q', k = 'k', v = 'v', o = 'o' },
    init = nn.init.normal(f * d ^ -0.5), out_init = nn.init.normal(f * (c.num_heads * c.d_kv) ^ -0.5),
    device = opts.device, dtype = opts.dtype })
  a.q.weight.init = nn.init.normal(f * (d * c.d_kv) ^ -0.5)
  if has_relative_bias then
    a:add_module('relative_attention_bias', nn.Embedding(c.relative_attention_num_buckets, c.num_heads, {
      init = nn.init.normal(f * d ^ -0.5), device = opts.device, dtype = opts.dtype }))
    a._bidirectional = not causal
    a._num_buckets = c.relative_attention_num_buckets
    a._max_distance = c.relative_attention_max_distance
    a._buckets = {}
  end
  return a
end

-- The bucket ids [Tq, Tk] for query positions 0..Tq-1 and key positions
-- 0..Tk-1, made once per (Tq, Tk, device): they depend on nothing else.
function Attention:buckets(Tq, Tk, device)
  local key = Tq .. '/' .. Tk .. '/' .. device
  local b = self._buckets[key]
  if not b then
    local q = fsdp.arange(Tq, { dtype = 'i64', device = device }):view(Tq, 1)
    local k = fsdp.arange(Tk, { dtype = 'i64', device = device }):view(1, Tk)
    b = M.relative_position_bucket(k - q, self._bidirectional, self._num_buckets, self._max_distance)
    self._buckets[key] = b
  end
  return b
end

-- The position bias [1, H, Tq, Tk] (HF's compute_bias): a lookup of the
-- bucket table, differentiable in relative_attention_bias.weight.
function Attention:compute_bias(Tq, Tk, device)
  local values = self.relative_attention_bias(self:buckets(Tq, Tk, device)) -- [Tq, Tk, H]
  return values:permute(2, 0, 1):unsqueeze(0)
end

-- T5LayerNorm: RMS only, in fp32, then the weight (nn.RMSNorm).
local LayerNorm = nn.RMSNorm:extend('T5LayerNorm')
M.LayerNorm = LayerNorm

local function layer_norm(c, opts)
  return LayerNorm(c.d_model, { eps = c.norm_eps, device = opts.device, dtype = opts.dtype })
end

-- The MLPs under HF's class names. wi ~ N(0, d^-1/2), wo ~ N(0, d_ff^-1/2).
local DenseActDense = nn.MLP:extend('T5DenseActDense')
M.DenseActDense = DenseActDense
local DenseGatedActDense = nn.GatedMLP:extend('T5DenseGatedActDense')
M.DenseGatedActDense = DenseGatedActDense

local function mlp(c, opts)
  local f = c.init_factor
  local o = { bias = false, init = nn.init.normal(f * c.d_model ^ -0.5), out_init = nn.init.normal(f * c.d_ff ^ -0.5),
              device = opts.device, dtype = opts.dtype }
  if c.gated then
    -- HF's T5DenseGatedActDense: wo(gelu_new(wi_0(x)) * wi_1(x)).
    o.activation, o.names = 'gelu_tanh', { 'wi_0', 'wi_1', 'wo' }
    return DenseGatedActDense(c.d_model, c.d_ff, o)
  end
  o.activation, o.names = 'relu', { 'wi', 'wo' }
  return DenseActDense(c.d_model, c.d_ff, o)
end

-- The residual sub-layers: x + dropout(sublayer(layer_norm(x))).
local LayerSelfAttention = nn.Module:extend('T5LayerSelfAttention')
M.LayerSelfAttention = LayerSelfAttention

function LayerSelfAttention:__init(c, opts, causal, has_relative_bias)
  self.SelfAttention = attention(c, opts, causal, has_relative_bias)
  self.layer_norm = layer_norm(c, opts)
  self.dropout = nn.Dropout(c.dropout)
end

function LayerSelfAttention:forward(x, position_bias)
  return x + self.dropout(self.SelfAttention(self.layer_norm(x), { bias = position_bias }))
end

local LayerCrossAttention = nn.Module:extend('T5LayerCrossAttention')
M.LayerCrossAttention = LayerCrossAttention

function LayerCrossAttention:__init(c, opts)
  self.EncDecAttention = attention(c, opts, false, false)
  self.layer_norm = layer_norm(c, opts)
  self.dropout = nn.Dropout(c.dropout)
end

-- Keys and values from the encoder output, unnormalised (it went through
-- the encoder's final_layer_norm); no position bias, only the encoder's
-- padding mask as a bias [B, 1, 1, S] (or nil).
function LayerCrossAttention:forward(x, encoder_hidden, encoder_bias)
  return x + self.dropout(self.EncDecAttention(self.layer_norm(x), { context = encoder_hidden, bias = encoder_bias }))
end

local LayerFF = nn.Module:extend('T5LayerFF')
M.LayerFF = LayerFF

function LayerFF:__init(c, opts)
  self.DenseReluDense = mlp(c, opts)
  self.layer_norm = layer_norm(c, opts)
  self.dropout = nn.Dropout(c.dropout)
end

function LayerFF:forward(x)
  return x + self.dropout(self.DenseReluDense(self.layer_norm(x)))
end

-- The transformer layer: the class wrap and checkpoint policies name.
-- Encoder blocks: layer = {self-attention, FF}; decoder blocks:
-- {causal self-attention, cross-attention, FF}.
local Block = nn.Module:extend('T5Block')
M.Block = Block

function Block:__init(c, opts, is_decoder, has_relative_bias)
  self.is_decoder = is_decoder
  self.layer = nn.ModuleList()
  self.layer:append(LayerSelfAttention(c, opts, is_decoder, has_relative_bias))
  if is_decoder then self.layer:append(LayerCrossAttention(c, opts)) end
  self.layer:append(LayerFF(c, opts))
end

-- x [B, T, d] -> hidden [B, T, d], position_bias. Block 0 (the one with
-- the relative attention bias) is given position_bias = nil and computes
-- it, adding mask_bias (this sequence's padding mask, [B, 1, 1, T] or nil);
-- the stack hands what it returns to every later block, as Hugging Face's
-- T5Block does. Computing it inside block 0 keeps the bias table's use
-- inside the module that owns it, so block 0 can be a sharded unit. For
-- decoder blocks encoder_hidden [B, S, d] and encoder_bias, the encoder's
-- padding mask [B, 1, 1, S] or nil.
function Block:forward(x, position_bias, encoder_hidden, encoder_bias, mask_bias)
  local layers = self.layer:children()
  if position_bias == nil then
    local T = x:size(1)
    position_bias = layers[1].SelfAttention:compute_bias(T, T, x.device)
    if mask_bias ~= nil then position_bias = position_bias + mask_bias end
  end
  local h = layers[1](x, position_bias)
  if self.is_decoder then h = layers[2](h, encoder_hidden, encoder_bias) end
  return layers[#layers](h), position_bias
end

-- A stack of blocks: the encoder or the decoder.
local Stack = nn.Module:extend('T5Stack')
M.Stack = Stack

function Stack:__init(c, opts, is_decoder)
  self.is_decoder = is_decoder
  self.block = nn.ModuleList()
  local n = is_decoder and c.num_decoder_layers or c.num_layers
  for i = 1, n do self.block:append(Block(c, opts, is_decoder, i == 1)) end
  self.final_layer_norm = layer_norm(c, opts)
  self.dropout = nn.Dropout(c.dropout)
end

-- embeds [B, T, d] (the shared embedding of the ids) -> hidden [B, T, d].
-- opts: mask (this sequence's padding mask [B, T]); for the decoder
-- encoder_hidden [B, S, d] and encoder_mask [B, S]. The position bias is
-- computed once, by block 0, the padding mask added to it (as HF does), and
-- the sum given to every later block.
function Stack:forward(embeds, opts)
  opts = opts or {}
  local B, T = embeds:size(0), embeds:size(1)
  local mask_bias
  if opts.mask ~= nil then
    local what = self.is_decoder and 'decoder_attention_mask' or 'attention_mask'
    mask_bias = M.mask_bias(opts.mask, B, T, embeds, what)
  end
  local encoder_bias
  if opts.encoder_mask ~= nil then
    encoder_bias = M.mask_bias(opts.encoder_mask, B, opts.encoder_hidden:size(1), embeds, 'attention_mask')
  end
  local h, bias = self.dropout(embeds), nil
  for _, block in ipairs(self.block:children()) do
    h, bias = block(h, bias, opts.encoder_hidden, encoder_bias, mask_bias)
  end
  return self.dropout(self.final_layer_norm(h))
end

local Model = nn.Module:extend('T5ForConditionalGeneration')
M.Model = Model

function Model:__init(c, opts)
  self.config = c
  -- HF: shared ~ N(0, factor * 1.0).
  self.shared = nn.Embedding(c.vocab_size, c.d_model, { init = nn.init.normal(c.init_factor),
                                                        device = opts.device, dtype = opts.dtype })
  self.encoder = Stack(c, opts, false)
  self.decoder = Stack(c, opts, true)
  if c.tied then
    -- One tensor under two modules: counted once, named shared.weight.
    self.lm_head = nn.Linear(c.d_model, c.vocab_size, { bias = false, device = 'meta' })
    self.lm_head:register_parameter('weight', self.shared.weight)
  else
    self.lm_head = nn.Linear(c.d_model, c.vocab_size, { bias = false, init = nn.init.normal(c.init_factor),
                                                        device = opts.device, dtype = opts.dtype })
  end
end

-- Hugging Face's other names for shared.weight: T5 checkpoints may carry
-- the embedding under them too (the same tensor). fsdp.safetensors.load_into
-- reads this table; load_state_dict below applies it.
Model.state_dict_aliases = { ['encoder.embed_tokens.weight'] = 'shared.weight',
                             ['decoder.embed_tokens.weight'] = 'shared.weight' }

-- nn.Module's load_state_dict after mapping the aliases onto shared.weight
-- (dropped when shared.weight itself is in the state).
function Model:load_state_dict(state, opts)
  local renamed = {}
  for name, t in pairs(state) do
    local own = Model.state_dict_aliases[name]
    if own == nil then
      renamed[name] = t
    elseif state[own] == nil then
      renamed[own] = t
    end
  end
  return nn.Module.load_state_dict(self, renamed, opts)
end

-- input_ids i64 [B, S] -> encoder hidden states [B, S, d]. attention_mask
-- [B, S] (1 = token, 0 = padding; nil: no padding) keeps padded keys out
-- of the encoder's attention; hidden states at padded positions are
-- computed anyway (as in HF) and masked again in cross-attention.
function Model:encode(input_ids, attention_mask)
  return self.encoder(self.shared(input_ids), { mask = attention_mask })
end

-- The decoder over decoder_input_ids i64 [B, T] attending to the encoder's
-- output -> logits [B, T, vocab]. opts: attention_mask (the encoder's
-- padding mask [B, S], for cross-attention), decoder_attention_mask [B, T]
-- (on top of the causal mask). With scale_decoder_outputs (v1.0: tied
-- embeddings) the output is scaled by d_model^-0.5 first, as in Mesh
-- TensorFlow.
function Model:decode(encoder_hidden, decoder_input_ids, opts)
  opts = opts or {}
  local h = self.decoder(self.shared(decoder_input_ids), {
    mask = opts.decoder_attention_mask, encoder_hidden = encoder_hidden, encoder_mask = opts.attention_mask })
  if self.config.scale_decoder_outputs then h = h * (self.config.d_model ^ -0.5) end
  return self.lm_head(h)
end

-- input_ids [B, S], decoder_input_ids [B, T] -> logits [B, T, vocab].
-- opts: attention_mask [B, S], decoder_attention_mask [B, T] (HF's
-- meaning: 1 = attend, 0 = padding).
function Model:forward(input_ids, decoder_input_ids, opts)
  opts = opts or {}
  return self:decode(self:encode(input_ids, opts.attention_mask), decoder_input_ids, opts)
end

-- Mean cross-entropy of labels i64 [B, T] (-100 entries ignored), the
-- decoder reading the labels shifted right; opts as forward's. Returns
-- loss, logits.
function Model:loss(input_ids, labels, opts)
  if not fsdp.is_tensor(labels) or labels:dim() ~= 2 or (labels.dtype ~= 'i64' and labels.dtype ~= 'i32') then
    core.fail('t5: labels must be an integer tensor [batch, target length] (-100: ignored), got '
      .. (fsdp.is_tensor(labels) and (labels.dtype .. ' ' .. core.format_shape(labels.shape)) or type(labels)))
  end
  local logits = self(input_ids, M.shift_right(labels, self.config), opts)
  local V = self.config.vocab_size
  return F.cross_entropy(logits:view(-1, V), labels:reshape(-1), { ignore_index = -100 }), logits
end

-- fsdp.plan's example batch: input ids and labels i64 [batch, seq] on
-- meta (seq 512 when nil, both sides as long); the arguments of loss,
-- the tokens (the encoder's) and seq.
function Model:example_batch(batch, seq)
  seq = seq or 512
  local ids = fsdp.empty({ batch, seq }, { dtype = 'i64', device = 'meta' })
  local labels = fsdp.empty({ batch, seq }, { dtype = 'i64', device = 'meta' })
  return { n = 2, ids, labels }, batch * seq, seq
end

-- HF's _shift_right: labels [B, T] -> decoder inputs [B, T]: the start
-- token, then labels[:, :-1], with -100 (ignored positions) replaced by
-- the pad token so that they are valid ids.
function M.shift_right(labels, c)
  c = c or DEFAULTS
  local B, T = labels:size(0), labels:size(1)
  local start = fsdp.full({ B, 1 }, c.decoder_start_token_id, { dtype = 'i64', device = labels.device })
  local shifted = start
  if T > 1 then shifted = F.cat({ start, labels:narrow(1, 0, T - 1) }, 1) end
  return F.where(F.eq(shifted, -100), c.pad_token_id, shifted)
end

-- Decoding for inspection: the encoder once, then the decoder re-run on
-- the growing sequence (no cache) for max_new_tokens steps, or until every
-- row has produced eos; finished rows continue with pad. The next token is
-- chosen by fsdp.generate's sampler, the one Llama and GPT-2 use: greedy by
-- default, or do_sample with temperature, top_k, top_p, seed;
-- repetition_penalty counts the decoder's tokens. opts: max_new_tokens
-- (20), eos_token_id, attention_mask (padded sources), and the sampler's
-- options. Returns the decoder ids i64 [B, 1 + n], starting with the start
-- token.
function M.generate(model, input_ids, opts)
  opts = opts or {}
  local c = model.config
  local mask = opts.attention_mask
  local sopts = { max_new_tokens = opts.max_new_tokens or 20, stop_ids = { opts.eos_token_id or c.eos_token_id },
                  pad_id = c.pad_token_id }
  for k, v in pairs(opts) do
    if k ~= 'eos_token_id' and k ~= 'attention_mask' and k ~= 'max_new_tokens' then sopts[k] = v end
  end
  sopts = generate.check_options(sopts)
  return fsdp.no_grad(function()
    local enc = model:encode(input_ids, mask)
    local B = input_ids:size(0)
    local ids = fsdp.full({ B, 1 }, c.decoder_start_token_id, { dtype = 'i64', device = input_ids.device })
    local sampler = generate.sampler(sopts, B, c.vocab_size, input_ids.device)
    for _ = 1, sopts.max_new_tokens do
      local logits = model:decode(enc, ids, { attention_mask = mask })
      local T = logits:size(1)
      ids = F.cat({ ids, sampler:next(logits:narrow(1, T - 1, 1):reshape(B, -1)) }, 1)
      if sampler:all_done() then break end
    end
    return ids
  end)
end

-- (A config from a Hugging Face T5Config and back: models/hf.lua, which
-- translates every family's configs, config_from_hf and config_to_hf.)

-- Build a model: name_or_config as in M.config; opts: device ('cpu' or
-- 'meta'), dtype, and config overrides (num_layers=, dropout=, ...).
function M.build(name_or_config, opts)
  local placement, overrides = common.split_build_opts(opts)
  return Model(M.config(name_or_config, overrides), placement)
end

-- What sizes it, for the bound on a config before building (common.size_of).
common.add_sizes_of('t5', { 'num_layers', 'num_decoder_layers' },
  { 'num_layers', 'num_decoder_layers', 'd_model', 'num_heads', 'd_kv', 'd_ff', 'vocab_size' },
  M.closed_form_parameters)

return M
