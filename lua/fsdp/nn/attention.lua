-- fsdp.nn.attention: nn.Attention, multi-head and grouped-query attention
-- with its projections, the block every transformer in models/ shares.
--
--   nn.Attention(dim, n_heads, {n_kv_heads = n_heads, head_dim = dim / n_heads,
--                bias = false, out_bias = bias, causal = true, scale = 1/sqrt(head_dim),
--                window = 0, softcap = 0,
--                dropout = 0, out_dropout = 0, fused_qkv = false, names = {...},
--                init = rule, out_init = init, bias_init = rule, device =, dtype =})
--   y = attn(x, {rope = {cos =, sin =, positions =}, bias = t, mask = t, context = t,
--               kv_cache = layer_cache, segments = t})
--
-- Children, in the order PyTorch models register them: q_proj, k_proj,
-- v_proj, o_proj (Hugging Face Llama names), or with fused_qkv one
-- projection of all three, qkv_proj [(H + 2 KV) * head_dim, dim] rows in
-- the order q, k, v, and o_proj. opts.names renames them ({q =, k =, v =,
-- o =} or, fused, {qkv =, o =}): GPT-2 is {qkv = 'c_attn', o = 'c_proj'},
-- T5 is {q = 'q', k = 'k', v = 'v', o = 'o'}; the names are the
-- checkpoint's keys, so they must be the model's own.
--
-- forward(x [B, T, dim], opts): rope applies rotary embeddings to q and k
-- (F.apply_rotary: rotate-half, the Hugging Face convention); bias is
-- added to the scores (broadcast to [B, H, T, S]: T5's position bias, an
-- ALiBi slope table); mask is a bool tensor broadcast the same way, true
-- where a query may attend (PyTorch's boolean attn_mask); context gives
-- keys and values from another sequence [B, S, dim] (cross-attention; not
-- with fused_qkv, which projects all three from x). causal hides key j
-- from query i when j > i. window (0: none; needs causal) also hides key
-- j when j <= i - window: each query sees the last `window` tokens, itself
-- included (Mistral's sliding window; Gemma 2 alternates windowed and
-- global layers, so each Attention has its own). softcap (0: none) maps the
-- scaled scores to softcap * tanh(scores / softcap) before bias and masks
-- (Gemma 2). Both go to the fused kernel, which builds no [T, S] mask.
-- segments (packed sequences, training; causal self-attention only, not
-- with a kv_cache, nor with attention dropout in training, whose path
-- materialises the scores): i64 [B, T] document ids, each run of equal
-- ids one document, negative ids padding; the fused kernel confines each
-- query to its own document ([Note: packed sequences] in
-- core/ops/attention.c). Positions restarting per document are the rope's
-- (rope.positions).
--
-- kv_cache (decoding, fsdp.generate): an object whose update(k, v) stores
-- this call's keys and values [B, KV, T, hd] (after RoPE) in its
-- preallocated buffers and returns views of everything cached so far
-- [B, KV, S, hd], which the queries then attend to. The causal flag is
-- aligned top-left (query 0 sees key 0 only), which is wrong once queries
-- start at cache position S - T, so with a cache causality is the mask's
-- job: the caller's mask must hide future and padded keys (several
-- queries with a cache and no mask are refused). The window is this
-- layer's own: with a cache it is added to the mask here, from the cache's
-- invariant that this call's T queries sit at cache positions S - T ... S
-- - 1 of the S keys update returns (a [T, S] bool band, small when
-- decoding one token). A cache may instead return a third value, the
-- mask for the keys it returns, which then replaces opts.mask and the
-- band: a sliding layer's ring of its last `window` positions returns
-- them in ring order, not position order. [Note: the KV cache] in
-- lua/fsdp/generate.lua.
--
-- dropout is on the attention probabilities (HF's attn_pdrop /
-- attention_dropout); out_dropout on the output projection (HF GPT-2's
-- resid_pdrop). Both act in training mode only. The fused kernel
-- (F.scaled_dot_product_attention: blocks of rows, never the whole score
-- matrix) has no dropout, so with dropout > 0 in training the scores are
-- materialised ([B, H, T, S]) and the probabilities dropped explicitly;
-- everywhere else, eval included, the fused kernel runs.
--
-- Weights start as nn.Linear's (PyTorch's kaiming-uniform) unless the
-- model gives rules: init for q, k, v (or qkv), out_init for o (GPT-2
-- scales it by 1/sqrt(2 n_layers)), bias_init for every bias.
local factories = require 'fsdp.factories'
local core = require 'fsdp.core'
local validate = require 'fsdp.validate'
local Module = require 'fsdp.nn.module'
local Linear = require 'fsdp.nn.linear'
local functional = require 'fsdp.functional'

local Attention = Module:extend('Attention')

local function positive_int(what, v)
  if validate.problem(v, validate.COUNT) then
    core.fail(('Attention: %s must be a positive integer, got %s'):format(what, validate.show(v)))
  end
  return v
end

local function probability(what, v)
  v = v or 0
  if validate.problem(v, { min = 0, max = 1 }) then
    core.fail(('Attention: %s must be a probability in [0, 1], got %s'):format(what, validate.show(v)))
  end
  return v
end

function Attention:__init(dim, n_heads, opts)
  opts = opts or {}
  positive_int('dim', dim)
  positive_int('n_heads', n_heads)
  local n_kv = positive_int('n_kv_heads', opts.n_kv_heads or n_heads)
  if n_heads % n_kv ~= 0 then
    core.fail(('Attention: n_heads %d is not a multiple of n_kv_heads %d'):format(n_heads, n_kv))
  end
  local hd = opts.head_dim
  if hd == nil then
    if dim % n_heads ~= 0 then
      core.fail(('Attention: dim %d is not a multiple of n_heads %d (give head_dim)'):format(dim, n_heads))
    end
    hd = dim / n_heads
  end
  positive_int('head_dim', hd)
  self.dim, self.n_heads, self.n_kv_heads, self.head_dim = dim, n_heads, n_kv, hd
  self.causal = opts.causal ~= false
  self.scale = opts.scale or 1 / math.sqrt(hd)
  self.window = opts.window or 0
  if validate.problem(self.window, { min = 0, int = true }) then
    core.fail(('Attention: window must be 0 (none) or a positive integer, got %s'):format(validate.show(opts.window)))
  end
  if self.window > 0 and not self.causal then
    core.fail(('Attention: window %d needs causal attention (a sliding window is a band below the causal diagonal)')
      :format(self.window))
  end
  self.softcap = opts.softcap or 0
  if validate.problem(self.softcap, { min = 0 }) then
    core.fail(('Attention: softcap must be 0 (none) or a positive number, got %s'):format(validate.show(opts.softcap)))
  end
  self.dropout = probability('dropout', opts.dropout)
  self.out_dropout = probability('out_dropout', opts.out_dropout)
  self.fused_qkv = opts.fused_qkv and true or false

  local names = opts.names or {}
  local bias = opts.bias == true
  local out_bias = opts.out_bias
  if out_bias == nil then out_bias = bias end
  local function linear(in_f, out_f, with_bias, init)
    return Linear(in_f, out_f, { bias = with_bias, init = init, bias_init = opts.bias_init,
                                 device = opts.device, dtype = opts.dtype })
  end
  -- Child names live in a plain field (not a registered attribute), so
  -- forward finds its projections under whatever the model calls them.
  local n = {}
  if self.fused_qkv then
    n.qkv = names.qkv or 'qkv_proj'
    self:add_module(n.qkv, linear(dim, (n_heads + 2 * n_kv) * hd, bias, opts.init))
  else
    n.q, n.k, n.v = names.q or 'q_proj', names.k or 'k_proj', names.v or 'v_proj'
    self:add_module(n.q, linear(dim, n_heads * hd, bias, opts.init))
    self:add_module(n.k, linear(dim, n_kv * hd, bias, opts.init))
    self:add_module(n.v, linear(dim, n_kv * hd, bias, opts.init))
  end
  n.o = names.o or 'o_proj'
  self:add_module(n.o, linear(n_heads * hd, dim, out_bias, opts.out_init or opts.init))
  self._names = n
end

-- x [B, T, dim] (and context [B, S, dim]) -> q [B, H, T, hd], k and v
-- [B, KV, S, hd]: views of the projections, no copies.
function Attention:project(x, context)
  local n, hd, H, KV = self._names, self.head_dim, self.n_heads, self.n_kv_heads
  local B, T = x:size(0), x:size(1)
  if self.fused_qkv then
    if context ~= nil then
      core.fail('Attention: a fused qkv projection cannot attend to a context (cross-attention)')
    end
    -- One product for all three; the heads axis is then split by narrowing.
    local qkv = self[n.qkv](x):view(B, T, H + 2 * KV, hd)
    return qkv:narrow(2, 0, H):transpose(1, 2), qkv:narrow(2, H, KV):transpose(1, 2),
           qkv:narrow(2, H + KV, KV):transpose(1, 2)
  end
  local kv_in = context or x
  local S = kv_in:size(1)
  return self[n.q](x):view(B, T, H, hd):transpose(1, 2),
         self[n.k](kv_in):view(B, S, KV, hd):transpose(1, 2),
         self[n.v](kv_in):view(B, S, KV, hd):transpose(1, 2)
end

-- The scores materialised, for dropout on the probabilities: grouped heads
-- are matched by broadcasting k and v over a group axis ([B, KV, rep, ...]),
-- never by copying them.
-- Softcap, bias, causal and window masks in the fused kernel's order.
local function attend_with_dropout(F, q, k, v, bias, o, p)
  local B, H, T, hd = q:size(0), q:size(1), q:size(2), q:size(3)
  local KV, S, Dv = k:size(1), k:size(2), v:size(3)
  local rep = H / KV
  local scores = F.matmul(q:reshape(B, KV, rep, T, hd), k:unsqueeze(2):transpose(3, 4)) * o.scale
  scores = scores:view(B, H, T, S)
  if o.softcap > 0 then scores = F.tanh(scores / o.softcap) * o.softcap end
  if bias ~= nil then scores = scores + bias end
  if o.causal then
    local rows = factories.arange(T, { dtype = 'i64', device = q.device }):view(T, 1)
    local cols = factories.arange(S, { dtype = 'i64', device = q.device }):view(1, S)
    scores = F.masked_fill(scores, F.gt(cols, rows), -math.huge)
    if o.window > 0 then scores = F.masked_fill(scores, F.le(cols, rows - o.window), -math.huge) end
  end
  local probs = F.dropout(F.softmax(scores, -1), p, true)
  return F.matmul(probs:view(B, KV, rep, T, S), v:unsqueeze(2)):view(B, H, T, Dv)
end

-- An additive bias from opts.bias and opts.mask (0 where true, -inf where
-- false), or nil.
local function score_bias(F, opts, like)
  local bias, mask = opts.bias, opts.mask
  if mask == nil then return bias end
  local zero = factories.zeros({}, { dtype = like.dtype, device = like.device })
  local from_mask = F.where(mask, zero, -math.huge)
  if bias == nil then return from_mask end
  return bias + from_mask
end

function Attention:forward(x, opts)
  opts = opts or {}
  local F = functional
  local B, T = x:size(0), x:size(1)
  local q, k, v = self:project(x, opts.context)
  local rope = opts.rope
  if rope ~= nil then
    local ropts = rope.positions and { positions = rope.positions } or nil
    q = F.apply_rotary(q, rope.cos, rope.sin, ropts)
    k = F.apply_rotary(k, rope.cos, rope.sin, ropts)
  end
  local causal, window, mask = self.causal, self.window, opts.mask
  local segments = opts.segments
  if segments ~= nil then
    if opts.kv_cache ~= nil then
      core.fail('Attention: segments (packed sequences) are for training, not with a kv_cache')
    end
    if not causal then core.fail('Attention: segments (packed sequences) need causal attention') end
    if self.training and self.dropout > 0 then
      core.fail(('Attention: segments (packed sequences) with attention dropout %g: the dropout path materialises '
        .. 'the scores and has no document mask'):format(self.dropout))
    end
  end
  if opts.kv_cache ~= nil then
    if causal and T > 1 and mask == nil then
      core.fail(('Attention: %d queries with a kv_cache need a mask: with a cache the mask carries causality'):format(T))
    end
    local own
    k, v, own = opts.kv_cache:update(k, v)
    causal = false
    if own ~= nil then
      -- a sliding layer's ring: its keys are in slot order, and its mask
      -- (padding, causality, window) is for that order
      mask, window = own, 0
    elseif window > 0 then
      -- queries at cache positions S - T ... S - 1 see keys j > position - window
      local S = k:size(2)
      local rows = factories.arange(T, { dtype = 'i64', device = q.device }):view(T, 1) + (S - T - window)
      local band = F.gt(factories.arange(S, { dtype = 'i64', device = q.device }):view(1, S), rows)
      mask = mask == nil and band or F.where(band, mask, false)
      window = 0
    end
  end
  local bias = score_bias(F, { bias = opts.bias, mask = mask }, q)
  local ao = { causal = causal, bias = bias, scale = self.scale, window = window, softcap = self.softcap,
               segments = segments }
  local o
  if self.training and self.dropout > 0 then
    o = attend_with_dropout(F, q, k, v, bias, ao, self.dropout)
  else
    o = F.scaled_dot_product_attention(q, k, v, ao)
  end
  local y = self[self._names.o](o:transpose(1, 2):reshape(B, T, self.n_heads * self.head_dim))
  if self.training and self.out_dropout > 0 then y = F.dropout(y, self.out_dropout, true) end
  return y
end

return Attention
