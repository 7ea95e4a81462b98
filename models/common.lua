-- models/common.lua: what the model files share: config resolution, the
-- next-token loss of causal language models, and how build() options split
-- into where the model lives (device, dtype) and config overrides.
local fsdp = require 'fsdp'
local F = require 'fsdp.functional'

local M = {}

-- Mean cross-entropy of next-token predictions of `model` (forward: ids ->
-- logits [B, T, V]); targets i64 [B, T] are the ids shifted by one, -100
-- entries ignored. Returns loss, logits.
function M.causal_lm_loss(model, ids, targets)
  local logits = model(ids)
  local V = model.config.vocab_size
  return F.cross_entropy(logits:view(-1, V), targets:view(-1), { ignore_index = -100 }), logits
end

-- A model config: `name_or_config` is a key of `configs` or a table; the
-- result layers `defaults`, then it, then `overrides`, renaming keys through
-- `aliases` (other spellings of a field, e.g. Hugging Face's). An unknown
-- name is an error listing the known ones, raised at the caller of the
-- family's M.config. The family validates and derives fields after.
function M.merge_config(family, configs, defaults, aliases, name_or_config, overrides)
  local base = name_or_config
  if type(base) == 'string' then
    base = configs[base]
    if not base then
      local names = {}
      for k in pairs(configs) do names[#names + 1] = k end
      table.sort(names)
      error(("%s: unknown config '%s' (known: %s)"):format(family, name_or_config,
        table.concat(names, ', ')), 3)
    end
  end
  aliases = aliases or {}
  local c = {}
  for k, v in pairs(defaults) do c[k] = v end
  for k, v in pairs(base) do c[aliases[k] or k] = v end
  for k, v in pairs(overrides or {}) do c[aliases[k] or k] = v end
  return c
end

-- build(name, opts): placement {device=, dtype=} (device defaulting to
-- fsdp's default device) and the remaining keys as config overrides.
function M.split_build_opts(opts)
  opts = opts or {}
  local overrides = {}
  for k, v in pairs(opts) do
    if k ~= 'device' and k ~= 'dtype' then overrides[k] = v end
  end
  return { device = opts.device or fsdp.get_default_device(), dtype = opts.dtype }, overrides
end

return M
