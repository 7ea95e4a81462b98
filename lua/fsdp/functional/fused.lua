-- fsdp.functional.fused: norms, softmax, cross-entropy, rotary embeddings
-- and attention: the fused, memory-bound kernels of core/ops/ (norm.c,
-- softmax.c, cross_entropy.c, rotary.c, attention.c), each one pass over
-- its input with its backward in C.
--
--   local F = require 'fsdp.functional'
--   local h = F.rms_norm(x, w, 1e-5)
--   local cos, sin = F.rope_tables(T, 64, {theta = 5e5, scaling = {type = 'llama3'}})
--   local y = F.scaled_dot_product_attention(F.apply_rotary(q, cos, sin),
--                                            F.apply_rotary(k, cos, sin), v, {causal = true})
--   local loss = F.cross_entropy(logits, targets, {ignore_index = -100})
--
-- Dims are 0-based (negative from the end); option tables as PyTorch's
-- keyword arguments.
local core = require 'fsdp.core'
local Tensor = require 'fsdp.tensor'
local factories = require 'fsdp.factories'
local ffi, C = core.ffi, core.C
local wrap, cptr = Tensor.wrap, Tensor.cptr

local M = {}

-- An optional tensor argument: its C struct, or NULL for nil.
local function maybe(t)
  if t == nil then return nil end
  return cptr(t)
end

local function options(name, opts)
  if opts == nil then return {} end
  if type(opts) ~= 'table' or Tensor.is_tensor(opts) then
    core.fail(('%s: expected an options table, got %s'):format(name, type(opts)))
  end
  return opts
end

local function number(name, what, v, default)
  if v == nil then return default end
  if type(v) ~= 'number' then
    core.fail(('%s: %s must be a number, got %s'):format(name, what, type(v)))
  end
  return v
end

-- norms --------------------------------------------------------------------------

-- RMSNorm over the last dim, as Hugging Face's LlamaRMSNorm (and
-- T5LayerNorm): normalised in f32, cast back to x's dtype, then times
-- weight. weight may be nil. eps defaults to 1e-6 (HF's default; Llama
-- configs use 1e-5).
function M.rms_norm(x, weight, eps)
  return wrap(C.fl_rms_norm(cptr(x), maybe(weight), number('rms_norm', 'eps', eps, 1e-6)))
end

-- (the two outputs of fl_add_rms_norm)
local add_norm_out = ffi.new('fl_tensor *[2]')

-- F.add_rms_norm(x, a, weight, eps) -> h, y: the residual add h = x + a
-- and y = F.rms_norm(h, weight, eps) in one kernel (the same bits as the
-- two), with one backward pass for h's gradient ([Note: residual add fused
-- with RMSNorm] in core/ops/norm.c). x and a of one shape and dtype.
function M.add_rms_norm(x, a, weight, eps)
  core.check(C.fl_add_rms_norm(cptr(x), cptr(a), maybe(weight), number('add_rms_norm', 'eps', eps, 1e-6),
                               add_norm_out, add_norm_out + 1))
  return wrap(add_norm_out[0]), wrap(add_norm_out[1])
end

-- LayerNorm over the last dim (biased variance); weight and bias may be
-- nil; eps defaults to 1e-5 as PyTorch's.
function M.layer_norm(x, weight, bias, eps)
  return wrap(C.fl_layer_norm(cptr(x), maybe(weight), maybe(bias),
                              number('layer_norm', 'eps', eps, 1e-5)))
end

-- softmax ------------------------------------------------------------------------

-- F.softmax(x, dim): exp(x) / sum(exp(x)) along dim (-1 by default),
-- computed stably (the maximum subtracted first).
function M.softmax(x, dim)
  return wrap(C.fl_softmax(cptr(x), number('softmax', 'dim', dim, -1)))
end

-- F.log_softmax(x, dim): log(F.softmax(x, dim)) without the loss of
-- precision of taking them apart.
function M.log_softmax(x, dim)
  return wrap(C.fl_log_softmax(cptr(x), number('log_softmax', 'dim', dim, -1)))
end

-- losses --------------------------------------------------------------------------

local REDUCTIONS = { none = C.FL_LOSS_NONE, mean = C.FL_LOSS_MEAN, sum = C.FL_LOSS_SUM }

local function loss_options(name, opts)
  opts = options(name, opts)
  local reduction = opts.reduction or 'mean'
  local r = REDUCTIONS[reduction]
  if not r then
    core.fail(("%s: reduction must be 'mean', 'sum' or 'none', got %s"):format(name, tostring(reduction)))
  end
  return number(name, 'ignore_index', opts.ignore_index, -100), r, opts
end

-- Cross-entropy of logits [..., C] (classes on the last dim) against
-- integer targets [...]: opts.ignore_index (-100), opts.reduction
-- ('mean' | 'sum' | 'none'), opts.label_smoothing (0). A mean over no
-- targets (all ignored) is nan, as in PyTorch.
function M.cross_entropy(logits, targets, opts)
  local ignore, reduction, o = loss_options('cross_entropy', opts)
  local smoothing = number('cross_entropy', 'label_smoothing', o.label_smoothing, 0)
  return wrap(C.fl_cross_entropy(cptr(logits), cptr(targets), ignore, reduction, smoothing))
end

-- A language model's head and cross-entropy as one chunked op: the loss
-- of logits = h @ weight^T (h [N, D] or [..., D], weight [V, D]) against
-- targets [N] (or [...]) without the [N, V] logits or their gradient
-- ever whole ([Note: the fused head and loss] in
-- core/ops/linear_cross_entropy.c). opts as cross_entropy's with reduction
-- 'mean' or 'sum', and chunk_rows (rows per chunk; nil: about 256 MB of
-- logits a chunk). Equal to F.cross_entropy(F.linear(h, weight), targets)
-- up to the order of the weight gradient's sum.
function M.linear_cross_entropy(h, weight, targets, opts)
  local ignore, reduction, o = loss_options('linear_cross_entropy', opts)
  local smoothing = number('linear_cross_entropy', 'label_smoothing', o.label_smoothing, 0)
  local chunk = number('linear_cross_entropy', 'chunk_rows', o.chunk_rows, 0)
  if Tensor.is_tensor(h) and h:dim() ~= 2 then h = h:reshape(-1, h:size(-1)) end
  if Tensor.is_tensor(targets) and targets:dim() ~= 1 then targets = targets:reshape(-1) end
  return wrap(C.fl_linear_cross_entropy(cptr(h), cptr(weight), cptr(targets), ignore, reduction, smoothing,
                                        chunk))
end

-- Negative log-likelihood of log-probabilities [..., C] (F.log_softmax's
-- output) at integer targets [...]; options as cross_entropy's (no
-- smoothing).
function M.nll_loss(log_probs, targets, opts)
  local ignore, reduction = loss_options('nll_loss', opts)
  return wrap(C.fl_nll_loss(cptr(log_probs), cptr(targets), ignore, reduction))
end

-- rotary embeddings ----------------------------------------------------------------

-- transformers' rope types (fl_rope_scaling)
local ROPE_TYPES = { default = 'FL_ROPE_DEFAULT', llama3 = 'FL_ROPE_LLAMA3', linear = 'FL_ROPE_LINEAR',
                     dynamic = 'FL_ROPE_DYNAMIC', yarn = 'FL_ROPE_YARN', longrope = 'FL_ROPE_LONGROPE' }

-- cos, sin tables [seq_len, head_dim] built as transformers builds them.
-- opts: theta (1e4), scaling (nil, or a table with type or rope_type one
-- of 'default', 'llama3', 'linear', 'dynamic', 'yarn', 'longrope' and
-- that type's fields as transformers' rope_parameters name them: factor,
-- low_freq_factor, high_freq_factor, original_max_position_embeddings,
-- attention_factor, beta_fast, beta_slow, mscale, mscale_all_dim,
-- truncate, short_factor, long_factor, partial_rotary_factor; llama3's
-- missing fields take Llama 3.1's values), max_position_embeddings (the
-- model's: dynamic scales past it; yarn and longrope derive a missing
-- factor from it), context_len (dynamic and longrope: the length the
-- frequencies serve, default seq_len), dtype and device (the defaults of
-- fsdp). With partial_rotary_factor f the tables are [seq_len,
-- floor(head_dim * f)] (the rotary part of the head, as transformers).
function M.rope_tables(seq_len, head_dim, opts)
  local name = 'rope_tables'
  opts = options(name, opts)
  local o = ffi.new('fl_rope_options')
  o.theta = number(name, 'theta', opts.theta, 1e4)
  o.scaling = C.FL_ROPE_DEFAULT
  o.max_position_embeddings = number(name, 'max_position_embeddings', opts.max_position_embeddings, 0)
  o.context_len = number(name, 'context_len', opts.context_len, 0)
  head_dim = number(name, 'head_dim', head_dim)
  local s = opts.scaling
  local keep -- the factor arrays, alive until the call returns
  if s ~= nil then
    if type(s) ~= 'table' then core.fail(('%s: scaling must be a table, got %s'):format(name, type(s))) end
    local kind = s.rope_type or s.type or 'default'
    if not ROPE_TYPES[kind] then
      core.fail(("%s: scaling type must be one of default, llama3, linear, dynamic, yarn, longrope, got %s")
        :format(name, tostring(kind)))
    end
    o.scaling = C[ROPE_TYPES[kind]]
    local prf = number(name, 'scaling.partial_rotary_factor', s.partial_rotary_factor, 1)
    if not (prf > 0 and prf <= 1) then
      core.fail(('%s: scaling.partial_rotary_factor must be in (0, 1], got %s'):format(name, tostring(prf)))
    end
    head_dim = math.floor(head_dim * prf)
    local function field(k, default) return number(name, 'scaling.' .. k, s[k], default) end
    if kind == 'llama3' then
      o.factor = field('factor', 8)
      o.low_freq_factor = field('low_freq_factor', 1)
      o.high_freq_factor = field('high_freq_factor', 4)
      o.original_max_position_embeddings = field('original_max_position_embeddings', 8192)
    elseif kind ~= 'default' then
      o.factor = field('factor', 0)
      o.original_max_position_embeddings = field('original_max_position_embeddings', 0)
      o.attention_factor = field('attention_factor', 0)
      o.beta_fast = field('beta_fast', 0)
      o.beta_slow = field('beta_slow', 0)
      o.mscale = field('mscale', 0)
      o.mscale_all_dim = field('mscale_all_dim', 0)
      o.no_truncate = s.truncate == false and 1 or 0
      if kind == 'longrope' then
        local short, long = s.short_factor, s.long_factor
        if type(short) ~= 'table' or type(long) ~= 'table' or #short ~= #long then
          core.fail(('%s: longrope scaling needs short_factor and long_factor lists of equal length'):format(name))
        end
        keep = ffi.new('double[?]', 2 * #short + 1)
        for i = 1, #short do
          keep[i - 1] = number(name, 'scaling.short_factor[' .. i .. ']', short[i])
          keep[#short + i - 1] = number(name, 'scaling.long_factor[' .. i .. ']', long[i])
        end
        o.n_factors, o.short_factor, o.long_factor = #short, keep, keep + #short
      end
    end
  end
  local dtype = core.dtype(opts.dtype or factories.get_default_dtype())
  local device = core.device(opts.device or factories.get_default_device())
  local out = ffi.new('fl_tensor*[2]')
  core.check(C.fl_rope_tables(number(name, 'seq_len', seq_len), head_dim, o, dtype, device, out, out + 1))
  local _ = keep
  return wrap(out[0]), wrap(out[1])
end

-- x * cos + rotate_half(x) * sin for x [..., T, D] (usually [B, H, T, D]);
-- opts.positions: i64 [T] or [B, T] rows of the tables (default 0 ... T-1).
function M.apply_rotary(x, cos, sin, opts)
  opts = options('apply_rotary', opts)
  return wrap(C.fl_apply_rotary(cptr(x), cptr(cos), cptr(sin), maybe(opts.positions)))
end

-- attention -------------------------------------------------------------------------

-- softmax(scale * q k^T + bias) v with q [B, Hq, Tq, D], k [B, Hkv, Tk, D],
-- v [B, Hkv, Tk, Dv] (Hq a multiple of Hkv: grouped-query attention).
-- opts: causal (false), bias (additive, broadcastable to [B, Hq, Tq, Tk];
-- attn_mask is accepted as its PyTorch name), scale (1/sqrt(D); T5 passes 1),
-- window (0: none; with causal, query i sees keys i - window < j <= i:
-- Mistral's and Gemma's sliding window), softcap (0: none; scores become
-- softcap * tanh(scores / softcap) before the bias and masks: Gemma 2),
-- segments (packed sequences, with causal and Tq == Tk: i64/i32 [B, T]
-- document ids, each run of equal ids one document, negative ids padding;
-- a query sees only the keys of its own document: [Note: packed
-- sequences] in core/ops/attention.c). No [Tq, Tk] mask is built for any
-- of them (fsdp.h: fl_attention).
function M.scaled_dot_product_attention(q, k, v, opts)
  local name = 'scaled_dot_product_attention'
  opts = options(name, opts)
  local qc = cptr(q)
  local bias = opts.bias
  if bias == nil then bias = opts.attn_mask end
  local scale = opts.scale
  if scale == nil then
    local d = qc.ndim > 0 and tonumber(qc.shape[qc.ndim - 1]) or 1
    scale = 1 / math.sqrt(d)
  end
  local window = number(name, 'window', opts.window, 0)
  if window < 0 or window % 1 ~= 0 then
    core.fail(('%s: window must be 0 (none) or a positive integer, got %s'):format(name, tostring(window)))
  end
  local o = ffi.new('fl_attention_options', {
    causal = opts.causal and true or false, scale = number(name, 'scale', scale),
    window = window, softcap = number(name, 'softcap', opts.softcap, 0), segments = maybe(opts.segments) })
  return wrap(C.fl_attention(qc, cptr(k), cptr(v), maybe(bias), o))
end

-- Tensor methods ----------------------------------------------------------------------

local methods = Tensor.methods
function methods:softmax(dim) return M.softmax(self, dim) end
function methods:log_softmax(dim) return M.log_softmax(self, dim) end

return M
