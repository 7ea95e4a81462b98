-- fsdp.optim.adamw: AdamW (Loshchilov & Hutter), PyTorch's torch.optim.AdamW
-- with its defaults, one fused C update per parameter (fl_adamw_step_):
--
--   p *= 1 - lr * weight_decay
--   m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g^2
--   p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
--
-- Options: lr (1e-3), betas ({0.9, 0.999}), eps (1e-8), weight_decay
-- (1e-2), state_dtype (the dtype of exp_avg and exp_avg_sq; by default the
-- param's, as PyTorch), groups (see fsdp.optim.optimizer).
local ffi = require 'ffi'
local core = require 'fsdp.core'
local validate = require 'fsdp.validate'
local Tensor = require 'fsdp.tensor'
local Optimizer = require 'fsdp.optim.optimizer'

local C = core.C
local cptr = Tensor.cptr

local AdamW = Optimizer:extend('AdamW', {
  lr = 1e-3, betas = { 0.9, 0.999 }, eps = 1e-8, weight_decay = 1e-2, state_dtype = false,
})

-- Checks shared with AnyPrecisionAdamW.
-- (fsdp.validate: a NaN lr or eps would pass a comparison and make every
-- parameter NaN at the first step)
function AdamW:check_group(g)
  local why = validate.problem(g.lr, validate.NONNEGATIVE)
  if why then return 'lr ' .. why end
  local b = g.betas
  if type(b) ~= 'table' or validate.problem(b[1], validate.PROBABILITY) or validate.problem(b[2], validate.PROBABILITY) then
    return 'betas must be {beta1, beta2} with each in [0, 1)'
  end
  why = validate.problem(g.eps, validate.NONNEGATIVE)
  if why then return 'eps ' .. why end
  why = validate.problem(g.weight_decay, validate.NONNEGATIVE)
  if why then return 'weight_decay ' .. why end
  return nil
end

function AdamW:setup()
  self.options = ffi.new('fl_adamw_options')
end

-- Fill the C options of one update from a group and a step count.
function AdamW:options_for(g, step)
  local o = self.options
  o.lr, o.beta1, o.beta2, o.eps, o.weight_decay = g.lr, g.betas[1], g.betas[2], g.eps, g.weight_decay
  o.step = step
  return o
end

function AdamW:update(g, name, p, grad)
  local st = self.state[name]
  if st == nil then
    local dtype = g.state_dtype or nil
    st = { step = 0, exp_avg = self:zeros_like(p, dtype), exp_avg_sq = self:zeros_like(p, dtype) }
    self.state[name] = st
  end
  st.step = st.step + 1
  if C.fl_adamw_step_(cptr(p), cptr(grad), cptr(st.exp_avg), cptr(st.exp_avg_sq),
                      self:options_for(g, st.step)) ~= 0 then
    st.step = st.step - 1
    self:raise(name)
  end
end

return AdamW
