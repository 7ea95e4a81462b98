-- fsdp.policy: wrap policies, the predicates that choose which modules
-- become sharded units.
--
--   fsdp.shard(model, {policy = fsdp.policy.transformer{llama.DecoderLayer}})
--   fsdp.shard(model, {policy = fsdp.policy.size{min_params = 1e8}})
--   fsdp.shard(model, {policy = function(m, name, unwrapped_numel)
--     if name == 'lm_head' then return {strategy = 'NO_SHARD'} end
--     return m:is_instance_of(llama.DecoderLayer)
--   end})
--
-- A policy is any function (module, name, unwrapped_numel) -> false/nil,
-- true, or a table of per-unit overrides (strategy, mixed_precision,
-- reshard_after_forward). It is asked bottom-up, children before their
-- parent, and unwrapped_numel counts the parameters of the module's
-- subtree not already claimed by a unit below it (a shared tensor counted
-- once), as FSDP's auto-wrap policies see it. The root always becomes a
-- unit holding whatever no other unit claimed.
local core = require 'fsdp.core'
local validate = require 'fsdp.validate'

local M = {}

-- Modules that are instances of any of the classes (subclasses included).
function M.transformer(classes)
  if type(classes) ~= 'table' or #classes == 0 then
    core.fail('policy.transformer expects a list of module classes, e.g. {llama.DecoderLayer}')
  end
  return function(m)
    for _, cls in ipairs(classes) do
      if m:is_instance_of(cls) then return true end
    end
    return false
  end
end

-- Modules whose unwrapped parameters number at least min_params (FSDP's
-- size_based_auto_wrap_policy; default 1e8). As there, ModuleList and
-- ModuleDict are never chosen: nothing calls their forward, so what their
-- children left unclaimed rises to the next module that runs.
function M.size(opts)
  opts = opts or {}
  local min = opts.min_params or 1e8
  local why = validate.problem(min, validate.NONNEGATIVE)
  if why then core.fail('policy.size: min_params ' .. why) end
  return function(m, _, unwrapped) return not m.is_holder and unwrapped >= min end
end

-- The first non-false answer of several policies.
function M.any(list)
  return function(m, name, n)
    for _, p in ipairs(list) do
      local r = p(m, name, n)
      if r then return r end
    end
    return false
  end
end

-- Only the root is a unit: one flat parameter for the whole model.
function M.none() return false end

return M
