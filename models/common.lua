-- models/common.lua: what the model files share: the next-token loss of
-- causal language models, and how build() options split into where the
-- model lives (device, dtype) and config overrides.
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
