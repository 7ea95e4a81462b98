-- tools/export.lua: a sharded training checkpoint (saved on any number of
-- ranks) as a Hugging Face model directory, offline, in one process.
--
--   fsdp-lua tools/export.lua CHECKPOINT DIR
--   fsdp-lua tools/export.lua ckpt/step-000300 out/llama --max_shard_size=2GB --export_dtype=bf16
--
-- CHECKPOINT is what --init_from takes (models/pretrained.lua): a checkpoint
-- directory (its newest complete step), one step directory, or a full
-- state dict file. A checkpoint saved by a recipe records its model config,
-- the Hugging Face directory its run started from and that directory's
-- token ids, so DIR gets config.json, the weights (numbered files and an
-- index past --max_shard_size), generation_config.json and the tokenizer
-- files of that directory, as the recipes' --export_hf writes them. Older
-- checkpoints and state dicts tell only shapes: give --model or
-- --num_heads for the rest. The model is rebuilt whole in this process
-- (each parameter read from the saved ranks' slices), so the machine needs
-- its size in memory once. DIR is built beside it and swapped in whole,
-- so it must be missing, empty or an earlier export; a kill leaves the
-- old export or the new one ([Note: exports are published whole] in
-- lua/fsdp/io/publish.lua).
local options = require 'fsdp.options'
local clock = require 'fsdp.clock'
local hf = require 'models.hf'
local pretrained = require 'models.pretrained'

local cfg, positional = options.config({
  max_shard_size = { '5GB', 'the largest weight file; more go in numbered files and an index',
                     check = function(v)
                       local ok, err = pcall(require('fsdp.io.safetensors_sharded').parse_size, v)
                       if not ok then return (tostring(err):gsub('^.-max_shard_size ', '')) end
                     end },
  model = { '', 'for checkpoints that do not record their config: a model config name for what the weights do not '
                .. 'tell (heads, RoPE)' },
  num_heads = { 0, 'for checkpoints that do not record their config: attention heads', int = true, min = 0 },
  num_kv_heads = { 0, 'for checkpoints that do not record their config: key/value heads (0: from the weights)',
                   int = true, min = 0 },
  export_dtype = { 'auto', "the dtype of the weights written: auto (what the checkpoint's run started from, as its "
                           .. "Hugging Face directory's config.json named it; else the saved parameters' dtype), f32 "
                           .. 'or bf16', one_of = { 'auto', 'f32', 'bf16' } },
  tokenizer_from = { '', 'copy the tokenizer files of this directory (default: the Hugging Face directory the run '
                         .. 'started from, when the checkpoint records one)', input = 'dir' },
}, arg, 'tools/export.lua', nil, { positional = 'CHECKPOINT DIR' })

local function usage(msg) options.usage_error('tools/export.lua: ' .. msg) end

if #positional ~= 2 then usage('give CHECKPOINT DIR (a checkpoint, step directory or state dict, and the output directory)') end
local from, out = positional[1], positional[2]
-- DIR first: a bad output path is found before anything is read.
local ok, err = pcall(options.validate, { out = { '', '', output = 'dir' } }, { out = out })
if not ok then usage((options.bare(err):gsub('^%-%-out', 'DIR'))) end

local t0 = clock.now()
local opened, src = pcall(pretrained.open, from, { who = 'tools/export.lua', model = cfg.model,
                                                   num_heads = cfg.num_heads, num_kv_heads = cfg.num_kv_heads })
if not opened then usage(options.bare(src)) end
if src.kind == 'hf' then usage(('%s is a Hugging Face directory already'):format(from)) end
-- DIR is replaced whole (fsdp.io.publish): never over what the model
-- comes from, only over a missing, empty or earlier export directory.
local why = pretrained.export_problem(out, src, 'DIR', {
  { 'CHECKPOINT', from, 'the checkpoint being exported' },
  { '--tokenizer_from', cfg.tokenizer_from, 'the tokenizer files the export copies' } })
if why then usage(why) end
-- The model is built whole here: its sizes against this machine first
-- ([Note: sizes are bounded before building] in fsdp.sharding.fit).
local bounded, too_big = pcall(pretrained.bound, {}, src.family, src.config, src, { source = 'CHECKPOINT',
  dtype = require('fsdp').get_default_dtype() })
if not bounded then usage(options.bare(too_big)) end

local model = pretrained.build(src, { device = 'cpu' })
local loaded, why = pcall(pretrained.load, model, src)
if not loaded then
  io.stderr:write('fsdp-lua: tools/export.lua: ', options.bare(why), '\n')
  os.exit(1, true) -- (the state closed: the model's tensors are freed, as a sanitizer checks)
end
-- A LoRA run's checkpoint (adapters on its --init_from base): exported merged.
local lora = require 'fsdp.lora'
if lora.config_of(model) then lora.merge(model) end
local saved, written = pcall(hf.save_pretrained, model, out, {
  max_shard_size = cfg.max_shard_size, token_ids = src.token_ids,
  dtype = pretrained.export_dtype(cfg.export_dtype, src),
  tokenizer_from = cfg.tokenizer_from ~= '' and cfg.tokenizer_from or src.tokenizer_from,
})
if not saved then
  io.stderr:write('fsdp-lua: tools/export.lua: ', options.bare(written), '\n')
  os.exit(1, true)
end
print(('export: %s, %d parameters -> %s (%d weight file%s, config.json) in %.2f s'):format(pretrained.describe(src),
  model:num_parameters(), out, #written, #written == 1 and '' or 's', clock.now() - t0))
