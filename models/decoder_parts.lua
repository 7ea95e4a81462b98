-- models/decoder_parts.lua: the parts models/decoder.lua assembles a
-- decoder family from, where nn's blocks do not already say it: the
-- RMSNorm variants of MODELS_FAMILIES.md (where the weight meets the
-- normalised x, in which precision), q/k norms inside the attention
-- projection, the fused gate/up MLP (Phi-3), and the per-expert pieces
-- of a mixture of experts' checkpoints.
--
-- [Note: RMSNorm variants] All three normalise x in f32; they differ in
-- what the weight does and where the cast back to x's dtype happens:
--   'rms'        w * cast(x^)            Llama, Qwen, Mistral, Phi-3 (nn.RMSNorm)
--   'rms_wide'   cast(w * x^), w in f32  OLMo 2 (Olmo2RMSNorm)
--   'rms_offset' cast((1 + w) * x^)      Gemma 2/3, weights stored as offsets from 1
-- On f32 activations the three are the same products, so the f32
-- goldens cannot tell 'rms' from 'rms_wide'; bf16 runs can.
local nn = require 'fsdp.nn'
local functional = require 'fsdp.functional'
local core = require 'fsdp.core'
local moe_keys = require 'models.moe_keys'

local M = {}

local function F() return functional end

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
    core.fail(('%s: only silu is fused (got %s)'):format(self:class_name(), self.activation))
  end
end

function FusedGatedMLP:forward(x)
  local gu = self.gate_up_proj(x)
  local d, ff = gu:dim() - 1, self.hidden
  return self.down_proj(F().silu_mul(gu:narrow(d, 0, ff), gu:narrow(d, ff, ff)))
end

-- [Note: checkpoint pieces] A mixture-of-experts checkpoint on the hub
-- stores one tensor per expert and projection (Mixtral's
-- block_sparse_moe.experts.E.w1/w3/w2, Qwen3-MoE's
-- mlp.experts.E.gate_proj/up_proj/down_proj), where the model holds
-- transformers 5's fused experts.gate_up_proj [E, 2ff, h] and down_proj
-- [E, h, ff]. Each such tensor is one contiguous run of its fused
-- parameter's elements (gate of expert e at e*2ff*h, up after it, down at
-- e*h*ff), so a model describes them as pieces: checkpoint_piece(name) ->
-- the parameter's name, the run's first element and the piece's shape
-- (nil: not a piece), and checkpoint_pieces(param name) -> the list of
-- {name, offset, shape} that make it up (nil: stored whole). The file
-- loader (fsdp.io.safetensors_sharded.load_into) copies a piece into
-- whatever part of that run a rank's shard holds, and save_pretrained
-- writes the pieces in the disk names, so transformers 4.x (which knows
-- only those) and 5.x load the export. A renamed tensor (Mixtral's
-- router, block_sparse_moe.gate) is a piece of one run: the whole.
function M.checkpoint_pieces(CausalLM, layout)
  local L = moe_keys.layout(layout)
  -- offset and shape of expert e's part in the fused parameter of config c
  local function place(c, e, part)
    local ff, h = c.moe_ffn_dim, c.dim
    if part == 'down' then return e * h * ff, { h, ff } end
    return e * 2 * ff * h + (part == 'up' and ff * h or 0), { ff, h }
  end
  function CausalLM:checkpoint_piece(name)
    local fused, e, part = moe_keys.fused_of(L, name)
    if not fused then return nil end
    local c = self.config
    if not e then return fused, 0, { c.n_experts, c.dim } end -- the router under its disk name
    if e >= c.n_experts then return nil end
    local offset, shape = place(c, e, part)
    return fused, offset, shape
  end
  function CausalLM:checkpoint_pieces(name)
    local c = self.config
    local disk = moe_keys.disk_of(L, name, c.n_experts)
    if not disk then return nil end
    local out = {}
    for i, d in ipairs(disk) do
      if d.expert then
        local offset, shape = place(c, d.expert, d.part)
        out[i] = { name = d.name, offset = offset, shape = shape }
      else
        if d.name == name then return nil end -- stored under its own name
        out[i] = { name = d.name, offset = 0, shape = { c.n_experts, c.dim } }
      end
    end
    return out
  end
end

return M
