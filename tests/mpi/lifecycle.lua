-- tests/mpi/lifecycle.lua: the in-process checks of tests/mpi/lifecycle.sh,
-- on every rank of a sharded model (models/pretrained.lua's path, as the
-- recipes take it).
--
--   mpirun -np 2 fsdp-lua tests/mpi/lifecycle.lua golden HF_DIR GOLDEN
--       HF_DIR (the golden's config.json + model.safetensors) loaded into
--       a sharded model (holding at most one parameter beside its shards
--       meanwhile) gives the golden's HF logits (f32, max abs err <= 1e-4)
--   mpirun -np 2 fsdp-lua tests/mpi/lifecycle.lua export CHECKPOINT EXPORT HF_DIR
--       EXPORT (--export_hf) loads back with our loader and gives the
--       logits of the trained model (CHECKPOINT, the last step's save,
--       loaded into a sharded model); exporting that model again peaks at
--       one gathered unit per rank; and training moved the weights away
--       from HF_DIR's
local fsdp = require 'fsdp'
local hf = require 'models.hf'
local decoders = require 'models.decoders'
local pretrained = require 'models.pretrained'
local T = require 'tests.mpi.tap'
local F = fsdp.F

local mode = arg[1]

-- The model of `path` (any --init_from), sharded as the Llama recipe
-- shards it; and the peak of CPU memory while its weights were loaded
-- (bytes over what the shards already held), and the largest parameter.
local function sharded(path)
  local src = pretrained.open(path, { families = { 'llama', 'gpt2' } })
  local fam = decoders.families[src.family]
  local model = pretrained.build(src, { device = 'meta' }) -- a LoRA checkpoint: with its adapters
  local largest = 0
  for _, np in ipairs(model:named_parameters()) do largest = math.max(largest, np[2]:numel() * 4) end
  fsdp.shard(model, { policy = fsdp.policy.transformer { fam.block }, seed = 7 })
  fsdp.set_collect_budget(0) -- exact peaks: dead tensors collected before every allocation
  fsdp.collect()
  fsdp.reset_memory_stats('cpu')
  local base = fsdp.memory_stats('cpu').in_use
  pretrained.start({}, model, src, 0)
  local peak = fsdp.memory_stats('cpu').peak - base
  model:eval()
  return model, peak, largest
end

local function logits(model, ids)
  return fsdp.no_grad(function() return model(ids) end)
end

local function max_abs(a, b) return F.max(F.abs(a - b)):item() end

if mode == 'golden' then
  local dir, golden = arg[2], fsdp.load_safetensors(arg[3])
  local model, peak, largest = sharded(dir)
  T.test('loading into the shards holds at most one parameter beside them', function()
    T.truthy(peak <= largest, ('peak +%d bytes, largest parameter %d'):format(peak, largest))
  end)
  if T.rank == 0 then print(('# load into shards: peak +%d bytes on rank 0, largest parameter %d'):format(peak, largest)) end
  local err
  T.test('the HF directory loaded into 2-rank shards gives the golden HF logits (f32, <= 1e-4)', function()
    local got = logits(model, golden.input_ids)
    T.same_shape(got, golden.logits_f32.shape, 'logits')
    err = max_abs(got, golden.logits_f32)
    T.truthy(err <= 1e-4, ('max abs error %g'):format(err))
  end)
  if T.rank == 0 and err then print(('# golden logits: max abs error %.3g'):format(err)) end
elseif mode == 'export' then
  local ckpt, export, start = arg[2], arg[3], arg[4]
  local trained = sharded(ckpt)
  local ids = fsdp.randint(0, trained.config.vocab_size, { 2, 12 }, { seed = 5 })
  local want = logits(trained, ids)
  local err
  T.test('the export loads back (models.hf) with the trained model\'s logits', function()
    local back = hf.from_pretrained(export)
    back:eval()
    err = max_abs(logits(back, ids), want)
    -- Full fine-tuning exports the trained weights bit for bit; a LoRA
    -- export holds W + B A * scaling rounded once to f32, which the
    -- trained model computes as two products: f32 rounding apart.
    local tol = require('fsdp.lora').config_of(trained) and 1e-5 or 1e-6
    T.truthy(err <= tol, ('max abs difference %g (tolerance %g)'):format(err, tol))
  end)
  if T.rank == 0 and err then print(('# export vs trained logits: max abs difference %.3g'):format(err)) end
  -- The export streams: rank 0 holds about one gathered unit at a time.
  local dir = fsdp.dist.all_gather_strings(T.rank == 0 and os.tmpname() .. '.d' or '')[1]
  fsdp.set_collect_budget(0) -- exact peaks: dead tensors collected before every allocation
  fsdp.collect()
  fsdp.reset_memory_stats('cpu')
  local base = fsdp.memory_stats('cpu').in_use
  hf.save_pretrained(trained, dir)
  local peak = fsdp.memory_stats('cpu').peak - base
  local largest, total = 0, 0
  for _, u in ipairs(fsdp.sharding.units(trained)) do
    largest, total = math.max(largest, u.padded_numel * 4), total + u.numel * 4
  end
  T.test('--export_hf of the sharded model peaks at about one unit on each rank', function()
    T.truthy(peak <= largest + 4096, ('peak +%d bytes, largest unit %d'):format(peak, largest))
  end)
  if T.rank == 0 then
    print(('# export of the sharded model: peak +%d bytes on rank 0, largest unit %d bytes, model %d bytes'):format(
      peak, largest, total))
    os.execute('rm -rf ' .. dir)
  end
  T.test('training moved the weights away from the starting directory\'s', function()
    local d = max_abs(logits(hf.from_pretrained(start), ids), want)
    T.truthy(d > 1e-3, ('logits differ by only %g'):format(d))
  end)
else
  error('usage: tests/mpi/lifecycle.lua golden HF_DIR GOLDEN | export CHECKPOINT EXPORT HF_DIR', 0)
end
T.done()
