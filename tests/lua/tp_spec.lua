-- tp_spec.lua: fsdp.tp on one process: the checks of a plan and of
-- parallelize (one clear line naming the module, before anything
-- changes), the families' plans, the TP init keying (a shard's values are
-- the logical tensor's, for dim-0 and dim-1 shards and for FSDP segments
-- that start mid-row), a tp 1 model (a group of one, with and
-- without sequence parallelism, whose plan checks run on one rank too)
-- equal to the plain model, and the collectives of a layer's forward and
-- backward (over a planning group, which records them on meta tensors). The numerics on 2 and 4 ranks: tests/mpi/tp_layers.lua and
-- tests/mpi/tp_equivalence.lua.
local fsdp = require 'fsdp'
local nn = fsdp.nn
local tp = require 'fsdp.tp'
local lora = require 'fsdp.lora'
local llama = require 'models.llama'
local decoders = require 'models.decoders'
local parameter = require 'fsdp.nn.parameter'

local CFG = { dim = 32, n_layers = 2, n_heads = 4, n_kv_heads = 2, ffn_dim = 64, vocab_size = 64, max_seq_len = 32 }

local function meta_llama(over)
  local c = {}
  for k, v in pairs(CFG) do c[k] = v end
  for k, v in pairs(over or {}) do c[k] = v end
  return llama.CausalLM(llama.config('Llama-2-7b', c), { device = 'meta' })
end

local function err_of(fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok, 'expected an error')
  return tostring(err)
end

local world = fsdp.dist.world()

describe('tp.parallelize checks', function()
  it('needs a group or a mesh', function()
    local m = meta_llama()
    assert.matches('needs {mesh = m}', err_of(tp.parallelize, m, m:tp_plan(), {}), 1, true)
    assert.matches('no :group', err_of(tp.parallelize, m, m:tp_plan(), { mesh = {} }), 1, true)
    assert.matches('not an fsdp.dist Group', err_of(tp.parallelize, m, m:tp_plan(), { group = 3 }), 1, true)
  end)

  it('takes the tp group of a mesh', function()
    local m = meta_llama()
    local asked
    tp.parallelize(m, m:tp_plan(), { mesh = { group = function(_, dim) asked = dim; return world end } })
    assert.equal('tp', asked)
    assert.equal(world, tp.group(m))
  end)

  it('refuses a malformed plan', function()
    local m = meta_llama()
    assert.matches('non%-empty list', err_of(tp.parallelize, m, {}, { group = world }))
    assert.matches("unknown style diagonal", err_of(tp.parallelize, m, { { match = 'x', style = 'diagonal' } },
      { group = world }), 1, true)
    assert.matches('plan entry 1 needs match', err_of(tp.parallelize, m, { { style = 'colwise' } }, { group = world }),
      1, true)
    assert.matches('matched no module', err_of(tp.parallelize, m, { { match = 'nothing', style = 'colwise' } },
      { group = world }), 1, true)
  end)

  it('refuses a style on the wrong module, naming it, and changes nothing', function()
    local m = meta_llama()
    local e = err_of(tp.parallelize, m, { { match = 'input_layernorm$', style = 'colwise' } }, { group = world })
    assert.matches("model.layers.0.input_layernorm is a RMSNorm; 'colwise' takes a Linear", e, 1, true)
    e = err_of(tp.parallelize, m, { { match = '%.self_attn$', style = 'attention' } }, { group = world })
    assert.matches("model.layers.0.self_attn: its q_proj must be 'colwise' in the plan", e, 1, true)
    assert.is_nil(rawget(m.model.layers[1].self_attn.q_proj.weight, 'tp'))
    assert.equal(4, m.model.layers[1].self_attn.n_heads)
  end)

  it('refuses a sharded model and a second parallelize', function()
    local m = meta_llama()
    tp.parallelize(m, m:tp_plan(), { group = world })
    assert.matches('already tensor%-parallel', err_of(tp.parallelize, m, m:tp_plan(), { group = world }))
    local s = meta_llama()
    fsdp.shard(s, { group = world })
    assert.matches('call tp.parallelize before fsdp.shard', err_of(tp.parallelize, s, s:tp_plan(), { group = world }),
      1, true)
  end)

  it('refuses LoRA on a layer already tensor-parallel (LoRA goes first)', function()
    local m = meta_llama()
    tp.parallelize(m, m:tp_plan(), { group = world })
    assert.matches('apply LoRA before fsdp.tp.parallelize', err_of(lora.apply, m, { rank = 4, targets = { 'q_proj' } }), 1, true)
  end)

  it('refuses LoRA dropout', function()
    local m = meta_llama()
    lora.apply(m, { rank = 4, targets = { 'q_proj' }, dropout = 0.1 })
    assert.matches('LoRA dropout 0.1 with TP is not supported', err_of(tp.parallelize, m, m:tp_plan(),
      { group = world }), 1, true)
  end)
end)

describe('the decoder families\' TP plans', function()
  local function build(family)
    return decoders.families[family].module.build('tiny', { device = 'meta' })
  end

  it('refuses fused projections, experts and whole-projection q/k norms in one line', function()
    assert.matches('phi3: no tensor%-parallel plan for its fused qkv_proj', err_of(function() build('phi3'):tp_plan() end))
    assert.matches('mixture%-of%-experts', err_of(function() build('qwen3_moe'):tp_plan() end))
    assert.matches('whole projection', err_of(function() build('olmo2'):tp_plan() end))
  end)

  it('parallelizes every other family with a group of one and keeps its loss, with and without SP', function()
    for _, family in ipairs({ 'llama', 'qwen2', 'qwen3', 'mistral', 'gemma2', 'gemma3_text' }) do
      for _, sp in ipairs({ false, true }) do
        local ref, m = build(family), build(family)
        -- (sequence_parallel checks the plan's regions and norms here; on one rank it moves nothing)
        tp.parallelize(m, m:tp_plan(), { group = world, sequence_parallel = sp })
        local n = 0
        for _, np in ipairs(m:named_parameters()) do if rawget(np[2], 'tp') then n = n + 1 end end
        assert.is_true(n > 0, family)
        ref:init_weights({ device = 'cpu', seed = 1 })
        m:init_weights({ device = 'cpu', seed = 1 })
        local ids = fsdp.randint(0, ref.config.vocab_size, { 1, 6 }, { seed = 2 })
        local a, b = ref:loss(ids, ids), m:loss(ids, ids)
        assert.is_true(math.abs(a:item() - b:item()) <= 1e-6 * math.abs(a:item()), family)
      end
    end
  end)

  it('refuses, with sequence_parallel, a plan that leaves a norm out or a projection outside a region', function()
    local function plan_without(style)
      local m, plan = build('llama'), {}
      for _, e in ipairs(m:tp_plan()) do if e.style ~= style then plan[#plan + 1] = e end end
      return m, plan
    end
    local m, plan = plan_without('sequence')
    assert.matches("model.layers.0.input_layernorm (RMSNorm) holds parameters between the TP regions",
      err_of(tp.parallelize, m, plan, { group = world, sequence_parallel = true }), 1, true)
    tp.parallelize(m, plan, { group = world }) -- (without SP the norms need no style)
    m, plan = plan_without('region')
    assert.matches("'colwise' outside a region", err_of(tp.parallelize, m, plan, { group = world,
      sequence_parallel = true }), 1, true)
    m = build('llama')
    plan = { { match = '%.self_attn%.q_norm$', style = 'sequence' } }
    for _, e in ipairs(m:tp_plan()) do plan[#plan + 1] = e end
    m = build('qwen3')
    assert.matches("_norm is 'sequence' inside the region model.layers.", err_of(tp.parallelize, m, plan,
      { group = world, sequence_parallel = true }), 1, true)
    assert.matches('sequence_parallel must be true or false', err_of(tp.parallelize, m, m:tp_plan(),
      { group = world, sequence_parallel = 1 }), 1, true)
  end)
end)

describe('TP collectives per layer (a planning group records each)', function()
  -- The collectives (kind:bytes) of one step of a meta Llama with `layers`
  -- layers parallelized over a planning group of 2, forward and backward.
  local function step_log(layers, plan_of, sp)
    local m = meta_llama({ n_layers = layers })
    local g = fsdp.dist.planning_group(2)
    tp.parallelize(m, plan_of and plan_of(m) or m:tp_plan(), { group = g, sequence_parallel = sp })
    local ids = fsdp.empty({ 2, 8 }, { device = 'meta', dtype = 'i64' })
    local loss = m:loss(ids, ids)
    local n = #g.log
    loss:backward()
    local fwd, bwd = {}, {}
    for i, r in ipairs(g.log) do table.insert(i <= n and fwd or bwd, r.kind .. ':' .. r.bytes) end
    return fwd, bwd
  end
  -- What one more layer adds: the entries of the longer list past the shorter's, as a multiset.
  local function one_layer(plan_of, sp)
    local f1, b1 = step_log(1, plan_of, sp)
    local f2, b2 = step_log(2, plan_of, sp)
    local function extra(short, long)
      local left = {}
      for _, k in ipairs(long) do left[k] = (left[k] or 0) + 1 end
      for _, k in ipairs(short) do left[k] = left[k] - 1 end
      for k, c in pairs(left) do if c == 0 then left[k] = nil end end
      return left
    end
    return extra(f1, f2), extra(b1, b2)
  end
  local act = 2 * 8 * CFG.dim * 4 -- one [2, 8, dim] f32 activation

  it('are Megatron-LM\'s: 2 all-reduces forward (o, down) and 2 backward (the regions\' inputs)', function()
    local f, b = one_layer()
    assert.same({ ['all_reduce:' .. act] = 2 }, f)
    assert.same({ ['all_reduce:' .. act] = 2 }, b)
  end)

  it('are a copy_to per colwise layer outside a region (a plan without the MLP\'s region)', function()
    local function no_region(m)
      local plan = {}
      for _, e in ipairs(m:tp_plan()) do if e.style ~= 'region' then plan[#plan + 1] = e end end
      return plan
    end
    local f, b = one_layer(no_region)
    assert.same({ ['all_reduce:' .. act] = 2 }, f)
    assert.same({ ['all_reduce:' .. act] = 3 }, b) -- the attention's input, gate's and up's
  end)

  it('under sequence parallelism: a gather and a reduce-scatter per region, each way, and the norms\' weights',
    function()
      local f, b = one_layer(nil, true)
      assert.same({ ['all_gather:' .. act] = 2, ['reduce_scatter:' .. act] = 2 }, f)
      -- (the two norms' weight gradients are summed: [Note: sequence parallelism])
      assert.same({ ['all_gather:' .. act] = 2, ['reduce_scatter:' .. act] = 2, ['all_reduce:' .. CFG.dim * 4] = 2 },
        b)
    end)

  it('refuses a region inside a region, naming both', function()
    local m = meta_llama()
    local plan = { { match = '^model%.layers%.%d+$', style = 'region' } }
    for _, e in ipairs(m:tp_plan()) do plan[#plan + 1] = e end
    assert.matches("model.layers.0.self_attn is 'attention' inside the region model.layers.0: "
      .. 'regions do not nest', err_of(tp.parallelize, m, plan, { group = world }), 1, true)
  end)
end)

describe('TP init keying', function()
  -- The logical tensor, filled as one process fills it.
  local function logical(shape, rule)
    local t = fsdp.empty(shape)
    parameter.fill(t, rule, { seed = 3, name = 'w' })
    return t
  end

  local function shard(rule, tp_, shape, offset, n)
    local t = fsdp.empty({ n })
    local r = require('fsdp.tp.shard_init').rule(rule, tp_, 'w')
    parameter.fill(t, r, { seed = 3, name = 'w', offset = offset })
    return t
  end

  for _, rule in ipairs({ nn.init.normal(0.02), nn.init.kaiming_uniform(7), nn.init.uniform(-1, 2) }) do
    it('gives a dim-0 and a dim-1 shard, whole or as segments, the logical values (' .. rule.kind .. ')', function()
      local full = logical({ 6, 8 }, rule)
      for rank = 0, 1 do
        local rows = { dim = 0, size = 2, rank = rank, global_shape = { 6, 8 } }
        local want0 = full:narrow(0, rank * 3, 3):contiguous():reshape(-1)
        assert.same(want0:tolist(), shard(rule, rows, nil, 0, 24):tolist())
        assert.same(want0:narrow(0, 5, 11):tolist(), shard(rule, rows, nil, 5, 11):tolist())
        local cols = { dim = 1, size = 2, rank = rank, global_shape = { 6, 8 } }
        local want1 = full:narrow(1, rank * 4, 4):contiguous():reshape(-1)
        assert.same(want1:tolist(), shard(rule, cols, nil, 0, 24):tolist())
        -- a segment starting and ending mid-row
        assert.same(want1:narrow(0, 3, 14):tolist(), shard(rule, cols, nil, 3, 14):tolist())
      end
    end)
  end

  it('keeps index-free rules and refuses computed ones', function()
    local si = require 'fsdp.tp.shard_init'
    local z = nn.init.zeros()
    assert.equal(z, si.rule(z, { dim = 1, size = 2, rank = 0, global_shape = { 2, 2 } }, 'w'))
    assert.matches('computed %(function%) init rule', err_of(si.rule, function() end,
      { dim = 0, size = 2, rank = 0, global_shape = { 2 } }, 'layers.0.w'))
  end)

  it('marks TP shards with p.tp and leaves replicated parameters alone', function()
    local m = meta_llama()
    tp.parallelize(m, m:tp_plan(), { group = world })
    local l = m.model.layers[1]
    assert.same({ dim = 0, size = 1, rank = 0, global_shape = { 32, 32 } }, rawget(l.self_attn.q_proj.weight, 'tp'))
    assert.same({ dim = 1, size = 1, rank = 0, global_shape = { 32, 64 } }, rawget(l.mlp.down_proj.weight, 'tp'))
    assert.same({ dim = 0, size = 1, rank = 0, global_shape = { 64, 32 } }, rawget(m.lm_head.weight, 'tp'))
    assert.is_nil(rawget(l.input_layernorm.weight, 'tp'))
  end)
end)
