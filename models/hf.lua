-- models/hf.lua: Hugging Face model directories (config.json plus
-- model.safetensors, or shards with model.safetensors.index.json) to and
-- from our Llama and T5 models. The weights already use HF's names; this
-- file translates the configs and moves the files.
--
--   local hf = require 'models.hf'
--   local model = hf.from_pretrained('path/to/t5-small', {dtype = 'f32'})
--   hf.save_pretrained(model, 'out/dir', {max_shard_size = '2GB'})
--   -- in Python: T5ForConditionalGeneration.from_pretrained('out/dir')
--
-- Loading streams the weights file by file into the built model
-- (fsdp.safetensors.load_into); saving writes each tensor once (tied ones
-- under their first name, as save_pretrained does) in the model's dtype.
local fsdp = require 'fsdp'
local core = require 'fsdp.core'
local llama = require 'models.llama'
local t5 = require 'models.t5'
local lfs = require 'lfs'

-- A private cjson instance (settings stay local). Configs hold short
-- decimals (1e-06, 0.02, 500000), which its 14 significant digits
-- write back exactly.
local json = require('cjson').new()

local M = {}

local DTYPE_NAMES = { f32 = 'float32', f64 = 'float64', bf16 = 'bfloat16', f16 = 'float16' }

-- Llama: HF LlamaConfig <-> models/llama.lua's fields.
local function llama_from_hf(h, overrides)
  if h.hidden_act and h.hidden_act ~= 'silu' then
    core.fail(("hf: Llama hidden_act '%s' is not supported (silu)"):format(h.hidden_act))
  end
  if h.attention_bias or h.mlp_bias then core.fail('hf: Llama with attention_bias or mlp_bias is not supported') end
  local scaling = h.rope_scaling
  if scaling == json.null then scaling = nil end
  local c = {
    dim = h.hidden_size, n_layers = h.num_hidden_layers, n_heads = h.num_attention_heads,
    n_kv_heads = h.num_key_value_heads, ffn_dim = h.intermediate_size, vocab_size = h.vocab_size,
    norm_eps = h.rms_norm_eps, rope_theta = h.rope_theta, rope_scaling = scaling,
    tied = h.tie_word_embeddings or false, max_seq_len = h.max_position_embeddings,
    init_std = h.initializer_range,
  }
  if type(h.head_dim) == 'number' then c.head_dim = h.head_dim end
  return llama.config(c, overrides)
end

local function llama_to_hf(c)
  return {
    architectures = { 'LlamaForCausalLM' }, model_type = 'llama', hidden_act = 'silu',
    hidden_size = c.dim, num_hidden_layers = c.n_layers, num_attention_heads = c.n_heads,
    num_key_value_heads = c.n_kv_heads, head_dim = c.head_dim, intermediate_size = c.ffn_dim,
    vocab_size = c.vocab_size, rms_norm_eps = c.norm_eps, rope_theta = c.rope_theta,
    rope_scaling = c.rope_scaling, tie_word_embeddings = c.tied, max_position_embeddings = c.max_seq_len,
    initializer_range = c.init_std, attention_bias = false, mlp_bias = false,
  }
end

local FAMILIES = {
  llama = { build = function(c, place) return llama.CausalLM(c, place) end, from_hf = llama_from_hf,
            to_hf = llama_to_hf, class = llama.CausalLM },
  t5 = { build = function(c, place) return t5.Model(c, place) end, from_hf = t5.config_from_hf,
         to_hf = t5.config_to_hf, class = t5.Model },
}

local function read_config(dir)
  local path = dir .. '/config.json'
  local f, err = io.open(path, 'rb')
  if not f then core.fail(('hf: cannot read %s: %s'):format(path, err)) end
  local text = f:read('*a')
  f:close()
  local ok, h = pcall(json.decode, text)
  if not ok or type(h) ~= 'table' then core.fail(('hf: %s is not valid JSON'):format(path)) end
  local family = FAMILIES[h.model_type]
  if not family then
    core.fail(("hf: %s: model_type '%s' is not supported (llama, t5)"):format(path, tostring(h.model_type)))
  end
  return h, family
end

-- Our config (models/llama.lua or models/t5.lua fields) of a Hugging Face
-- config.json decoded to a table, and the family name.
function M.config_from_hf(h, overrides)
  local family = FAMILIES[h.model_type]
  if not family then core.fail(("hf: model_type '%s' is not supported (llama, t5)"):format(tostring(h.model_type))) end
  return family.from_hf(h, overrides), h.model_type
end

-- Build the model a Hugging Face directory describes and load its weights.
-- opts: device, dtype (the weights are converted to it; default the
-- default dtype), strict (true), and config overrides (e.g. dropout = 0).
function M.from_pretrained(dir, opts)
  opts = opts or {}
  if lfs.attributes(dir, 'mode') ~= 'directory' then core.fail(('hf: %s is not a directory'):format(dir)) end
  local h, family = read_config(dir)
  local overrides = {}
  for k, v in pairs(opts) do
    if k ~= 'device' and k ~= 'dtype' and k ~= 'strict' then overrides[k] = v end
  end
  local model = family.build(family.from_hf(h, overrides),
    { device = opts.device or fsdp.get_default_device(), dtype = opts.dtype })
  fsdp.safetensors.load_into(model, dir, { strict = opts.strict })
  return model
end

-- Write model as a Hugging Face directory: config.json and the weights
-- (model.safetensors, or shards and an index past opts.max_shard_size).
-- opts.max_shard_size as fsdp.save_safetensors_sharded's (default '5GB').
function M.save_pretrained(model, dir, opts)
  opts = opts or {}
  local family
  for _, f in pairs(FAMILIES) do
    if model:is_instance_of(f.class) then family = f end
  end
  if not family then core.fail(('hf: save_pretrained: %s is not a Llama or T5 model'):format(model:class_name())) end
  local pairs_list, dtype = {}, nil
  for _, p in ipairs(model:named_parameters()) do
    pairs_list[#pairs_list + 1] = p
    dtype = dtype or p[2].dtype
  end
  local files = fsdp.save_safetensors_sharded(dir, pairs_list, { max_shard_size = opts.max_shard_size })
  local h = family.to_hf(model.config)
  h.torch_dtype = DTYPE_NAMES[dtype]
  local f, err = io.open(dir .. '/config.json', 'wb')
  if not f then core.fail(('hf: cannot write %s/config.json: %s'):format(dir, err)) end
  f:write(json.encode(h), '\n')
  f:close()
  return files
end

return M
