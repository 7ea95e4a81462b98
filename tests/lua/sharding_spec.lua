-- sharding_spec.lua: fsdp.shard in one process (world of one rank, the
-- `self` backend): training identical to the plain model, deferred init
-- identical to a whole init, policies and per-unit overrides, what the
-- model shows (names, print), summon/full_state_dict, clipping, meta
-- planning, the C unit's state machine, and the errors. The multi-rank
-- behaviour is tested under mpirun (tests/mpi/fsdp_*.lua).
local fsdp = require 'fsdp'
local ffi = require 'ffi'
local llama = require 'models.llama'
local optim = require 'fsdp.optim'
local core = require 'fsdp.core'
local Tensor = require 'fsdp.tensor'

local CFG = { dim = 32, n_layers = 3, n_heads = 4, n_kv_heads = 2, ffn_dim = 64, vocab_size = 64,
              max_seq_len = 32 }
local is_block = function(m) return m:is_instance_of(llama.DecoderLayer) end
local policy = fsdp.policy.transformer { llama.DecoderLayer }
local ids = fsdp.randint(0, 64, { 2, 16 }, { seed = 1 })
local tg = fsdp.randint(0, 64, { 2, 16 }, { seed = 2 })

local function meta_model(cfg)
  return llama.CausalLM(llama.config('Llama-2-7b', cfg or CFG), { device = 'meta' })
end

local function plain_model()
  local m = meta_model()
  m:init_weights({ seed = 4, device = 'cpu' })
  return m
end

local function sharded(opts)
  opts = opts or {}
  opts.seed = opts.seed or 4
  if opts.policy == nil then opts.policy = policy end
  return fsdp.shard(meta_model(), opts)
end

local function train(m, steps, clip)
  local opt = optim.AdamW(m:named_parameters(), { lr = 1e-2 })
  local losses = {}
  for _ = 1, steps do
    local loss = m:loss(ids, tg)
    loss:backward()
    if clip then
      if rawget(m, '_fsdp') then fsdp.clip_grad_norm(m, clip) else optim.clip_grad_norm_(m:parameters(), clip) end
    end
    opt:step()
    opt:zero_grad()
    losses[#losses + 1] = loss:item()
  end
  return losses
end

local function full_params(m)
  if rawget(m, '_fsdp') then return fsdp.full_state_dict(m) end
  local out = {}
  for _, np in ipairs(m:named_parameters()) do out[np[1]] = np[2] end
  return out
end

local function assert_same_params(a, b, tol)
  local n = 0
  for name, t in pairs(a) do
    if b[name] ~= nil or t.is_param then
      assert.is_not_nil(b[name], name)
      local err = (t:double() - b[name]:double()):abs():max():item()
      assert.is_true(err <= (tol or 0), ('%s differs by %g'):format(name, err))
      n = n + 1
    end
  end
  assert.is_true(n > 0)
end

describe('fsdp.shard on one rank', function()
  it('initialises each shard from the rules: equal to a whole init', function()
    local whole, m = plain_model(), sharded()
    local full = fsdp.full_state_dict(m)
    for _, np in ipairs(whole:named_parameters()) do
      assert.equals(0, (full[np[1]] - np[2]):abs():max():item(), np[1])
    end
  end)

  it('trains exactly like the unsharded model, with and without checkpointing', function()
    local plain = plain_model()
    local want = train(plain, 3, 0.5)
    for _, ckpt in ipairs({ false, true }) do
      local m = sharded()
      if ckpt then fsdp.checkpoint(m, is_block) end
      local got = train(m, 3, 0.5)
      for i = 1, 3 do assert.near(want[i], got[i], 1e-6 * math.abs(want[i])) end
      local fp = full_params(m)
      for _, np in ipairs(plain:named_parameters()) do
        local err = (fp[np[1]] - np[2]):abs():max():item()
        assert.is_true(err < 1e-6, np[1] .. ' ' .. err)
      end
    end
  end)

  it('shards T5, DeepViT and GPT-2 by their block classes, training exactly as unsharded', function()
    local F = require 'fsdp.functional'
    local function compare(build, block, loss_fn, n_units)
      local plain = build(); plain:init_weights({ seed = 9, device = 'cpu' })
      local m = fsdp.shard(build(), { policy = fsdp.policy.transformer { block }, seed = 9 })
      fsdp.checkpoint(m, function(x) return x:is_instance_of(block) end)
      assert.equals(n_units, #fsdp.sharding.units(m))
      local losses = {}
      for k, mod in ipairs({ plain, m }) do
        local opt = optim.AdamW(mod:named_parameters(), { lr = 1e-3 })
        for _ = 1, 3 do
          local l = loss_fn(mod); l:backward(); opt:step(); opt:zero_grad()
          losses[k] = l:item()
        end
      end
      assert.near(losses[1], losses[2], 1e-6 * math.abs(losses[1]))
    end
    local t5 = require 'models.t5'
    local src, lab = fsdp.randint(0, 32, { 2, 8 }, { seed = 1 }), fsdp.randint(0, 32, { 2, 6 }, { seed = 2 })
    local mask = fsdp.tensor({ { 1, 1, 1, 1, 1, 1, 0, 0 }, { 1, 1, 1, 1, 1, 1, 1, 1 } }, { dtype = 'i64' })
    compare(function() return t5.build('tiny', { device = 'meta' }) end, t5.Block,
      function(m) return m:loss(src, lab, { attention_mask = mask }) end, 5)
    local deepvit = require 'models.deepvit'
    local img, y = fsdp.randn({ 2, 3, 32, 32 }, { seed = 3 }), fsdp.tensor({ 1, 7 }, { dtype = 'i64' })
    compare(function() return deepvit.build('tiny', { device = 'meta' }) end, deepvit.Block,
      function(m) return F.cross_entropy(m(img), y) end, 3)
    local gpt2 = require 'models.gpt2'
    local toks = fsdp.randint(0, 64, { 2, 16 }, { seed = 4 })
    compare(function()
      return gpt2.build({ n_layer = 2, n_embd = 32, n_head = 4, vocab_size = 64, n_positions = 32 }, { device = 'meta' })
    end, gpt2.Block, function(m) return m:loss(toks, toks) end, 3)
  end)

  it('keeps original names, with 1-d shard segments and their shapes', function()
    local m = sharded()
    local names = {}
    for _, np in ipairs(m:named_parameters()) do names[#names + 1] = np[1] end
    local want = {}
    for _, np in ipairs(plain_model():named_parameters()) do want[#want + 1] = np[1] end
    assert.same(want, names)
    local q = m.model.layers[1].self_attn.q_proj.weight
    assert.equals(1, q:dim())
    assert.same({ 32, 32 }, q.fsdp_shape)
    assert.equals(1024, q:numel())
  end)

  it('says why an op failed on a unit that was not gathered: forward() called past the module call', function()
    local m = llama.CausalLM(llama.config('tiny', { dim = 32, n_layers = 2, n_heads = 4, n_kv_heads = 2, ffn_dim = 48,
      vocab_size = 64 }), { device = 'meta' })
    fsdp.shard(m, { policy = fsdp.policy.transformer { llama.DecoderLayer }, seed = 1 })
    local ids = fsdp.randint(0, 64, { 2, 8 }, { seed = 1 })
    local ok, err = pcall(function() return m:forward(ids) end)
    assert.is_false(ok)
    assert.matches("in model%.embed_tokens: .*embedding: weight must be 2%-d .*got shape %[2048%] %(its parameter "
      .. "weight %[64, 32%] is not gathered: it holds this rank's 1%-d shard of sharded unit <root>, which is "
      .. "gathered when a module is called, as model%(x%) or self%.block%(x%); calling forward%(%) directly "
      .. "%(self:forward%(x%)%) skips that%)$", tostring(err))
    assert.equals(64, m(ids).shape[3]) -- called as a module it runs
  end)

  it('prints its units like FSDP', function()
    local s = tostring(sharded({ strategy = 'SHARD_GRAD_OP' }))
    assert.truthy(s:find('^FullyShardedDataParallel%(SHARD_GRAD_OP, 3 params'))
    assert.truthy(s:find('%(0%-2%): 3 x FullyShardedDataParallel%(SHARD_GRAD_OP, 9 params, numel 9,280'))
    assert.truthy(s:find('(_fsdp_wrapped_module): LlamaDecoderLayer(', 1, true))
  end)

  it('applies policies bottom-up with per-unit overrides', function()
    local seen = {}
    local m = sharded({
      policy = function(mod, name, numel)
        seen[#seen + 1] = name
        if name == 'lm_head' then return { strategy = 'NO_SHARD', mixed_precision = { param = 'bf16' } } end
        return is_block(mod)
      end,
    })
    local units = fsdp.sharding.units(m)
    assert.equals(5, #units) -- 3 blocks, lm_head, root
    assert.equals('lm_head', units[4].name)
    assert.equals('NO_SHARD', units[4].strategy)
    assert.equals('bf16', units[4].param_dtype)
    assert.equals('', units[5].name)
    assert.equals('FULL_SHARD', units[5].strategy)
    -- children are asked before their parent
    local pos = {}
    for i, n in ipairs(seen) do pos[n] = i end
    assert.is_true(pos['model.layers.0.self_attn.q_proj'] < pos['model.layers.0'])
    -- a NO_SHARD bf16 head still trains
    local l = train(m, 2)
    assert.is_true(l[2] < l[1])
  end)

  it('wraps by size: fsdp.policy.size counts only unclaimed parameters', function()
    local function names(min)
      local out = {}
      for _, u in ipairs(fsdp.sharding.units(sharded({ policy = fsdp.policy.size { min_params = min } }))) do
        out[#out + 1] = u.name
      end
      return out
    end
    -- blocks have 9,280 parameters, their MLPs 6,144, attention 3,072
    assert.same({ 'model.layers.0', 'model.layers.1', 'model.layers.2', '' }, names(7000))
    -- at 5000 the MLPs go first; what is left of the three blocks (3 x 3,136)
    -- would make their ModuleList a unit, but nothing calls a ModuleList's
    -- forward (FSDP excludes it too): the rest rises to the LlamaModel
    assert.same({ 'model.layers.0.mlp', 'model.layers.1.mlp', 'model.layers.2.mlp', 'model', '' }, names(5000))
    -- and that model trains: every unit is gathered when it runs
    local m = sharded({ policy = fsdp.policy.size { min_params = 5000 } })
    assert.equals(2, #train(m, 2))
  end)

  it('refuses a policy that wraps a ModuleList, naming it', function()
    local ok, err = pcall(sharded, { policy = function(_, name) return name == 'model.layers' end })
    assert.is_false(ok)
    assert.matches('policy chose model.layers, a ModuleList', tostring(err), 1, true)
  end)

  it('runs mixed precision: bf16 compute, f32 master shards', function()
    local m = sharded({ mixed_precision = { param = 'bf16', reduce = 'f32', buffer = 'bf16' } })
    local during
    m.model.layers[1]:register_forward_hook(function(self) during = self.mlp.up_proj.weight end)
    local loss = m:loss(ids, tg)
    assert.equals('bf16', during.dtype)
    assert.same({ 64, 32 }, during.shape)
    loss:backward()
    local seg = m.model.layers[1].mlp.up_proj.weight
    assert.equals('f32', seg.dtype)
    assert.equals('f32', seg.grad.dtype)
    local l = train(m, 3)
    assert.is_true(l[3] < l[1])
  end)

  it('gives a parameter unused in forward a zero gradient, other gradients exact', function()
    local nn = require 'fsdp.nn'
    local Two = nn.Module:extend('TwoLinears')
    function Two:__init(opts)
      self.used = nn.Linear(128, 128, opts)
      self.unused = nn.Linear(128, 128, opts)
    end
    function Two:forward(x) return self.used(x) end
    local x = fsdp.randn({ 4, 128 }, { seed = 2 })
    local g = fsdp.randn({ 4, 128 }, { seed = 3 })
    local plain = Two({ device = 'meta' })
    plain:init_weights({ seed = 1, device = 'cpu' })
    plain(x):backward(g)
    local flat = 2 * (128 * 128 + 128)
    for _, mp in ipairs({ false, 'bf16' }) do
      local dt = mp or 'f32'
      local m = fsdp.shard(Two({ device = 'meta' }), { seed = 1, mixed_precision = mp or nil })
      local y = m(x:to(dt))
      -- a block of the flat gradient's size, full of garbage, waiting in
      -- the allocator's cache for the backward to take
      fsdp.full({ flat }, 7, { dtype = dt }):free()
      y:backward(g:to(dt))
      assert.same(fsdp.zeros(128 * 128):tolist(), m.unused.weight.grad:view(-1):tolist())
      assert.same(fsdp.zeros(128):tolist(), m.unused.bias.grad:tolist())
      -- f32: the same products, exact; bf16: inputs and result rounded to
      -- bf16 (a few units of 2^-8 of the largest gradient)
      local want = plain.used.weight.grad
      local tol = mp and 0.02 * want:abs():max():item() or 0
      local got = m.used.weight.grad:view(128, 128)
      local diff = require('fsdp.testing').max_abs_diff(got, plain.used.weight.grad)
      assert.is_true(diff <= tol, ('%s: %g'):format(dt, diff))
    end
  end)

  it('keeps low-precision gradients when asked', function()
    local m = sharded({ mixed_precision = { param = 'bf16', keep_low_precision_grads = true } })
    local l = train(m, 3)
    assert.equals('bf16', m.lm_head.weight.grad == nil and 'bf16' or m.lm_head.weight.grad.dtype)
    local loss = m:loss(ids, tg); loss:backward()
    assert.equals('bf16', m.lm_head.weight.grad.dtype)
    assert.equals('f32', m.lm_head.weight.dtype)
    assert.is_true(l[3] < l[1])
  end)

  it('summons full parameters, writing changes back when asked', function()
    local m = sharded()
    fsdp.summon_full_params(m, function()
      assert.same({ 64, 32 }, m.lm_head.weight.shape)
      m.lm_head.weight:fill_(0.5)
    end)
    assert.is_true(fsdp.full_state_dict(m)['lm_head.weight']:sum():item() ~= 0.5 * 64 * 32)
    fsdp.summon_full_params(m, function() m.lm_head.weight:fill_(0.25) end, { writeback = true })
    assert.equals(0.25 * 64 * 32, fsdp.full_state_dict(m)['lm_head.weight']:sum():item())
    assert.equals(1, m.lm_head.weight:dim()) -- back to the segment
  end)

  it('accumulates gradients under no_sync like two backward passes', function()
    local a, b = sharded(), sharded()
    local la = a:loss(ids, tg); la:backward()
    local lb = a:loss(ids, tg); lb:backward()
    b:no_sync(function() local l = b:loss(ids, tg); l:backward() end)
    local l2 = b:loss(ids, tg); l2:backward()
    local ga, gb = a.lm_head.weight.grad, b.lm_head.weight.grad
    assert.is_true((ga - gb):abs():max():item() < 1e-6)
  end)

  it('drops gradients on zero_grad: the next backward starts afresh', function()
    local m = sharded()
    local l = m:loss(ids, tg); l:backward()
    local first = m.lm_head.weight.grad:clone()
    m:zero_grad()
    assert.is_nil(m.lm_head.weight.grad)
    l = m:loss(ids, tg); l:backward()
    assert.equals(0, (m.lm_head.weight.grad - first):abs():max():item())
  end)

  it('updates each unit with one fused call per parameter group, state by name', function()
    local function make(m)
      return optim.AdamW(m:named_parameters(), { lr = 1e-2, groups = {
        { match = function(name) return name:find('norm') ~= nil end, weight_decay = 0 } } })
    end
    local m = sharded()
    local opt = make(m)
    for _ = 1, 2 do
      local l = m:loss(ids, tg); l:backward(); opt:step(); opt:zero_grad()
    end
    -- a block: q, k, v, o, gate, up, down in one run; its two norms in another
    local runs = 0
    for _, g in ipairs(opt.runs) do
      for _, r in ipairs(g) do if r.unit.name == 'model.layers.1' then runs = runs + 1 end end
    end
    assert.equals(2, runs)
    local sd = opt:state_dict()
    local st = sd.state['model.layers.1.mlp.up_proj.weight']
    assert.equals(2, st.step)
    assert.equals(2048, st.exp_avg:numel())
    assert.is_nil(sd.state['model.layers.1.self_attn.q_proj.weight#run'])
    -- a fresh optimizer loading that state continues exactly
    local saved = {}
    for name, s in pairs(sd.state) do
      saved[name] = { step = s.step, exp_avg = s.exp_avg:clone(), exp_avg_sq = s.exp_avg_sq:clone() }
    end
    local m2 = sharded()
    fsdp.summon_full_params(m2, function()
      local full = fsdp.full_state_dict(m)
      for _, np in ipairs(m2:named_parameters()) do np[2]:copy_(full[np[1]]) end
    end, { writeback = true })
    local opt2 = make(m2)
    opt2:load_state_dict({ state = saved, param_groups = sd.param_groups })
    for _, pair in ipairs({ { m, opt }, { m2, opt2 } }) do
      local l = pair[1]:loss(ids, tg); l:backward(); pair[2]:step(); pair[2]:zero_grad()
    end
    assert_same_params(fsdp.full_state_dict(m), fsdp.full_state_dict(m2), 0)
  end)

  -- Unit:sync_zero_grad (lua/fsdp/sharding/unit.lua): a gradient that
  -- zero_grad dropped goes before the next one is packed, so the second
  -- step holds it once, as fsdp.plan predicts. With a root unit (the
  -- vocabulary's embedding and head) far larger than the blocks, holding
  -- it twice put the step's peak a root gradient over the plan; both the
  -- default collection budget (the dropped views are garbage) and exact
  -- accounting.
  it('frees a gradient zero_grad dropped before packing the next, as planned', function()
    local cfg = { dim = 64, n_layers = 2, n_heads = 4, n_kv_heads = 2, ffn_dim = 128, vocab_size = 4096,
                  max_seq_len = 16 }
    local c = llama.config('tiny', cfg)
    local x = fsdp.randint(0, 4096, { 1, 16 }, { seed = 1 })
    local y = fsdp.randint(0, 4096, { 1, 16 }, { seed = 2 })
    local plan = fsdp.plan(llama.CausalLM(c, { device = 'meta' }), { world = 1, batch = 1, seq = 16, device = 'cpu' })
    local root_grad = 2 * 4096 * 64 * 4
    for _, budget in ipairs({ 0, 64 * 2^20 }) do
      local was = fsdp.set_collect_budget(0)
      fsdp.collect()
      local base = fsdp.memory_stats('cpu').in_use
      local m = llama.CausalLM(c, { device = 'meta' })
      fsdp.shard(m, { policy = policy, seed = 1 })
      local opt = optim.AdamW(m:parameters(), { lr = 1e-3 })
      fsdp.set_collect_budget(budget)
      local peak
      for step = 1, 2 do
        if step == 2 then
          fsdp.collect() -- (the same garbage in the step whatever ran before)
          fsdp.reset_memory_stats('cpu')
        end
        local l = m:loss(x, y); l:backward(); opt:step(); opt:zero_grad()
        l = nil -- luacheck: ignore
        peak = fsdp.memory_stats('cpu').peak - base
      end
      fsdp.set_collect_budget(was)
      -- exact accounting meets the plan; with garbage left to the budget
      -- more may be in use, but never the root gradient twice
      if budget == 0 then
        assert.is_true(math.abs(peak - plan.memory.peak) <= plan.memory.peak * 1e-3,
          ('peak %d, planned %d'):format(peak, plan.memory.peak))
      else
        assert.is_true(peak < plan.memory.peak + root_grad, ('peak %d, planned %d'):format(peak, plan.memory.peak))
      end
      m, opt = nil, nil -- luacheck: ignore
      fsdp.collect()
    end
  end)

  it('reports the memory a rank holds', function()
    local m = sharded()
    local opt = optim.AdamW(m:named_parameters(), { lr = 1e-3 })
    local l = m:loss(ids, tg); l:backward(); opt:step()
    local r = fsdp.sharding.memory(m, opt)
    local n = plain_model():num_parameters()
    assert.equals(n * 4, r.params)
    assert.equals(n * 4, r.grads)
    assert.equals(n * 8, r.optimizer)
    assert.equals(r.params + r.grads + r.optimizer + r.buffers, r.persistent)
  end)

  -- [Note: traces pin closures] (fsdp.collect in lua/fsdp/init.lua). In a
  -- fresh process, where the first model's closures are the ones the JIT
  -- specializes on: after two plain collections the dropped model may still
  -- hold memory; after fsdp.collect() it holds none.
  it('gives back all of a dropped model with fsdp.collect()', function()
    local script = [[
      local fsdp = require 'fsdp'
      local llama = require 'models.llama'
      fsdp.set_collect_budget(0)
      fsdp.collect()
      local base = fsdp.memory_stats('cpu').in_use
      for _ = 1, 2 do
        local c = llama.config('tiny', { dim = 32, n_layers = 3, n_heads = 4, n_kv_heads = 2, ffn_dim = 64,
                                         vocab_size = 64, max_seq_len = 32 })
        local m = llama.CausalLM(c, { device = 'meta' })
        fsdp.shard(m, { policy = fsdp.policy.transformer { llama.DecoderLayer }, seed = 1 })
        local opt = require('fsdp.optim').AdamW(m:parameters(), { lr = 1e-3 })
        for step = 1, 3 do
          local ids = fsdp.randint(0, 64, { 2, 16 }, { seed = step })
          m:loss(ids, ids):backward()
          opt:step(); opt:zero_grad()
        end
      end
      collectgarbage(); collectgarbage()
      local plain = fsdp.memory_stats('cpu').in_use - base
      fsdp.collect()
      print(('RESULT %d %d'):format(plain, fsdp.memory_stats('cpu').in_use - base))
    ]]
    local path = os.tmpname()
    local f = assert(io.open(path, 'w'))
    f:write(script)
    f:close()
    local p = assert(io.popen(("timeout 60 '%s' '%s' 2>&1"):format(require('fsdp.host').exe, path)))
    local out = p:read('*a')
    p:close()
    os.remove(path)
    local plain, collected = out:match('RESULT (%d+) (%d+)')
    assert.is_not_nil(plain, out)
    assert.equals(0, tonumber(collected), 'bytes still in use after fsdp.collect(): ' .. out)
  end)

  it('plans Llama-2-70B on the meta device without allocating', function()
    local budget = fsdp.set_collect_budget(0)
    finally(function() fsdp.set_collect_budget(budget) end)
    -- Twice: tensors reachable only from other garbage go in the second
    -- cycle (the budget of 0 would free them during the test otherwise).
    collectgarbage(); collectgarbage()
    -- Counted as allocations, not bytes in use: garbage of earlier tests
    -- that the collector frees meanwhile lowers in_use.
    local before = fsdp.memory_stats('cpu').allocations
    local m = llama.CausalLM(llama.config('Llama-2-70b'), { device = 'meta' })
    fsdp.shard(m, { policy = policy, device = 'meta', mixed_precision = { param = 'bf16' } })
    local units = fsdp.sharding.units(m)
    assert.equals(81, #units)
    assert.equals(855654400, units[1].numel) -- one 70B block
    assert.equals(855654400 * 2, units[1].gathered_bytes)
    assert.equals(before, fsdp.memory_stats('cpu').allocations)
    assert.truthy(tostring(m):find('80 x FullyShardedDataParallel(FULL_SHARD, 9 params, numel 855,654,400', 1, true))
  end)

  it('explains misuse', function()
    assert.error_matches(function() fsdp.shard(meta_model(), { stratgy = 'x' }) end,
      "unknown option 'stratgy'")
    assert.error_matches(function() sharded({ strategy = 'FULL' }) end,
      "unknown strategy 'FULL' %(known: FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD, HYBRID_SHARD_ZERO2%)")
    assert.error_matches(function() sharded({ mixed_precision = { param = 'i32' } }) end,
      "'i32' is not a floating%-point dtype")
    assert.error_matches(function() sharded({ mixed_precision = { parm = 'bf16' } }) end,
      "unknown key 'parm'")
    assert.error_matches(function() sharded({ backward_prefetch = 'both' }) end,
      "backward_prefetch must be 'pre', 'post' or false")
    assert.error_matches(function()
      sharded({ policy = function(_, name) if name == 'lm_head' then return { strategy = 'ZERO3' } end end })
    end, "unit lm_head: unknown strategy 'ZERO3'")
    local tied = llama.CausalLM(llama.config('Llama-2-7b', { dim = 32, n_layers = 1, n_heads = 4, n_kv_heads = 4,
      ffn_dim = 64, vocab_size = 64, tied = true }), { device = 'meta' })
    assert.error_matches(function()
      fsdp.shard(tied, { policy = function(_, name) return name == 'model.embed_tokens' end })
    end, 'parameter model.embed_tokens.weight of unit model.embed_tokens is also used by lm_head, outside that unit')
    local m = sharded()
    assert.error_matches(function() fsdp.shard(m) end, 'already sharded')
    assert.error_matches(function() fsdp.clip_grad_norm(plain_model(), 1) end, 'not sharded')
    assert.error_matches(function() fsdp.shard(42) end, 'expects a module')
  end)

  it('packs gradients into one flat buffer, zeros where a parameter has none', function()
    local C = core.C
    local names = ffi.new('const char*[2]', { 'a', 'b' })
    local ndims = ffi.new('int[2]', { 1, 1 })
    local dims = ffi.new('int64_t[2]', { 20000, 20000 })
    local cfg = ffi.new('fl_unit_config')
    for _, f in ipairs({ 'master_dtype', 'param_dtype', 'reduce_dtype', 'grad_dtype' }) do
      cfg[f] = core.dtype('f32')
    end
    cfg.device = core.device('cpu')
    local u = ffi.gc(C.fl_unit_new('pack', 2, names, ndims, dims, cfg), C.fl_unit_free)
    -- a block of the flat buffer's size full of garbage, cached for the pack
    fsdp.full({ 40000 }, 7):free()
    local b = fsdp.full({ 20000 }, 3)
    local grads = ffi.new('fl_tensor*[2]') -- a: none (NULL), b: threes
    grads[1] = Tensor.cptr(b)
    local flat = Tensor.wrap(C.fl_unit_pack_grads(u, 2, grads, nil))
    assert.equals(0, flat:narrow(0, 0, 20000):abs():max():item())
    assert.equals(3, flat:narrow(0, 20000, 20000):min():item())
    assert.equals(3, flat:narrow(0, 20000, 20000):max():item())
  end)

  it('packs a unit that communicates nothing straight into the grad dtype, which becomes its gradient', function()
    -- [Note: a gradient nobody else reduces] (core/sharding/unit.c): one
    -- process, bf16 reduction, f32 gradients
    local C = core.C
    local names = ffi.new('const char*[1]', { 'w' })
    local ndims = ffi.new('int[1]', { 1 })
    local dims = ffi.new('int64_t[1]', { 1000 })
    local cfg = ffi.new('fl_unit_config')
    cfg.master_dtype, cfg.param_dtype = core.dtype('f32'), core.dtype('bf16')
    cfg.reduce_dtype, cfg.grad_dtype = core.dtype('bf16'), core.dtype('f32')
    cfg.device = core.device('cpu')
    local u = ffi.gc(C.fl_unit_new('alone', 1, names, ndims, dims, cfg), C.fl_unit_free)
    local g = fsdp.randn({ 1000 }, { seed = 3 }):to('bf16')
    local grads = ffi.new('fl_tensor*[1]')
    grads[0] = Tensor.cptr(g)
    local flat = Tensor.wrap(C.fl_unit_pack_grads(u, 1, grads, nil))
    assert.equals('f32', flat.dtype)
    assert.equals(0, (flat:narrow(0, 0, 1000) - g:to('f32')):abs():max():item())
    assert.equals(0, C.fl_unit_reduce(u, Tensor.cptr(flat)))
    assert.equals(0, C.fl_unit_finish_reduce(u))
    local grad = Tensor.wrap(C.fl_unit_grad(u))
    assert.equals('f32', grad.dtype)
    assert.equals(0, (grad:narrow(0, 0, 1000) - g:to('f32')):abs():max():item())
    -- a flat gradient in the reduce dtype is not what this unit packs
    assert.equals(C.FL_ERR_ARG, tonumber(C.fl_unit_reduce(u, Tensor.cptr(flat:to('bf16')))))
  end)

  it('has a C unit with explicit states', function()
    local C = core.C
    local names = ffi.new('const char*[1]', { 'w' })
    local ndims = ffi.new('int[1]', { 2 })
    local dims = ffi.new('int64_t[2]', { 3, 5 })
    local cfg = ffi.new('fl_unit_config')
    cfg.master_dtype, cfg.param_dtype, cfg.reduce_dtype = core.dtype('f32'), core.dtype('bf16'), core.dtype('f32')
    cfg.device = core.device('cpu')
    local u = ffi.gc(C.fl_unit_new('demo', 1, names, ndims, dims, cfg), C.fl_unit_free)
    assert.equals(15, tonumber(C.fl_unit_numel(u)))
    assert.equals(C.FL_UNIT_SHARDED, tonumber(C.fl_unit_state_of(u)))
    assert.equals(C.FL_ERR_STATE, tonumber(C.fl_unit_wait(u)))
    assert.truthy(core.last_error():find('sharded unit demo: wait before unshard', 1, true))
    local shard = Tensor.wrap(C.fl_unit_shard(u))
    shard:copy_(fsdp.arange(15))
    assert.equals(0, C.fl_unit_unshard(u))
    assert.equals(C.FL_UNIT_UNSHARDING, tonumber(C.fl_unit_state_of(u)))
    assert.equals(C.FL_ERR_STATE, tonumber(C.fl_unit_reshard(u)))
    assert.equals(0, C.fl_unit_wait(u))
    local view = Tensor.wrap(C.fl_unit_param_view(u, 0))
    assert.same({ 3, 5 }, view.shape)
    assert.equals('bf16', view.dtype)
    assert.equals(14, view:get(2, 4))
    local before = fsdp.memory_stats('cpu').in_use
    assert.equals(0, C.fl_unit_reshard(u))
    assert.equals(before - 4096, fsdp.memory_stats('cpu').in_use) -- one page returned
    assert.equals(0, C.fl_unit_unshard(u))
    assert.equals(0, C.fl_unit_wait(u))
    assert.equals(7, view:get(1, 2)) -- the same view sees the gathered values again
    assert.is_true(C.fl_unit_param_name(u, 3) == nil)
    assert.truthy(core.last_error():find('parameter index 3 out of range', 1, true))
  end)
end)
