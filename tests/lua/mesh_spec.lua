-- mesh_spec.lua: the device mesh (fsdp.mesh) in one process: a mesh of one
-- rank, the validation messages, the sizes for other worlds (what the
-- planner and the recipes' --plan use), the data-parallel rank functions,
-- fsdp.shard and fsdp.plan on a mesh, and the decoder recipes' mesh and
-- --tp checks. The 4-rank meshes and their training are tests/mpi/mesh.lua.
local fsdp = require 'fsdp'
local mesh_mod = require 'fsdp.mesh'
local layout = require 'fsdp.sharding.layout'
local shard_options = require 'fsdp.sharding.options'
local dr = require 'models.decoder_training'
local decoders = require 'models.decoders'
local llama = require 'models.llama'
local optim = require 'fsdp.optim'
local T = require 'fsdp.testing'

describe('fsdp.mesh on one rank', function()
  it('is 1 x 1 x 1 with this rank at 0 and groups of one, whatever sizes of 1 are given', function()
    for _, spec in ipairs({ {}, { dp_shard = 1 }, { tp = 1, dp_replicate = 1 }, { dp_replicate = 1, dp_shard = 1,
                                                                                     tp = 1 } }) do
      local m = fsdp.mesh.new(spec)
      for _, d in ipairs({ 'dp_replicate', 'dp_shard', 'tp', 'dp' }) do
        assert.are.equal(1, m:size(d))
        assert.are.equal(0, m:coordinate(d))
        assert.are.equal(1, m:group(d):size())
        assert.are.same({ 0 }, m:group(d):ranks())
      end
      assert.are.same({ { name = 'dp_replicate', size = 1 }, { name = 'dp_shard', size = 1 },
                        { name = 'tp', size = 1 } }, m:dims())
      assert.are.equal('mesh dp_replicate 1 x dp_shard 1 x tp 1 (rank 0: 0,0,0)', tostring(m))
      assert.is_true(mesh_mod.is_mesh(m))
    end
  end)

  it('refuses, in one line naming the thing at fault, what cannot be a mesh of this world', function()
    T.raises(function() mesh_mod.new({ pp = 2 }) end,
      "fsdp.mesh: unknown mesh dimension 'pp' (known: dp_replicate, dp_shard, tp)")
    T.raises(function() mesh_mod.new({ tp = 0 }) end, 'mesh dimension tp must be a positive integer, got 0')
    T.raises(function() mesh_mod.new({ dp_shard = 1.5 }) end, 'dp_shard must be a positive integer, got 1.5')
    T.raises(function() mesh_mod.new({ dp_replicate = '2' }) end, 'dp_replicate must be a positive integer, got 2')
    T.raises(function() mesh_mod.new({ dp_shard = 2 }) end,
      'mesh dp_replicate 1 x dp_shard 2 x tp 1 is 2 ranks, but the world has 1')
    T.raises(function() mesh_mod.new({ tp = 2 }) end,
      "the world's 1 rank do not split into dp_replicate 1 x tp 2 (2 ranks) times a whole dp_shard")
    T.raises(function() mesh_mod.new(4) end, 'expected a table {dp_replicate=, dp_shard=, tp=}, got number')
    local m = mesh_mod.new({})
    T.raises(function() m:size('pp') end, "fsdp.mesh: size: unknown dimension 'pp' (known: dp_replicate, dp_shard")
    T.raises(function() m:group('x') end, "group: unknown dimension 'x'")
    T.raises(function() mesh_mod.set_current({}) end, 'set_current: expected a mesh from fsdp.mesh.new')
  end)

  it('resolves sizes for other worlds: dp_shard inferred, the others 1 when omitted', function()
    assert.are.same({ dp_replicate = 2, dp_shard = 4, tp = 2 },
      mesh_mod.resolve_sizes({ dp_replicate = 2, tp = 2 }, 16))
    assert.are.same({ dp_replicate = 1, dp_shard = 8, tp = 8 }, mesh_mod.resolve_sizes({ tp = 8 }, 64))
    assert.are.same({ dp_replicate = 4, dp_shard = 2, tp = 1 }, mesh_mod.resolve_sizes({ dp_replicate = 4,
                                                                                          dp_shard = 2 }, 8))
    T.raises(function() mesh_mod.resolve_sizes({ dp_shard = 4, tp = 2 }, 16, 'fsdp.plan: mesh') end,
      'fsdp.plan: mesh: mesh dp_replicate 1 x dp_shard 4 x tp 2 is 8 ranks, but the world has 16')
    T.raises(function() mesh_mod.resolve_sizes({ tp = 3 }, 16) end, "the world's 16 ranks do not split")
  end)

  it('answers the data-parallel rank and size from the current mesh, else the world', function()
    assert.is_nil(mesh_mod.current())
    assert.are.equal(0, mesh_mod.data_parallel_rank())
    assert.are.equal(1, mesh_mod.data_parallel_size())
    assert.is_nil(mesh_mod.data_parallel_group())
    local m = mesh_mod.new({})
    mesh_mod.set_current(m)
    assert.are.equal(m, mesh_mod.current())
    assert.are.equal(m:group('dp'), mesh_mod.data_parallel_group())
    assert.are.equal(1, mesh_mod.data_parallel_size())
    local s = require('fsdp.data.sampler').new({ n = 8, batch_size = 2 })
    assert.are.equal(0, s.rank)
    assert.are.equal(1, s.world_size)
    mesh_mod.set_current(nil)
    assert.is_nil(mesh_mod.current())
  end)
end)

describe('sharding on a mesh', function()
  local CFG = { dim = 32, n_layers = 2, n_heads = 4, n_kv_heads = 2, ffn_dim = 64, vocab_size = 64, max_seq_len = 32 }
  local ids = fsdp.randint(0, 64, { 4, 16 }, { seed = 1 })
  local tg = fsdp.randint(0, 64, { 4, 16 }, { seed = 2 })

  local function train(opts)
    local m = llama.CausalLM(llama.config('Llama-2-7b', CFG), { device = 'meta' })
    opts.policy, opts.seed = fsdp.policy.transformer { llama.DecoderLayer }, 3
    fsdp.shard(m, opts)
    local opt = optim.AdamW(m:named_parameters(), { lr = 1e-3 })
    local losses = {}
    for _ = 1, 2 do
      local loss = m:loss(ids, tg)
      loss:backward()
      losses[#losses + 1] = { loss:item(), fsdp.clip_grad_norm(m, 0.5) }
      opt:step()
      opt:zero_grad()
    end
    return losses, fsdp.full_state_dict(m), m
  end

  it('trains with the bits of no mesh on a one-rank mesh, for every strategy', function()
    for _, st in ipairs(fsdp.sharding.strategies) do
      local want, wp = train({ strategy = st })
      local got, gp, m = train({ strategy = st, mesh = mesh_mod.new({}) })
      assert.are.same(want, got)
      for name, t in pairs(wp) do assert.are.equal(0, T.max_abs_diff(gp[name], t), st .. ' ' .. name) end
      assert.are.equal(1, fsdp.sharding.units(m)[1].replicas)
    end
  end)

  it('refuses a mesh that is not one, and a mesh with a group', function()
    local m = llama.CausalLM(llama.config('Llama-2-7b', CFG), { device = 'meta' })
    T.raises(function() fsdp.shard(m, { mesh = { dp_shard = 1 } }) end,
      'fsdp.shard: mesh must be a mesh from fsdp.mesh.new, got table')
    T.raises(function() fsdp.shard(m, { mesh = mesh_mod.new({}), group = fsdp.dist.world() }) end,
      'fsdp.shard: give group or mesh, not both')
  end)

  it('gives each strategy its shard and replica counts on mesh sizes, as the planner asks', function()
    local sizes = { dp_replicate = 2, dp_shard = 4, tp = 2 }
    for _, st in ipairs({ 'FULL_SHARD', 'SHARD_GRAD_OP', 'HYBRID_SHARD', 'HYBRID_SHARD_ZERO2' }) do
      local G, R = layout.strategy(st):mesh_shard_size(sizes)
      assert.are.same({ 4, 2 }, { G, R }, st)
    end
    assert.are.same({ 1, 8 }, { layout.NO_SHARD:mesh_shard_size(sizes) })
  end)

  it('plans a world it does not run in on mesh sizes: units shard over dp_shard', function()
    local m = llama.CausalLM(llama.config('Llama-2-7b', CFG), { device = 'meta' })
    local p = fsdp.plan(m, { world = 16, mesh = { dp_replicate = 2, tp = 2 }, batch = 1, seq = 16 })
    assert.are.equal(4, p.units[1].G)
    assert.are.equal(2, p.units[1].replicas)
    local flat = fsdp.plan(m, { world = 16, batch = 1, seq = 16 })
    assert.are.equal(16, flat.units[1].G)
    assert.is_true(p.comm.all_reduce ~= nil and p.comm.all_reduce.calls > 0)
    T.raises(function() fsdp.plan(m, { world = 16, mesh = { dp_shard = 3 }, batch = 1, seq = 16 }) end,
      'fsdp.plan: mesh: mesh dp_replicate 1 x dp_shard 3 x tp 1 is 3 ranks, but the world has 16')
  end)
end)

describe('the decoder recipes\' mesh options', function()
  local function sizes(o, where)
    local cfg = { tp = o.tp or 1, dp_shard = o.dp_shard or 0, dp_replicate = o.dp_replicate or 0,
                  sharding_strategy = o.strategy or 'FULL_SHARD' }
    return shard_options.mesh_sizes(cfg, where or { world = 8, nodes = 2 })
  end

  it('makes no mesh when none is given, and fills what is left from the strategy', function()
    assert.is_nil(sizes({}))
    assert.are.same({ dp_replicate = 1, dp_shard = 4, tp = 2 }, sizes({ tp = 2 }))
    assert.are.same({ dp_replicate = 2, dp_shard = 2, tp = 2 }, sizes({ tp = 2, strategy = 'HYBRID_SHARD' }))
    assert.are.same({ dp_replicate = 2, dp_shard = 4, tp = 1 }, sizes({ dp_replicate = 2 }))
    assert.are.same({ dp_replicate = 4, dp_shard = 1, tp = 2 }, sizes({ tp = 2, strategy = 'NO_SHARD' }))
    assert.are.same({ dp_replicate = 2, dp_shard = 4, tp = 1 }, sizes({ dp_shard = 4, strategy = 'HYBRID_SHARD' },
      { world = 8, nodes = 1 }))
  end)

  it('refuses meshes that contradict the world, the nodes or the strategy, in one line', function()
    T.raises(function() sizes({ tp = 3 }) end, '--tp=3 --dp_shard=(the rest) --dp_replicate=1: the world\'s 8 ranks')
    T.raises(function() sizes({ dp_shard = 2 }) end, 'dp_shard 2 x tp 1 is 2 ranks, but the world has 8')
    T.raises(function() sizes({ tp = 8, dp_shard = 1 }) end,
      '--tp=8 does not divide the 4 ranks per node: a tensor-parallel group must not straddle nodes')
    T.raises(function() sizes({ dp_shard = 2, strategy = 'NO_SHARD' }) end,
      '--dp_shard=2 contradicts --sharding_strategy=NO_SHARD')
    T.raises(function() sizes({ dp_shard = 8, strategy = 'HYBRID_SHARD' }) end,
      '--sharding_strategy=HYBRID_SHARD shards inside a node, but --dp_shard=8 x --tp=1 is 8 ranks')
  end)

  it('checks --tp against the model and the options before anything is built', function()
    local family, name = decoders.resolve('tiny')
    local fam = decoders.families[family]
    local c = fam.module.config(name, {})
    local cfg = { tp = 2 }
    for _, k in ipairs(dr.TP_UNSUPPORTED) do cfg[k[1]] = k[2] end
    local with_plan = { fam = { name = 'planned', module = { build = function()
      return { tp_plan = function() return {} end } end } } }
    dr.check_tp(cfg, c, with_plan) -- tiny: 4 heads, 2 kv heads, ffn 176, vocab 256 divide by 2
    cfg.tp = 4
    T.raises(function() dr.check_tp(cfg, c, with_plan) end,
      "--tp=4 does not divide the model's num_kv_heads (2)")
    cfg.tp = 2
    local moe = setmetatable({ moe_ffn_dim = 33 }, { __index = c })
    T.raises(function() dr.check_tp(cfg, moe, with_plan) end, "does not divide the model's moe_ffn_dim (33)")
    cfg.lora_rank, cfg.lora_dropout = 8, 0
    dr.check_tp(cfg, c, with_plan) -- LoRA is applied before TP, which splits the adapters
    cfg.lora_dropout = 0.1
    T.raises(function() dr.check_tp(cfg, c, with_plan) end, '--tp=2 with --lora_dropout=0.1')
    cfg.lora_rank, cfg.lora_dropout = 0, nil
    local no_plan = { fam = { name = 'plain', module = { build = function() return {} end } } }
    T.raises(function() dr.check_tp(cfg, c, no_plan) end,
      '--tp=2: the plain family has no tensor-parallel plan (model:tp_plan)')
  end)

  it('refuses --tp in a recipe run with one line, and prints the mesh it trains on', function()
    local out, rc = T.run_script('recipes/llama2_7b.lua', '--model=tiny --max_steps=1 --warmup_steps=0 --tp=2 2>&1', 60)
    assert.are_not.equal(0, rc)
    assert.is_truthy(out:find('--tp=2 --dp_shard=(the rest) --dp_replicate=1: the world\'s 1 rank', 1, true), out)
    out, rc = T.run_script('recipes/llama2_7b.lua',
      '--model=tiny --max_steps=1 --warmup_steps=0 --validation_freq=0 --dp_shard=1 2>&1', 120)
    assert.are.equal(0, rc, out)
    assert.is_truthy(out:find('mesh dp_replicate 1 x dp_shard 1 x tp 1 (rank 0: 0,0,0)', 1, true), out)
    assert.is_truthy(out:find('sharding: FULL_SHARD over the mesh dp_replicate 1 x dp_shard 1 x tp 1', 1, true), out)
  end)
end)
