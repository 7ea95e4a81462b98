-- models/pretrained.lua: where a run's weights start and where they end
-- up. --init_from starts from a Hugging Face directory, a sharded training
-- checkpoint of ours or a full state dict file; --export_hf writes the
-- trained model as a Hugging Face directory. Shared by the training
-- recipes (recipes/llama2_7b.lua for Llama and GPT-2, models/t5_training.lua),
-- recipes/generate.lua and tools/export.lua, so a path means the same
-- everywhere.
--
--   local pretrained = require 'models.pretrained'
--   local src = pretrained.open(path, {families = {'llama', 'gpt2'}, who = 'recipes/llama2_7b.lua'})
--   -- src.family, src.config (ours), src.kind: 'hf' | 'checkpoint' | 'state_dict'
--   local model = build(src.config, {device = 'meta'}); fsdp.shard(model, ...)
--   pretrained.load(model, src)     -- collective for checkpoints: into each rank's shards
--
-- open() reads headers and JSON only, so every problem (no config.json, a
-- family the recipe does not train, a config key this loader does not
-- know) is found before a model is built; load() checks names and shapes
-- against the model from the headers before the first copy, and copies
-- each rank's slice of each tensor straight into its shards (an HF or
-- state dict file mapped one at a time, a checkpoint's rank files read
-- only where they hold this rank's elements), so no rank ever holds the
-- whole model.
--
-- [Note: what a checkpoint says about its model] A checkpoint saved by a
-- recipe records its model in the index's `extra` (extra() below: family,
-- the whole config, the --init_from it started from and that source's
-- token ids and tokenizer directory), so --init_from, generate.lua and
-- tools/export.lua rebuild exactly the trained model from it, and an
-- export carries the tokenizer of the model it was fine-tuned from.
-- Checkpoints without that record and full state dicts tell only shapes:
-- the config comes from them plus what they cannot tell (heads, RoPE), which
-- the caller names (a --model config, --num_heads).
local fsdp = require 'fsdp'
local core = require 'fsdp.core'
local files = require 'fsdp.io.files'
local json = require 'fsdp.io.json'
local hf = require 'models.hf'
local decoders = require 'models.decoders'
local t5 = require 'models.t5'
local st = require 'fsdp.io.safetensors_sharded'
local common = require 'models.common'
local nonfinite = require 'fsdp.nonfinite'
local console = require 'fsdp.observe.console'
local hub = require 'fsdp.data.hub'
local publish = require 'fsdp.io.publish'
local fit = require 'fsdp.sharding.fit'
local lora = require 'fsdp.lora'
local clock = require 'fsdp.clock'
local options = require 'fsdp.options'
local ckpt_parts = require 'fsdp.checkpointing.parts'
local ckpt = require 'fsdp.checkpointing'

local M = {}

-- The options of a training recipe that starts from weights and exports
-- them (merged under the recipe's own by M.options).
M.OPTIONS = {
  init_from = { '', 'start from these weights: a Hugging Face directory (its config.json sets the model), a sharded '
                    .. 'checkpoint (a checkpoint or step directory: weights only, a fresh optimizer, step 0) or a full '
                    .. 'state dict .safetensors file; OWNER/NAME[@REVISION] that is no local path: its snapshot in the '
                    .. 'Hugging Face cache ($HF_HUB_CACHE, $HF_HOME/hub or ~/.cache/huggingface/hub)', input = true,
                hub = true },
  export_hf = { '', 'at the end, write the trained model as a Hugging Face directory here (config.json, safetensors, '
                    .. 'generation_config.json, the tokenizer files of --init_from)', output = 'dir' },
  export_max_shard_size = { '5GB', 'with --export_hf: the largest weight file; more go in numbered files and an index',
                            check = function(v)
                              local ok, err = pcall(st.parse_size, v,
                                'export_max_shard_size')
                              if not ok then return (tostring(err):gsub('^.-export_max_shard_size ', '')) end
                            end },
  -- [Note: export dtype] in models/hf.lua; auto: M.export_dtype.
  export_dtype = { 'auto', 'with --export_hf: the dtype of the weights written: auto (the dtype the --init_from '
                           .. "Hugging Face directory's config.json names, also through a checkpoint of a run that "
                           .. 'started from one; else the trained parameters\' dtype, f32 in mixed precision), f32 or '
                           .. 'bf16', one_of = { 'auto', 'f32', 'bf16' } },
  -- A LoRA run (--lora_rank, fsdp.lora) exports either form.
  export_lora = { 'merged', 'with --lora_rank: what --export_hf writes: merged (the adapters folded into the base '
                            .. 'weights: a plain Hugging Face model) or adapter (PEFT\'s adapter_config.json and '
                            .. 'adapter_model.safetensors, to load on the --init_from base with peft)',
                  one_of = { 'merged', 'adapter' }, needs = { 'lora_rank', 'export_hf' } },
}

function M.options(own) return options.merge(M.OPTIONS, own) end

local function fail(fmt, ...) error(fmt:format(...), 0) end

-- A message without the "file:line: " and the "hf: " a raise put first.
local function bare(msg) return (tostring(msg):gsub('^[^%s:]+:%d+: ', ''):gsub('^hf: ', '')) end

-- The family of a state dict by its names (name -> shape).
local function family_of_names(shapes, where)
  for name in pairs(shapes) do
    if name:find('^model%.embed_tokens%.') then return 'llama' end
    if name:find('^transformer%.wte%.') then return 'gpt2' end
    if name == 'shared.weight' or name:find('^encoder%.block%.') then return 't5' end
  end
  fail('%s holds neither a Llama (model.embed_tokens.weight), a GPT-2 (transformer.wte.weight) nor a T5 '
    .. '(shared.weight) model', where)
end

-- The model file of each family: T5's, and the decoders' (GPT-2 and the
-- declared families), which models.decoders has loaded.
local MODULES = { t5 = t5 }
for name, fam in pairs(decoders.families) do MODULES[name] = fam.module end
local function module_of(family) return MODULES[family] end

-- A decoder's config from its weights' shapes (name -> shape): layers,
-- width, vocabulary, MLP width, KV width; what shapes cannot tell (heads,
-- RoPE, norm eps) from opts.model's config (a --model name) and
-- opts.num_heads / opts.num_kv_heads.
local function config_from_shapes(family, shapes, opts, where)
  if family == 't5' then
    local named = opts.model and opts.model ~= '' and module_of('t5').configs[opts.model]
    if not named and not opts.t5_config then
      fail('%s: a T5 state dict does not say the model\'s heads and sizes: give --model (a T5 config name) and '
        .. 'the size options it was trained with', where)
    end
    return opts.t5_config or module_of('t5').config(opts.model, opts.overrides)
  end
  local fam = module_of(family)
  local base, name = {}, opts.model or ''
  if name ~= '' then
    local named_family, config_name = decoders.resolve(name)
    if named_family ~= family then
      fail('--model %s is a %s config, but %s holds a %s model', name, tostring(named_family), where, family)
    end
    name = config_name
    base = fam.configs[name]
  elseif (opts.num_heads or 0) == 0 then
    fail('%s: give --model (a %s config name) or --num_heads: the weights do not say how many attention heads '
      .. 'the model has', where, family)
  end
  local function shape(key)
    if not shapes[key] then fail('%s has no %s, which a %s model has', where, key, family) end
    return shapes[key]
  end
  local layers = -1
  for n in pairs(shapes) do
    local i = tonumber(n:match('^model%.layers%.(%d+)%.') or n:match('^transformer%.h%.(%d+)%.'))
    if i and i > layers then layers = i end
  end
  local o = { n_layers = layers + 1 }
  local heads = (opts.num_heads or 0) > 0 and opts.num_heads or base.n_heads
  o.n_heads = heads
  if family == 'llama' then
    local emb = shape('model.embed_tokens.weight')
    o.vocab_size, o.dim = emb[1], emb[2]
    o.ffn_dim = shape('model.layers.0.mlp.gate_proj.weight')[1]
    local q, k = shape('model.layers.0.self_attn.q_proj.weight')[1], shape('model.layers.0.self_attn.k_proj.weight')[1]
    if q % heads ~= 0 then fail('%s: q_proj has %d rows, not a multiple of %d heads (give --num_heads)', where, q, heads) end
    o.head_dim = q / heads
    o.n_kv_heads = (opts.num_kv_heads or 0) > 0 and opts.num_kv_heads or k / o.head_dim
    o.tied = shapes['lm_head.weight'] == nil
  else
    local wte, wpe = shape('transformer.wte.weight'), shape('transformer.wpe.weight')
    o.vocab_size, o.dim, o.max_seq_len = wte[1], wte[2], wpe[1]
    o.ffn_dim = shape('transformer.h.0.mlp.c_fc.weight')[1]
  end
  for k, v in pairs(opts.overrides or {}) do o[k] = v end
  local ok, c = pcall(fam.config, name ~= '' and name or o, name ~= '' and o or nil)
  if not ok then fail('%s: %s', where, bare(c)) end
  return c
end

-- The config a state dict or checkpoint was given (from its record or
-- the caller's options) against its shapes, on a model built on meta (no
-- memory): a tensor whose shape differs is named with both shapes before
-- anything is built for real.
local function check_shapes(family, config, shapes, where)
  local build = family == 't5' and module_of('t5').Model or module_of(family).build
  local model = build(config, { device = 'meta' })
  for _, np in ipairs(model:named_parameters()) do
    local have = shapes[np[1]]
    if have and table.concat(have, ',') ~= table.concat(np[2].shape, ',') then
      fail('%s: %s is [%s] there, [%s] in the %s model configured (%s)', where, np[1], table.concat(have, ', '),
        table.concat(np[2].shape, ', '), family, family == 't5' and 'give --model and the size options it was '
          .. 'trained with' or 'give the --model or --num_heads it was trained with')
    end
  end
end

local function accepted(family, opts, where)
  local list = opts.families or { 'llama', 'gpt2', 't5' }
  -- 'decoders': every decoder family (models/decoders.lua)
  if list == 'decoders' then list = decoders.ORDER end
  for _, f in ipairs(list) do
    if f == family then return end
  end
  fail('%s holds a %s model; %s takes %s', where, family, opts.who or 'this recipe', table.concat(list, ' or '))
end

-- [Note: the fingerprint of a LoRA base]
-- A LoRA checkpoint holds the adapters only; its frozen base is the
-- --init_from the run started from, named by path. Files at a path can be
-- replaced, and adapters on another base are silently wrong: so the
-- checkpoint also records the base's fingerprint, and every later load
-- (resume, generate, export, --init_from) compares it with what the path
-- holds now, refusing a difference by naming both. The fingerprint is an
-- XXH3-64 over: an HF directory's config.json; for each weight file (in
-- name order) its name, size, header (every tensor's name, dtype, shape
-- and offsets) and SAMPLES evenly spaced blocks of its data, the last
-- one included; for one of our checkpoints, its index, which holds each
-- file's checksum of all its data. The sampled blocks catch another
-- model of the same shapes (every block of its weights differs) while
-- reading ~4 MB per file, not the whole base at every start; an edit of a
-- few bytes between samples is not what it guards against.
local SAMPLES, SAMPLE_BYTES = 64, 64 * 1024

local ffi = require 'ffi'
local function xxh3(bytes) return core.C.fl_checksum(bytes, #bytes) end
local function hex(v)
  local out = ffi.new('char[?]', core.C.FL_CHECKSUM_TEXT)
  core.C.fl_checksum_text(v, out)
  return ffi.string(out)
end

-- The parts of one safetensors file that its fingerprint covers.
local function weight_file_parts(path, parts)
  local f = assert(io.open(path, 'rb'))
  local size = f:seek('end')
  f:seek('set', 0)
  local prefix = f:read(8) or ''
  local n = 0
  for i = 8, 1, -1 do n = n * 256 + (prefix:byte(i) or 0) end
  if #prefix < 8 or n > size - 8 then
    f:close()
    fail('%s: not a safetensors file (its header length %d does not fit in %d bytes)', path, n, size)
  end
  parts[#parts + 1] = ('%s %d %s'):format(path:match('[^/]*$'), size, hex(xxh3(f:read(n))))
  local data, len = 8 + n, size - 8 - n
  local step = math.max(SAMPLE_BYTES, math.floor(len / SAMPLES))
  for at = 0, len - 1, step do
    f:seek('set', data + math.min(at, math.max(len - SAMPLE_BYTES, 0)))
    parts[#parts + 1] = hex(xxh3(f:read(SAMPLE_BYTES) or ''))
  end
  f:close()
end

-- src's fingerprint (see the Note): "xxh3-64:<16 hex>", computed once.
function M.fingerprint(src)
  if src.fingerprint then return src.fingerprint end
  local parts = {}
  if src.kind == 'checkpoint' then
    parts[1] = files.read(files.join(src.step_dir, ckpt.directory.INDEX)) or ''
  else
    local weights = { src.path }
    if src.kind == 'hf' then
      parts[1] = files.read(files.join(src.path, 'config.json')) or ''
      weights = st.open_checkpoint(src.path)._files
      table.sort(weights)
    end
    for _, path in ipairs(weights) do weight_file_parts(path, parts) end
  end
  src.fingerprint = hex(xxh3(table.concat(parts, '\n')))
  return src.fingerprint
end

-- Refuse `src` as the base of adapters trained on a base whose
-- fingerprint was `recorded` (nil: a checkpoint from before fingerprints,
-- taken as it is). what: the checkpoint, for the message.
local function check_base(src, recorded, what)
  if recorded == nil then return end
  local now = M.fingerprint(src)
  if now ~= recorded then
    fail('%s holds LoRA adapters trained on a base with fingerprint %s, but %s now has %s: the files there have '
      .. 'changed (give --init_from the base the adapters were trained on)', what, recorded, M.describe(src), now)
  end
end

-- What `path` holds, from its headers and JSON (no tensor is read):
-- {path, kind = 'hf' | 'checkpoint' | 'state_dict', family, config (ours,
-- complete), where (what messages name: the config.json, the step
-- directory or the file), hf_dir, hf (config.json), step_dir, index}.
-- opts: families (the ones accepted; default all), who (the program, for
-- messages), overrides (config fields every kind takes, e.g. dropout),
-- and for sources that tell only shapes: model (a config name, '' none),
-- num_heads, num_kv_heads, t5_config (the config to use for a T5 state
-- dict). Raises one line naming the path and what is wrong.
function M.open(path, opts)
  opts = opts or {}
  local mode = files.mode(path)
  -- OWNER/NAME[@REVISION] that is not a local path: the Hugging Face
  -- cache's snapshot ([Note: the hub cache] in fsdp.data.hub); a local
  -- directory of that name wins.
  local hub_name
  if not mode and hub.is_model_name(path) then
    local ok, dir = pcall(hub.model_dir, path)
    if not ok then fail('%s', bare(dir)) end
    hub_name, path, mode = path, dir, files.mode(dir)
  end
  if not mode then fail('%s does not exist%s', path, publish.missing_hint(path)) end
  local src = { path = path }
  -- Our unfinished or mixed export is refused as such, whatever it holds.
  local checked, why = pcall(publish.check, path)
  if not checked then fail('%s', bare(why)) end
  local config_json = mode == 'directory' and files.join(path, 'config.json')
  local is_hf = false
  if config_json then
    -- a FIFO or a device named config.json is refused, not taken for absent
    local ok, is = pcall(files.is_file, config_json)
    if not ok then fail('%s', is) end
    is_hf = is
  end
  if is_hf then
    -- The family first: another family's config refuses this one's overrides.
    local h0 = json.decode(files.read(config_json) or '')
    if type(h0) == 'table' and MODULES[h0.model_type] then accepted(h0.model_type, opts, files.join(path, 'config.json')) end
    local ok, c, family, h = pcall(hf.read_config, path, opts.overrides)
    if not ok then fail('%s', bare(c)) end
    src.kind, src.family, src.config, src.hf, src.hf_dir = 'hf', family, c, h, path
    src.where = files.join(path, 'config.json')
  elseif mode == 'directory' then
    local is_step = files.mode(files.join(path, ckpt.directory.INDEX)) == 'file'
    local has_safetensors = false
    for _, n in ipairs(files.list(path)) do
      if n:match('%.safetensors$') then has_safetensors = true end
    end
    if not is_step and not ckpt.directory.latest(path) and #ckpt.directory.scan(path).incomplete == 0 then
      fail('%s is neither a Hugging Face model directory (it has no config.json%s) nor a checkpoint directory '
        .. '(no step-NNNNNN/ saves)', path, has_safetensors and ', only safetensors files' or '')
    end
    local ok, step_dir = pcall(ckpt.resolve, path)
    if not ok then fail('%s', bare(step_dir):gsub('^checkpointing%.load: ', '')) end
    local ok2, index = pcall(ckpt.directory.read_index, step_dir)
    if not ok2 then fail('%s', bare(index)) end
    src.kind, src.step_dir, src.index, src.where = 'checkpoint', step_dir, index, step_dir
    local extra = type(index.extra) == 'table' and index.extra or {}
    if type(extra.config) == 'table' and MODULES[extra.family] then
      src.family = extra.family
      accepted(src.family, opts, step_dir)
      local ok3, c = pcall(module_of(src.family).config, extra.config, opts.overrides)
      if not ok3 then fail('%s: the recorded model config: %s', step_dir, bare(c)) end
      src.config = c
      src.token_ids = type(extra.token_ids) == 'table' and extra.token_ids or nil
      if type(extra.tokenizer_from) == 'string' and files.mode(extra.tokenizer_from) == 'directory' then
        src.tokenizer_from = extra.tokenizer_from
      end
      -- A LoRA run's checkpoint holds the adapters; its frozen base is the
      -- --init_from it started from ([Note: what a LoRA checkpoint holds]).
      if type(index.lora) == 'table' then
        if type(extra.init_from) ~= 'string' or extra.init_from == '' then
          fail('%s holds LoRA adapters of a run that did not start from --init_from: its base weights are in no '
            .. 'file', step_dir)
        end
        local ok4, base = pcall(M.open, extra.init_from, { families = opts.families, who = opts.who,
                                                           overrides = opts.overrides })
        if not ok4 then fail('%s: the LoRA base it was trained on: %s', step_dir, bare(base)) end
        check_base(base, extra.init_from_fingerprint, step_dir)
        src.lora, src.base = index.lora, base
      end
    else
      local shapes = {}
      for name, p in pairs(ckpt_parts.saved_params(index)) do shapes[name] = p.shape end
      src.family = family_of_names(shapes, step_dir)
      accepted(src.family, opts, step_dir)
      local o = {}
      for k, v in pairs(opts) do o[k] = v end
      if (o.model or '') == '' and type(extra.model) == 'string' then o.model = extra.model end
      src.config = config_from_shapes(src.family, shapes, o, step_dir)
      check_shapes(src.family, src.config, shapes, step_dir)
    end
  else
    local ok, f = pcall(fsdp.safetensors.open, path)
    if not ok then
      fail('%s: not a Hugging Face directory (no config.json), a checkpoint directory or a safetensors file: %s',
        path, bare(f))
    end
    local shapes = {}
    for _, n in ipairs(f:names()) do shapes[n] = f:info(n).shape end
    f:close()
    src.kind, src.where = 'state_dict', path
    src.family = family_of_names(shapes, path)
    accepted(src.family, opts, path)
    src.config = config_from_shapes(src.family, shapes, opts, path)
    check_shapes(src.family, src.config, shapes, path)
  end
  accepted(src.family, opts, src.where)
  src.hub_name = hub_name
  if src.kind == 'hf' then
    src.token_ids = hf.token_ids(path)
    src.tokenizer_from = path
  end
  return src
end

-- [Note: sizes are bounded before building] in fsdp.sharding.fit: a
-- config's sizes held to what this machine can hold, from the config
-- alone, naming what set them: the config.json and its keys for an HF
-- directory, the checkpoint's recorded config, or the options (opts.options:
-- field -> option, as written in opts.written; opts.model: the --model
-- value; opts.source: what names src, default '--init_from'). opts.weights,
-- dtype, shards, extra, fix, rows: as fit.bound's. Raises one line.
function M.bound(cfg, family, c, src, opts)
  opts = opts or {}
  local params, blocks, fields = common.size_of(family, c)
  local where, name_of
  local source = opts.source or '--init_from'
  if src and src.kind == 'hf' then
    where, name_of = source .. ' ' .. src.where, function(f) return hf.key_of(family, f) or f end
  elseif src then
    where = ('%s %s (its model config)'):format(source, src.where)
  else
    local written = opts.written or {}
    where = opts.model and ('--model ' .. opts.model) or 'the model'
    -- an option given as --name, the others by the option's name alone
    name_of = function(f)
      local o = (opts.options or {})[f]
      if o and written[o] then return '--' .. written[o] end
      return o or f
    end
  end
  fit.bound(cfg, { params = params, blocks = blocks, dtype = opts.dtype, shards = opts.shards, extra = opts.extra,
                   weights = opts.weights, fix = opts.fix, rows = opts.rows,
                   what = where .. ': ' .. fit.sizes_text(c, fields, name_of) })
end

-- One line for the log: "Hugging Face directory X (llama)".
function M.describe(src)
  local kind = src.kind == 'hf' and 'Hugging Face directory' or src.kind == 'checkpoint' and 'checkpoint'
               or 'full state dict'
  return ('%s %s (%s)'):format(kind, src.kind == 'checkpoint' and src.step_dir or src.path, src.family)
end

-- The recipe's size options that contradict the source's config: given is
-- a list of {field, value, option as written} for the options the user
-- set; raises naming the first that differs and the source.
function M.check_sizes(src, given)
  for _, g in ipairs(given) do
    local field, value, option = g[1], g[2], g[3]
    if src.config[field] ~= value then
      fail('--%s=%s contradicts --init_from %s, whose model has %s %s (leave --%s out: the weights decide it)',
        option, tostring(value), src.where, field, tostring(src.config[field]), option)
    end
  end
end

-- --init_from opened and checked against the other options (from_options).
local function open_option(cfg, written, opts)
  local given_model = written.model ~= nil
  local ok, src = pcall(M.open, cfg.init_from, {
    families = opts.families, who = opts.who, overrides = opts.overrides, t5_config = opts.t5_config,
    model = given_model and cfg.model or '', num_heads = cfg.num_heads, num_kv_heads = cfg.num_kv_heads })
  if not ok then fail('--init_from %s', bare(src)) end
  if given_model and opts.family_of_model then
    local family = opts.family_of_model(cfg.model)
    if family ~= src.family then
      fail('--%s=%s is a %s model, but --init_from %s holds a %s model (leave --%s out)', written.model, cfg.model,
        tostring(family), src.where, src.family, written.model)
    end
  end
  if not given_model then cfg.model = '' end
  -- A LoRA run freezes a base it loads whole; our training checkpoints of
  -- a LoRA run hold adapters only, and a full one's weights load as the
  -- export of it does.
  if (cfg.lora_rank or 0) > 0 and src.kind == 'checkpoint' then
    fail('--init_from %s is a training checkpoint; with --lora_rank start from a Hugging Face directory or a full '
      .. 'state dict (tools/export.lua %s DIR writes one from the checkpoint)', cfg.init_from, cfg.init_from)
  end
  local given = {}
  for _, o in ipairs(opts.sizes or {}) do
    local v = cfg[o[2]]
    if v and v ~= 0 then given[#given + 1] = { o[1], v, written[o[2]] or o[2] } end
  end
  M.check_sizes(src, given)
  return src
end

-- A recipe's --init_from, opened and checked against its other options
-- (call it in the recipe's option checks, options.config's fourth
-- argument; written: the names the options were given under). Returns
-- the source, or nil without --init_from. opts: families and who (as
-- open's), overrides and t5_config (as open's), sizes ({{config field,
-- option}...}: a size option given must agree with the weights), and
-- family_of_model (name -> the family a --model names: a --model given
-- must be of the weights' family). A --model not given is cleared: the
-- weights' config is the model, not the default's name. --export_hf is
-- checked here too (export_problem), so a run never trains for hours to
-- find at the end that its export would overwrite --init_from or cannot
-- replace the directory.
function M.from_options(cfg, written, opts)
  local src = cfg.init_from ~= '' and open_option(cfg, written, opts) or nil
  if (cfg.export_hf or '') ~= '' then
    local why = M.export_problem(cfg.export_hf, src, '--' .. (written.export_hf or 'export_hf'), {
      { '--' .. (written.init_from or 'init_from'), src and src.path, 'the weights this run starts from' },
      { '--checkpoint_dir', cfg.checkpoint_dir, "the run's checkpoints" } })
    if why then fail('%s', why) end
  end
  return src
end

-- Why an export to dir (the option or argument `what` names it) must be
-- refused, or nil: it is, or holds, a directory the model comes from
-- (src's path, the Hugging Face directory a checkpoint's run started from,
-- a LoRA base, the tokenizer directory; and `other`: {name, path, what it
-- holds} each), which an export there would destroy; or it is not a
-- directory an export may replace (fsdp.io.publish: an export replaces
-- its directory whole).
function M.export_problem(dir, src, what, other)
  local kept = {}
  local function add(name, path, holds)
    if type(path) == 'string' and path ~= '' then kept[#kept + 1] = { name, path, holds } end
  end
  for _, o in ipairs(other or {}) do add(o[1] .. ' ' .. tostring(o[2]), o[2], o[3]) end
  if src then
    local starts = 'the weights this model starts from'
    local extra = src.index and type(src.index.extra) == 'table' and src.index.extra or {}
    add(('%s, the Hugging Face directory that %s was trained from'):format(tostring(extra.init_from), src.path),
      extra.init_from, starts)
    if src.base then add(('%s, the LoRA base of %s'):format(src.base.path, src.path), src.base.path, starts) end
    add(('%s, the tokenizer directory of %s'):format(tostring(src.tokenizer_from), src.path), src.tokenizer_from,
      'the tokenizer files the export copies')
  end
  local real = files.realpath((dir:gsub('(.)/+$', '%1'))) or dir
  for _, k in ipairs(kept) do
    local p = files.realpath(k[2])
    if p and p == real then
      return ('%s %s is %s: an export there would overwrite %s; give another directory'):format(what, dir, k[1],
        k[3])
    elseif p and p:sub(1, #real + 1) == real .. '/' then
      return ('%s %s holds %s: an export replaces its directory whole and would delete %s; give another directory')
        :format(what, dir, k[1], k[3])
    end
  end
  local why = publish.problem(dir)
  if why then return ('%s: %s'):format(what, why) end
  return nil
end

-- The model src holds, built from src.config with `place` ({device,
-- dtype}; 'meta' to shard it next), with src's LoRA adapters applied
-- when it is a LoRA run's checkpoint (no values yet: M.load).
function M.build(src, place)
  local model
  if src.family == 't5' then
    model = module_of('t5').Model(src.config, place)
  else
    model = decoders.families[src.family].module.build(src.config, place)
  end
  if src.lora then
    lora.apply(model, { rank = src.lora.rank, alpha = src.lora.alpha, rslora = src.lora.rslora,
                                        targets = src.lora.targets })
  end
  return model
end

-- Copy the weights of src (from open) into model, built by M.build,
-- sharded or not: a LoRA checkpoint's base from its --init_from, then its
-- adapters. Collective for a checkpoint (its files are checked by all
-- ranks together first). Raises naming the path and the tensor at fault.
function M.load(model, src)
  if src.lora then M.load(model, src.base) end
  -- New LoRA adapters are not in the pretrained weights: they keep their init.
  local adapters = lora.config_of(model) and lora.is_adapter or nil
  local ok, err = pcall(function()
    if src.kind == 'hf' then
      hf.load_weights(model, src.path, { allow_missing = adapters })
    elseif src.kind == 'checkpoint' and adapters and not src.lora then
      core.fail('a training checkpoint does not load under new LoRA adapters (tools/export.lua writes it as a '
        .. 'Hugging Face directory, which does)')
    elseif src.kind == 'checkpoint' then
      local index, why = ckpt.check(src.step_dir)
      if not index then core.fail(why) end
      ckpt.load(src.step_dir, { model = model, weights_only = true }, index)
    else
      fsdp.load_safetensors_into(model, src.path, { allow_missing = adapters })
    end
  end)
  if not ok then fail('--init_from %s: %s', src.path, bare(err)) end
  -- Weights that are not finite would make every logit NaN (generation
  -- exits 0 with garbage) or be exported as they are: the values loaded
  -- are checked, one C pass over this rank's part (collective when
  -- sharded over several ranks).
  local name = nonfinite.first_nonfinite(model, true)
  if name then
    local file = src.where
    if src.kind == 'hf' then
      local ok2, f = pcall(function() return st.open_checkpoint(src.path):file_of(name) end)
      if ok2 and f then file = f end
    end
    fail('--init_from %s: %s holds NaN or infinite values (%s)', src.path, name, file)
  end
end

-- rank 0's line ("[rank 0] " first with several ranks; fsdp.console)
local function say(msg) console.print(msg) end

-- A training recipe's start, after its --resume_from_checkpoint (which
-- returned start_step): src's weights into the (sharded) model, unless a
-- checkpoint of the run was resumed: then the run goes on from there and
-- the log says --init_from was not used.
function M.start(cfg, model, src, start_step, resumed)
  if not src then return end
  -- A LoRA run's checkpoint holds only the adapters: its frozen base comes
  -- from --init_from again, which must be the base they were trained on.
  local is_lora = lora.config_of(model) ~= nil
  if start_step > 0 and is_lora then
    local extra = resumed and type(resumed.extra) == 'table' and resumed.extra or {}
    check_base(src, extra.init_from_fingerprint, ('the checkpoint of step %d in %s'):format(start_step,
      cfg.checkpoint_dir))
    local t0 = clock.now()
    M.load(model, src)
    say(('init_from: loaded the LoRA base %s in %.2f s under the adapters resumed from step %d'):format(
      M.describe(src), clock.now() - t0, start_step))
    return
  end
  if start_step > 0 then
    say(('init_from: %s not loaded: resumed from the checkpoint in %s instead (--resume_from_checkpoint wins '
      .. 'once a checkpoint exists)'):format(M.describe(src), cfg.checkpoint_dir))
    return
  end
  local t0 = clock.now()
  M.load(model, src)
  say(('init_from: loaded %s in %.2f s (a fresh optimizer, step 0)'):format(M.describe(src), clock.now() - t0))
end

-- What a recipe records about its model in each checkpoint (see the Note
-- at the top): family and config name, the whole config, and what an
-- export needs from the --init_from source.
function M.extra(model_name, family, config, src)
  return { model = model_name, family = family, config = config, init_from = src and src.path or nil,
           init_from_dtype = src and M.source_dtype(src) or nil,
           init_from_fingerprint = src and M.fingerprint(src) or nil,
           token_ids = src and src.token_ids or nil, tokenizer_from = src and src.tokenizer_from or nil }
end

-- The dtype src's weights came in: an HF directory's config.json dtype
-- (torch_dtype), or what a checkpoint recorded of the HF directory its run
-- started from (M.extra); nil when unknown.
function M.source_dtype(src)
  if src.kind == 'hf' then return hf.source_dtype(src.path) end
  local extra = src.index and type(src.index.extra) == 'table' and src.index.extra or {}
  local d = extra.init_from_dtype
  if d == 'f32' or d == 'bf16' or d == 'f16' then return d end
  if src.base then return M.source_dtype(src.base) end
  return nil
end

-- The dtype an export writes for --export_dtype `choice` ('auto', 'f32',
-- 'bf16'; [Note: export dtype] in models/hf.lua): auto is src's
-- (M.source_dtype), else nil (each parameter's own dtype: the trained
-- master weights).
function M.export_dtype(choice, src)
  if choice == nil or choice == '' or choice == 'auto' then return src and M.source_dtype(src) or nil end
  return choice
end

-- --export_hf: the trained model (sharded or not; collective) as a Hugging
-- Face directory, with the token ids and tokenizer files of src (the
-- --init_from source, or nil). A LoRA model writes, by --export_lora,
-- the base with the adapters merged into it (gathered whole on rank 0:
-- the merge needs a layer's base weight and adapters together) or PEFT's
-- adapter files. Returns the seconds it took.
function M.export(cfg, model, src)
  if (cfg.export_hf or '') == '' then return end
  local t0 = clock.now()
  local what, how = 'Hugging Face ' .. hf.family_of_model(model).name, ''
  local ok, err
  if lora.config_of(model) and cfg.export_lora == 'adapter' then
    what, how = 'PEFT', ' adapter files for ' .. (src and src.path or 'the base')
    ok, err = pcall(lora.save_peft, model, cfg.export_hf, { base_model_name_or_path = src and src.path })
  else
    local state
    if lora.config_of(model) then
      how = ' with the LoRA adapters merged'
      state = lora.merged_state_dict(model, { rank0_only = true })
    end
    local dtype = M.export_dtype(cfg.export_dtype, src)
    if dtype then how = how .. ' in ' .. dtype end
    ok, err = pcall(hf.save_pretrained, model, cfg.export_hf, {
      max_shard_size = cfg.export_max_shard_size, token_ids = src and src.token_ids,
      tokenizer_from = src and src.tokenizer_from, state = state, dtype = dtype,
    })
  end
  if not ok then fail('--export_hf %s: %s', cfg.export_hf, bare(err)) end
  local dt = clock.now() - t0
  say(('export: wrote %s (%s)%s in %.2f s'):format(cfg.export_hf, what, how, dt))
  return dt
end

return M
