-- fsdp.nn.moe: a sparse mixture-of-experts feed-forward block, as
-- transformers 5's MixtralSparseMoeBlock and Qwen3MoeSparseMoeBlock.
--
--   nn.MoE(dim, ffn_dim, n_experts, top_k, {norm_topk_prob = bool,
--          activation = 'silu', init = rule, device =, dtype =})
--   local y, router_logits = moe(x)        -- x [B, T, dim] -> y [B, T, dim]
--
-- Children and parameters carry transformers 5's state-dict names, so under
-- a decoder layer's `mlp` they read model.layers.N.mlp.gate.weight [E, dim]
-- (the router, a bias-free nn.Linear), model.layers.N.mlp.experts.gate_up_proj
-- [E, 2*ffn_dim, dim] (gate rows first) and ...experts.down_proj
-- [E, dim, ffn_dim]. (models/moe_keys.lua converts the per-expert names
-- checkpoints store on disk.)
--
-- forward returns y and the router logits [B*T, E] (x's dtype), and also
-- keeps those logits as self.router_logits until the next forward: a model
-- collects them from its MoE layers for F.load_balancing_loss (times the
-- config's router_aux_loss_coef when it outputs router logits). Under
-- activation checkpointing the recomputed forward replaces them.
--
-- norm_topk_prob: renormalise the top-k probabilities to sum 1 (Mixtral
-- always does; Qwen3-MoE from its config, false by the class default).
-- The routing weights are cast to x's dtype (Qwen3-MoE's rule; Mixtral
-- multiplies in f32 and rounds each expert's contribution to x's dtype,
-- which is what fl_moe_experts does with them in any case). Init: every
-- parameter from `init` (default normal(0.02), transformers'
-- initializer_range).
local core = require 'fsdp.core'
local validate = require 'fsdp.validate'
local Module = require 'fsdp.nn.module'
local Linear = require 'fsdp.nn.linear'
local parameter = require 'fsdp.nn.parameter'
local repr = require 'fsdp.nn.repr'
local functional = require 'fsdp.functional'

-- The experts' fused weights (a child, so its names read experts.*):
-- nn.MoEExperts(dim, ffn_dim, n_experts, {init =, device =, dtype =})
-- holds gate_up_proj [n_experts, 2 * ffn_dim, dim] and down_proj
-- [n_experts, dim, ffn_dim], each from the init rule, on that device in
-- that dtype.
local Experts = Module:extend('MoEExperts')

function Experts:__init(dim, ffn_dim, n_experts, opts)
  self.n_experts, self.dim, self.ffn_dim = n_experts, dim, ffn_dim
  local place = { init = opts.init, device = opts.device, dtype = opts.dtype }
  self:register_parameter('gate_up_proj', parameter.Parameter({ n_experts, 2 * ffn_dim, dim }, place))
  self:register_parameter('down_proj', parameter.Parameter({ n_experts, dim, ffn_dim }, place))
end

function Experts:forward(x, weights, ids)
  return functional.moe_experts(x, weights, ids, self.gate_up_proj, self.down_proj)
end

function Experts:extra_repr()
  return ('n_experts=%d, dim=%d, ffn_dim=%d'):format(self.n_experts, self.dim, self.ffn_dim)
end

local MoE = Module:extend('MoE')

function MoE:__init(dim, ffn_dim, n_experts, top_k, opts)
  opts = opts or {}
  for _, v in ipairs({ { 'dim', dim }, { 'ffn_dim', ffn_dim }, { 'n_experts', n_experts },
                       { 'top_k', top_k } }) do
    if validate.problem(v[2], validate.COUNT) then
      core.fail(('MoE: %s must be a positive integer, got %s'):format(v[1], validate.show(v[2])))
    end
  end
  if top_k > n_experts then
    core.fail(('MoE: top_k %d is more than the %d experts'):format(top_k, n_experts))
  end
  local act = opts.activation or 'silu'
  if act ~= 'silu' and act ~= 'swish' then
    core.fail(("MoE: activation must be 'silu' (transformers' Mixtral and Qwen3-MoE experts), got %s")
      :format(tostring(act)))
  end
  if opts.norm_topk_prob ~= nil and type(opts.norm_topk_prob) ~= 'boolean' then
    core.fail(('MoE: norm_topk_prob must be a boolean, got %s'):format(validate.show(opts.norm_topk_prob)))
  end
  self.dim, self.ffn_dim, self.n_experts, self.top_k = dim, ffn_dim, n_experts, top_k
  self.norm_topk_prob = opts.norm_topk_prob == true
  local place = { init = opts.init or parameter.init.normal(0.02), device = opts.device, dtype = opts.dtype }
  self:add_module('gate', Linear(dim, n_experts, { bias = false, init = place.init, device = place.device,
                                                   dtype = place.dtype }))
  self:add_module('experts', Experts(dim, ffn_dim, n_experts, place))
end

function MoE:forward(x)
  local F = functional
  local shape = x.shape
  if shape[#shape] ~= self.dim then
    core.fail(('MoE: input of shape [%s] must end in dim %d'):format(table.concat(shape, ', '), self.dim))
  end
  local flat = x:reshape({ -1, self.dim })
  local logits = self.gate(flat)
  local weights, ids = F.moe_route(logits, self.top_k, { normalize = self.norm_topk_prob })
  if weights.dtype ~= x.dtype then weights = weights:to(x.dtype) end
  local y = self.experts(x, weights, ids)
  rawset(self, 'router_logits', logits)
  return y, logits
end

function MoE:extra_repr()
  return ('dim=%d, ffn_dim=%d, n_experts=%d, top_k=%d, norm_topk_prob=%s'):format(
    self.dim, self.ffn_dim, self.n_experts, self.top_k, repr.bool(self.norm_topk_prob))
end

return { MoE = MoE, MoEExperts = Experts }
