-- fsdp.optim.adadelta: Adadelta (Zeiler 2012), PyTorch's
-- torch.optim.Adadelta, one fused C update per parameter
-- (fl_adadelta_step_):
--
--   d = g + weight_decay * p
--   s = rho * s + (1 - rho) * d^2
--   delta = sqrt(a + eps) / sqrt(s + eps) * d
--   a = rho * a + (1 - rho) * delta^2
--   p -= lr * delta
--
-- Options: lr (1.0), rho (0.9), eps (1e-6), weight_decay (0), groups. The
-- MNIST tutorial trains with Adadelta(lr = 1.0) and StepLR(gamma = 0.7).
local ffi = require 'ffi'
local core = require 'fsdp.core'
local validate = require 'fsdp.validate'
local Tensor = require 'fsdp.tensor'
local Optimizer = require 'fsdp.optim.optimizer'

local C = core.C
local cptr = Tensor.cptr

local Adadelta = Optimizer:extend('Adadelta', {
  lr = 1.0, rho = 0.9, eps = 1e-6, weight_decay = 0,
})

function Adadelta:check_group(g)
  -- (fsdp.validate: NaN and infinity pass none of these)
  for _, k in ipairs({ 'lr', 'eps', 'weight_decay' }) do
    local why = validate.problem(g[k], validate.NONNEGATIVE)
    if why then return k .. ' ' .. why end
  end
  if validate.problem(g.rho, { min = 0, max = 1 }) then return 'rho must be in [0, 1]' end
  return nil
end

function Adadelta:setup()
  self.options = ffi.new('fl_adadelta_options')
end

function Adadelta:update(g, name, p, grad)
  local st = self.state[name]
  if st == nil then
    st = { step = 0, square_avg = self:zeros_like(p), acc_delta = self:zeros_like(p) }
    self.state[name] = st
  end
  local o = self.options
  o.lr, o.rho, o.eps, o.weight_decay = g.lr, g.rho, g.eps, g.weight_decay
  if C.fl_adadelta_step_(cptr(p), cptr(grad), cptr(st.square_avg), cptr(st.acc_delta), o) ~= 0 then
    self:raise(name)
  end
  st.step = st.step + 1
end

return Adadelta
