-- models/gpt2.lua: GPT-2 (Radford et al. 2019) with Hugging Face
-- GPT2LMHeadModel's structure and parameter names (transformer.wte,
-- transformer.h.N.attn.c_attn, ..., lm_head tied to wte), the way nanoGPT
-- trains it.
--
--   local gpt2 = require 'models.gpt2'
--   local model = gpt2.build('gpt2', {device = 'meta'})
--   print(model:num_parameters())                  -- 124439808
--   local small = gpt2.build('tiny', {dropout = 0.1})
--   small:init_weights({seed = 0})
--   local logits = small(ids)                      -- ids: i64 [B, T], T <= n_positions
--   local loss = small:loss(ids, targets)
--
-- The math: learned token and position embeddings, pre-norm blocks
-- x + attn(ln_1(x)), h + mlp(ln_2(h)) with LayerNorm (eps 1e-5), causal
-- multi-head attention scaled by 1/sqrt(head_dim) from one fused qkv
-- projection (c_attn, with bias), an MLP of 4 * dim with the tanh GELU
-- (HF's 'gelu_new'), a final LayerNorm, and the output head sharing the
-- token embedding. Dropout (embeddings, attention probabilities, residual
-- branches) defaults to 0, nanoGPT's setting for pre-training and the
-- benchmarks; HF's checkpoints were trained with 0.1.
--
-- Checkpoints: HF's GPT-2 implements c_attn, c_proj, c_fc as Conv1D,
-- whose weight is stored [in, out]; here they are nn.Linear, [out, in].
-- A Hugging Face state dict therefore loads only through
-- M.from_hf_state_dict, which transposes those four weights per block
-- (and drops the causal-mask buffers old checkpoints carry); M.to_hf_state_dict
-- goes the other way. models/hf.lua's from_pretrained / save_pretrained
-- use them for whole Hugging Face directories (config.json, one or many
-- safetensors files).
local fsdp = require 'fsdp'
local nn = require 'fsdp.nn'
local F = require 'fsdp.functional'
local common = require 'models.common'
local validate = require 'fsdp.validate'

local M = {}

-- The four released sizes (HF's gpt2, gpt2-medium, gpt2-large, gpt2-xl)
-- and a small config for tests and CPU training. Fields: dim (HF n_embd),
-- n_layers (n_layer), n_heads (n_head), ffn_dim (n_inner, default 4 *
-- dim), vocab_size, max_seq_len (n_positions), norm_eps
-- (layer_norm_epsilon), dropout (the default of embd_pdrop, attn_pdrop,
-- resid_pdrop, which may be set apart), init_std (initializer_range).
M.configs = {
  ['gpt2'] = { dim = 768, n_layers = 12, n_heads = 12 },
  ['gpt2-medium'] = { dim = 1024, n_layers = 24, n_heads = 16 },
  ['gpt2-large'] = { dim = 1280, n_layers = 36, n_heads = 20 },
  ['gpt2-xl'] = { dim = 1600, n_layers = 48, n_heads = 25 },
  -- Seconds-long CPU training and tests.
  ['tiny'] = { dim = 64, n_layers = 2, n_heads = 4, vocab_size = 256, max_seq_len = 128 },
}

local DEFAULTS = { vocab_size = 50257, max_seq_len = 1024, norm_eps = 1e-5, init_std = 0.02, dropout = 0 }

-- Every field a config or an override may set (anything else is a typo).
local FIELDS = common.set({ 'dim', 'n_layers', 'n_heads', 'ffn_dim', 'head_dim', 'vocab_size', 'max_seq_len',
                            'norm_eps', 'init_std', 'dropout', 'embd_pdrop', 'attn_pdrop', 'resid_pdrop' })

-- Override keys as Hugging Face's GPT2Config and the recipes spell them.
local ALIASES = {
  n_embd = 'dim', n_layer = 'n_layers', n_head = 'n_heads', n_inner = 'ffn_dim',
  n_positions = 'max_seq_len', layer_norm_epsilon = 'norm_eps', initializer_range = 'init_std',
  num_layers = 'n_layers', hidden_width = 'dim', num_heads = 'n_heads', vocab = 'vocab_size',
  ffn = 'ffn_dim',
}

-- A full config from a name or a table, with overrides applied. Checks
-- the shapes fit together.
function M.config(name_or_config, overrides)
  local c = common.merge_config('gpt2', M.configs, DEFAULTS, ALIASES, name_or_config, overrides, FIELDS)
  c.ffn_dim = c.ffn_dim or 4 * c.dim
  common.check_fields('gpt2', c, { 'dim', 'n_layers', 'n_heads', 'ffn_dim', 'vocab_size', 'max_seq_len' },
    { 'dropout', 'embd_pdrop', 'attn_pdrop', 'resid_pdrop' },
    { norm_eps = validate.NONNEGATIVE, init_std = validate.NONNEGATIVE })
  c.head_dim = c.dim / c.n_heads
  c.embd_pdrop = c.embd_pdrop or c.dropout
  c.attn_pdrop = c.attn_pdrop or c.dropout
  c.resid_pdrop = c.resid_pdrop or c.dropout
  local function need(ok, msg) if not ok then error('gpt2 config: ' .. msg, 3) end end
  need(c.head_dim == math.floor(c.head_dim), ('dim %d is not a multiple of n_heads %d'):format(c.dim, c.n_heads))
  need(c.max_seq_len >= 1, ('n_positions must be positive, got %s'):format(tostring(c.max_seq_len)))
  return c
end

-- Parameters in closed form (a check on the build): embeddings V d + P d,
-- per block attention 4 d^2 + 4 d, MLP 2 d ffn + ffn + d, two LayerNorms
-- 4 d, the final LayerNorm 2 d; the head is the token embedding.
function M.closed_form_parameters(c)
  local d, ffn = c.dim, c.ffn_dim
  local per_layer = 4 * d * d + 4 * d + 2 * d * ffn + ffn + d + 4 * d
  return (c.vocab_size + c.max_seq_len) * d + c.n_layers * per_layer + 2 * d
end

-- Training FLOPs per token (PaLM appendix B): 6N + 12 L H hd T. N is the
-- parameter count without the position table, as nanoGPT's estimate_mfu
-- (get_num_params(non_embedding=True)) counts it: wpe is a lookup, no
-- product, while wte is also the head's [V, d] product and stays in.
-- n_params is the model's whole count (num_parameters(); default the
-- closed form); the position table is subtracted here.
function M.flops_per_token(c, seq_len, n_params)
  n_params = n_params or M.closed_form_parameters(c)
  local n = n_params - c.max_seq_len * c.dim
  return 6 * n + 12 * c.n_layers * c.n_heads * c.head_dim * seq_len
end

-- layers ---------------------------------------------------------------------------------

-- nn.Attention and nn.MLP under Hugging Face's class names and with its
-- child names: one fused c_attn (q, k, v rows in that order) and c_proj;
-- c_fc and c_proj. Init as GPT-2's paper and nanoGPT: weights N(0, 0.02),
-- the projections back into the residual stream N(0, 0.02 / sqrt(2 L)),
-- biases zero.
local Attention = nn.Attention:extend('GPT2Attention')
M.Attention = Attention
local MLP = nn.MLP:extend('GPT2MLP')
M.MLP = MLP

local Block = nn.Module:extend('GPT2Block')
M.Block = Block

function Block:__init(c, opts)
  local place = { device = opts.device, dtype = opts.dtype }
  local init = nn.init.normal(c.init_std)
  local out_init = nn.init.normal(c.init_std / math.sqrt(2 * c.n_layers))
  local zeros = nn.init.zeros()
  self.ln_1 = nn.LayerNorm(c.dim, { eps = c.norm_eps, device = place.device, dtype = place.dtype })
  self.attn = Attention(c.dim, c.n_heads, {
    fused_qkv = true, names = { qkv = 'c_attn', o = 'c_proj' }, bias = true, causal = true,
    dropout = c.attn_pdrop, out_dropout = c.resid_pdrop,
    init = init, out_init = out_init, bias_init = zeros, device = place.device, dtype = place.dtype })
  self.ln_2 = nn.LayerNorm(c.dim, { eps = c.norm_eps, device = place.device, dtype = place.dtype })
  self.mlp = MLP(c.dim, c.ffn_dim, {
    activation = 'gelu_tanh', bias = true, names = { 'c_fc', 'c_proj' }, dropout = c.resid_pdrop,
    init = init, out_init = out_init, bias_init = zeros, device = place.device, dtype = place.dtype })
end

-- mask and kv_cache as nn.Attention's (decoding: fsdp.generate).
function Block:forward(x, mask, kv_cache)
  local h = x + self.attn(self.ln_1(x), { mask = mask, kv_cache = kv_cache })
  return h + self.mlp(self.ln_2(h))
end

local Model = nn.Module:extend('GPT2Model')

function Model:__init(c, opts)
  self.config = c
  local place = { device = opts.device, dtype = opts.dtype }
  self.wte = nn.Embedding(c.vocab_size, c.dim, { init = nn.init.normal(c.init_std), device = place.device,
                                                  dtype = place.dtype })
  self.wpe = nn.Embedding(c.max_seq_len, c.dim, { init = nn.init.normal(c.init_std), device = place.device,
                                                   dtype = place.dtype })
  self.drop = nn.Dropout(c.embd_pdrop)
  self.h = nn.ModuleList()
  for _ = 1, c.n_layers do self.h:append(Block(c, opts)) end
  self.ln_f = nn.LayerNorm(c.dim, { eps = c.norm_eps, device = place.device, dtype = place.dtype })
  self._positions = {}
end

-- Position ids 0 ... T-1 on a device, made once per (length, device).
function Model:positions(T, device)
  local key = T .. '/' .. device
  local p = self._positions[key]
  if not p then
    p = fsdp.arange(T, { dtype = 'i64', device = device })
    self._positions[key] = p
  end
  return p
end

-- ids i64 [B, T] -> hidden states [B, T, dim]. opts (decoding,
-- fsdp.generate): positions i64 [B, T] (rows of the position table, each
-- row's own: left-padded rows start later; the caller keeps them below
-- n_positions), mask (bool, broadcast to [B, H, T, S]), cache (a
-- fsdp.generate KV cache).
function Model:forward(ids, opts)
  local c = self.config
  local T = ids:size(ids:dim() - 1)
  local positions = opts and opts.positions
  if positions == nil then
    if T > c.max_seq_len then
      error(('gpt2: sequence length %d exceeds n_positions %d (the learned position table has %d rows)')
        :format(T, c.max_seq_len, c.max_seq_len), 0)
    end
    positions = self:positions(T, ids.device)
  end
  local h = self.drop(self.wte(ids) + self.wpe(positions))
  local mask, cache = opts and opts.mask, opts and opts.cache
  for i, block in ipairs(self.h:children()) do h = block(h, mask, cache and cache:layer(i)) end
  return self.ln_f(h)
end

local LMHead = nn.Module:extend('GPT2LMHeadModel')
M.LMHeadModel = LMHead

function LMHead:__init(c, opts)
  self.config = c
  self.transformer = Model(c, opts)
  -- One tensor under two modules: counted once, named transformer.wte.weight.
  self.lm_head = nn.Linear(c.dim, c.vocab_size, { bias = false, device = 'meta' })
  self.lm_head:register_parameter('weight', self.transformer.wte.weight)
end

-- ids: i64 [B, T] -> logits [B, T, vocab]. opts: Model:forward's, and
-- last_only (the last position's logits alone, [B, 1, vocab]).
function LMHead:forward(ids, opts)
  local h = self.transformer(ids, opts)
  if opts and opts.last_only then h = h:narrow(1, h:size(1) - 1, 1) end
  return self.lm_head(h)
end

-- What fsdp.generate's KV cache holds per layer, and the most positions
-- the learned table embeds (prompt plus new tokens).
function LMHead:kv_cache_spec()
  local c = self.config
  return { n_layers = c.n_layers, n_kv_heads = c.n_heads, head_dim = c.head_dim, max_positions = c.max_seq_len }
end

-- Mean cross-entropy of next-token predictions; targets i64 [B, T] (the
-- ids shifted by one; -100 entries are ignored). Returns loss, logits.
function LMHead:loss(ids, targets)
  return common.causal_lm_loss(self, ids, targets)
end

-- fsdp.plan's example batch (common.causal_lm_batch).
function LMHead:example_batch(batch, seq) return common.causal_lm_batch(self, batch, seq) end

-- Build a model: name_or_config as in M.config; opts: device ('cpu' or
-- 'meta'), dtype, and config overrides (n_layers=, dropout=, ...).
function M.build(name_or_config, opts)
  local placement, overrides = common.split_build_opts(opts)
  return LMHead(M.config(name_or_config, overrides), placement)
end

-- checkpoints ------------------------------------------------------------------------------

-- The weights HF stores as Conv1D [in, out], by name suffix.
local CONV1D = { 'attn.c_attn.weight', 'attn.c_proj.weight', 'mlp.c_fc.weight', 'mlp.c_proj.weight' }

function M.is_conv1d(name)
  for _, suffix in ipairs(CONV1D) do
    if name:sub(-#suffix) == suffix then return true end
  end
  return false
end
local is_conv1d = M.is_conv1d

-- Our name of a Hugging Face GPT-2 checkpoint key, or nil for the keys
-- that hold nothing of ours: the per-block causal-mask buffers (attn.bias,
-- attn.masked_bias) and lm_head.weight, the tied embedding. Keys of the
-- bare GPT2Model checkpoints the hub ships ('h.0.ln_1.weight') get the
-- 'transformer.' prefix.
function M.name_from_hf(name)
  local key = name
  if not (key:find('^transformer%.') or key:find('^lm_head%.')) then key = 'transformer.' .. key end
  if key:find('%.attn%.bias$') or key:find('%.attn%.masked_bias$') or key == 'lm_head.weight' then return nil end
  return key
end

-- A Hugging Face GPT-2 state dict (name -> tensor, e.g. from
-- fsdp.load_safetensors of model.safetensors) as this model's: the Conv1D
-- weights transposed to [out, in] (contiguous copies), the per-block
-- causal-mask buffers (attn.bias, attn.masked_bias) dropped, and keys of
-- the bare GPT2Model checkpoints the hub ships ('h.0.ln_1.weight') given
-- the 'transformer.' prefix. lm_head.weight, when present, is the tied
-- embedding and is dropped too.
function M.from_hf_state_dict(state)
  local out = {}
  for name, t in pairs(state) do
    local key = M.name_from_hf(name)
    if key then out[key] = is_conv1d(key) and t:t():contiguous() or t end
  end
  return out
end

-- This model's state dict in Hugging Face's layout (Conv1D weights [in,
-- out], lm_head.weight as the tied embedding), for GPT2LMHeadModel.
function M.to_hf_state_dict(model)
  local out = {}
  for _, np in ipairs(model:named_parameters()) do
    local name, t = np[1], np[2]:detach()
    out[name] = is_conv1d(name) and t:t():contiguous() or t
  end
  out['lm_head.weight'] = out['transformer.wte.weight']
  return out
end

-- What sizes it, for the bound on a config before building (common.size_of).
common.add_sizes_of('gpt2', { 'n_layers' },
  { 'n_layers', 'dim', 'n_heads', 'ffn_dim', 'vocab_size', 'max_seq_len' }, M.closed_form_parameters)

return M
