-- tests/mpi/ckpt_mesh.lua: sharded checkpoints across meshes (issue 43) on
-- 4 ranks. A tiny Llama trained 2 AdamW steps at tp 2 x dp_shard 2 is
-- saved; it loads at tp 4, at dp_shard 4 (no TP), on no mesh and at tp 2 x
-- dp_shard 2 again, where:
--   - the logical parameters (fsdp.full_state_dict, gathered over dp and
--     tp) equal the saved model's bit for bit;
--   - saved again there and loaded back at tp 2 x dp_shard 2, every
--     parameter segment and every AdamW state tensor (exp_avg, exp_avg_sq)
--     and step equals the original run's bit for bit, so parameters and
--     optimizer state both travel through the other layout unchanged;
--   - one more step on the same global batch gives the loss of the
--     original run's next step: bit for bit on the same mesh, within 1e-5
--     relative across meshes (the bound of tests/mpi/tp_equivalence.lua:
--     only the order of additions differs: split GEMMs summed over TP
--     ranks, gradients averaged over other dp ranks).
-- A TP model that is not sharded (whole parameters per TP rank) saves,
-- loads at dp_shard 4 and at tp 4, and writes a full state dict equal to
-- the model without TP. A checkpoint of another model (other ffn width)
-- is refused in one line naming the parameter and both logical shapes.
--
--   mpirun -np 4 fsdp-lua tests/mpi/ckpt_mesh.lua WORK
local fsdp = require 'fsdp'
local dist = fsdp.dist
local tp = require 'fsdp.tp'
local mesh_mod = require 'fsdp.mesh'
local llama = require 'models.llama'
local optim = require 'fsdp.optim'
local ckpt = require 'fsdp.checkpointing'
local st_sharded = require 'fsdp.io.safetensors_sharded'
local T = require 'tests.mpi.tap'

local work = arg[1]
if not work or T.world ~= 4 then
  io.stderr:write('usage: mpirun -np 4 fsdp-lua tests/mpi/ckpt_mesh.lua WORK\n')
  os.exit(2)
end
local K, G, SEQ, SEED, LR = 2, 4, 8, 7, 1e-3
local CFG = { dim = 32, n_layers = 2, n_heads = 4, n_kv_heads = 4, ffn_dim = 64, vocab_size = 64,
              max_seq_len = 16 }
local ids = fsdp.randint(0, CFG.vocab_size, { (K + 1) * G, SEQ }, { seed = 11 })
local tgs = fsdp.randint(0, CFG.vocab_size, { (K + 1) * G, SEQ }, { seed = 12 })
local policy = fsdp.policy.transformer { llama.DecoderLayer }

-- A model on a mesh of `sizes` (nil: no mesh, FULL_SHARD over the world),
-- TP layers first when the mesh has a tp dimension, and its AdamW.
local function build(sizes, cfg)
  local m = llama.CausalLM(llama.config('Llama-2-7b', cfg or CFG), { device = 'meta' })
  local mesh = sizes and mesh_mod.new(sizes) or nil
  if mesh and mesh:size('tp') > 1 then tp.parallelize(m, m:tp_plan(), { mesh = mesh }) end
  fsdp.shard(m, { mesh = mesh, strategy = 'FULL_SHARD', policy = policy, seed = SEED })
  local opt = optim.AdamW(m:named_parameters(), { lr = LR, weight_decay = 0.1 })
  local dp = mesh and mesh:group('dp') or dist.world()
  return { model = m, opt = opt, dp = dp, tp = mesh and mesh:size('tp') or 1 }
end

-- Step `step` (1-based) of a run: rows [(step-1)G, stepG) split over the
-- dp ranks; returns the loss averaged over them (the global mean).
local function train_step(r, step)
  local rows = G / r.dp:size()
  local first = (step - 1) * G + r.dp:rank() * rows
  local loss = r.model:loss(ids:narrow(0, first, rows), tgs:narrow(0, first, rows))
  loss:backward()
  if r.tp > 1 then tp.clip_grad_norm(r.model, 1.0) else fsdp.clip_grad_norm(r.model, 1.0) end
  r.opt:step()
  r.opt:zero_grad()
  local l = loss:float():reshape({ 1 })
  dist.all_reduce(l, { op = 'avg', group = r.dp })
  return l:item()
end

-- This rank's parameter segments and optimizer state, cloned.
local function snapshot(r)
  local snap = { params = {}, state = {} }
  for _, u in ipairs(fsdp.sharding.units(r.model)) do
    for _, p in ipairs(u.params) do snap.params[p.name] = p.segment:detach():clone() end
  end
  for name, st in pairs(r.opt.state) do
    local s = {}
    for k, v in pairs(st) do s[k] = fsdp.Tensor.is_tensor(v) and v:reshape(-1):clone() or v end
    snap.state[name] = s
  end
  return snap
end

local function same_bits(a, b)
  if a:numel() ~= b:numel() then return false end
  return a:numel() == 0 or (a:double() - b:double()):abs():max():item() == 0
end

local function shape_of(t) return table.concat(t.shape, 'x') end

local function compare_full(got, want, what)
  local n = 0
  for name, t in pairs(want) do
    T.truthy(got[name] ~= nil and shape_of(got[name]) == shape_of(t) and same_bits(got[name], t),
      ('%s: logical %s differs'):format(what, name))
    n = n + 1
  end
  T.truthy(n > 0, 'no logical tensors compared')
end

local A = build({ tp = 2, dp_shard = 2 })
local losses = {}
for step = 1, K do losses[step] = train_step(A, step) end
ckpt.save(work .. '/a', { model = A.model, optimizer = A.opt, step = K })
local full_a = fsdp.full_state_dict(A.model)
local snap_a = snapshot(A)
local next_loss = train_step(A, K + 1) -- the original run's step K + 1

local layouts = {
  { 'tp 2 x dp_shard 2 (the same mesh)', { tp = 2, dp_shard = 2 }, 'same' },
  { 'tp 4', { tp = 4 }, 'tp4' },
  { 'dp_shard 4 (no TP)', { dp_shard = 4 }, 'dp4' },
  { 'no mesh (FULL_SHARD over the world)', nil, 'plain' },
}
for _, l in ipairs(layouts) do
  local label, sizes, tag = l[1], l[2], l[3]
  T.test(('tp 2 x dp_shard 2 checkpoint loads at %s: the same logical tensors, and back with the same bits'):format(
    label), function()
    local B = build(sizes)
    local info = ckpt.load(work .. '/a', { model = B.model, optimizer = B.opt })
    T.truthy(info.step == K, 'step ' .. tostring(info.step))
    compare_full(fsdp.full_state_dict(B.model), full_a, label)
    ckpt.save(work .. '/' .. tag, { model = B.model, optimizer = B.opt, step = K })
    local loss = train_step(B, K + 1)
    local rel = math.abs(loss - next_loss) / math.abs(next_loss)
    if T.rank == 0 then
      print(('# %s: step %d loss relative to the uninterrupted run %.3g'):format(label, K + 1, rel))
    end
    if tag == 'same' then
      T.truthy(loss == next_loss, ('step %d loss %.9g, the uninterrupted run %.9g'):format(K + 1, loss, next_loss))
    else
      T.truthy(rel <= 1e-5, ('step %d loss %.9g, the uninterrupted run %.9g (relative %.3g)'):format(K + 1, loss,
        next_loss, rel))
    end
    -- back at tp 2 x dp_shard 2: the original run's segments and optimizer state
    local A2 = build({ tp = 2, dp_shard = 2 })
    ckpt.load(work .. '/' .. tag, { model = A2.model, optimizer = A2.opt })
    local snap = snapshot(A2)
    local n = 0
    for name, want in pairs(snap_a.params) do
      T.truthy(snap.params[name] and same_bits(snap.params[name], want), ('parameter %s differs'):format(name))
      n = n + 1
    end
    for name, st in pairs(snap_a.state) do
      local got = snap.state[name]
      T.truthy(got ~= nil, ('no optimizer state for %s'):format(name))
      for k, v in pairs(st) do
        if fsdp.Tensor.is_tensor(v) then
          T.truthy(got and got[k] and same_bits(got[k], v), ('optimizer %s of %s differs'):format(k, name))
          n = n + 1
        else
          T.truthy(got and got[k] == v, ('optimizer %s of %s: %s, saved %s'):format(k, name, tostring(got and got[k]),
            tostring(v)))
        end
      end
    end
    T.truthy(n > 10, ('only %d tensors compared'):format(n))
  end)
end

T.test('a TP model without fsdp.shard: its checkpoint and full state dict hold the logical tensors', function()
  local function tp_only(sizes)
    local m = llama.CausalLM(llama.config('Llama-2-7b', CFG), { device = 'meta' })
    m:init_weights({ seed = SEED, device = 'cpu' })
    if sizes then tp.parallelize(m, m:tp_plan(), { mesh = mesh_mod.new(sizes) }) end
    -- values no init gives, so a load that copies nothing is seen
    fsdp.no_grad(function()
      for _, p in ipairs(m:parameters()) do p:mul_(1.5) end
    end)
    return m
  end
  local m2 = tp_only({ tp = 2, dp_shard = 2 })
  ckpt.save(work .. '/tponly', { model = m2, step = 0 })
  ckpt.save_full_state_dict(work .. '/tponly.safetensors', m2)
  local want = st_sharded.load_dir(work .. '/tponly.safetensors')
  -- the file is the model without TP
  compare_full(tp_only(nil):state_dict(), want, 'the TP-only model\'s file against no TP')
  local B = build({ dp_shard = 4 })
  ckpt.load(work .. '/tponly', { model = B.model })
  compare_full(fsdp.full_state_dict(B.model), want, 'loaded at dp_shard 4')
  local m4 = llama.CausalLM(llama.config('Llama-2-7b', CFG), { device = 'meta' })
  m4:init_weights({ seed = SEED, device = 'cpu' })
  tp.parallelize(m4, m4:tp_plan(), { mesh = mesh_mod.new({ tp = 4 }) })
  ckpt.load(work .. '/tponly', { model = m4 })
  ckpt.save_full_state_dict(work .. '/tponly4.safetensors', m4)
  compare_full(st_sharded.load_dir(work .. '/tponly4.safetensors'), want, 'loaded at tp 4 without fsdp.shard')
end)

T.test('a checkpoint of another model is refused in one line naming the parameter and both shapes', function()
  local other = {}
  for k, v in pairs(CFG) do other[k] = v end
  other.ffn_dim = 96
  local B = build({ tp = 2, dp_shard = 2 }, other)
  local ok, err = pcall(ckpt.load, work .. '/a', { model = B.model, optimizer = B.opt })
  T.truthy(not ok, 'loaded')
  T.truthy(tostring(err):find('is [64, 32] in the checkpoint, [96, 32] in the model', 1, true)
    or tostring(err):find('is [32, 64] in the checkpoint, [32, 96] in the model', 1, true), tostring(err))
  T.truthy(not tostring(err):find('\n'), 'one line: ' .. tostring(err))
end)

T.done()
