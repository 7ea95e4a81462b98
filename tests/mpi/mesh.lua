-- tests/mpi/mesh.lua: the device mesh (fsdp.mesh) on 4 ranks, and fully
-- sharded training whose groups come from it.
--
--   FSDP_RANKS_PER_NODE=2 mpirun -np 4 fsdp-lua tests/mpi/mesh.lua
--
-- Run as 2 nodes of 2 (tests/mpi/run.sh), so a mesh dp_replicate 2 x
-- dp_shard 2 has the groups of HYBRID_SHARD and a tp of 4 straddles nodes.
-- Checked: each rank's coordinates and every group's members (gathered
-- over the group, so the members agree with each other, not only with
-- this rank's view) for meshes 2x2, 1x4, 4x1, 1x2x2 and 2x1x2; the
-- validation messages; FSDP on a mesh dp_replicate 2 x dp_shard 2 = the
-- HYBRID_SHARD path on the same layout (bit for bit) = one process (f32
-- bounds of tests/mpi/fsdp_equivalence.lua); on a mesh dp_shard 2 x tp 2
-- with no TP layer (every parameter a copy on both TP ranks) the TP ranks
-- see the same batches and training = one process on the dp ranks'
-- batch; and the gradient norm counts a parameter marked as split by TP
-- (p.tp) once per TP rank and a copied one once.
local fsdp = require 'fsdp'
local dist = fsdp.dist
local mesh_mod = require 'fsdp.mesh'
local llama = require 'models.llama'
local optim = require 'fsdp.optim'
local T = require 'tests.mpi.tap'

local R, W = T.rank, T.world
assert(W == 4, 'tests/mpi/mesh.lua runs on 4 ranks')
assert(dist.nodes() == 2, 'tests/mpi/mesh.lua needs FSDP_RANKS_PER_NODE=2 (2 nodes of 2)')

local function list(t) return '{' .. table.concat(t, ',') .. '}' end

-- The world ranks of a group, as its members report them (one all-gather).
local function gathered_members(g)
  local me = fsdp.tensor({ R }, { dtype = 'i64' })
  local all = dist.all_gather(me, { group = g })
  return all:tolist()
end

-- Expected coordinates of world rank r (mpirun places ranks node by node).
local function coords(r, S, TP)
  return { dp_replicate = math.floor(r / (S * TP)), dp_shard = math.floor(r / TP) % S, tp = r % TP }
end

local MESHES = {
  { dp_replicate = 2, dp_shard = 2 },
  { dp_shard = 4 },
  { dp_replicate = 4, dp_shard = 1 },
  { dp_shard = 2, tp = 2 },
  { dp_replicate = 2, dp_shard = 1, tp = 2 },
}

for _, spec in ipairs(MESHES) do
  local Rp, S, TP = spec.dp_replicate or 1, spec.dp_shard, spec.tp or 1
  local label = ('mesh %d x %d x %d'):format(Rp, S, TP)
  T.test(label .. ': coordinates, sizes and group members', function()
    local m = mesh_mod.new(spec)
    local want = coords(R, S, TP)
    want.dp = want.dp_replicate * S + want.dp_shard
    local sizes = { dp_replicate = Rp, dp_shard = S, tp = TP, dp = Rp * S }
    for _, d in ipairs({ 'dp_replicate', 'dp_shard', 'tp', 'dp' }) do
      T.truthy(m:size(d) == sizes[d], ('%s size %d, expected %d'):format(d, m:size(d), sizes[d]))
      T.truthy(m:coordinate(d) == want[d], ('%s coordinate %d, expected %d'):format(d, m:coordinate(d), want[d]))
      local g = m:group(d)
      T.truthy(g:size() == sizes[d] and g:rank() == want[d],
        ('%s group: rank %d of %d, expected %d of %d'):format(d, g:rank(), g:size(), want[d], sizes[d]))
      -- members: every world rank whose other coordinates equal this rank's, by coordinate along d
      local expect = {}
      for r = 0, W - 1 do
        local c = coords(r, S, TP)
        local same = d == 'dp' and c.tp == want.tp
          or d ~= 'dp' and (d == 'dp_replicate' or c.dp_replicate == want.dp_replicate)
            and (d == 'dp_shard' or c.dp_shard == want.dp_shard) and (d == 'tp' or c.tp == want.tp)
        if same then expect[#expect + 1] = r end
      end
      local got = gathered_members(g)
      T.truthy(list(got) == list(expect), ('%s group members %s, expected %s'):format(d, list(got), list(expect)))
      T.truthy(list(g:ranks()) == list(expect), ('%s group ranks %s'):format(d, list(g:ranks())))
    end
    local dims = m:dims()
    T.truthy(#dims == 3 and dims[1].name == 'dp_replicate' and dims[3].name == 'tp' and dims[3].size == TP,
      'dims outermost first')
    local text = tostring(m)
    local expect_text = ('mesh dp_replicate %d x dp_shard %d x tp %d (rank %d: %d,%d,%d)'):format(Rp, S, TP, R,
      want.dp_replicate, want.dp_shard, want.tp)
    T.truthy(text == expect_text, ('tostring %q, expected %q'):format(text, expect_text))
  end)
end

T.test('a mesh whose tp straddles nodes is refused on every rank, naming the node size', function()
  T.raises(function() mesh_mod.new({ tp = 4 }) end, 'tp 4 does not divide the 2 ranks of node',
    'must not straddle nodes')
  T.raises(function() mesh_mod.new({ dp_shard = 3 }) end, 'the world has 4')
end)

T.test('ranks that build different meshes fail together, naming the values', function()
  T.raises(function() mesh_mod.new({ dp_shard = R < 2 and 4 or 2, tp = R < 2 and nil or 2 }) end,
    'the ranks disagree on the device mesh')
end)

-- training ----------------------------------------------------------------------------------

local K, G, SEQ = 3, 4, 16
local CFG = { dim = 32, n_layers = 2, n_heads = 4, n_kv_heads = 2, ffn_dim = 64, vocab_size = 64, max_seq_len = 32 }
local SEED, LR = 7, 1e-3
local data_ids = fsdp.randint(0, CFG.vocab_size, { K * G, SEQ }, { seed = 11 })
local data_tg = fsdp.randint(0, CFG.vocab_size, { K * G, SEQ }, { seed = 12 })
local one = dist.split(R, { name = 'one rank' })
local policy = fsdp.policy.transformer { llama.DecoderLayer }

local function build(opts)
  local m = llama.CausalLM(llama.config('Llama-2-7b', CFG), { device = 'meta' })
  opts.policy, opts.seed = policy, SEED
  fsdp.shard(m, opts)
  return m
end

-- K steps on rows [first, first + rows) of each global batch of G rows;
-- the losses averaged over `avg_group` (nil: none), the gradient norms.
local function train(m, first, rows, avg_group)
  local opt = optim.AdamW(m:named_parameters(), { lr = LR, weight_decay = 0.1 })
  local losses, norms = {}, {}
  for step = 0, K - 1 do
    local loss = m:loss(data_ids:narrow(0, step * G + first, rows), data_tg:narrow(0, step * G + first, rows))
    loss:backward()
    norms[#norms + 1] = fsdp.clip_grad_norm(m, 0.5)
    opt:step()
    opt:zero_grad()
    local l = loss:float():reshape({ 1 })
    if avg_group ~= false then dist.all_reduce(l, { op = 'avg', group = avg_group }) end
    losses[#losses + 1] = l:item()
  end
  return losses, norms, fsdp.full_state_dict(m)
end

local reference
local function one_process()
  if not reference then
    local losses, norms, params = train(build({ group = one }), 0, G, false)
    reference = { losses = losses, norms = norms, params = params }
  end
  return reference
end

local function close_to_one_process(losses, norms, params)
  local ref = one_process()
  for i = 1, K do
    T.truthy(math.abs(losses[i] - ref.losses[i]) <= 1e-5 * math.abs(ref.losses[i]),
      ('step %d loss %.9g, one process %.9g'):format(i, losses[i], ref.losses[i]))
    T.truthy(math.abs(norms[i] - ref.norms[i]) <= 1e-5 * ref.norms[i],
      ('step %d gradient norm %.9g, one process %.9g'):format(i, norms[i], ref.norms[i]))
  end
  local n = 0
  for name, want in pairs(ref.params) do
    local err, why = T.params_error(params[name], want, LR, K)
    T.truthy(not why, name .. ': ' .. tostring(why))
    T.truthy(err <= 1e-5, ('%s differs from one process: relative error %.3g'):format(name, err))
    n = n + 1
  end
  T.truthy(n > 0, 'no parameters compared')
end

local function bits(a, b, what)
  for name, t in pairs(b) do
    T.truthy(a[name] ~= nil and (a[name]:double() - t:double()):abs():max():item() == 0,
      ('%s: %s differs'):format(what, name))
  end
end

for _, st in ipairs({ 'FULL_SHARD', 'SHARD_GRAD_OP', 'HYBRID_SHARD' }) do
  T.test(('%s on a mesh dp_replicate 2 x dp_shard 2 = HYBRID_SHARD by nodes (bits) = one process'):format(st),
    function()
      local m = mesh_mod.new({ dp_replicate = 2, dp_shard = 2 })
      local per = G / W
      local model = build({ mesh = m, strategy = st })
      local u = fsdp.sharding.units(model)[1]
      T.truthy(u.shard_size == 2 and u.replicas == 2, ('unit shard size %d, replicas %d'):format(u.shard_size,
        u.replicas))
      local ml, mn, mp = train(model, R * per, per)
      local hybrid = st == 'SHARD_GRAD_OP' and 'HYBRID_SHARD_ZERO2' or 'HYBRID_SHARD'
      local hl, hn, hp = train(build({ strategy = hybrid }), R * per, per)
      for i = 1, K do
        T.truthy(ml[i] == hl[i] and mn[i] == hn[i], ('step %d: loss %.17g norm %.17g on the mesh, %.17g %.17g by '
          .. 'nodes'):format(i, ml[i], mn[i], hl[i], hn[i]))
      end
      bits(mp, hp, 'mesh against HYBRID_SHARD')
      close_to_one_process(ml, mn, mp)
    end)
end

T.test('NO_SHARD on a mesh replicates over dp = one process', function()
  local m = mesh_mod.new({ dp_replicate = 2, dp_shard = 2 })
  local model = build({ mesh = m, strategy = 'NO_SHARD' })
  local u = fsdp.sharding.units(model)[1]
  T.truthy(u.shard_size == 1 and u.replicas == 4, ('shard size %d, replicas %d'):format(u.shard_size, u.replicas))
  close_to_one_process(train(model, R, 1))
end)

T.test('a mesh dp_shard 2 x tp 2 without TP layers: TP ranks share batches, training = one process', function()
  local m = mesh_mod.new({ dp_shard = 2, tp = 2 })
  mesh_mod.set_current(m)
  local ok, err = pcall(function()
    T.truthy(mesh_mod.data_parallel_rank() == m:coordinate('dp') and mesh_mod.data_parallel_size() == 2,
      'data-parallel rank and size are the mesh\'s dp')
    local sampler = require('fsdp.data.sampler').new({ n = 8, batch_size = 2, seed = 1 })
    T.truthy(sampler.rank == m:coordinate('dp') and sampler.world_size == 2, 'the sampler takes the dp rank')
    local per = G / 2
    local model = build({ mesh = m })
    local u = fsdp.sharding.units(model)[1]
    T.truthy(u.shard_size == 2 and u.replicas == 1, ('shard size %d, replicas %d'):format(u.shard_size, u.replicas))
    close_to_one_process(train(model, m:coordinate('dp') * per, per, m:group('dp')))
  end)
  mesh_mod.set_current(nil)
  if not ok then error(err, 0) end
end)

T.test('the gradient norm on tp 2 counts a TP-split parameter once per TP rank, a copy once', function()
  local m = mesh_mod.new({ dp_shard = 2, tp = 2 })
  local function norm_and_sq(mark)
    local model = llama.CausalLM(llama.config('Llama-2-7b', CFG), { device = 'meta' })
    local w
    for _, np in ipairs(model:named_parameters()) do
      if np[1] == 'model.layers.0.self_attn.q_proj.weight' then w = np[2] end
    end
    -- the same whole weight on both TP ranks, marked as if each held a part:
    -- its squares must then count on both
    if mark then rawset(w, 'tp', { dim = 0, size = 2, rank = m:coordinate('tp'), global_shape = { 64, 32 } }) end
    fsdp.shard(model, { mesh = m, policy = policy, seed = SEED })
    local first = m:coordinate('dp') * 2
    model:loss(data_ids:narrow(0, first, 2), data_tg:narrow(0, first, 2)):backward()
    local sq = 0
    for _, np in ipairs(model:named_parameters()) do
      if np[1] == 'model.layers.0.self_attn.q_proj.weight' and np[2].grad ~= nil then
        sq = np[2].grad:double():pow(2):sum():item()
      end
    end
    local t = dist.all_reduce(fsdp.tensor({ sq }, { dtype = 'f64' }), { group = m:group('dp_shard') })
    return fsdp.sharding.grad_norm(model), t:item()
  end
  local plain, wsq = norm_and_sq(false)
  local marked = norm_and_sq(true)
  T.truthy(wsq > 0, 'the marked weight has a gradient')
  local want = math.sqrt(plain ^ 2 + wsq)
  T.truthy(math.abs(marked - want) <= 1e-9 * want, ('norm with the split weight %.17g, expected %.17g (plain %.17g)')
    :format(marked, want, plain))
end)

T.test('fsdp.shard refuses a mesh together with a group, and a mesh that is not one', function()
  local m = mesh_mod.new({ dp_shard = 4 })
  T.raises(function() build({ mesh = m, group = one }) end, 'give group or mesh, not both')
  T.raises(function() build({ mesh = { dp_shard = 4 } }) end, 'mesh must be a mesh from fsdp.mesh.new')
end)

T.done()
