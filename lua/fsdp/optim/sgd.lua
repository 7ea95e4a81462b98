-- fsdp.optim.sgd: stochastic gradient descent with momentum, PyTorch's
-- torch.optim.SGD, one fused C update per parameter (fl_sgd_step_):
--
--   d = g + weight_decay * p
--   buf = d (first step), else momentum * buf + (1 - dampening) * d
--   d = nesterov and d + momentum * buf or buf      (momentum > 0)
--   p -= lr * d
--
-- Options: lr (1e-3), momentum (0), dampening (0), weight_decay (0),
-- nesterov (false), groups. The momentum buffer has the param's dtype.
local ffi = require 'ffi'
local validate = require 'fsdp.validate'
local Optimizer = require 'fsdp.optim.optimizer'
local C, cptr = Optimizer.C, Optimizer.cptr

local SGD = Optimizer:extend('SGD', {
  lr = 1e-3, momentum = 0, dampening = 0, weight_decay = 0, nesterov = false,
}, {
  { 'lr', validate.NONNEGATIVE }, { 'momentum', validate.NONNEGATIVE }, { 'weight_decay', validate.NONNEGATIVE },
  { 'dampening', validate.FRACTION },
})

function SGD:check_group(g)
  local why = Optimizer.check_group(self, g)
  if why then return why end
  if g.nesterov and (g.momentum <= 0 or g.dampening ~= 0) then
    return 'nesterov momentum requires momentum > 0 and zero dampening'
  end
  return nil
end

function SGD:setup()
  self.options = ffi.new('fl_sgd_options')
end

function SGD:new_state(g, p)
  return { momentum_buffer = g.momentum ~= 0 and self:zeros_like(p) or nil }
end

function SGD:update(g, name, p, grad)
  local st = self:state_of(g, name, p)
  if g.momentum ~= 0 and st.momentum_buffer == nil then
    -- momentum switched on after steps without it: start the buffer afresh
    st.momentum_buffer, st.step = self:zeros_like(p), 0
  end
  st.step = st.step + 1
  local o = self.options
  o.lr, o.momentum, o.dampening, o.weight_decay = g.lr, g.momentum, g.dampening, g.weight_decay
  o.nesterov, o.step = g.nesterov and true or false, st.step
  local buf = g.momentum ~= 0 and cptr(st.momentum_buffer) or nil
  self:check_update(name, st, C.fl_sgd_step_(cptr(p), cptr(grad), buf, o))
end

return SGD
