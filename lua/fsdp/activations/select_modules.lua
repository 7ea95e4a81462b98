-- fsdp.activations.select_modules: the modules of a model that a predicate picks, for
-- the wrappers that apply to whole subtrees (fsdp.checkpoint,
-- fsdp.offload_activations).
--
--   for _, nm in ipairs(select_modules(model, check_fn, every, '_checkpointed')) do wrap(nm[2]) end
--
-- Outermost first: a match inside a picked module is left to it (the root,
-- named '', covers everything). Modules carrying `marker` (already wrapped
-- by an earlier call) are skipped; every = k keeps the 1st, k+1-th, ...
-- match. Returns a list of {name, module}.
return function(model, check_fn, every, marker)
  local picked, inside, matches = {}, {}, 0
  for _, nm in ipairs(model:named_modules()) do
    local name, m = nm[1], nm[2]
    local covered = false
    for prefix in pairs(inside) do
      if prefix == '' or name:sub(1, #prefix + 1) == prefix .. '.' then
        covered = true
        break
      end
    end
    if not covered and not rawget(m, marker) and check_fn(m, name) then
      matches = matches + 1
      if (matches - 1) % every == 0 then
        inside[name] = true
        picked[#picked + 1] = { name, m }
      end
    end
  end
  return picked
end
