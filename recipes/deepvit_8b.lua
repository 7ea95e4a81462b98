-- recipes/deepvit_8b.lua: the DeepViT 8B experiment of the seed (images
-- 256x256 in 32x32 patches, width 1024, 952 re-attention blocks, 10000
-- classes), sharded over the job's ranks: --dry-run builds it at full size on
-- meta; reduced sizes train on CPU with synthetic image classes.
--
--   fsdp-lua recipes/deepvit_8b.lua --dry-run
--   fsdp-lua recipes/deepvit_8b.lua --depth=2 --dim=128 --heads=4 --mlp_dim=256 \
--            --image_size=64 --num_classes=10 --max_steps=50
--
-- Activation checkpointing applies to DeepViTBlock, the class the seed's
-- wrap and checkpoint policies name; --optimizer=anyprecision uses
-- AnyPrecisionAdamW (bf16 states) as the seed can.
local fsdp = require 'fsdp'
local options = require 'fsdp.options'
local shard_options = require 'fsdp.sharding.options'
local fit = require 'fsdp.sharding.fit'
local ckpt_options = require 'fsdp.checkpointing.options'
local nonfinite = require 'fsdp.nonfinite'
local accumulate = require 'fsdp.sharding.accumulate'
local deepvit = require 'models.deepvit'
local optim = require 'fsdp.optim'
local clock = require 'fsdp.clock'
local images = require 'fsdp.data.images'
local metrics = require 'fsdp.observe.metrics'
local console = require 'fsdp.observe.console'
local profiler = require 'fsdp.observe.profiler'
local F = fsdp.F

-- Each option carries its constraints; they and the model config they
-- make are checked before anything is built: a bad one is one line naming
-- it, exit status 2.
local c
local cfg = options.config(metrics.options(nonfinite.options(ckpt_options.options(shard_options.options(accumulate.options({
  model = { '8B', 'config: 60M, 1B, 3B, 8B, tiny', one_of = function() return options.keys(deepvit.configs) end },
  depth = { 0, 'override the number of blocks (0: keep)', int = true, min = 0 },
  dim = { 0, 'override the width (0: keep)', int = true, min = 0 },
  heads = { 0, 'override the heads (0: keep)', int = true, min = 0 },
  mlp_dim = { 0, 'override the MLP width (0: keep)', int = true, min = 0 },
  image_size = { 0, 'override the image size (0: keep)', int = true, min = 0, multiple_of = 'patch_size' },
  patch_size = { 0, 'override the patch size (0: keep)', int = true, min = 0 },
  num_classes = { 0, 'override the classes (0: keep)', int = true, min = 0 },
  batch_size = { 8, 'images per step', int = true, min = 1 },
  max_steps = { 50, 'optimizer steps', int = true, min = 1 },
  lr = { 1e-3, 'learning rate', positive = true },
  optimizer = { 'adamw', 'adamw or anyprecision (AnyPrecisionAdamW, bf16 states)', one_of = { 'adamw', 'anyprecision' } },
  dropout = { -1, 'override dropout (-1: keep the config\'s 0.1)', check = function(v)
    if v ~= -1 and not (v >= 0 and v < 1) then return 'must be -1 (keep) or in [0, 1), got ' .. v end
  end },
  seed = { 0, 'initialisation and data seed', int = true, min = 0 },
  log_every = { 5, 'steps between log lines (averages since the previous one)', int = true, min = 1 },
  dry_run = { false, 'build at full size on meta, print it, and exit' },
  data = { '', 'directory of raw images (train_images.u8, train_labels.txt; fsdp.data.images); empty: synthetic',
           input = 'dir' },
  validation_freq = { 0, 'steps between validations (0: never); on the val_* files of --data', int = true, min = 0 },
  val_batches = { 4, 'batches per validation', int = true, min = 1 },
  peak_tflops = require('fsdp.sharding.device').peak_tflops_option(),
}))))), arg, 'recipes/deepvit_8b.lua', function(cfg, written)
  local overrides = {}
  for _, k in ipairs({ 'depth', 'dim', 'heads', 'mlp_dim', 'image_size', 'patch_size', 'num_classes' }) do
    if cfg[k] > 0 then overrides[k] = cfg[k] end
  end
  if cfg.dropout >= 0 then overrides.dropout, overrides.emb_dropout = cfg.dropout, cfg.dropout end
  local ok, err = pcall(deepvit.config, cfg.model, overrides)
  local names = {}
  for _, k in ipairs({ 'depth', 'dim', 'heads', 'mlp_dim', 'image_size', 'patch_size', 'num_classes', 'dropout' }) do
    names[k] = k
  end
  if not ok then error(options.explain(err, names), 0) end
  c = err
  -- The sizes against this machine before anything is built, even on
  -- meta ([Note: sizes are bounded before building] in fsdp.sharding.fit).
  require('models.pretrained').bound(cfg, 'deepvit', c, nil, {
    model = cfg.model, options = names, written = written, weights = not (cfg.dry_run or cfg.plan),
    rows = not cfg.dry_run and { cfg.batch_size * (c.num_patches + 1), ('--batch_size %d x %d tokens an image')
      :format(cfg.batch_size, c.num_patches + 1) } or nil,
    shards = fit.weight_shards(cfg),
    fix = 'fewer blocks (--depth) or more ranks' })
end)

if cfg.dry_run then
  local t0 = clock.now()
  local m = deepvit.DeepViT(c, { device = 'meta' })
  print(m)
  print(('parameters: %d'):format(m:num_parameters()))
  print(('training FLOPs per image: %.3e'):format(deepvit.flops_per_image(c)))
  print(('built on meta in %.2f s; cpu memory in use: %d bytes'):format(clock.now() - t0,
    fsdp.memory_stats('cpu').in_use))
  options.expose({ model = m, config = c, cfg = cfg })  -- for the REPL after -i
  return
end

-- --checkpoint_dir is this job's alone from here on (fsdp.checkpointing.options.lock).
ckpt_options.lock(cfg)
fsdp.manual_seed(cfg.seed)
-- On meta, then sharded (one unit per DeepViTBlock, the seed's wrap and
-- checkpoint class): each rank initialises only its shards.
-- --device: the shards, every batch and the loss live there (cpu or cuda:N).
local dev = shard_options.device(cfg)
local model = deepvit.DeepViT(c, { device = 'meta' })
local n_params = model:num_parameters()
-- Refused here, with the planner's numbers, when it cannot fit this machine.
fit.check(model, cfg, deepvit.Block, { batch = cfg.batch_size }, 'recipes/deepvit_8b.lua',
  { layers = 'depth' }, { optimizer = cfg.optimizer == 'anyprecision' and 'anyprecision_adamw' or 'adamw' })
shard_options.apply(model, cfg, deepvit.Block, 'recipes/deepvit_8b.lua')
console.print(('model: %d blocks, width %d, %d heads, image %d / patch %d, %d classes: %d parameters'):format(
  c.depth, c.dim, c.heads, c.image_size, c.patch_size, c.num_classes, n_params))
local Opt = cfg.optimizer == 'anyprecision' and optim.AnyPrecisionAdamW or optim.AdamW
local opt = Opt(model:named_parameters(), { lr = cfg.lr, weight_decay = 0 })

-- Data: synthetic classes (a fixed random image per class plus noise), or
-- raw uint8 images with labels; both with next/batches/state/load_state.
local data, val_data
local image_opts = { channels = c.channels, image_size = c.image_size, num_classes = c.num_classes,
                     batch_size = cfg.batch_size, seed = cfg.seed }
if cfg.data ~= '' then
  data = images.open(cfg.data, image_opts)
  if cfg.validation_freq > 0 then
    image_opts.split, image_opts.shuffle = 'val', false
    val_data = images.open(cfg.data, image_opts)
  end
else
  data = images.synthetic(image_opts)
  val_data = data
end
console.print(('data: %s; chance loss: ln(%d) = %.3f'):format(tostring(data), c.num_classes, math.log(c.num_classes)))

local log = metrics.Logger({
  total_steps = cfg.max_steps, batch_size = cfg.batch_size * cfg.grad_accum_steps, flops_per_sample = deepvit.flops_per_image(c),
  peak_tflops = cfg.peak_tflops, metrics_file = cfg.metrics_file, log_every = cfg.log_every, device = dev,
  tensorboard_dir = cfg.tensorboard_dir, config = cfg, plot = cfg.plot,
  profile_steps = cfg.profile_steps, profile_dir = cfg.profile_dir, model = model, comm_joined = cfg.comm_joined,
})
local state = { model = model, optimizer = opt, data = data }
state.guard = nonfinite.guard(cfg, state, 'recipes/deepvit_8b.lua')  -- the step, and --on_nonfinite
local start_step = ckpt_options.resume(cfg, state)
if cfg.resume_from_checkpoint then log:resume(start_step) end
for step = start_step + 1, cfg.max_steps do
  log:begin_step(step) -- --profile_steps
  local t0 = clock.now()
  -- --grad_accum_steps micro-batches, gradients reduced once at the last.
  local loss = accumulate.forward_backward(model, cfg.grad_accum_steps, function()
    local x, y = profiler.call('data', 'data', data.next, data)
    return F.cross_entropy(model(x:to(dev)), y:to(dev))
  end)
  local r = profiler.call('optimizer', 'optim', state.guard.step, state.guard, step, loss)
  r.dt = clock.now() - t0
  log:step(step, r)
  if val_data and cfg.validation_freq > 0 and (step % cfg.validation_freq == 0 or step == cfg.max_steps) then
    model:eval()
    log:validation(step, metrics.evaluate(function(vx, vy) return F.cross_entropy(model(vx:to(dev)), vy:to(dev)) end,
      val_data:batches(cfg.val_batches)))
    model:train()
  end
  ckpt_options.after_step(cfg, state, step, { model = cfg.model })
end
log:close()
ckpt_options.finish(cfg, model)
