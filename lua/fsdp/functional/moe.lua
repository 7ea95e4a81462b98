-- fsdp.functional.moe: a mixture of experts as transformers 5 computes it
-- (Mixtral's and Qwen3-MoE's sparse MoE blocks): the router's top-k, the
-- experts as one grouped product, and the router's load-balancing loss.
--
--   local w, ids = F.moe_route(logits, 2, {normalize = true})   -- logits [N, E]
--   local y = F.moe_experts(x, w, ids, gate_up_proj, down_proj)  -- x [..., h]
--   local aux = F.load_balancing_loss({logits_1, logits_2}, 8, 2, attention_mask)
--
-- The math and its kernels are core/ops/moe.c's (fl_moe_route,
-- fl_moe_experts); nn.MoE is the module over them.
local core = require 'fsdp.core'
local Tensor = require 'fsdp.tensor'
local autograd = require 'fsdp.autograd'
local factories = require 'fsdp.factories'
local fused = require 'fsdp.functional.fused' -- softmax
local ffi, C = core.ffi, core.C
local wrap, cptr = Tensor.wrap, Tensor.cptr

local M = {}

local route_out = ffi.new('fl_tensor *[2]')

-- logits [N, E] -> weights [N, top_k] (f32; f64 for f64 logits), the top
-- experts' softmax probabilities in descending order (ties to the lower
-- expert), renormalised to sum 1 when opts.normalize (Mixtral; Qwen3-MoE's
-- norm_topk_prob), differentiable in the logits; ids [N, top_k] i64.
function M.moe_route(logits, top_k, opts)
  opts = opts or {}
  if type(top_k) ~= 'number' then
    core.fail(('moe_route: top_k must be a number, got %s'):format(type(top_k)))
  end
  core.check(C.fl_moe_route(cptr(logits), top_k, opts.normalize == true, route_out, route_out + 1))
  return wrap(route_out[0]), wrap(route_out[1])
end

-- y[n] = sum_j weights[n, j] * down_e(silu(gate_e x[n]) * up_e x[n]), e =
-- ids[n, j]: x [..., h] (N tokens), weights and ids [N, k], gate_up_proj
-- [E, 2ff, h] (gate rows first), down_proj [E, h, ff] in x's dtype.
function M.moe_experts(x, weights, ids, gate_up_proj, down_proj)
  return wrap(C.fl_moe_experts(cptr(x), cptr(weights), cptr(ids), cptr(gate_up_proj),
                               cptr(down_proj)))
end

-- transformers' load_balancing_loss_func: over the router logits of every
-- layer (a list of [N, E] tensors), E * sum_e f_e * P_e where f_e is the
-- share of the N * top_k picks that went to expert e and P_e the mean
-- router probability of e, both over all layers' rows (rows where
-- attention_mask ([B, T], B * T = N) is 0 left out). The picks are the
-- router's own (fl_moe_route); the probabilities are a softmax in f32 (for
-- bf16 logits transformers takes it in bf16, then sums in f32). The
-- gradient flows through the probabilities only, as in transformers.
-- Multiply by the config's router_aux_loss_coef before adding it to the
-- language-model loss.
function M.load_balancing_loss(router_logits, n_experts, top_k, attention_mask)
  local name = 'load_balancing_loss'
  if type(router_logits) ~= 'table' or Tensor.is_tensor(router_logits) or #router_logits == 0 then
    core.fail(name .. ': router_logits must be a non-empty list of [tokens, experts] tensors')
  end
  local first = router_logits[1]
  local mask
  if attention_mask ~= nil then
    mask = attention_mask:reshape({ -1 }):float()
  end
  local counts, probs, rows
  local experts = factories.arange(n_experts, { dtype = 'i64', device = first.device })
  for i, logits in ipairs(router_logits) do
    local shape = logits.shape
    if #shape ~= 2 or shape[2] ~= n_experts then
      core.fail(('%s: router_logits[%d] of shape [%s] must be [tokens, %d]'):format(
        name, i, table.concat(shape, ', '), n_experts))
    end
    if mask and mask.shape[1] ~= shape[1] then
      core.fail(('%s: attention_mask has %d positions, router_logits[%d] %d rows'):format(
        name, mask.shape[1], i, shape[1]))
    end
    local p = fused.softmax(logits:float(), -1)
    local ids
    autograd.no_grad(function() local _; _, ids = M.moe_route(logits, top_k) end)
    local picked = ids:unsqueeze(-1):eq(experts):float()          -- [N, k, E]
    local c, s
    if mask then
      c = (picked * mask:reshape({ -1, 1, 1 })):sum({ 0, 1 })
      s = (p * mask:reshape({ -1, 1 })):sum({ 0 })
    else
      c, s = picked:sum({ 0, 1 }), p:sum({ 0 })
    end
    counts = counts and counts + c or c
    probs = probs and probs + s or s
    if mask then rows = rows and rows + mask:sum() or mask:sum()
    else rows = (rows or 0) + shape[1] end
  end
  return ((counts / rows) * (probs / rows)):sum() * n_experts
end

return M
