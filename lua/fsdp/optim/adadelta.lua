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
local validate = require 'fsdp.validate'
local Optimizer = require 'fsdp.optim.optimizer'
local C, cptr = Optimizer.C, Optimizer.cptr

local Adadelta = Optimizer:extend('Adadelta', {
  lr = 1.0, rho = 0.9, eps = 1e-6, weight_decay = 0,
}, {
  { 'lr', validate.NONNEGATIVE }, { 'eps', validate.NONNEGATIVE }, { 'weight_decay', validate.NONNEGATIVE },
  { 'rho', validate.FRACTION },
})

function Adadelta:setup()
  self.options = ffi.new('fl_adadelta_options')
end

function Adadelta:new_state(_, p)
  return { square_avg = self:zeros_like(p), acc_delta = self:zeros_like(p) }
end

function Adadelta:update(g, name, p, grad)
  local st = self:state_of(g, name, p)
  local o = self.options
  o.lr, o.rho, o.eps, o.weight_decay = g.lr, g.rho, g.eps, g.weight_decay
  st.step = st.step + 1
  self:check_update(name, st, C.fl_adadelta_step_(cptr(p), cptr(grad), cptr(st.square_avg), cptr(st.acc_delta), o))
end

return Adadelta
