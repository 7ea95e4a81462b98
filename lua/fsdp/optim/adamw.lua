-- fsdp.optim.adamw: AdamW (Loshchilov & Hutter), PyTorch's torch.optim.AdamW
-- with its defaults, fused C updates: the whole parameters of a group in
-- one multi-tensor call per (device, dtypes, step) (fl_adamw_step_multi_,
-- one kernel launch per batch of tensors on cuda), a sharded unit's run of
-- segments in one call on its flat shard (fl_adamw_step_):
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
local Optimizer = require 'fsdp.optim.optimizer'
local C, cptr = Optimizer.C, Optimizer.cptr

-- (AdamW.ranges serve AnyPrecisionAdamW too)
local AdamW = Optimizer:extend('AdamW', {
  lr = 1e-3, betas = { 0.9, 0.999 }, eps = 1e-8, weight_decay = 1e-2, state_dtype = false,
}, {
  { 'lr', validate.NONNEGATIVE }, { 'betas', validate.PROBABILITY, pair = '{beta1, beta2} with each in [0, 1)' },
  { 'eps', validate.NONNEGATIVE }, { 'weight_decay', validate.NONNEGATIVE },
})

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

function AdamW:new_state(g, p)
  local dtype = g.state_dtype or nil
  return { exp_avg = self:zeros_like(p, dtype), exp_avg_sq = self:zeros_like(p, dtype) }
end

function AdamW:update(g, name, p, grad)
  local st = self:state_of(g, name, p)
  st.step = st.step + 1
  self:check_update(name, st, C.fl_adamw_step_(cptr(p), cptr(grad), cptr(st.exp_avg), cptr(st.exp_avg_sq),
                                               self:options_for(g, st.step)))
end

-- Whole parameters of group g: one fl_adamw_step_multi_ per set of equal
-- device, dtypes and step (the options hold one step), each parameter's
-- result bit for bit that of its own fl_adamw_step_. A failure names the
-- parameter at fault (the core checks every tensor before updating any).
function AdamW:update_many(g, names, ps, grads)
  local sets, order = {}, {}
  for i = 1, #ps do
    local p, grad = ps[i], grads[i]
    local st = self:state_of(g, names[i], p)
    local key = ('%s|%s|%s|%s|%s|%d'):format(p.device, p.dtype, grad.dtype, st.exp_avg.dtype,
                                             st.exp_avg_sq.dtype, st.step)
    local set = sets[key]
    if set == nil then
      set = { step = st.step + 1, names = {}, sts = {}, p = {}, g = {} }
      sets[key] = set
      order[#order + 1] = set
    end
    local k = #set.names + 1
    set.names[k], set.sts[k], set.p[k], set.g[k] = names[i], st, p, grad
  end
  for _, set in ipairs(order) do
    local n = #set.names
    local cp, cg = ffi.new('fl_tensor *[?]', n), ffi.new('const fl_tensor *[?]', n)
    local cm, cv = ffi.new('fl_tensor *[?]', n), ffi.new('fl_tensor *[?]', n)
    for k = 1, n do
      cp[k - 1], cg[k - 1] = cptr(set.p[k]), cptr(set.g[k])
      cm[k - 1], cv[k - 1] = cptr(set.sts[k].exp_avg), cptr(set.sts[k].exp_avg_sq)
    end
    if C.fl_adamw_step_multi_(n, cp, cg, cm, cv, self:options_for(g, set.step)) ~= 0 then
      local msg = core.last_error()
      local at = tonumber(msg:match(': tensor (%d+): '))
      if at then
        core.fail(('%s: parameter %s: %s'):format(self.name, set.names[at + 1], (msg:gsub(': tensor %d+: ', ': ', 1))))
      end
      -- (two tensors at fault: "tensor 0's param and tensor 3's grad share memory")
      core.fail(('%s: %s'):format(self.name, (msg:gsub("tensor (%d+)'s", function(i)
        return ("parameter %s's"):format(set.names[tonumber(i) + 1])
      end))))
    end
    for k = 1, n do set.sts[k].step = set.step end
  end
end

return AdamW
