-- models/hf.lua: Hugging Face model directories (config.json plus
-- model.safetensors, or shards with model.safetensors.index.json) to and
-- from our Llama, T5 and GPT-2 models, as transformers 4.x and 5.x write
-- them. Llama and T5 weights already use HF's names; GPT-2's Conv1D
-- weights are transposed on the way (models/gpt2.lua). This file
-- translates the configs and moves the files.
--
--   local hf = require 'models.hf'
--   local model = hf.from_pretrained('path/to/t5-small', {dtype = 'f32'})
--   hf.save_pretrained(model, 'out/dir', {max_shard_size = '2GB'})
--   -- in Python: T5ForConditionalGeneration.from_pretrained('out/dir')
--
-- Loading streams the weights file by file into the built model
-- (fsdp.safetensors.load_into); saving writes each tensor once (tied ones
-- under their first name, as save_pretrained does) in the model's dtype.
--
-- [Note: config keys] Every key of a config.json is either translated
-- (it sets a field of ours), checked (it must hold the one value our
-- model implements: hidden_act 'silu', attention_bias false, ...), or on
-- a family's list of keys that do not change the math (token ids,
-- generation defaults, bookkeeping such as transformers_version). Any
-- other key is an error naming it, as is a pair of keys that disagree
-- (rope_theta vs rope_parameters.rope_theta): a silently ignored key
-- would load a different model than transformers builds.
--
-- The two layouts differ in: RoPE (4.x: rope_theta, rope_scaling; 5.x:
-- rope_parameters = {rope_type, rope_theta, factor, ...}); T5's head (4.x:
-- tie_word_embeddings both ties lm_head and scales the decoder output by
-- d_model^-0.5; 5.x writes tie_word_embeddings true always and
-- scale_decoder_outputs for the scale, and keeps lm_head untied when the
-- checkpoint holds its own lm_head.weight); dtype (4.x torch_dtype).
-- Exports write both layouts' keys, consistently, so that either loads
-- them, and floats as floats (fsdp.json.float): transformers 5 validates
-- JSON types.
local fsdp = require 'fsdp'
local core = require 'fsdp.core'
local json = require 'fsdp.io.json'
local st = require 'fsdp.io.safetensors_sharded'
local publish = require 'fsdp.io.publish'
local suggest = require 'fsdp.suggest'
local validate = require 'fsdp.validate'
local decoders = require 'models.decoders'
local hf_rope = require 'models.hf_rope'
local t5 = require 'models.t5'
local gpt2 = require 'models.gpt2'
local lfs = require 'lfs'
local files = require 'fsdp.io.files'
local sharding = require 'fsdp.sharding'
local autograd = require 'fsdp.autograd'
local decoder = require 'models.decoder'
local safetensors = require 'fsdp.io.safetensors'
local tables = require 'fsdp.tables'

local M = {}

local DTYPE_NAMES = { f32 = 'float32', f64 = 'float64', bf16 = 'bfloat16', f16 = 'float16' }

local function set(list)
  local s = {}
  for _, k in ipairs(list) do s[k] = true end
  return s
end

local function null(v) return v == nil or v == json.null end

-- Keys any PretrainedConfig may carry that leave a model's forward as it
-- is: bookkeeping, token ids (the tokenizer's business), generation
-- defaults (generate's options), task heads we do not build.
local COMMON_IGNORED = set({
  'architectures', 'transformers_version', 'torch_dtype', 'dtype', '_name_or_path', 'use_cache', 'return_dict',
  'output_attentions', 'output_hidden_states', 'torchscript', 'use_bfloat16', 'tf_legacy_loss',
  '_attn_implementation_autoset', 'gradient_checkpointing', 'output_past',
  'bos_token_id', 'eos_token_id', 'pad_token_id', 'sep_token_id', 'decoder_start_token_id',
  'id2label', 'label2id', 'problem_type', 'finetuning_task', 'tokenizer_class', 'prefix', 'task_specific_params',
  'max_length', 'min_length', 'do_sample', 'early_stopping', 'num_beams', 'num_beam_groups', 'diversity_penalty',
  'temperature', 'top_k', 'top_p', 'typical_p', 'repetition_penalty', 'length_penalty', 'no_repeat_ngram_size',
  'encoder_no_repeat_ngram_size', 'bad_words_ids', 'num_return_sequences', 'output_scores',
  'return_dict_in_generate', 'forced_bos_token_id', 'forced_eos_token_id', 'remove_invalid_values',
  'exponential_decay_length_penalty', 'suppress_tokens', 'begin_suppress_tokens', 'chunk_size_feed_forward',
  'is_decoder', 'tie_encoder_decoder', 'cross_attention_hidden_size',
})

-- Keys whose one accepted value is what our models compute (absent or
-- null is HF's default, the same value).
local COMMON_REQUIRED = { add_cross_attention = false }

local function fail(where, fmt, ...) core.fail(('hf: %s: ' .. fmt):format(where, ...)) end

local show = validate.show
-- a name as messages quote it ('gelu'), anything else as the file holds it
local function quote(v) return type(v) == 'string' and "'" .. v .. "'" or show(v) end

-- Check every key of h against a family's spec (see the Note at the top):
-- spec.fields (HF key -> our field), spec.rules (HF key -> a
-- fsdp.validate rule, or 'boolean'), spec.sizes (keys that must be
-- there: LlamaConfig's defaults for them are 7B's, never what a file that
-- leaves them out holds), spec.required (HF key -> value), spec.special
-- (keys the family's function reads itself), spec.ignored. A value is
-- named by its key: "num_hidden_layers must be an integer of at most
-- 2^53 ..., got 1e+300", never by the field it becomes.
local function check_keys(where, h, spec)
  for _, k in ipairs(tables.sorted_keys(h)) do
    local v = h[k]
    local want = spec.required[k]
    if want == nil then want = COMMON_REQUIRED[k] end
    if want ~= nil then
      if not null(v) and v ~= want then
        fail(where, '%s is %s; only %s is supported', k, show(v), tostring(want))
      end
    elseif spec.fields[k] then
      local rule = spec.rules[k]
      if not null(v) and rule == 'boolean' then
        if type(v) ~= 'boolean' then fail(where, '%s must be true or false, got %s', k, show(v)) end
      elseif not null(v) then
        local why = validate.problem(v, rule)
        if why then fail(where, '%s %s', k, why) end
      end
    elseif not (spec.special[k] or spec.ignored[k] or COMMON_IGNORED[k] or k == 'model_type') then
      local known = {}
      for _, t in ipairs({ spec.fields, spec.required, spec.special }) do
        for n in pairs(t) do known[#known + 1] = n end
      end
      fail(where, "unknown key '%s'%s: not a %s setting this loader knows, and keys it does not know may change "
        .. 'the model', k, suggest.hint(k, known), spec.name)
    end
  end
  for _, k in ipairs(spec.sizes or {}) do
    if null(h[k]) then
      fail(where, '%s is missing (a %s config.json gives its sizes: %s)', k, spec.name, table.concat(spec.sizes, ', '))
    end
  end
end

-- The fields spec.fields names, copied into our config (null: unset);
-- spec.defaults (HF key -> value) where the file leaves a key out: the
-- HF config class's default, which is what transformers builds.
local function copy_fields(h, spec)
  local c = {}
  for k, ours in pairs(spec.fields) do
    if not null(h[k]) then
      c[ours] = h[k]
    elseif spec.defaults and spec.defaults[k] ~= nil then
      c[ours] = spec.defaults[k]
    end
  end
  return c
end

-- A family's config function on what the file gave; a relation it refuses
-- ("dim 30 is not a multiple of n_heads 4") is said in the file's keys
-- ("hidden_size 30 is not a multiple of num_attention_heads 4").
local function family_config(where, spec, fn, c, overrides)
  local ok, r = pcall(fn, c, overrides)
  if ok then return r end
  local msg = tostring(r):gsub('^[^\n:]+:%d+: ', ''):gsub('^%w+ config: ', '')
  local hf_of = {}
  for k, ours in pairs(spec.fields) do hf_of[ours] = k end
  msg = (' ' .. msg .. ' '):gsub('([^%w_%.])([%a_][%w_]*)', function(pre, word)
    return pre .. (hf_of[word] or word)
  end)
  fail(where, '%s', msg:sub(2, -2))
end

-- Decoder families (models/families/*) -----------------------------------------------------

-- The config.json keys every decoder family shares (LlamaConfig's names);
-- a declaration's `hf` adds its own ([Note: a family declaration] in
-- models/decoder.lua): fields, required, ignored, defaults, special keys
-- and from_hf/to_hf hooks for what is not a one-to-one key.
local DECODER_FIELDS = {
  hidden_size = 'dim', num_hidden_layers = 'n_layers', num_attention_heads = 'n_heads',
  num_key_value_heads = 'n_kv_heads', intermediate_size = 'ffn_dim', vocab_size = 'vocab_size',
  rms_norm_eps = 'norm_eps', max_position_embeddings = 'max_seq_len', initializer_range = 'init_std',
  head_dim = 'head_dim', tie_word_embeddings = 'tied' }
local DECODER_RULES = {
  hidden_size = validate.COUNT, num_hidden_layers = validate.COUNT, num_attention_heads = validate.COUNT,
  num_key_value_heads = validate.COUNT, intermediate_size = validate.COUNT, vocab_size = validate.COUNT,
  rms_norm_eps = validate.NONNEGATIVE, max_position_embeddings = validate.COUNT,
  initializer_range = validate.NONNEGATIVE, head_dim = validate.COUNT, tie_word_embeddings = 'boolean' }
-- (their config classes' defaults for these are 7B's, never what a file that leaves them out holds)
local DECODER_SIZES = { 'hidden_size', 'num_hidden_layers', 'num_attention_heads', 'intermediate_size', 'vocab_size' }
-- [Note: one RoPE translator] Every family reads and writes its RoPE
-- keys through models/hf_rope.lua (both config layouts, every rope type
-- transformers has): from_hf(where, h, fail) -> theta, scaling;
-- to_hf(theta, scaling) -> {rope_theta =, rope_scaling =, rope_parameters =}.
local ROPE_KEYS = hf_rope.KEYS
local function rope_from_hf(where, h) return hf_rope.from_hf(where, h, fail) end
local function rope_to_hf(theta, scaling) return hf_rope.to_hf(theta, scaling) end

-- check_keys' spec of a family's declaration (made once).
local SPECS = {}
local function decoder_spec(fam)
  if SPECS[fam] then return SPECS[fam] end
  local d = fam.decl.hf
  local spec = { name = d.name, fields = {}, rules = {}, sizes = DECODER_SIZES, defaults = d.defaults or {},
                 required = d.required or {}, special = set(ROPE_KEYS), ignored = set(d.ignored or {}) }
  for k, v in pairs(DECODER_FIELDS) do spec.fields[k] = v end
  for k, v in pairs(DECODER_RULES) do spec.rules[k] = v end
  for k, ours in pairs(d.fields or {}) do
    spec.fields[k] = ours
    spec.rules[k] = decoder.FIELD_RULES[ours]
  end
  for k in pairs(d.special or {}) do spec.special[k] = true end
  SPECS[fam] = spec
  return spec
end

-- The layer_types list of a config (for export).
local function layer_types_of(fam, c)
  local out = json.array({})
  for i = 1, c.n_layers do
    out[i] = decoder.window_of(fam.decl, c, i - 1) and 'sliding_attention' or 'full_attention'
  end
  return out
end

local function decoder_from_hf(fam)
  return function(h, overrides, where, has_lm_head)
    local spec = decoder_spec(fam)
    check_keys(where, h, spec)
    local c = copy_fields(h, spec)
    local d = fam.decl.hf
    local ctx = { where = where, fail = function(fmt, ...) fail(where, fmt, ...) end,
                  rope = function(hh) return rope_from_hf(where, hh) end }
    if not d.own_rope then c.rope_theta, c.rope_scaling = rope_from_hf(where, h) end
    if d.from_hf then d.from_hf(h, c, ctx) end
    -- The class's default is untied (Gemma's tied); a head the file holds
    -- stays untied (transformers 5 unties it too).
    c.tied = (c.tied or false) and not has_lm_head
    return family_config(where, spec, fam.config, c, overrides)
  end
end

-- Fields config classes type as float (query_pre_attn_scalar is an int:
-- transformers 5 refuses 24.0 there).
local FLOAT_FIELDS = set({ 'attn_softcap', 'final_softcap', 'router_aux_loss_coef' })

local function decoder_to_hf(fam)
  return function(c)
    local F = json.float
    local d = fam.decl.hf
    local h = {
      architectures = { d.architecture }, model_type = d.model_type,
      hidden_size = c.dim, num_hidden_layers = c.n_layers, num_attention_heads = c.n_heads,
      num_key_value_heads = c.n_kv_heads, head_dim = c.head_dim, intermediate_size = c.ffn_dim,
      vocab_size = c.vocab_size, rms_norm_eps = F(c.norm_eps), tie_word_embeddings = c.tied,
      max_position_embeddings = c.max_seq_len, initializer_range = F(c.init_std),
      -- no pad id unless the export knows one (save_pretrained's token_ids):
      -- the class defaults (Phi-3's 32000, Gemma's 0) may lie outside a
      -- small vocabulary, and a padding_idx freezes that embedding row in
      -- transformers' training, which ours does not
      pad_token_id = json.null,
    }
    for k, v in pairs(d.required or {}) do h[k] = type(v) == 'number' and F(v) or v end
    for k, ours in pairs(d.fields or {}) do
      local v = c[ours]
      if v == nil then h[k] = json.null
      elseif FLOAT_FIELDS[ours] then h[k] = F(v)
      else h[k] = v end
    end
    local rope = rope_to_hf(c.rope_theta, c.rope_scaling)
    h.rope_theta, h.rope_scaling, h.rope_parameters = rope.rope_theta, rope.rope_scaling, rope.rope_parameters
    if d.to_hf then
      d.to_hf(c, h, { float = F, null = json.null, rope_to_hf = rope_to_hf,
                      layer_types = function(cc) return layer_types_of(fam, cc) end })
    end
    return h
  end
end

-- T5 -------------------------------------------------------------------------------------

local T5 = {
  name = 'T5',
  fields = { d_model = 'd_model', d_ff = 'd_ff', d_kv = 'd_kv', num_heads = 'num_heads', num_layers = 'num_layers',
             num_decoder_layers = 'num_decoder_layers', vocab_size = 'vocab_size',
             relative_attention_num_buckets = 'relative_attention_num_buckets',
             relative_attention_max_distance = 'relative_attention_max_distance', layer_norm_epsilon = 'norm_eps',
             dropout_rate = 'dropout', initializer_factor = 'init_factor',
             decoder_start_token_id = 'decoder_start_token_id', pad_token_id = 'pad_token_id',
             eos_token_id = 'eos_token_id' },
  rules = { d_model = validate.COUNT, d_ff = validate.COUNT, d_kv = validate.COUNT, num_heads = validate.COUNT,
            num_layers = validate.COUNT, num_decoder_layers = validate.COUNT, vocab_size = validate.COUNT,
            relative_attention_num_buckets = validate.COUNT, relative_attention_max_distance = validate.COUNT,
            layer_norm_epsilon = validate.NONNEGATIVE, dropout_rate = validate.PROBABILITY,
            initializer_factor = validate.NONNEGATIVE, decoder_start_token_id = validate.INDEX,
            pad_token_id = validate.INDEX, eos_token_id = validate.INDEX },
  sizes = { 'd_model', 'd_ff', 'd_kv', 'num_heads', 'num_layers' },
  required = { is_encoder_decoder = true },
  special = set({ 'feed_forward_proj', 'dense_act_fn', 'is_gated_act', 'tie_word_embeddings',
                  'scale_decoder_outputs' }),
  -- n_positions: old hub configs carry it; T5's positions are relative.
  -- classifier_dropout: T5ForSequenceClassification's head only.
  ignored = set({ 'n_positions', 'classifier_dropout' }),
}

-- feed_forward_proj -> (gated, dense_act_fn); the activations we implement.
local T5_MLP = { relu = { false, 'relu' }, ['gated-gelu'] = { true, 'gelu_new' },
                 ['gated-gelu_new'] = { true, 'gelu_new' } }

-- has_lm_head: whether the checkpoint holds lm_head.weight (nil: unknown,
-- taken as tie_word_embeddings says).
local function t5_from_hf(h, overrides, where, has_lm_head)
  check_keys(where, h, T5)
  local c = copy_fields(h, T5)
  local ff = null(h.feed_forward_proj) and 'relu' or h.feed_forward_proj
  local mlp = T5_MLP[ff]
  if not mlp then
    fail(where, "feed_forward_proj %s is not supported (relu: v1.0, gated-gelu: v1.1)", quote(ff))
  end
  c.gated = mlp[1]
  if not null(h.is_gated_act) and h.is_gated_act ~= mlp[1] then
    fail(where, "is_gated_act %s and feed_forward_proj '%s' disagree", show(h.is_gated_act), ff)
  end
  if not null(h.dense_act_fn) and h.dense_act_fn ~= mlp[2] then
    fail(where, "dense_act_fn %s and feed_forward_proj '%s' disagree (it means %s)", quote(h.dense_act_fn), ff,
      mlp[2])
  end
  local tie = h.tie_word_embeddings
  if null(tie) then tie = true end -- T5Config's default
  local scale = h.scale_decoder_outputs
  for k, v in pairs({ tie_word_embeddings = tie, scale_decoder_outputs = scale }) do
    if not null(v) and type(v) ~= 'boolean' then fail(where, '%s must be true or false, got %s', k, show(v)) end
  end
  -- 4.x: the scale goes with the tie. 5.x: its own key.
  if null(scale) then scale = tie end
  c.scale_decoder_outputs = scale
  -- Tied unless the checkpoint brings its own head (as transformers 5
  -- unties a head whose weights are there).
  c.tied = tie and not has_lm_head
  return family_config(where, T5, t5.config, c, overrides)
end

local function t5_to_hf(c)
  local F = json.float
  return {
    architectures = { 'T5ForConditionalGeneration' }, model_type = 't5', is_encoder_decoder = true,
    d_model = c.d_model, d_ff = c.d_ff, d_kv = c.d_kv, num_heads = c.num_heads, num_layers = c.num_layers,
    num_decoder_layers = c.num_decoder_layers, vocab_size = c.vocab_size,
    relative_attention_num_buckets = c.relative_attention_num_buckets,
    relative_attention_max_distance = c.relative_attention_max_distance, layer_norm_epsilon = F(c.norm_eps),
    dropout_rate = F(c.dropout), initializer_factor = F(c.init_factor),
    feed_forward_proj = c.gated and 'gated-gelu' or 'relu', is_gated_act = c.gated,
    dense_act_fn = c.gated and 'gelu_new' or 'relu',
    -- 4.x reads the scale from the tie; 5.x reads scale_decoder_outputs
    -- and unties the head the file holds.
    tie_word_embeddings = c.tied, scale_decoder_outputs = c.scale_decoder_outputs,
    decoder_start_token_id = c.decoder_start_token_id, pad_token_id = c.pad_token_id, eos_token_id = c.eos_token_id,
  }
end

-- GPT-2 ----------------------------------------------------------------------------------

local GPT2 = {
  name = 'GPT-2',
  fields = { n_embd = 'dim', n_layer = 'n_layers', n_head = 'n_heads', n_inner = 'ffn_dim', vocab_size = 'vocab_size',
             n_positions = 'max_seq_len', layer_norm_epsilon = 'norm_eps', initializer_range = 'init_std',
             embd_pdrop = 'embd_pdrop', attn_pdrop = 'attn_pdrop', resid_pdrop = 'resid_pdrop' },
  rules = { n_embd = validate.COUNT, n_layer = validate.COUNT, n_head = validate.COUNT, n_inner = validate.COUNT,
            vocab_size = validate.COUNT, n_positions = validate.COUNT, layer_norm_epsilon = validate.NONNEGATIVE,
            initializer_range = validate.NONNEGATIVE, embd_pdrop = validate.PROBABILITY,
            attn_pdrop = validate.PROBABILITY, resid_pdrop = validate.PROBABILITY },
  required = { activation_function = 'gelu_new', scale_attn_weights = true, scale_attn_by_inverse_layer_idx = false,
               tie_word_embeddings = true },
  special = set({ 'n_ctx' }),
  -- summary_*: GPT2DoubleHeadsModel's head. reorder_and_upcast_attn:
  -- the same attention computed in f32 under autocast.
  ignored = set({ 'summary_type', 'summary_use_proj', 'summary_activation', 'summary_proj_to_labels',
                  'summary_first_dropout', 'reorder_and_upcast_attn' }),
}

local function gpt2_from_hf(h, overrides, where)
  check_keys(where, h, GPT2)
  local c = copy_fields(h, GPT2)
  if not null(h.n_ctx) then
    local why = validate.problem(h.n_ctx, validate.COUNT)
    if why then fail(where, 'n_ctx %s', why) end
  end
  if not null(h.n_ctx) and not null(h.n_positions) and h.n_ctx ~= h.n_positions then
    fail(where, 'n_ctx (%s) and n_positions (%s) disagree', show(h.n_ctx), show(h.n_positions))
  end
  if not null(h.n_ctx) and null(h.n_positions) then c.max_seq_len = h.n_ctx end
  -- GPT2Config's defaults where the file leaves a field out (ours differ
  -- for dropout and the sizes).
  local defaults = { vocab_size = 50257, max_seq_len = 1024, dim = 768, n_layers = 12, n_heads = 12,
                     embd_pdrop = 0.1, attn_pdrop = 0.1, resid_pdrop = 0.1 }
  for k, v in pairs(defaults) do
    if c[k] == nil then c[k] = v end
  end
  return family_config(where, GPT2, gpt2.config, c, overrides)
end

local function gpt2_to_hf(c)
  local F = json.float
  return {
    architectures = { 'GPT2LMHeadModel' }, model_type = 'gpt2', activation_function = 'gelu_new',
    n_embd = c.dim, n_layer = c.n_layers, n_head = c.n_heads, n_inner = c.ffn_dim, vocab_size = c.vocab_size,
    n_positions = c.max_seq_len, layer_norm_epsilon = F(c.norm_eps), initializer_range = F(c.init_std),
    embd_pdrop = F(c.embd_pdrop), attn_pdrop = F(c.attn_pdrop), resid_pdrop = F(c.resid_pdrop),
    scale_attn_weights = true, scale_attn_by_inverse_layer_idx = false, reorder_and_upcast_attn = false,
    tie_word_embeddings = true,
    -- GPT2Config's default token ids (50256, <|endoftext|>) are GPT-2's
    -- tokenizer's; with another vocabulary they would point past it.
    bos_token_id = c.vocab_size == 50257 and 50256 or json.null,
    eos_token_id = c.vocab_size == 50257 and 50256 or json.null,
  }
end

-- families --------------------------------------------------------------------------------

-- GPT-2's checkpoint names and shapes differ from ours (Conv1D weights
-- [in, out], bare GPT2Model keys): its weights go through
-- gpt2.from_hf_state_dict, file by file.
local function gpt2_load(model, dir, strict, allow_missing)
  local ck = st.open_checkpoint(dir)
  local own = {}
  for _, p in ipairs(model:named_parameters()) do own[p[1]] = p[2] end
  local seen, unexpected = {}, {}
  for _, name in ipairs(ck:names()) do
    local info = ck:info(name)
    local mapped = gpt2.name_from_hf(name)
    if mapped then
      local dst = own[mapped]
      if not dst then
        unexpected[#unexpected + 1] = name
      else
        local shape = info.shape
        if gpt2.is_conv1d(mapped) then shape = { shape[2], shape[1] } end
        local want = rawget(dst, 'fsdp_shape') or dst.shape
        if core.format_shape(shape) ~= core.format_shape(want) then
          fail(dir, 'size mismatch for %s: %s has %s, the model %s (as HF stores it)', name, ck:file_of(name),
            core.format_shape(info.shape), core.format_shape(gpt2.is_conv1d(mapped) and { want[2], want[1] } or want))
        end
        seen[mapped] = true
      end
    end
  end
  local missing = {}
  for name in pairs(own) do
    if not seen[name] and not (allow_missing and allow_missing(name)) then missing[#missing + 1] = name end
  end
  table.sort(missing)
  if strict ~= false and (#missing > 0 or #unexpected > 0) then
    local parts = {}
    if #missing > 0 then parts[#parts + 1] = 'missing keys: ' .. table.concat(missing, ', ') end
    if #unexpected > 0 then parts[#parts + 1] = 'unexpected keys: ' .. table.concat(unexpected, ', ') end
    fail(dir, 'the checkpoint does not fit the GPT-2 model: %s', table.concat(parts, '; '))
  end
  for _, tensors in ck:each_file() do
    model:load_state_dict(gpt2.from_hf_state_dict(tensors), { strict = false })
  end
end

-- GPT-2's Conv1D weights are stored [in, out] (models/gpt2.lua): the
-- shape and the tensor as the file holds them.
local function gpt2_hf_shape(name, shape)
  if gpt2.is_conv1d(name) then return { shape[2], shape[1] } end
  return shape
end
local function gpt2_hf_tensor(name, t)
  if gpt2.is_conv1d(name) then return t:t():contiguous() end
  return t
end

-- family.name: its model_type; hf_shape/hf_tensor (default: as ours) map a
-- parameter to what the file holds under the same name.
local FAMILIES = {
  t5 = { name = 't5', build = t5.Model, from_hf = t5_from_hf, to_hf = t5_to_hf, class = t5.Model },
  gpt2 = { name = 'gpt2', build = gpt2.LMHeadModel, from_hf = gpt2_from_hf, to_hf = gpt2_to_hf,
           class = gpt2.LMHeadModel, load = gpt2_load, hf_shape = gpt2_hf_shape, hf_tensor = gpt2_hf_tensor },
}
-- Every decoder family of models/families/ (Llama among them), by its model_type.
for _, name in ipairs(decoders.DECLARED) do
  local fam = decoders.families[name].module
  FAMILIES[name] = { name = name, build = fam.CausalLM, from_hf = decoder_from_hf(fam), to_hf = decoder_to_hf(fam),
                     class = fam.CausalLM, decoder = fam }
end
local SUPPORTED = {}
for name in pairs(FAMILIES) do SUPPORTED[#SUPPORTED + 1] = name end
table.sort(SUPPORTED)

local function family_of(model_type, where)
  local family = FAMILIES[model_type]
  if not family then
    fail(where, "model_type %s is not supported (%s)", quote(model_type), table.concat(SUPPORTED, ', '))
  end
  return family
end

local function read_config(dir)
  local path = dir .. '/config.json'
  local text, err = files.read(path, files.LIMITS.text[1], 'a JSON config')
  if not text then core.fail('hf: ' .. err) end
  local h, why = json.decode(text)
  if type(h) ~= 'table' then core.fail(('hf: %s is not a JSON object: %s'):format(path, why or 'not an object')) end
  return h, family_of(h.model_type, path), path
end

-- Our config (models/llama.lua, t5.lua or gpt2.lua fields) of a Hugging
-- Face config.json decoded to a table, and the family name. Every key is
-- checked (see the Note at the top). opts.has_lm_head: whether the
-- checkpoint holds lm_head.weight (a tied config then gets an untied
-- head, as in transformers 5).
function M.config_from_hf(h, overrides, opts)
  opts = opts or {}
  local where = opts.where or 'config'
  local family = family_of(h.model_type, where)
  return family.from_hf(h, overrides, where, opts.has_lm_head), h.model_type
end

-- The config.json key of one of our config fields in a family
-- (hidden_size for Llama's dim), or nil.
function M.key_of(family_name, field)
  local f = FAMILIES[family_name]
  local spec = ({ t5 = T5, gpt2 = GPT2 })[family_name] or (f and f.decoder and decoder_spec(f.decoder))
  for k, ours in pairs(spec and spec.fields or {}) do
    if ours == field then return k end
  end
end

-- The config.json table (before encoding) of our config of a family.
function M.config_to_hf(c, family_name)
  return family_of(family_name, 'config_to_hf').to_hf(c)
end

-- The weights' shapes in the headers of dir against the model config c
-- makes, before that model is built: a config.json value the weights do
-- not have (intermediate_size 40 for weights of 48) is refused naming the
-- tensor, its file and both shapes, instead of after the build. The
-- model is built on meta with one block (every block's tensors have the
-- shapes of the first's), so this costs nothing whatever the sizes say;
-- sizes past what a shape can hold are left to the size bound.
local BLOCK_PREFIX = { decoder = { '^(model%.layers%.)%d+%.' }, gpt2 = { '^(transformer%.h%.)%d+%.' },
                       t5 = { '^(encoder%.block%.)%d+%.', '^(decoder%.block%.)%d+%.' } }
local function check_shapes(dir, c, family_name, where)
  local family = FAMILIES[family_name]
  local one = {}
  for k, v in pairs(c) do one[k] = v end
  if family_name == 't5' then one.num_layers, one.num_decoder_layers = 1, 1 else one.n_layers = 1 end
  if one.layer_types then one.layer_types = { one.layer_types[1] } end
  local ok, model = pcall(family.build, one, { device = 'meta' })
  if not ok then return end
  local want = {}
  for _, np in ipairs(model:named_parameters()) do want[np[1]] = np[2].shape end
  local hf_shape = family.hf_shape or function(_, shape) return shape end
  for _, file in ipairs(st.open_checkpoint(dir):files()) do
    local f = safetensors.open(file)
    local names = f:names()
    table.sort(names)
    for _, name in ipairs(names) do
      local ours = family_name == 'gpt2' and gpt2.name_from_hf(name) or name
      local first = ours
      local patterns = ours and (BLOCK_PREFIX[family_name] or BLOCK_PREFIX.decoder) or {}
      for _, pattern in ipairs(patterns) do first = first:gsub(pattern, '%10.') end
      local shape = ours and (want[ours] or want[first])
      if shape then
        local have, expect = f:info(name).shape, hf_shape(ours, shape)
        if core.format_shape(have) ~= core.format_shape(expect) then
          f:close()
          fail(where, 'size mismatch for %s: %s has %s, the model this config.json describes %s', name, file,
            core.format_shape(have), core.format_shape(expect))
        end
      end
    end
    f:close()
  end
end

-- Our config of a Hugging Face directory (config.json read, every key
-- checked; the weights' headers say whether it has its own lm_head, and
-- have the shapes the config makes), the family name, and the config.json
-- table. Nothing is built (but one block on meta) or read beyond
-- headers. overrides: config fields (e.g. dropout = 0).
function M.read_config(dir, overrides)
  if lfs.attributes(dir, 'mode') ~= 'directory' then
    core.fail(('hf: %s is not a directory%s'):format(dir, publish.missing_hint(dir)))
  end
  -- Our unfinished or mixed export, before "no config.json" (which a
  -- half-written one may also lack).
  publish.check(dir)
  if not files.is_file(dir .. '/config.json') then
    core.fail(('hf: %s has no config.json (a Hugging Face model directory holds config.json and its '
      .. 'safetensors files)'):format(dir))
  end
  local h, family, path = read_config(dir)
  local has_lm_head = st.open_checkpoint(dir).map['lm_head.weight'] ~= nil
  local c = family.from_hf(h, overrides or {}, path, has_lm_head)
  check_shapes(dir, c, h.model_type, path)
  return c, h.model_type, h
end

-- Load the weights of the Hugging Face directory `dir` into `model` (built
-- from its config), one file at a time: into a sharded model's shards
-- straight (each rank copies its slice of each tensor; no rank holds more
-- than one file's tensors whole). opts.strict (default true),
-- opts.allow_missing(name) (names the directory need not have: new LoRA
-- adapters).
function M.load_weights(model, dir, opts)
  opts = opts or {}
  local family = M.family_of_model(model)
  if family.load then
    family.load(model, dir, opts.strict, opts.allow_missing)
  else
    fsdp.safetensors.load_into(model, dir, { strict = opts.strict, allow_missing = opts.allow_missing })
  end
end

-- Build the model a Hugging Face directory describes and load its weights.
-- opts: device, dtype (the weights are converted to it; default the
-- default dtype), strict (true), and config overrides (e.g. dropout = 0).
function M.from_pretrained(dir, opts)
  opts = opts or {}
  local overrides = {}
  for k, v in pairs(opts) do
    if k ~= 'device' and k ~= 'dtype' and k ~= 'strict' then overrides[k] = v end
  end
  local c, name = M.read_config(dir, overrides)
  local model = FAMILIES[name].build(c, { device = opts.device or fsdp.get_default_device(), dtype = opts.dtype })
  M.load_weights(model, dir, opts)
  return model
end

-- The family entry of a model (an instance of a family's class).
function M.family_of_model(model)
  for _, f in pairs(FAMILIES) do
    if model:is_instance_of(f.class) then return f end
  end
  core.fail(('hf: %s is not a model of a family this loader knows (%s)'):format(model:class_name(),
    table.concat(SUPPORTED, ', ')))
end

-- The token ids a Hugging Face directory gives generation: its
-- generation_config.json's, else its config.json's (bos_token_id,
-- eos_token_id, pad_token_id, decoder_start_token_id; absent ones nil).
function M.token_ids(dir)
  local out = {}
  for _, name in ipairs({ 'config.json', 'generation_config.json' }) do
    local text = files.read(dir .. '/' .. name)
    local h = text and json.decode(text)
    if type(h) == 'table' then
      for _, k in ipairs(M.TOKEN_ID_KEYS) do
        if not null(h[k]) then out[k] = h[k] end
      end
    end
  end
  return out
end

-- The dtype a Hugging Face directory's config.json says its weights are
-- in (5.x dtype, else 4.x torch_dtype): 'f32', 'bf16', 'f16', or nil when
-- it names none we read (or two that disagree).
function M.source_dtype(dir)
  local text = files.read(dir .. '/config.json')
  local h = text and json.decode(text)
  if type(h) ~= 'table' then return nil end
  local ours = {}
  for k, v in pairs(DTYPE_NAMES) do ours[v] = k end
  local a, b = ours[h.dtype], ours[h.torch_dtype]
  if a and b and a ~= b then return nil end
  return a or b
end

M.TOKEN_ID_KEYS = { 'bos_token_id', 'eos_token_id', 'pad_token_id', 'decoder_start_token_id' }

-- The tokenizer files a model directory may hold (transformers' and
-- SentencePiece's), copied by save_pretrained's opts.tokenizer_from.
M.TOKENIZER_FILES = { 'tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json', 'added_tokens.json',
                      'tokenizer.model', 'spiece.model', 'vocab.json', 'merges.txt', 'chat_template.jinja' }
-- The most read of one of them (the core reads a tokenizer.json up to the same).
local TOKENIZER_FILE_LIMIT = 256 * 2^20

-- The parameters in the order they are written: a sharded model's unit by
-- unit (each gathered once), else named_parameters'. {name, shape, dtype}.
local function write_order(model)
  local S = rawget(model, '_fsdp')
  local out = {}
  if S then
    for _, u in ipairs(S.units) do
      for _, p in ipairs(u.params) do out[#out + 1] = { p.name, p.shape, u.master_dtype } end
    end
  else
    for _, np in ipairs(model:named_parameters()) do out[#out + 1] = { np[1], np[2].shape, np[2].dtype } end
  end
  return out
end

-- Write model as a Hugging Face directory: config.json and the weights
-- (model.safetensors, or shards and an index past opts.max_shard_size),
-- each tensor once (tied ones under their first name, as transformers
-- does), in the model's (master) dtype. A sharded model is collective:
-- every rank calls it, the units are gathered one at a time
-- (fsdp.sharding.each_full_unit) and rank 0 streams each into its file
-- (fsdp.safetensors_sharded.stream_sharded), so no rank holds more than
-- one unit whole. opts: max_shard_size (as fsdp.save_safetensors_sharded's,
-- default '5GB'); token_ids ({bos_token_id =, eos_token_id =, ...}: put in
-- config.json and generation_config.json, which is written when any is
-- known); tokenizer_from (a directory whose tokenizer files are copied);
-- state (tensors by name to write instead of the model's parameters, in
-- their dtype: a LoRA model's merged_state_dict; a sharded model's rank 0
-- holds them, the other ranks pass an empty table); dtype ('f32', 'bf16',
-- 'f16': every tensor converted to it as it is written; default each
-- tensor's own).
-- dir is replaced as a whole, never written in place: it must be missing,
-- empty or an earlier export of ours, and a crash leaves the old
-- directory or the whole new one ([Note: exports are published whole] in
-- fsdp.io.publish).
-- Returns the weight files written (on rank 0; {} elsewhere).
function M.save_pretrained(model, dir, opts)
  opts = opts or {}
  local family = M.family_of_model(model)
  local dist = fsdp.dist
  local sharded = rawget(model, '_fsdp') ~= nil
  local writes = not sharded or dist.rank() == 0
  local hf_shape = family.hf_shape or function(_, shape) return shape end
  local hf_tensor = family.hf_tensor or function(_, t) return t end
  local order = write_order(model)
  local state = opts.state
  if state then
    -- The model's order and names, the state's tensors (names it lacks, a
    -- LoRA model's adapters, are not written).
    local kept = {}
    for _, e in ipairs(order) do
      local t = state[e[1]]
      if t then kept[#kept + 1] = { e[1], t.shape, t.dtype } end
    end
    order = kept
  end
  -- Rank 0 builds the directory beside dir and swaps it in whole at the
  -- end ([Note: exports are published whole] in fsdp.io.publish).
  local w, stage, failed, written = nil, nil, nil, {}
  local function try(fn)
    if writes and not failed then
      local ok, err = pcall(fn)
      if not ok then
        failed = err
        if w then w:abort() end
        if stage then stage:abort() end
      end
    end
  end
  -- [Note: export dtype] opts.dtype converts every tensor as it is
  -- written; without it each keeps its own dtype (the model's: the
  -- master dtype of a sharded one). config.json's dtype (5.x) and
  -- torch_dtype (4.x) name what was written.
  local dtype = opts.dtype and core.dtype_name(core.dtype(opts.dtype)) or order[1] and order[1][3]
  if opts.dtype and not DTYPE_NAMES[dtype] then
    core.fail(('hf: save_pretrained: dtype %s is not one a Hugging Face directory holds (f32, bf16, f16)')
      :format(tostring(opts.dtype)))
  end
  try(function()
    stage = publish.begin(dir, { what = 'save_pretrained' })
    local decls = {}
    for _, e in ipairs(order) do
      local pieces = model.checkpoint_pieces and model:checkpoint_pieces(e[1])
      for _, p in ipairs(pieces or { { name = e[1], shape = hf_shape(e[1], e[2]) } }) do
        decls[#decls + 1] = { p.name, opts.dtype and dtype or e[3], p.shape }
      end
    end
    -- finite: an export never writes a NaN or infinity (the writer scans
    -- each tensor and names the first that holds one)
    w = st.stream_sharded(stage.dir, decls, { max_shard_size = opts.max_shard_size, checksum = true, id = stage.id,
                                              finite = true })
  end)
  local function put(name, t)
    try(function()
      local out = hf_tensor(name, t)
      if opts.dtype and out.dtype ~= dtype then
        local cast = out:to(dtype)
        if out ~= t then out:free() end
        out = cast
      end
      -- a parameter checkpoints store in pieces is written as them, in
      -- their disk names ([Note: checkpoint pieces] in models/decoder_parts.lua)
      local pieces = model.checkpoint_pieces and model:checkpoint_pieces(name)
      if pieces then
        local flat = out:reshape(-1)
        for _, p in ipairs(pieces) do
          local n = 1
          for _, d in ipairs(p.shape) do n = n * d end
          w:write(p.name, flat:narrow(0, p.offset, n):view(p.shape))
        end
      else
        w:write(name, out)
      end
      if out ~= t then out:free() end
    end)
  end
  if state then
    for _, e in ipairs(order) do put(e[1], state[e[1]]) end
  elseif sharded then
    -- Every rank takes part in every gather, even after rank 0 failed.
    sharding.each_full_unit(model, function(u, by)
      for _, p in ipairs(u.params) do put(p.name, by[p]) end
    end)
  else
    autograd.no_grad(function()
      for _, np in ipairs(model:named_parameters()) do put(np[1], np[2]) end
    end)
  end
  try(function()
    written = w:finish()
    local h = family.to_hf(model.config)
    -- 5.x reads dtype, 4.x torch_dtype.
    h.dtype = DTYPE_NAMES[dtype]
    h.torch_dtype = DTYPE_NAMES[dtype]
    local ids = opts.token_ids or {}
    local gen = {}
    for _, k in ipairs(M.TOKEN_ID_KEYS) do
      local v = ids[k]
      if v == nil and not null(h[k]) then v = h[k] end -- T5's config carries its ids
      if v ~= nil then h[k], gen[k] = v, v end
    end
    files.write_atomic(stage.dir .. '/config.json', json.encode(h))
    if next(gen) then
      gen._from_model_config = true
      files.write_atomic(stage.dir .. '/generation_config.json', json.encode(gen))
    end
    if opts.tokenizer_from then
      for _, name in ipairs(M.TOKENIZER_FILES) do
        local src = opts.tokenizer_from .. '/' .. name
        if files.is_file(src) then
          local text, err = files.read(src, TOKENIZER_FILE_LIMIT, 'a tokenizer file')
          if not text then core.fail('hf: ' .. err) end
          files.write_atomic(stage.dir .. '/' .. name, text)
        end
      end
    end
    stage:commit()
  end)
  if sharded and dist.world_size() > 1 then
    local flag = fsdp.tensor({ failed and 1 or 0 }, { dtype = 'i32' })
    dist.broadcast(flag, 0)
    if flag:item() ~= 0 and not failed then
      core.fail(('hf: save_pretrained: rank 0 could not write %s (see its error)'):format(dir))
    end
  end
  if failed then error(failed, 0) end
  return written
end

return M
