-- models/decoders.lua: the decoder-only families (GPT-2 and every family
-- declared in models/families/: Llama, Qwen 2/3, Mistral, Gemma 2/3,
-- Phi-3, OLMo 2) under one --model name space, so recipes/llama2_7b.lua
-- trains any of them and recipes/generate.lua generates with any. A name
-- is a config of one family; a name two families share (each has a
-- 'tiny') is Llama's, the others' are prefixed: 'gpt2-tiny', 'qwen3-tiny'.
--
--   local decoders = require 'models.decoders'
--   local family, name = decoders.resolve('gpt2-tiny')   -- 'gpt2', 'tiny'
--   local fam = decoders.families[family]                 -- module, block class
--   local model = fam.module.build(name, {device = 'meta'})
local llama = require 'models.llama'
local gpt2 = require 'models.gpt2'

local M = {}

-- The declared families (models/families/<name>.lua), Llama first: the
-- order of names() and of messages.
M.DECLARED = { 'llama', 'qwen2', 'qwen3', 'mistral', 'gemma2', 'gemma3_text', 'phi3', 'olmo2', 'mixtral',
               'qwen3_moe' }

-- module: the model file (config, build, flops_per_token,
-- closed_form_parameters, configs); block: the class the recipes wrap
-- into a unit and checkpoint; prefix: its configs' names in --model when
-- Llama has the same name; lora_targets: PEFT's default target_modules.
M.families = {
  gpt2 = { name = 'gpt2', module = gpt2, block = gpt2.Block, prefix = 'gpt2-', lora_targets = 'c_attn' },
}
for _, name in ipairs(M.DECLARED) do
  local fam = require('models.families.' .. name)
  M.families[name] = { name = name, module = fam, block = fam.DecoderLayer, prefix = name == 'llama' and ''
                       or (name:gsub('_text$', '')) .. '-', lora_targets = fam.lora_targets, declared = true }
end
-- Every family, in the order of names().
M.ORDER = { 'llama', 'gpt2' }
for i = 2, #M.DECLARED do M.ORDER[#M.ORDER + 1] = M.DECLARED[i] end

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
  if n <= c.max_seq_len or (family ~= 'gpt2' and allowed) then return nil end
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
  if family ~= 'llama' and llama.configs[name] then return M.families[family].prefix .. name end
  return name
end
M.model_name = shown

-- Every --model name, family by family (M.ORDER), each sorted.
function M.names()
  local out = {}
  for _, family in ipairs(M.ORDER) do
    local sorted = {}
    for k in pairs(M.families[family].module.configs) do sorted[#sorted + 1] = shown(family, k) end
    table.sort(sorted)
    for _, k in ipairs(sorted) do out[#out + 1] = k end
  end
  return out
end

-- The family and config name of a --model value (nil when it names none).
function M.resolve(name)
  for _, family in ipairs(M.ORDER) do
    local f = M.families[family]
    local rest = f.prefix ~= '' and name:sub(1, #f.prefix) == f.prefix and name:sub(#f.prefix + 1)
    if rest and f.module.configs[rest] and llama.configs[rest] then return family, rest end
  end
  for _, family in ipairs(M.ORDER) do
    if M.families[family].module.configs[name] and shown(family, name) == name then return family, name end
  end
end

return M
