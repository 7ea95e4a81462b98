-- fsdp.nn.mlp: the transformer feed-forward blocks.
--
--   nn.GatedMLP(dim, hidden, {activation = 'silu', bias = false, dropout = 0,
--               names = {'gate_proj', 'up_proj', 'down_proj'},
--               init = rule, out_init = init, bias_init = rule, device =, dtype =})
--     y = down(act(gate(x)) * up(x))     SwiGLU (Llama), GeGLU (T5 v1.1, Gemma)
--   nn.MLP(dim, hidden, {activation = 'gelu_tanh', bias = true, dropout = 0,
--          names = {'fc1', 'fc2'}, init =, out_init =, bias_init =, device =, dtype =})
--     y = fc2(act(fc1(x)))                GPT-2 ({'c_fc', 'c_proj'}), ViT, T5 v1.0
--
-- Activations: 'silu' (alias 'swish'), 'gelu' (the exact erf form),
-- 'gelu_tanh' (aliases 'gelu_new' and 'gelu_pytorch_tanh', the Hugging
-- Face config names of the tanh approximation), 'relu'. The gated SiLU
-- runs F.silu_mul, one pass over gate and up instead of two.
--
-- The children are the checkpoint's keys, so `names` takes the model's own
-- (T5 v1.1 gates with {'wi_0', 'wi_1', 'wo'}). dropout acts on the output
-- in training mode (HF GPT-2's resid_pdrop). Weights start as nn.Linear's
-- unless the model gives rules: init for the input projections, out_init
-- for the output one (GPT-2 scales it by 1/sqrt(2 n_layers)), bias_init
-- for every bias. The activation is not a child module, so printed trees
-- hold only the projections.
local core = require 'fsdp.core'
local validate = require 'fsdp.validate'
local Module = require 'fsdp.nn.module'
local Linear = require 'fsdp.nn.linear'
local functional = require 'fsdp.functional'

local M = {}

local ALIASES = { swish = 'silu', gelu_new = 'gelu_tanh', gelu_pytorch_tanh = 'gelu_tanh' }

-- activation name -> function of x (F is fsdp.functional, loaded on first
-- use so models build and print without kernels).
local ACTIVATIONS = {
  silu = function(F, x) return F.silu(x) end,
  gelu = function(F, x) return F.gelu(x) end,
  gelu_tanh = function(F, x) return F.gelu(x, 'tanh') end,
  relu = function(F, x) return F.relu(x) end,
}

local function activation(cls, name)
  local canonical = ALIASES[name] or name
  if ACTIVATIONS[canonical] == nil then
    core.fail(("%s: unknown activation %s (known: silu, gelu, gelu_tanh, relu; aliases swish, gelu_new, "
      .. "gelu_pytorch_tanh)"):format(cls, tostring(name)))
  end
  return canonical
end

local function check(cls, dim, hidden, opts)
  for _, v in ipairs({ { 'dim', dim }, { 'hidden', hidden } }) do
    if validate.problem(v[2], validate.COUNT) then
      core.fail(('%s: %s must be a positive integer, got %s'):format(cls, v[1], validate.show(v[2])))
    end
  end
  local p = opts.dropout or 0
  if validate.problem(p, { min = 0, max = 1 }) then
    core.fail(('%s: dropout must be a probability in [0, 1], got %s'):format(cls, validate.show(p)))
  end
  return p
end

-- Child names from opts.names, n of them.
local function child_names(cls, names, n)
  if type(names) ~= 'table' or #names ~= n then
    core.fail(('%s: names must be a list of %d child names, got %s'):format(cls, n, tostring(names)))
  end
  return names
end

local function linear(in_f, out_f, bias, init, opts)
  return Linear(in_f, out_f, { bias = bias, init = init, bias_init = opts.bias_init,
                               device = opts.device, dtype = opts.dtype })
end

local function output(self, F, y)
  if self.training and self.dropout > 0 then return F.dropout(y, self.dropout, true) end
  return y
end

-- GatedMLP ------------------------------------------------------------------------------

local GatedMLP = Module:extend('GatedMLP')
M.GatedMLP = GatedMLP

function GatedMLP:__init(dim, hidden, opts)
  opts = opts or {}
  self.dropout = check('GatedMLP', dim, hidden, opts)
  self.activation = activation('GatedMLP', opts.activation or 'silu')
  local names = child_names('GatedMLP', opts.names or { 'gate_proj', 'up_proj', 'down_proj' }, 3)
  local bias = opts.bias == true
  self:add_module(names[1], linear(dim, hidden, bias, opts.init, opts))
  self:add_module(names[2], linear(dim, hidden, bias, opts.init, opts))
  self:add_module(names[3], linear(hidden, dim, bias, opts.out_init or opts.init, opts))
  self._names = names
end

function GatedMLP:forward(x)
  local F = functional
  local n = self._names
  local gate, up = self[n[1]](x), self[n[2]](x)
  local h
  if self.activation == 'silu' then
    h = F.silu_mul(gate, up)
  else
    h = ACTIVATIONS[self.activation](F, gate) * up
  end
  return output(self, F, self[n[3]](h))
end

-- MLP ----------------------------------------------------------------------------------

local MLP = Module:extend('MLP')
M.MLP = MLP

function MLP:__init(dim, hidden, opts)
  opts = opts or {}
  self.dropout = check('MLP', dim, hidden, opts)
  self.activation = activation('MLP', opts.activation or 'gelu_tanh')
  local names = child_names('MLP', opts.names or { 'fc1', 'fc2' }, 2)
  local bias = opts.bias ~= false
  self:add_module(names[1], linear(dim, hidden, bias, opts.init, opts))
  self:add_module(names[2], linear(hidden, dim, bias, opts.out_init or opts.init, opts))
  self._names = names
end

function MLP:forward(x)
  local F = functional
  local n = self._names
  return output(self, F, self[n[2]](ACTIVATIONS[self.activation](F, self[n[1]](x))))
end

return M
