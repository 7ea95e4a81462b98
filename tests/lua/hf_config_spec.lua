-- hf_config_spec.lua: models/hf.lua's reading of config.json keys (see its
-- Note on config keys): both transformers layouts give the same config;
-- an unknown key, a value we do not implement, or two keys that disagree
-- is an error naming the key; exports write floats as floats and the keys
-- of both layouts (what transformers 5's validation and 4.x read).
local fsdp = require 'fsdp'
local hf = require 'models.hf'
local json = require 'fsdp.io.json'
local llama = require 'models.llama'
local t5 = require 'models.t5'
local gpt2 = require 'models.gpt2'
local T = require 'fsdp.testing'
local lfs = require 'lfs'

local DIR = 'tests/golden/hf/'

local function read_json(path)
  local f = assert(io.open(path, 'rb'))
  local v = assert(json.decode(f:read('*a')))
  f:close()
  return v
end

local function copy(t)
  local c = {}
  for k, v in pairs(t) do c[k] = type(v) == 'table' and copy(v) or v end
  return c
end

local function with(base, changes)
  local h = copy(base)
  for k, v in pairs(changes) do
    if v == false and k:match('^%-') then h[k:sub(2)] = nil else h[k] = v end
  end
  return h
end

describe('Hugging Face config.json keys', function()
  local l4 = read_json(DIR .. 'llama3_tiny/config.json')
  local l5 = read_json(DIR .. 'llama3_tiny_v5/config.json')
  local t5v5 = read_json(DIR .. 't5_v1_1_tiny_v5/config.json')
  local g = read_json(DIR .. 'gpt2_tiny/config.json')

  it('a transformers 4 and a transformers 5 Llama config give the same config', function()
    assert.same(hf.config_from_hf(l4), hf.config_from_hf(l5))
    -- 5.x without rope_parameters.original_max_position_embeddings: max_position_embeddings.
    local h = copy(l5)
    h.rope_parameters.original_max_position_embeddings = nil
    assert.equals(64, hf.config_from_hf(h).rope_scaling.original_max_position_embeddings)
    -- No rope settings at all: theta 10000, no scaling.
    local bare = with(l4, { ['-rope_theta'] = false, rope_scaling = json.null })
    local c = hf.config_from_hf(bare)
    assert.equals(1e4, c.rope_theta)
    assert.is_nil(c.rope_scaling)
  end)

  it('an unknown key is an error naming it', function()
    assert.error_matches(function() hf.config_from_hf(with(l5, { sliding_window = 4096 })) end,
      "unknown key 'sliding_window'")
    assert.error_matches(function() hf.config_from_hf(with(t5v5, { relative_attention_buckets = 8 })) end,
      "unknown key 'relative_attention_buckets' %(did you mean relative_attention_num_buckets%?%)")
    assert.error_matches(function() hf.config_from_hf(with(g, { n_embed = 64 })) end, "unknown key 'n_embed'")
    assert.error_matches(function()
      local h = copy(l5)
      h.rope_parameters.beta_fast = 32
      hf.config_from_hf(h)
    end, "unknown key 'rope_parameters.beta_fast' for rope_type 'llama3'")
    assert.error_matches(function() hf.config_from_hf(with(l5, { model_type = 'falcon' })) end,
      "model_type 'falcon' is not supported %(gemma2, gemma3_text, gpt2, llama, mistral, mixtral, olmo2, phi3, "
      .. "qwen2, qwen3, qwen3_moe, t5%)")
  end)

  it('a value our model does not compute is an error naming the key', function()
    assert.error_matches(function() hf.config_from_hf(with(l5, { hidden_act = 'gelu' })) end,
      'hidden_act is "gelu"; only silu is supported')
    assert.error_matches(function() hf.config_from_hf(with(l5, { attention_bias = true })) end, 'attention_bias is true')
    assert.error_matches(function() hf.config_from_hf(with(l5, { attention_dropout = 0.1 })) end,
      'attention_dropout is 0.1')
    assert.error_matches(function()
      hf.config_from_hf(with(l4, { rope_scaling = { rope_type = 'su', factor = 4 } }))
    end, 'rope_scaling.rope_type "su" is not supported %(default, linear, dynamic, yarn, longrope, llama3%)')
    assert.error_matches(function() hf.config_from_hf(with(t5v5, { feed_forward_proj = 'gated-silu' })) end,
      "feed_forward_proj 'gated%-silu' is not supported")
    assert.error_matches(function() hf.config_from_hf(with(g, { activation_function = 'relu' })) end,
      'activation_function is "relu"')
    assert.error_matches(function() hf.config_from_hf(with(g, { tie_word_embeddings = false })) end,
      'tie_word_embeddings is false')
    assert.error_matches(function() hf.config_from_hf(with(l5, { hidden_size = '32' })) end,
      'hidden_size must be a number')
  end)

  it('keys that disagree are an error naming both', function()
    assert.error_matches(function() hf.config_from_hf(with(l5, { rope_theta = 1e4 })) end,
      'rope_theta %(10000%) and rope_parameters.rope_theta %(500000%) disagree')
    assert.error_matches(function()
      hf.config_from_hf(with(l5, { rope_scaling = { rope_type = 'llama3', factor = 8 } }))
    end, 'rope_scaling.factor %(8%) and rope_parameters.factor %(32%) disagree')
    assert.error_matches(function() hf.config_from_hf(with(t5v5, { dense_act_fn = 'relu' })) end,
      "dense_act_fn 'relu' and feed_forward_proj 'gated%-gelu' disagree")
    assert.error_matches(function() hf.config_from_hf(with(t5v5, { is_gated_act = false })) end,
      "is_gated_act false and feed_forward_proj 'gated%-gelu' disagree")
    assert.error_matches(function() hf.config_from_hf(with(g, { n_ctx = 1024 })) end,
      'n_ctx %(1024%) and n_positions %(16%) disagree')
  end)

  -- issue 38: values are checked under their own key, NaN and infinity
  -- included, before anything is built, and never as our field names
  it('a value that is not a finite number in range is an error naming the key', function()
    local function err(h)
      local ok, e = pcall(hf.config_from_hf, h, nil, { where = 'X/config.json' })
      assert.is_false(ok, 'accepted')
      e = tostring(e)
      assert.is_nil(e:find('table: 0x', 1, true), e)
      assert.is_nil(e:find('models/llama.lua', 1, true), e)
      return e
    end
    for _, case in ipairs({
      { l5, { num_hidden_layers = 1 / 0 }, 'X/config.json: num_hidden_layers must be a finite number, got inf' },
      { l5, { num_hidden_layers = 1e300 }, 'num_hidden_layers must be an integer of at most 2^53' },
      { l5, { num_hidden_layers = 2.5 }, 'num_hidden_layers must be an integer, got 2.5' },
      { l5, { num_attention_heads = 0 }, 'num_attention_heads must be >= 1, got 0' },
      { l5, { rms_norm_eps = 0 / 0 }, 'rms_norm_eps must be a finite number, got nan' },
      { l5, { initializer_range = -1 }, 'initializer_range must be >= 0, got -1' },
      { l4, { rope_theta = 0 / 0, rope_scaling = json.null }, 'rope_theta must be a finite number, got nan' },
      { l4, { rope_theta = -1, rope_scaling = json.null }, 'rope_theta must be > 0, got -1' },
      { l5, { tie_word_embeddings = 'yes' }, 'tie_word_embeddings must be true or false, got "yes"' },
      { t5v5, { dropout_rate = 1 }, 'dropout_rate must be < 1, got 1' },
      { t5v5, { num_layers = -1 / 0 }, 'num_layers must be a finite number, got -inf' },
      { g, { n_layer = 1 / 0 }, 'n_layer must be a finite number, got inf' },
      { g, { attn_pdrop = 0 / 0 }, 'attn_pdrop must be a finite number, got nan' },
    }) do
      assert.matches(case[3], err(with(case[1], case[2])), 1, true)
    end
    local h = copy(l5)
    h.rope_parameters.factor = 0 / 0
    assert.matches('rope_parameters.factor must be a finite number, got nan', err(h), 1, true)
    h = copy(l5)
    h.rope_parameters.factor = { a = 1 }
    assert.matches('rope_parameters.factor must be a number, got {"a": 1}', err(h), 1, true)
    h = copy(l5)
    h.rope_parameters = { 1, 2 }
    assert.matches('rope_parameters must be an object, got [1, 2]', err(h), 1, true)
  end)

  it('a relation the model needs is said in the keys of the file', function()
    local function err(h)
      local ok, e = pcall(hf.config_from_hf, h, nil, { where = 'X/config.json' })
      assert.is_false(ok, 'accepted')
      return tostring(e)
    end
    local e = err(with(l5, { hidden_size = 30, ['-head_dim'] = false }))
    assert.matches('X/config.json: hidden_size 30 is not a multiple of num_attention_heads 4', e, 1, true)
    assert.matches('num_attention_heads 4 is not a multiple of num_key_value_heads 3',
      err(with(l5, { num_key_value_heads = 3 })), 1, true)
    assert.matches('n_embd 30 is not a multiple of n_head 4', err(with(g, { n_embd = 30 })), 1, true)
  end)

  it('a size key left out is named (LlamaConfig would build 7B sizes); other keys take HF\'s defaults', function()
    local function err(h)
      local ok, e = pcall(hf.config_from_hf, h, nil, { where = 'X/config.json' })
      assert.is_false(ok, 'accepted')
      return tostring(e)
    end
    assert.matches('X/config.json: num_hidden_layers is missing (a Llama config.json gives its sizes:',
      err(with(l5, { ['-num_hidden_layers'] = false })), 1, true)
    assert.matches('X/config.json: num_hidden_layers is missing',
      err(with(l5, { num_hidden_layers = json.null })), 1, true)
    assert.matches('X/config.json: d_model is missing', err(with(t5v5, { ['-d_model'] = false })), 1, true)
    -- LlamaConfig's defaults, not ours (norm eps 1e-5, 4096 positions)
    local c = hf.config_from_hf(with(l4, { ['-rms_norm_eps'] = false, ['-max_position_embeddings'] = false,
                                           ['-initializer_range'] = false, rope_scaling = json.null }))
    assert.equals(1e-6, c.norm_eps)
    assert.equals(2048, c.max_seq_len)
    assert.equals(0.02, c.init_std)
  end)

  it('T5: the 4.x tie decides the scale; 5.x scale_decoder_outputs decides it itself', function()
    local v4 = read_json(DIR .. 't5_v1_1_tiny/config.json')
    local c = hf.config_from_hf(v4, nil, { has_lm_head = true })
    assert.is_false(c.tied)
    assert.is_false(c.scale_decoder_outputs)
    c = hf.config_from_hf(read_json(DIR .. 't5_v1_0_tiny/config.json'))
    assert.is_true(c.tied)
    assert.is_true(c.scale_decoder_outputs)
    c = hf.config_from_hf(t5v5)
    assert.is_true(c.tied)
    assert.is_false(c.scale_decoder_outputs)
    assert.is_false(hf.config_from_hf(t5v5, nil, { has_lm_head = true }).tied)
  end)
end)

-- config.json of released checkpoints, as the hub serves them (older
-- transformers wrote extra keys: n_ctx, output_past, task_specific_params).
local HUB = {
  ['gpt2'] = { 124439808, { activation_function = 'gelu_new', architectures = { 'GPT2LMHeadModel' }, attn_pdrop = 0.1,
    bos_token_id = 50256, embd_pdrop = 0.1, eos_token_id = 50256, initializer_range = 0.02, layer_norm_epsilon = 1e-05,
    model_type = 'gpt2', n_ctx = 1024, n_embd = 768, n_head = 12, n_layer = 12, n_positions = 1024,
    resid_pdrop = 0.1, summary_activation = json.null, summary_first_dropout = 0.1, summary_proj_to_labels = true,
    summary_type = 'cls_index', summary_use_proj = true,
    task_specific_params = { ['text-generation'] = { do_sample = true, max_length = 50 } }, vocab_size = 50257 } },
  ['t5-small'] = { 60506624, { architectures = { 'T5ForConditionalGeneration' }, d_ff = 2048, d_kv = 64, d_model = 512,
    decoder_start_token_id = 0, dropout_rate = 0.1, eos_token_id = 1, initializer_factor = 1.0,
    is_encoder_decoder = true, layer_norm_epsilon = 1e-06, model_type = 't5', n_positions = 512, num_heads = 8,
    num_layers = 6, output_past = true, pad_token_id = 0, relative_attention_num_buckets = 32,
    task_specific_params = { summarization = { prefix = 'summarize: ' } }, vocab_size = 32128 } },
  ['google/t5-v1_1-xl'] = { 2849757184, { architectures = { 'T5ForConditionalGeneration' }, d_ff = 5120, d_kv = 64,
    d_model = 2048, decoder_start_token_id = 0, dropout_rate = 0.1, eos_token_id = 1,
    feed_forward_proj = 'gated-gelu', initializer_factor = 1.0, is_encoder_decoder = true,
    layer_norm_epsilon = 1e-06, model_type = 't5', num_decoder_layers = 24, num_heads = 32, num_layers = 24,
    output_past = true, pad_token_id = 0, relative_attention_num_buckets = 32, tie_word_embeddings = false,
    vocab_size = 32128 } },
  ['meta-llama/Llama-3.1-8B'] = { 8030261248, { architectures = { 'LlamaForCausalLM' }, attention_bias = false,
    attention_dropout = 0.0, bos_token_id = 128000, eos_token_id = { 128001, 128008, 128009 }, hidden_act = 'silu',
    hidden_size = 4096, initializer_range = 0.02, intermediate_size = 14336, max_position_embeddings = 131072,
    mlp_bias = false, model_type = 'llama', num_attention_heads = 32, num_hidden_layers = 32,
    num_key_value_heads = 8, pretraining_tp = 1, rms_norm_eps = 1e-05,
    rope_scaling = { factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0,
                     original_max_position_embeddings = 8192, rope_type = 'llama3' },
    rope_theta = 500000.0, tie_word_embeddings = false, torch_dtype = 'bfloat16',
    transformers_version = '4.43.0.dev0', use_cache = true, vocab_size = 128256 } },
}

describe('released checkpoints\' config.json', function()
  for name, case in pairs(HUB) do
    it(name .. ' builds with its exact parameter count', function()
      -- The untied ones' files hold lm_head.weight.
      local c, family = hf.config_from_hf(case[2], nil, { has_lm_head = case[2].tie_word_embeddings == false })
      local build = ({ llama = llama.build, t5 = t5.build, gpt2 = gpt2.build })[family]
      assert.equals(case[1], build(c, { device = 'meta' }):num_parameters())
    end)
  end
end)

describe('exported config.json', function()
  local function export(model)
    local out = os.tmpname()
    os.remove(out)
    -- (values: an export refuses to write what is not finite, and a
    -- model built on the CPU holds whatever its memory held)
    model:init_weights({ seed = 0 })
    hf.save_pretrained(model, out)
    local f = assert(io.open(out .. '/config.json', 'rb'))
    local text = f:read('*a')
    f:close()
    os.execute('rm -rf ' .. out)
    return text, assert(json.decode(text))
  end

  it('writes float fields as floats even when integral (transformers 5 validates the types)', function()
    local text = export(t5.build('tiny', { dropout = 0 }))
    assert.matches('"initializer_factor": 1%.0[,\n]', text)
    assert.matches('"dropout_rate": 0%.0[,\n]', text)
    assert.matches('"layer_norm_epsilon": 1e%-06[,\n]', text)
    assert.matches('"d_model": 32[,\n]', text) -- integers stay integers
    text = export(llama.build('tiny', { rope_theta = 5e5 }))
    assert.matches('"rope_theta": 500000%.0[,\n]', text)
    assert.matches('"attention_dropout": 0%.0[,\n]', text)
    text = export(gpt2.build('tiny', nil))
    assert.matches('"resid_pdrop": 0%.0[,\n]', text)
  end)

  -- issue 38: an export never writes a NaN or infinity (the writer scans
  -- each tensor), and nothing of the refused export is left
  it('refuses a parameter that is not finite, naming it', function()
    local m = llama.build('tiny', nil)
    m:init_weights({ seed = 0 })
    fsdp.no_grad(function() m.model.norm.weight:narrow(0, 3, 1):fill_(0 / 0) end)
    local out = os.tmpname()
    os.remove(out)
    local ok, err = pcall(hf.save_pretrained, m, out)
    assert.is_false(ok)
    assert.matches("model.safetensors: tensor 'model.norm.weight' is not finite (element 3 is NaN or infinite): "
      .. 'refusing to write it', tostring(err), 1, true)
    assert.is_nil(require('fsdp.io.files').mode(out .. '/model.safetensors'))
    os.execute('rm -rf ' .. out)
  end)

  it('round-trips through our reader, with both layouts\' rope keys', function()
    local m = llama.build('tiny', { rope_theta = 5e5, rope_scaling = {
      rope_type = 'llama3', factor = 32, low_freq_factor = 1, high_freq_factor = 4, original_max_position_embeddings = 16 } })
    local _, h = export(m)
    assert.equals(5e5, h.rope_parameters.rope_theta)
    assert.equals('llama3', h.rope_scaling.rope_type)
    assert.same(m.config, hf.config_from_hf(h))
    for _, b in ipairs({ t5.build('tiny', nil), gpt2.build('tiny', nil),
                         t5.build('tiny', { gated = true, tied = false }) }) do
      local _, hb = export(b)
      assert.same(b.config, hf.config_from_hf(hb, nil, { has_lm_head = not b.config.tied }))
    end
  end)
end)

describe('fsdp.json.float', function()
  it('writes integral floats with a fraction and reads them back as the same number', function()
    local text = json.encode({ a = json.float(1), b = json.float(1e-6), c = json.float(5e5), d = 3, e = json.null })
    assert.matches('"a": 1%.0,', text)
    assert.matches('"b": 1e%-06,', text)
    assert.matches('"c": 500000%.0,', text)
    assert.matches('"d": 3,', text)
    assert.matches('"e": null', text)
    local v = json.decode(text)
    assert.equals(1, v.a)
    assert.equals(5e5, v.c)
    assert.has_error(function() json.float('1') end, 'json.float: expected a number, got string')
  end)
end)

-- The decoder families' own keys (issue 39): each value the model does
-- not compute, each pair of keys that disagree, each list of the wrong
-- shape is one error naming the key, from the tiny directories'
-- config.json (tests/golden/hf/<family>_tiny) with one change.
describe('decoder families\' config.json keys', function()
  local FAMILIES = { 'qwen2', 'qwen3', 'olmo2', 'phi3', 'mistral', 'gemma2', 'gemma3_text', 'mixtral', 'qwen3_moe' }
  local base = {}
  for _, f in ipairs(FAMILIES) do base[f] = read_json(DIR .. f .. '_tiny/config.json') end
  local function refused(family, changes, text)
    local ok, err = pcall(hf.config_from_hf, with(base[family], changes))
    assert(not ok, family .. ': accepted')
    err = tostring(err)
    assert(err:find(text, 1, true), family .. ': ' .. err)
    assert.is_nil(err:find('\n', 1, true))
  end
  local GEMMA3_ROPE = { rope_type = 'default', rope_theta = 1e4 }
  local GEMMA3_GLOBAL = { rope_type = 'default', rope_theta = 1e6 }

  it('every family\'s tiny config.json reads as it is', function()
    for _, f in ipairs(FAMILIES) do assert.is_table(hf.config_from_hf(base[f])) end
  end)

  it('refuses what the model does not compute, naming the key', function()
    refused('phi3', { partial_rotary_factor = 0.5 }, 'partial_rotary_factor is 0.5; only 1 is supported')
    refused('phi3', { rope_parameters = { rope_type = 'default', rope_theta = 1e4, partial_rotary_factor = 0.75 } },
      'rope_parameters.partial_rotary_factor is 0.75; only 1.0 is supported')
    refused('mixtral', { router_jitter_noise = 0.1 }, 'router_jitter_noise is 0.1; only 0 is supported')
    refused('qwen3_moe', { mlp_only_layers = { 0 } },
      'mlp_only_layers is [0]; only [] (every layer a mixture of experts) is supported')
    refused('qwen3_moe', { decoder_sparse_step = 2 }, 'decoder_sparse_step')
    refused('gemma3_text', { rope_parameters = { full_attention = GEMMA3_GLOBAL, sliding_attention = GEMMA3_ROPE,
      chunked_attention = GEMMA3_ROPE } }, "unknown key 'rope_parameters.chunked_attention'")
    refused('gemma3_text', { rope_parameters = { full_attention = GEMMA3_GLOBAL, sliding_attention = {
      rope_type = 'default', rope_theta = 1e4, beta = 1 } } }, "unknown key 'rope_parameters.sliding_attention.beta'")
    refused('gemma3_text', { rope_parameters = { full_attention = 5, sliding_attention = GEMMA3_ROPE } },
      'rope_parameters.full_attention must be an object, got 5')
    refused('gemma3_text', { rope_parameters = { full_attention = GEMMA3_GLOBAL, sliding_attention = {
      rope_type = 'linear', factor = 2, rope_theta = 1e4 } } }, "the sliding layers' RoPE must be unscaled")
  end)

  it('refuses keys that disagree, naming both', function()
    refused('qwen3_moe', { num_experts = 8, num_local_experts = 4 },
      'num_experts (8) and num_local_experts (4) disagree')
    for _, f in ipairs({ 'qwen2', 'qwen3' }) do
      refused(f, { use_sliding_window = false, sliding_window = 4, layer_types = { 'sliding_attention',
        'full_attention' } }, "layer_types has 'sliding_attention' layers, but use_sliding_window is false")
      refused(f, { use_sliding_window = true, sliding_window = json.null, layer_types = { 'sliding_attention',
        'full_attention' } }, "layer_types has 'sliding_attention' layers, but sliding_window is null")
    end
    refused('gemma2', { sliding_window = json.null }, 'sliding_window is null, but the config has sliding layers')
  end)

  it('refuses a layer_types of the wrong length or kind, with or without a window', function()
    for _, f in ipairs({ 'qwen2', 'qwen3', 'gemma2', 'gemma3_text' }) do
      local n = base[f].num_hidden_layers
      refused(f, { layer_types = { 'full_attention' } },
        ('layer_types lists 1 types for num_hidden_layers %d: ["full_attention"]'):format(n))
      local long = {}
      for i = 1, n + 1 do long[i] = 'full_attention' end
      refused(f, { layer_types = long }, ('layer_types lists %d types for num_hidden_layers %d'):format(n + 1, n))
      local odd = {}
      for i = 1, n do odd[i] = 'full_attention' end
      odd[2] = 'chunked_attention'
      refused(f, { layer_types = odd }, 'layer_types[1] is "chunked_attention"; only \'sliding_attention\' and '
        .. '\'full_attention\' are supported')
      refused(f, { layer_types = { a = 1 } }, 'layer_types must be a list, got {"a": 1}')
    end
    -- families without per-layer types do not take the key
    for _, f in ipairs({ 'olmo2', 'phi3', 'mistral', 'mixtral', 'qwen3_moe' }) do
      refused(f, { layer_types = { 'full_attention', 'full_attention' } }, "unknown key 'layer_types'")
    end
  end)

  it('refuses an unknown key in every family, naming the family', function()
    local NAMES = { qwen2 = 'Qwen2', qwen3 = 'Qwen3', olmo2 = 'OLMo2', phi3 = 'Phi3', mistral = 'Mistral',
                    gemma2 = 'Gemma2', gemma3_text = 'Gemma3', mixtral = 'Mixtral', qwen3_moe = 'Qwen3Moe' }
    for _, f in ipairs(FAMILIES) do
      refused(f, { attn_chunk_size = 4 }, ("unknown key 'attn_chunk_size': not a %s setting"):format(NAMES[f]))
    end
    refused('mixtral', { num_experts = 4 }, "unknown key 'num_experts' (did you mean num_experts_per_tok?)")
  end)

  it('through the recipe: exit 2 and one line naming the key, before anything is built', function()
    local dir = T.tmpdir() .. '/mixtral'
    assert(lfs.mkdir(dir))
    local f = assert(io.open(dir .. '/config.json', 'wb'))
    f:write(json.encode(with(base.mixtral, { router_jitter_noise = 0.1 })))
    f:close()
    -- (the weights must exist before config.json is read: a symbolic link to the golden's)
    assert(os.execute(('ln -s %s %s'):format(T.quote(lfs.currentdir() .. '/' .. DIR .. 'mixtral_tiny/model.safetensors'),
      T.quote(dir .. '/model.safetensors'))))
    local rc, stdout, stderr = T.run_exe('recipes/generate.lua --init_from=' .. T.quote(dir) .. ' --prompt_ids=1', 60)
    assert.equals(2, rc, stdout .. stderr)
    assert.matches('^fsdp%-lua: [^\n]+\n$', stderr)
    assert.truthy(stderr:find('router_jitter_noise is 0.1; only 0 is supported', 1, true), stderr)
  end)
end)
