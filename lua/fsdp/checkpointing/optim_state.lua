-- fsdp.checkpointing.optim_state: which rank's optimizer state a sharded
-- checkpoint records for each parameter.
--
-- [Note: optimizer state is saved by the ranks that hold the parameter]
-- An optimizer's state per parameter is tensors over the parameter's
-- elements (exp_avg, exp_avg_sq: saved over each rank's slice like the
-- values) and scalars (AdamW's step: one value per parameter, kept by
-- every rank that updates a piece of it). A rank whose segment of a
-- parameter is empty (the parameter lies wholly in other ranks' shards)
-- updates nothing of it, so whatever state it might hold for that name is
-- never stepped: before this rule such a copy (made by the first resume)
-- reached the index, and every later resume trained with a step counter
-- frozen at the first resume. So:
--   - a rank reports the scalars of the parameters it holds elements of
--     (of_part), and only those ranks' reports count;
--   - the reports must agree (merge): ranks that update pieces of one
--     parameter step it together, so a difference is a broken invariant,
--     and the save fails naming the parameter and the ranks rather than
--     write a checkpoint that would train differently;
--   - a load gives state only to the segments this rank holds
--     (fsdp.checkpointing.load), and the optimizer's fused runs leave empty
--     segments out ([Note: fused updates of sharded units]), so no rank
--     keeps state it does not update.
local core = require 'fsdp.core'
local Tensor = require 'fsdp.tensor'
local json = require 'fsdp.io.json'

local M = {}

-- The state keys of the parameters of `part` that this rank holds
-- elements of (tensor-valued state, with its dtype), and their non-tensor
-- state by parameter name (false: a held parameter without state yet).
function M.of_part(opt, part)
  local keys, scalars = {}, {}
  if not opt then return keys, scalars end
  for _, p in ipairs(part.params) do
    if p.len > 0 then
      local st, sc = opt.state[p.name], false
      if st then
        sc = {}
        for k, v in pairs(st) do
          if Tensor.is_tensor(v) then keys[k] = keys[k] or v.dtype else sc[k] = v end
        end
      end
      scalars[p.name] = sc
    end
  end
  return keys, scalars
end

-- The scalars of every parameter from the ranks' reports (reports[r] =
-- {name = scalars} of rank r, 0-based), checked to agree; `where` (the
-- step directory) names the save in the error. Every rank runs it on the
-- same reports, so a disagreement fails on all ranks alike.
function M.merge(reports, world, where)
  local out, from = {}, {}
  local function show(sc)
    if not sc then return 'no state' end
    local items = {}
    for k, v in pairs(sc) do
      items[#items + 1] = ('%s = %s'):format(k, (json.encode(v):gsub('%s+', ' '):gsub('^ ', ''):gsub(' $', '')))
    end
    table.sort(items)
    return '{' .. table.concat(items, ', ') .. '}'
  end
  for r = 0, world - 1 do
    for name, sc in pairs(reports[r] or {}) do
      local text = sc and json.encode(sc) or 'no state'
      if from[name] == nil then
        out[name], from[name] = sc, { rank = r, text = text }
      elseif from[name].text ~= text then
        core.fail(('checkpointing.save %s: the optimizer state of parameter %s is %s on rank %d and %s on rank %d, which both hold elements of it; refusing to save a state that would not resume the same training')
          :format(where or '', name, show(out[name]), from[name].rank, show(sc), r))
      end
    end
  end
  for name, sc in pairs(out) do
    if not sc then out[name] = nil end
  end
  return out
end

return M
