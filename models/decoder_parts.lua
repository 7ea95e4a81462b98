-- models/decoder_parts.lua: the parts models/decoder.lua assembles a
-- decoder family from, where nn's blocks do not already say it: the
-- RMSNorm variants of MODELS_FAMILIES.md (where the weight meets the
-- normalised x, in which precision), q/k norms inside the attention
-- projection, and the fused gate/up MLP (Phi-3).
--
-- [Note: RMSNorm variants] All three normalise x in f32; they differ in
-- what the weight does and where the cast back to x's dtype happens:
--   'rms'        w * cast(x^)            Llama, Qwen, Mistral, Phi-3 (nn.RMSNorm)
--   'rms_wide'   cast(w * x^), w in f32  OLMo 2 (Olmo2RMSNorm)
--   'rms_offset' cast((1 + w) * x^)      Gemma 2/3, weights stored as offsets from 1
-- On f32 activations the three are the same products, so the f32
-- goldens cannot tell 'rms' from 'rms_wide'; bf16 runs can.
local nn = require 'fsdp.nn'

local M = {}

local function F() return require('fsdp.functional') end

-- x in f32 (itself when it is), and a function casting a result back.
local function widened(x)
  if x.dtype == 'f32' then return x, function(y) return y end end
  local dtype = x.dtype
  return x:to('f32'), function(y) return y:to(dtype) end
end

-- OLMo 2's norm: the weight multiplied in f32, the product cast.
local WideRMSNorm = nn.RMSNorm:extend('WideRMSNorm')
M.WideRMSNorm = WideRMSNorm

function WideRMSNorm:forward(x)
  local xw, back = widened(x)
  local w = self.weight.dtype == 'f32' and self.weight or self.weight:to('f32')
  return back(F().rms_norm(xw, w, self.eps))
end

-- Gemma's norm: (1 + w) in f32, the product cast; w starts at zeros.
local OffsetRMSNorm = nn.RMSNorm:extend('OffsetRMSNorm')
M.OffsetRMSNorm = OffsetRMSNorm

function OffsetRMSNorm:__init(dim, opts)
  local o = {}
  for k, v in pairs(opts or {}) do o[k] = v end
  o.init = o.init or nn.init.zeros()
  nn.RMSNorm.__init(self, dim, o)
end

function OffsetRMSNorm:forward(x)
  local xw, back = widened(x)
  local w = self.weight.dtype == 'f32' and self.weight or self.weight:to('f32')
  return back(F().rms_norm(xw, w + 1, self.eps))
end

-- The norm class of a kind ([Note: RMSNorm variants]).
M.NORMS = { rms = nn.RMSNorm, rms_wide = WideRMSNorm, rms_offset = OffsetRMSNorm }

-- nn.Attention's project with q/k norms (the family's q_norm, k_norm
-- children): 'head' normalises each head's hd values (Qwen 3, Gemma 3),
-- 'flat' the whole projection before it is split into heads (OLMo 2);
-- both before RoPE, which nn.Attention applies after project. Split
-- projections only (no family fuses qkv and norms q/k).
function M.qk_norm_project(kind)
  return function(self, x, context)
    local n, hd, H, KV = self._names, self.head_dim, self.n_heads, self.n_kv_heads
    local B, T = x:size(0), x:size(1)
    local q, k = self[n.q](x), self[n.k](x)
    if kind == 'flat' then
      q, k = self.q_norm(q):view(B, T, H, hd), self.k_norm(k):view(B, T, KV, hd)
    else
      q, k = self.q_norm(q:view(B, T, H, hd)), self.k_norm(k:view(B, T, KV, hd))
    end
    return q:transpose(1, 2), k:transpose(1, 2), self[n.v](x):view(B, T, KV, hd):transpose(1, 2)
  end
end

-- Phi-3's MLP: one gate_up_proj [2 ff, dim] (gate rows first), down_proj.
local FusedGatedMLP = nn.Module:extend('FusedGatedMLP')
M.FusedGatedMLP = FusedGatedMLP

function FusedGatedMLP:__init(dim, hidden, opts)
  self.hidden = hidden
  self.gate_up_proj = nn.Linear(dim, 2 * hidden, { bias = false, init = opts.init, device = opts.device,
                                                   dtype = opts.dtype })
  self.down_proj = nn.Linear(hidden, dim, { bias = false, init = opts.init, device = opts.device,
                                            dtype = opts.dtype })
  self.activation = opts.activation or 'silu'
  if self.activation ~= 'silu' then
    require('fsdp.core').fail(('%s: only silu is fused (got %s)'):format(self:class_name(), self.activation))
  end
end

function FusedGatedMLP:forward(x)
  local gu = self.gate_up_proj(x)
  local d, ff = gu:dim() - 1, self.hidden
  return self.down_proj(F().silu_mul(gu:narrow(d, 0, ff), gu:narrow(d, ff, ff)))
end

return M
