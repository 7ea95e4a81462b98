-- models/common.lua: what the model files share: config resolution, the
-- next-token loss of causal language models, and how build() options split
-- into where the model lives (device, dtype) and config overrides.
local fsdp = require 'fsdp'
local F = require 'fsdp.functional'
local suggest = require 'fsdp.suggest'
local validate = require 'fsdp.validate'
local tables = require 'fsdp.tables'

local M = {}

-- Mean cross-entropy of next-token predictions of `model` (forward: ids ->
-- logits [B, T, V]); targets i64 [B, T] are the ids shifted by one, -100
-- entries ignored; opts go to the forward (a packed batch's positions and
-- segments). Returns loss, logits.
function M.causal_lm_loss(model, ids, targets, opts)
  local logits = model(ids, opts)
  local V = model.config.vocab_size
  return F.cross_entropy(logits:view(-1, V), targets:view(-1), { ignore_index = -100 }), logits
end

-- A batch for fsdp.plan's trace of a causal language model: ids and
-- targets i64 [batch, seq] on the meta device (seq: the config's
-- max_seq_len when nil). Returns the arguments of model:loss, the tokens
-- and the sequence length.
function M.causal_lm_batch(model, batch, seq)
  seq = seq or model.config.max_seq_len
  local ids = fsdp.empty({ batch, seq }, { dtype = 'i64', device = 'meta' })
  local targets = fsdp.empty({ batch, seq }, { dtype = 'i64', device = 'meta' })
  return { n = 2, ids, targets }, batch * seq, seq
end

-- A model config: `name_or_config` is a key of `configs` or a table; the
-- result layers `defaults`, then it, then `overrides`, renaming keys through
-- `aliases` (other spellings of a field, e.g. Hugging Face's). An unknown
-- name is an error listing the known ones, raised at the caller of the
-- family's M.config; so is an override key that is neither a field (a key
-- of `fields`, a set) nor an alias, with "did you mean ...?": a misspelt
-- override (num_layer = 3) would otherwise build the full model. The family
-- validates and derives fields after (M.check_fields).
function M.merge_config(family, configs, defaults, aliases, name_or_config, overrides, fields)
  local base = name_or_config
  if type(base) == 'string' then
    base = configs[base]
    if not base then
      local names = tables.sorted_keys(configs)
      error(("%s: unknown config '%s'%s (known: %s)"):format(family, name_or_config,
        suggest.hint(name_or_config, names), table.concat(names, ', ')), 3)
    end
  elseif type(base) ~= 'table' then
    error(('%s: expected a config name or table, got %s'):format(family, type(base)), 3)
  end
  aliases = aliases or {}
  if overrides ~= nil and type(overrides) ~= 'table' then
    error(('%s: overrides must be a table, got %s'):format(family, type(overrides)), 3)
  end
  if fields then
    for k in pairs(overrides or {}) do
      if not (fields[k] or aliases[k]) then
        local names = {}
        for f in pairs(fields) do names[#names + 1] = f end
        for a in pairs(aliases) do names[#names + 1] = a end
        table.sort(names)
        error(("%s: unknown config key '%s'%s (keys: %s)"):format(family, tostring(k), suggest.hint(k, names),
          table.concat(names, ', ')), 3)
      end
    end
  end
  local c = {}
  for k, v in pairs(defaults) do c[k] = v end
  for k, v in pairs(base) do c[aliases[k] or k] = v end
  for k, v in pairs(overrides or {}) do c[aliases[k] or k] = v end
  return c
end

-- Check a merged config's fields with fsdp.validate's rules (NaN and
-- infinity fail all of them): each of `ints` a positive integer, each of
-- `rates` in [0, 1) when set, and each field of `reals` (field -> rule)
-- when set. Errors name the family and the field, raised at the caller of
-- the family's M.config; a caller that read the config from a file names
-- the file's keys instead (models/hf.lua).
function M.check_fields(family, c, ints, rates, reals)
  local function check(k, rule, words)
    local v = c[k]
    local why = validate.problem(v, rule)
    -- (a count past 2^53 says so; other failures in the rule's words)
    if why and words and not (rule.int and validate.finite(v) and v >= 1 and v == math.floor(v)) then
      why = ('must be %s, got %s'):format(words, validate.show(v))
    end
    if why then error(('%s config: %s %s'):format(family, k, why), 4) end
  end
  for _, k in ipairs(ints or {}) do check(k, validate.COUNT, 'a positive integer') end
  for _, k in ipairs(rates or {}) do
    if c[k] ~= nil then check(k, validate.PROBABILITY, 'in [0, 1)') end
  end
  for _, k in ipairs(tables.sorted_keys(reals or {})) do
    if c[k] ~= nil then check(k, reals[k]) end
  end
end

-- What sets the size of each family's model, for the bound recipes and
-- tools hold a config to before building (fsdp.sharding.fit.bound):
-- the fields that build blocks, the fields that make the parameter count
-- (shown in that order when a size is refused), and the closed form of
-- that count. Each model file adds its own row as it loads (gpt2, t5 and
-- deepvit by add_sizes_of, every family models/decoder.lua declares by
-- add_sizes), so this file, which they all require, names none of them.
M.SIZES = {}

-- A model file's row: M.SIZES[family] = { blocks = {fields}, fields =
-- {fields}, closed_form_parameters = fn(config) }.
function M.add_sizes_of(family, blocks, fields, closed_form_parameters)
  M.SIZES[family] = { blocks = blocks, fields = fields, closed_form_parameters = closed_form_parameters }
end

-- A declared decoder family (models/decoder.lua's define, as it declares
-- one) sizes like Llama, a mixture of experts by its experts too. Its
-- closed form is its module's, which is loading as it declares.
function M.add_sizes(family, moe)
  if M.SIZES[family] then return end
  M.SIZES[family] = { module = 'models.families.' .. family, blocks = { 'n_layers' },
                      fields = moe and { 'n_layers', 'dim', 'n_heads', 'n_experts', 'moe_ffn_dim', 'vocab_size' }
                        or { 'n_layers', 'dim', 'n_heads', 'ffn_dim', 'vocab_size' } }
end

-- The parameters (closed form) and blocks of a family's checked config,
-- and its size fields (M.SIZES). Nothing is built; the family's model file
-- is loaded (it added the row).
function M.size_of(family, c)
  local s = M.SIZES[family]
  if not s then
    error(('size_of: no sizes known for the family %s (its model file, which adds them, is not loaded)')
      :format(tostring(family)), 2)
  end
  local blocks = 0
  for _, f in ipairs(s.blocks) do blocks = blocks + c[f] end
  local closed_form = s.closed_form_parameters or package.loaded[s.module].closed_form_parameters
  return closed_form(c), blocks, s.fields
end

-- A set of field names from a list.
function M.set(list)
  local s = {}
  for _, k in ipairs(list) do s[k] = true end
  return s
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
