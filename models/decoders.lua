-- models/decoders.lua: the decoder-only families (Llama, GPT-2) under one
-- --model name space, so recipes/llama2_7b.lua trains either and
-- recipes/generate.lua generates with either. A name is a config of
-- models/llama.lua or models/gpt2.lua; GPT-2's 'tiny' is 'gpt2-tiny'
-- (Llama has a 'tiny' too).
--
--   local decoders = require 'models.decoders'
--   local family, name = decoders.resolve('gpt2-tiny')   -- 'gpt2', 'tiny'
--   local fam = decoders.families[family]                 -- module, block class
--   local model = fam.module.build(name, {device = 'meta'})
local llama = require 'models.llama'
local gpt2 = require 'models.gpt2'

local M = {}

-- module: the model file (config, build, flops_per_token,
-- closed_form_parameters, configs); block: the class the recipes wrap
-- into a unit and checkpoint; prefix: its configs' names in --model.
M.families = {
  llama = { name = 'llama', module = llama, block = llama.DecoderLayer, prefix = '' },
  gpt2 = { name = 'gpt2', module = gpt2, block = gpt2.Block, prefix = 'gpt2-' },
}

-- [Note: positions past the model's limit] GPT-2 learns one embedding
-- per position: nothing runs past n_positions. Llama's RoPE has no table
-- to run out of, but a model is trained to max_position_embeddings and
-- past it quality falls off (transformers warns and goes on); a run past
-- it is refused unless it says so, rather than going on without a word.
M.OPTIONS = {
  allow_past_max_positions = { false, 'Llama: train or generate past the model\'s max_position_embeddings '
                                      .. '(RoPE extrapolates; quality degrades). GPT-2 cannot (one embedding per '
                                      .. 'position)' },
}

-- nil, or why `n` positions (what: '--seq_len (128)') do not fit the
-- decoder config c of `family` (src: models/pretrained's source, or nil
-- for a --model config named model), in one line.
function M.positions_problem(family, c, n, what, src, model, allowed)
  if n <= c.max_seq_len or (family == 'llama' and allowed) then return nil end
  local key = family == 'gpt2' and 'n_positions' or 'max_position_embeddings'
  local from
  if src and src.kind == 'hf' then from = ('%s of %s'):format(key, src.where)
  elseif src then from = ('max_seq_len of the model config %s records'):format(src.where)
  else from = ('%s of --model %s'):format(key, model or '?') end
  if family == 'gpt2' then
    return ("%s is longer than the model's %d positions (%s)"):format(what, c.max_seq_len, from)
  end
  return ("%s is longer than the model's %d positions (%s); give --allow_past_max_positions to run past "
    .. 'them (RoPE extrapolates; quality degrades)'):format(what, c.max_seq_len, from)
end

-- The --model name of a family's config name.
local function shown(family, name)
  if family == 'gpt2' and llama.configs[name] then return 'gpt2-' .. name end
  return name
end
M.model_name = shown

-- Every --model name, Llama's then GPT-2's, each sorted.
function M.names()
  local out = {}
  for _, family in ipairs({ 'llama', 'gpt2' }) do
    local sorted = {}
    for k in pairs(M.families[family].module.configs) do sorted[#sorted + 1] = shown(family, k) end
    table.sort(sorted)
    for _, k in ipairs(sorted) do out[#out + 1] = k end
  end
  return out
end

-- The family and config name of a --model value (nil when it names none).
function M.resolve(name)
  if name:sub(1, 5) == 'gpt2-' and gpt2.configs[name:sub(6)] and llama.configs[name:sub(6)] then
    return 'gpt2', name:sub(6)
  end
  if llama.configs[name] then return 'llama', name end
  if gpt2.configs[name] then return 'gpt2', name end
end

return M
