-- models/decoder_training.lua: what the decoder training recipes share
-- (recipes/llama2_7b.lua on token data, recipes/sft.lua on conversations):
-- the model and optimizer options, the model config they make (from
-- --model and the size overrides, or from --init_from's weights), its
-- checks against this machine before anything is built, the sharded build
-- with LoRA, and AdamW with warmup and cosine decay.
--
--   local dr = require 'models.decoder_training'
--   local cfg = options.config(dr.options({...own...}), arg, script, function(cfg, written)
--     R = dr.resolve(cfg, written, script)      -- family, --init_from source, size overrides
--     ... (R.overrides.vocab_size from the data, say) ...
--     dr.check(R, cfg, written, {rows = ..., dry_run = ..., plan = ...})   -- R.config; bounds, positions, LoRA
--   end)
--   local model, n_params = dr.build(R, cfg, script, {batch =, seq =})   -- sharded, LoRA applied
--   local opt, sched = dr.optimizer(model, cfg)
local fsdp = require 'fsdp'
local options = require 'fsdp.options'
local decoders = require 'models.decoders'
local llama_family = require 'models.families.llama'
local pretrained = require 'models.pretrained'
local lora = require 'fsdp.lora'
local optim = require 'fsdp.optim'
local fit = require 'fsdp.sharding.fit'
local nonfinite = require 'fsdp.nonfinite'
local accumulate = require 'fsdp.sharding.accumulate'
local console = require 'fsdp.observe.console'
local metrics = require 'fsdp.observe.metrics'
local ckpt_options = require 'fsdp.checkpointing.options'
local shard_options = require 'fsdp.sharding.options'
local mesh_mod = require 'fsdp.mesh'
local tp = require 'fsdp.tp'

local M = {}

-- The model's options: a config name and its size overrides (0 keeps the
-- config's), all checked against --init_from's weights when given.
M.MODEL_OPTIONS = {
  model = { 'Llama-2-7b', 'model config (models/llama.lua; GPT-2: gpt2, ..., gpt2-tiny in models/gpt2.lua; '
                          .. 'Qwen2.5-0.5B, '
                          .. 'Qwen3-8B, Mistral-7B-v0.3, Gemma-2-2B, Gemma-3-1B, Phi-3-mini-4k, OLMo-2-1124-7B, '
                          .. 'qwen3-tiny, ... in models/families/); '
                          .. 'with --init_from a directory, its config.json decides', one_of = decoders.names,
            values = llama_family.old_names,
            aliases = { model_type = { llama_v2 = 'Llama-2-7b' } } },
  num_layers = { 0, 'override the number of layers (0: keep the config)', int = true, min = 0 },
  hidden_width = { 0, 'override the model width (0: keep)', int = true, min = 0, multiple_of = 'num_heads' },
  num_heads = { 0, 'override the attention heads (0: keep)', int = true, min = 0, multiple_of = 'num_kv_heads' },
  num_kv_heads = { 0, 'override the key/value heads (0: same as heads)', int = true, min = 0,
                   aliases = { 'num_key_value_heads' } },
  ffn_dim = { 0, 'override the MLP width (0: keep, or 8/3 width rounded up to 32 when the width changes)',
              int = true, min = 0, aliases = { 'intermediate_size' } },
  vocab_size = { 0, 'override the vocabulary (0: keep)', int = true, min = 0 },
  allow_past_max_positions = decoders.OPTIONS.allow_past_max_positions,
  fused_loss = { true, 'the LM head and the cross-entropy as one chunked op in training: the [tokens, vocab] '
                       .. 'logits and their gradient never whole (models/decoder.lua)' },
  loss_chunk_rows = { 0, 'with --fused_loss: token rows per chunk (0: about 256 MB of logits a chunk)', int = true,
                      min = 0 },
}

-- (no f64: the optimizers update f32, bf16 and f16 parameters, so an f64
-- run would be refused by AdamW after the build)
M.DTYPES = { 'f32', 'bf16' }

-- [Note: the learning-rate schedule]
-- The training recipes' schedule (fsdp.optim.lr_scheduler.WarmupCosine,
-- stepped after each optimizer step) in the recipes' option names, as
-- --help says it. Optimizer step s (1 to --max_steps) runs at
--   lr * s / (W + 1)                                          s <= W
--   min_lr + (lr - min_lr) * (1 + cos(pi * (s - 1 - W) / (max_steps - W))) / 2     s > W
-- with W = --warmup_steps: the first step's lr is lr/(W+1), not 0 as in
-- transformers' get_cosine_schedule_with_warmup (nanoGPT's and torchtitan's
-- warmup), and the last step's is just above min_lr.
M.SCHEDULE_HELP = 'optimizer step s (1..max_steps) runs at lr*s/(W+1) while s <= W (the first at lr/(W+1), not 0), '
  .. 'then min_lr + (lr - min_lr)*(1 + cos(pi*(s-1-W)/(max_steps-W)))/2'

-- The device mesh ([Note: the recipe's mesh] in fsdp/sharding/options.lua):
-- none given, no mesh (the strategy's own groups, as ever).
M.MESH_OPTIONS = {
  tp = { 1, 'tensor-parallel ranks: each layer\'s weights split over this many consecutive ranks of a node, which see '
            .. 'the same batches (1: none)', int = true, min = 1 },
  dp_shard = { 0, 'ranks one unit\'s parameters are sharded over (0: from --sharding_strategy: the ranks left by '
                  .. '--tp and --dp_replicate; a node\'s for the hybrids)', int = true, min = 0 },
  dp_replicate = { 0, 'copies of each shard, their gradients summed (HSDP; 0: from --sharding_strategy: the nodes for '
                      .. 'the hybrids, else 1)', int = true, min = 0 },
  sequence_parallel = { false, 'with --tp: the norms and residuals between the TP regions run on each TP rank\'s '
                               .. '1/tp of the sequence (less activation memory; the sequence length must divide '
                               .. 'by --tp)' },
}

-- The optimizer, schedule and loop options.
M.TRAIN_OPTIONS = {
  batch_size = { 4, 'sequences per micro-batch and rank (the global batch is this times the data-parallel ranks, '
                    .. 'the world / --tp, and --grad_accum_steps)', int = true, min = 1,
                aliases = { 'train_batch_size' } },
  val_batch_size = { 0, 'sequences per validation batch and rank (0: --batch_size)', int = true, min = 0 },
  max_steps = { 100, 'optimizer steps', int = true, min = 1 },
  lr = { 3e-4, 'peak learning rate', positive = true },
  min_lr = { 3e-5, 'final learning rate of the cosine decay', min = 0, at_most = 'lr' },
  warmup_steps = { 10, 'linear warmup steps W, then cosine decay to --min_lr: ' .. M.SCHEDULE_HELP, int = true, min = 0,
                   less_than = 'max_steps' },
  weight_decay = { 0.1, 'AdamW weight decay (not applied to norms)', min = 0 },
  beta1 = { 0.9, 'AdamW beta1 (torch: betas[0])', min = 0, below = 1 },
  beta2 = { 0.95, 'AdamW beta2 (torch: betas[1])', min = 0, below = 1 },
  eps = { 1e-8, 'AdamW epsilon, added to sqrt of the second moment (torch: eps)', min = 0, aliases = { 'adam_eps' } },
  grad_clip = { 1.0, 'clip the global gradient norm to this (0: off)', min = 0 },
  seed = { 0, 'initialisation and data seed', int = true, min = 0 },
  dtype = { 'f32', 'parameter and compute dtype: f32, bf16 (CPU: large products on oneDNN where installed)',
            one_of = M.DTYPES },
  validation_freq = { 50, 'steps between validations (0: never)', int = true, min = 0 },
  val_batches = { 4, 'batches per validation', int = true, min = 1 },
  peak_tflops = require('fsdp.sharding.device').peak_tflops_option(),
  memory_limit_mb = { 0, 'fail allocations on --device past this many MiB of live tensors (0: no limit); also what '
                         .. 'the fit check plans for', min = 0 },
}

-- Every shared option set (sharding, checkpoints, non-finite guard,
-- --init_from/export, LoRA, metrics, accumulation) plus these and `own`
-- (own wins on a clash).
function M.options(own)
  return metrics.options(lora.options(pretrained.options(nonfinite.options(
    ckpt_options.options(shard_options.options(
    accumulate.options(options.merge(M.MODEL_OPTIONS, M.MESH_OPTIONS, M.TRAIN_OPTIONS, own))))))))
end

local SIZE_OPTIONS = { { 'n_layers', 'num_layers' }, { 'dim', 'hidden_width' }, { 'n_heads', 'num_heads' },
                       { 'n_kv_heads', 'num_kv_heads' }, { 'ffn_dim', 'ffn_dim' }, { 'vocab_size', 'vocab_size' } }
-- What a first run that does not fit this machine is told to try (the
-- default is Llama 2 7B: a bare `fsdp-lua recipes/llama2_7b.lua` on a
-- laptop ends here, in its first lines).
M.TRY = 'to try the recipe here: --model=tiny (a small Llama that trains in seconds), --dry-run (the full size '
  .. 'on meta, nothing allocated) or --plan (what each rank would hold, send and compute)'
M.CONFIG_NAMES = { dim = 'hidden_width', n_heads = 'num_heads', n_kv_heads = 'num_kv_heads', head_dim = 'hidden_width',
                   n_layers = 'num_layers', ffn_dim = 'ffn_dim', vocab_size = 'vocab_size' }

-- In a recipe's option checks: the family (--model's, or --init_from's),
-- the --init_from source (nil without one; --export_hf checked against
-- it) and the size overrides. Returns R = {family, config_name, fam, src,
-- overrides}; raises the usage message.
function M.resolve(cfg, written, who)
  local family, config_name = decoders.resolve(cfg.model)
  local src = pretrained.from_options(cfg, written, {
    families = decoders.ORDER, who = who, family_of_model = decoders.resolve, sizes = SIZE_OPTIONS })
  if src then family = src.family end
  if family == 'gpt2' and cfg.num_kv_heads > 0 then
    error(('--%s: GPT-2 has no grouped-query attention (every head has its keys and values)'):format(
      written.num_kv_heads or 'num_kv_heads'), 0)
  end
  local o = {}
  if cfg.num_layers > 0 then o.n_layers = cfg.num_layers end
  if cfg.hidden_width > 0 then
    o.dim = cfg.hidden_width
    if cfg.ffn_dim == 0 and family ~= 'gpt2' then o.ffn_dim = math.ceil(cfg.hidden_width * 8 / 3 / 32) * 32 end
  end
  if cfg.num_heads > 0 then o.n_heads = cfg.num_heads end
  if cfg.num_kv_heads > 0 then o.n_kv_heads = cfg.num_kv_heads end
  if cfg.ffn_dim > 0 then o.ffn_dim = cfg.ffn_dim end
  if cfg.vocab_size > 0 then o.vocab_size = cfg.vocab_size end
  if family ~= 'gpt2' and o.n_heads and not o.n_kv_heads then o.n_kv_heads = o.n_heads end
  return { family = family, config_name = config_name, fam = decoders.families[family], src = src, overrides = o }
end

-- The model config (R.config: --init_from's, or --model's with the
-- overrides), then before anything is built: the sizes against this
-- machine ([Note: sizes are bounded before building] in fsdp.sharding.fit),
-- no sequence past the model's positions ([Note: positions past the
-- model's limit] in models/decoders.lua) and the LoRA targets. opts: seq
-- (the longest sequence) and seq_what (how to name it), rows ({count,
-- text}: the tokens of a micro-batch, or nil), weights (whether weights
-- will be allocated: false for --dry_run and --plan). Raises the usage
-- message.
function M.check(R, cfg, written, opts)
  local c
  if R.src then
    c = R.src.config
  else
    local ok, err = pcall(R.fam.module.config, R.config_name, R.overrides)
    if not ok then error(options.explain(err, M.CONFIG_NAMES, written), 0) end
    c = err
  end
  R.config = c
  pretrained.bound(cfg, R.family, c, R.src, {
    model = cfg.model, options = M.CONFIG_NAMES, written = written, dtype = cfg.dtype,
    weights = opts.weights ~= false,
    shards = fit.weight_shards(cfg),
    rows = opts.rows,
    fix = (cfg.dtype == 'f32' and '--dtype=bf16 (half the bytes), ' or '')
      .. (R.src and 'a smaller model' or ('fewer layers (--%s)'):format(written.num_layers or 'num_layers'))
      .. ' or more ranks' .. (R.src and '' or ('; ' .. M.TRY)) })
  local too_long = decoders.positions_problem(R.family, c, opts.seq, opts.seq_what, R.src, cfg.model,
    cfg.allow_past_max_positions)
  if too_long then error(too_long, 0) end
  lora.check_options(cfg, function() return R.fam.module.build(c, { device = 'meta' }) end, R.fam.lora_targets)
  -- the mesh against the world (--plan: the world planned for) and, with
  -- --tp, against the model
  local plan_world = opts.weights == false and (cfg.plan_world or 0) > 0 and cfg.plan_world or nil
  R.mesh_sizes = shard_options.mesh_sizes(cfg, plan_world and {
    world = plan_world, nodes = (cfg.plan_nodes or 0) > 0 and cfg.plan_nodes or 1 } or nil)
  if cfg.tp > 1 then M.check_tp(cfg, c, R) end
  if cfg.sequence_parallel then
    if cfg.tp <= 1 then error('--sequence_parallel needs --tp > 1: it splits the sequence over the TP ranks', 0) end
    if cfg.seq_len and cfg.seq_len % cfg.tp ~= 0 then
      error(('--sequence_parallel: --%s=%d is not divisible by --tp=%d (each TP rank holds 1/tp of the sequence)')
        :format(written.seq_len or 'seq_len', cfg.seq_len, cfg.tp), 0)
    end
  end
  return c
end

-- [Note: what --tp checks]
-- Before anything is built: the model's split dimensions (heads, key/value heads,
-- MLP and expert widths, vocabulary) divide by --tp, the family has a TP
-- plan (model:tp_plan, on a meta build) and no option asks for what the
-- TP layers do not cover. Whole weights load into TP slices (--init_from:
-- each rank copies its slice of the logical tensor), checkpoints record
-- logical tensors and resume on another mesh (--checkpoint_dir: [Note:
-- logical tensors in sharded checkpoints]), exports gather them
-- (--export_hf, --save_full_state_dict). LoRA (--lora_rank) is applied
-- before TP, which splits each adapter with its layer (fsdp/tp/styles.lua),
-- without dropout (each TP rank would drop different elements).
M.TP_SPLIT = { { 'n_heads', 'num_heads' }, { 'n_kv_heads', 'num_kv_heads' }, { 'ffn_dim', 'ffn_dim' },
               { 'moe_ffn_dim', 'moe_ffn_dim' }, { 'vocab_size', 'vocab_size' } }
M.TP_UNSUPPORTED = {}

function M.check_tp(cfg, c, R)
  local T = cfg.tp
  for _, k in ipairs(M.TP_SPLIT) do
    local v = c[k[1]] or (k[1] == 'n_kv_heads' and c.n_heads) or nil
    if v and v % T ~= 0 then
      error(('--tp=%d does not divide the model\'s %s (%d): tensor parallelism splits it over the TP ranks'):format(
        T, k[2], v), 0)
    end
  end
  for _, k in ipairs(M.TP_UNSUPPORTED) do
    local v = cfg[k[1]]
    if v ~= nil and v ~= k[2] then
      error(('--tp=%d with --%s: not tensor-parallel yet (whole shapes are split over the TP ranks); '
        .. 'use --tp=1'):format(T, k[1]), 0)
    end
  end
  if (cfg.lora_rank or 0) > 0 and (cfg.lora_dropout or 0) > 0 then
    error(('--tp=%d with --lora_dropout=%g: each TP rank would drop different elements of the adapters\' '
      .. 'input; use --lora_dropout=0'):format(T, cfg.lora_dropout), 0)
  end
  local model = R.fam.module.build(c, { device = 'meta' })
  if type(model.tp_plan) ~= 'function' then
    error(('--tp=%d: the %s family has no tensor-parallel plan (model:tp_plan); use --tp=1'):format(T, R.fam.name), 0)
  end
  -- (a family whose plan does not cover a feature says which: MoE, fused projections)
  local ok, why = pcall(model.tp_plan, model)
  if not ok then error(('--tp=%d: %s; use --tp=1'):format(T, options.bare(why)), 0) end
end

-- The device mesh of a checked config (R.mesh_sizes; nil without mesh
-- options), made the current one (the data samplers' and loss's
-- data-parallel ranks: [Note: data-parallel rank and size] in fsdp/mesh.lua)
-- and printed. Collective.
function M.mesh(R)
  if not R.mesh_sizes then return nil end
  local mesh = mesh_mod.new(R.mesh_sizes)
  mesh_mod.set_current(mesh)
  console.print(tostring(mesh))
  return mesh
end

-- The model of R built on meta, LoRA applied (--lora_rank), checked to
-- fit (the planner's numbers), sharded as cfg says, each rank's shards
-- initialised (--init_from's values come later: pretrained.start).
-- shape: {batch =, seq =} of a micro-batch. Returns the model and its
-- parameter count before LoRA.
function M.build(R, cfg, who, shape)
  local c = R.config
  local mesh = R.mesh or M.mesh(R)
  R.mesh = mesh
  local model = R.fam.module.build(c, { device = 'meta', dtype = cfg.dtype })
  local n_params = model:num_parameters() -- (the whole model's, before TP splits it)
  M.loss_options(model, cfg) -- (before the fit check, whose trace runs the model's own loss)
  -- before TP (which splits each adapter with its layer), the fit check
  -- and sharding, which see the frozen base
  lora.apply_options(model, cfg, R.fam.lora_targets)
  -- the fit check plans the whole model: with --tp the planner
  -- parallelizes a copy of it itself (fsdp.plan's tp, from the mesh sizes)
  fit.check(model, cfg, R.fam.block, shape, who, { layers = 'num_layers',
    try = not R.src and M.TRY or nil })
  -- --tp: the TP layers (on meta) before the sharding, so it sees what one
  -- TP rank holds ([Note: what --tp checks])
  if mesh and mesh:size('tp') > 1 then
    tp.parallelize(model, model:tp_plan(), { mesh = mesh, sequence_parallel = cfg.sequence_parallel })
  end
  shard_options.apply(model, cfg, R.fam.block, who, mesh)
  console.print(('model: %d layers, width %d, %d heads (%d kv), ffn %d, vocab %d: %d '
    .. 'parameters, %s, %s'):format(c.n_layers, c.dim, c.n_heads, c.n_kv_heads or c.n_heads, c.ffn_dim, c.vocab_size,
    n_params, cfg.dtype, R.fam.name))
  return model, n_params
end

-- --fused_loss and --loss_chunk_rows on a built model ([Note: the fused
-- loss] in models/decoder.lua): true fuses validation's loss too.
function M.loss_options(model, cfg)
  model.fused_loss = cfg.fused_loss
  if cfg.loss_chunk_rows > 0 then model.loss_chunk_rows = cfg.loss_chunk_rows end
end

-- AdamW on the trainable parameters (no decay for norms and other 1-d
-- parameters) and linear warmup then cosine decay to --min_lr.
function M.optimizer(model, cfg)
  local opt = optim.AdamW(lora.trainable(model), {
    lr = cfg.lr, betas = { cfg.beta1, cfg.beta2 }, eps = cfg.eps, weight_decay = cfg.weight_decay,
    groups = { { match = shard_options.no_decay, weight_decay = 0 } },
  })
  local sched = optim.lr_scheduler.WarmupCosine(opt, {
    warmup_steps = cfg.warmup_steps, total_steps = cfg.max_steps, min_lr = cfg.min_lr })
  return opt, sched
end

-- --memory_limit_mb and --summary: a limit, and the peak a summary
-- reports, are about live tensors: dead ones are collected before every
-- allocation so uncollected garbage never counts. (--plan only plans for
-- the limit: it allocates nothing to limit.)
function M.memory_limit(cfg)
  if cfg.memory_limit_mb > 0 or cfg.summary then fsdp.set_collect_budget(0) end
  if cfg.memory_limit_mb > 0 and not cfg.plan then
    fsdp.set_memory_limit(shard_options.device(cfg), cfg.memory_limit_mb * 2^20)
  end
end

return M
