-- fsdp.optim.anyprecision_adamw: AnyPrecisionAdamW (torchdistx, used by
-- llama-recipes for pure-bf16 training): AdamW with the moments in chosen
-- dtypes and optional Kahan summation so bf16 params do not lose the
-- updates smaller than their spacing. One fused C update per parameter
-- (fl_anyprecision_adamw_step_, which documents the math and how weight
-- decay joins the compensated update).
--
-- Options (torchdistx's defaults): lr (1e-3), betas ({0.9, 0.999}), eps
-- (1e-8), weight_decay (0), use_kahan_summation (false), momentum_dtype,
-- variance_dtype, compensation_buffer_dtype (all 'bf16'), groups.
local Optimizer = require 'fsdp.optim.optimizer'
local AdamW = require 'fsdp.optim.adamw'
local C, cptr = Optimizer.C, Optimizer.cptr

local AnyPrecisionAdamW = Optimizer:extend('AnyPrecisionAdamW', {
  lr = 1e-3, betas = { 0.9, 0.999 }, eps = 1e-8, weight_decay = 0.0,
  use_kahan_summation = false, momentum_dtype = 'bf16', variance_dtype = 'bf16',
  compensation_buffer_dtype = 'bf16',
}, AdamW.ranges)

AnyPrecisionAdamW.setup = AdamW.setup
AnyPrecisionAdamW.options_for = AdamW.options_for

function AnyPrecisionAdamW:new_state(g, p)
  return {
    exp_avg = self:zeros_like(p, g.momentum_dtype),
    exp_avg_sq = self:zeros_like(p, g.variance_dtype),
    compensation = g.use_kahan_summation and self:zeros_like(p, g.compensation_buffer_dtype) or nil,
  }
end

function AnyPrecisionAdamW:update(g, name, p, grad)
  local st = self:state_of(g, name, p)
  st.step = st.step + 1
  local comp = st.compensation and cptr(st.compensation) or nil
  self:check_update(name, st, C.fl_anyprecision_adamw_step_(cptr(p), cptr(grad), cptr(st.exp_avg),
                                                            cptr(st.exp_avg_sq), comp, self:options_for(g, st.step)))
end

return AnyPrecisionAdamW
