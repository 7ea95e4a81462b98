-- plan_spec.lua: fsdp.plan and fsdp.devices: the planner's units are
-- fsdp.shard's, bytes follow the strategy (1/world, full, 1/ranks per
-- node), precision and checkpointing, Llama-2-70B's numbers by hand,
-- FLOPs and communication, printing (and the REPL's printer), device
-- profiles, the batch search, and the errors. The planner's agreement with
-- measured memory is tests/mpi/plan_memory.lua.
local fsdp = require 'fsdp'
local llama = require 'models.llama'
local t5 = require 'models.t5'
local deepvit = require 'models.deepvit'

local N70 = 68976648192  -- Llama-2-70b's parameters
local BLOCK70 = 855654400 -- one of its 80 decoder layers
local ROOT70 = 524296192  -- embedding, final norm, lm_head

local function tiny(overrides)
  local o = { device = 'meta' }
  for k, v in pairs(overrides or {}) do o[k] = v end
  return llama.build('tiny', o)
end

local m70
local function llama70()
  m70 = m70 or llama.build('Llama-2-70b', { device = 'meta' })
  return m70
end

local H100 = { world = 64, nodes = 8, strategy = 'FULL_SHARD', mixed_precision = 'bf16', device = 'h100-80g',
               batch = 1, seq = 4096 }
local function with(base, extra)
  local o = {}
  for k, v in pairs(base) do o[k] = v end
  for k, v in pairs(extra or {}) do o[k] = v end
  return o
end

describe('fsdp.plan units', function()
  it('are the units fsdp.shard makes, with the same padding and overrides', function()
    local policy = function(m, name)
      if name == 'lm_head' then return { strategy = 'NO_SHARD' } end
      return m:is_instance_of(llama.DecoderLayer)
    end
    for _, mp in ipairs({ false, 'bf16' }) do
      local planned = fsdp.plan(tiny({ vocab_size = 255 }), { policy = policy, mixed_precision = mp or nil,
                                                              device = 'h100-80g' })
      local m = tiny({ vocab_size = 255 })
      fsdp.shard(m, { policy = policy, device = 'meta', mixed_precision = mp or nil })
      local units = fsdp.sharding.units(m)
      assert.are.equal(#units, #planned.units)
      for i, u in ipairs(units) do
        local p = planned.units[i]
        assert.are.equal(u.name, p.name)
        assert.are.equal(u.strategy, p.strategy)
        assert.are.equal(u.numel, p.numel)
        assert.are.equal(u.padded_numel, p.padded)
        assert.are.equal(u.shard_numel, p.shard)
        assert.are.equal(u.gathered_bytes, p.gb, u.name)
      end
    end
  end)

  it('pad each unit to a multiple of the shard group', function()
    local p = fsdp.plan(tiny({ vocab_size = 255 }), { world = 3 })
    for _, u in ipairs(p.units) do
      assert.are.equal(0, u.padded % 3)
      assert.is_true(u.padded - u.numel < 3)
      assert.are.equal(u.padded / 3, u.shard)
    end
    -- The last rank holds the padding: fewer real elements, less optimizer state.
    local last = fsdp.plan(tiny({ vocab_size = 255 }), { world = 3, rank = 2 })
    assert.is_true(last.memory.optimizer < p.memory.optimizer)
    assert.are.equal(p.memory.params, last.memory.params)
  end)
end)

describe('fsdp.plan memory', function()
  it('shards parameters, gradients and optimizer state 1/world with FULL_SHARD', function()
    local m = llama70()
    local one = fsdp.plan(m, { world = 1, device = 'h100-80g' })
    local p = fsdp.plan(m, with(H100))
    assert.are.equal(N70 * 4, one.memory.params)
    assert.are.equal(N70 * 4 / 64, p.memory.params) -- every unit divides by 64
    assert.are.equal(N70 * 4 / 64, p.memory.grads)   -- f32 gradients (keep_low_precision_grads off)
    assert.are.equal(N70 * 8 / 64, p.memory.optimizer)
    assert.are.equal(p.memory.params + p.memory.grads + p.memory.optimizer + p.memory.buffers, p.memory.persistent)
    local wide = fsdp.plan(m, with(H100, { world = 128, nodes = 16 }))
    assert.is_true(math.abs(wide.memory.params * 2 - p.memory.params) <= 81 * 4 * 2)
  end)

  it('keeps everything on every rank with NO_SHARD, 1/ranks-per-node with HYBRID_SHARD', function()
    local m = llama70()
    local full = fsdp.plan(m, with(H100, { strategy = 'NO_SHARD' }))
    assert.are.equal(N70 * 4, full.memory.params)
    assert.are.equal(N70 * 8, full.memory.optimizer)
    local hybrid = fsdp.plan(m, with(H100, { strategy = 'HYBRID_SHARD' }))
    assert.are.equal(N70 * 4 / 8, hybrid.memory.params)
    assert.are.equal(8, hybrid.units[1].G)
    assert.are.equal(8, hybrid.units[1].replicas)
  end)

  it('shares a node\'s link among the rings that cross it at once', function()
    -- CPU nodes with one 1 Gbit/s link each, 2 ranks per node
    local box = { name = 'box', memory = 2^34, flops = { f32 = 1e11 }, mem_bw = 1e10, intra_bw = 1e10,
                  inter_bw = 1.25e8, node_inter_bw = 1.25e8 }
    local o = { world = 4, nodes = 2, device = box }
    -- FULL_SHARD: one ring over the 4 ranks leaves each node once
    local full = fsdp.plan(tiny(), with(o, { strategy = 'FULL_SHARD' })).comm.all_gather
    assert.are.equal('inter', full.link)
    assert.is_true(math.abs(full.seconds - full.wire / 1.25e8) < 1e-9)
    -- HYBRID_SHARD: a replica ring per local rank, both crossing at once
    local hybrid = fsdp.plan(tiny(), with(o, { strategy = 'HYBRID_SHARD' })).comm
    assert.are.equal('intra', hybrid.all_gather.link)
    assert.is_true(math.abs(hybrid.all_gather.seconds - hybrid.all_gather.wire / 1e10) < 1e-12)
    local ar = hybrid.all_reduce
    assert.is_true(math.abs(ar.seconds - ar.wire / (1.25e8 / 2)) < 1e-9, tostring(ar.seconds))
    -- a NIC per rank (node_inter_bw unset: inter_bw x ranks per node)
    box.node_inter_bw = nil
    ar = fsdp.plan(tiny(), with(o, { strategy = 'HYBRID_SHARD', device = box })).comm.all_reduce
    assert.is_true(math.abs(ar.seconds - ar.wire / 1.25e8) < 1e-9)
  end)

  it('gathers units in the param dtype: bf16 halves them', function()
    local m = llama70()
    local f32 = fsdp.plan(m, with(H100, { mixed_precision = false }))
    local bf16 = fsdp.plan(m, with(H100))
    assert.are.equal(BLOCK70 * 4, f32.memory.largest_unit)
    assert.are.equal(BLOCK70 * 2, bf16.memory.largest_unit)
    assert.are.equal(f32.memory.gathered, 2 * bf16.memory.gathered)
    -- FULL_SHARD: the root and two blocks (one prefetched); SHARD_GRAD_OP
    -- keeps every unit gathered from its forward to its backward.
    assert.are.equal(ROOT70 * 2 + 2 * BLOCK70 * 2, bf16.memory.gathered)
    local zero2 = fsdp.plan(m, with(H100, { strategy = 'SHARD_GRAD_OP' }))
    assert.are.equal(N70 * 2, zero2.memory.gathered)
    local no_prefetch = fsdp.plan(m, with(H100, { backward_prefetch = false }))
    assert.are.equal(ROOT70 * 2 + BLOCK70 * 2, no_prefetch.memory.gathered)
  end)

  it('cuts activations with checkpointing, and they grow with the batch', function()
    local m = llama70()
    local plain = fsdp.plan(m, with(H100))
    local ckpt = fsdp.plan(m, with(H100, { checkpoint = true }))
    assert.are.equal(plain.memory.activations, ckpt.memory.activations_full)
    assert.are.equal(ckpt.memory.activations, plain.memory.activations_checkpointed)
    assert.is_true(ckpt.memory.activations < plain.memory.activations / 10)
    assert.is_true(ckpt.memory.peak < plain.memory.peak)
    -- A checkpointed 70B layer keeps its input: 4096 x 8192 bf16 values.
    local two = fsdp.plan(m, with(H100, { checkpoint = true, batch = 2 }))
    assert.is_true(two.memory.activations - ckpt.memory.activations >= 80 * 4096 * 8192 * 2)
  end)

  it('gives Llama-2-70B on 64 H100s in bf16 the numbers worked out by hand', function()
    local p = fsdp.plan(llama70(), with(H100, { checkpoint = true }))
    -- FLOPs as the traced ops count them: PaLM's 6N + 12 L H hd T per token
    -- counts the causal attention's masked half too, so the count is a few
    -- percent below it.
    local per_token = llama.flops_per_token(llama.config('Llama-2-70b'), 4096, N70)
    local ratio = p.flops.model / (per_token * 4096)
    assert.is_true(ratio > 0.95 and ratio < 1, tostring(ratio))
    -- the recomputed forward: the blocks' forward, a third of their share
    assert.is_true(p.flops.recompute > 80 * 2 * BLOCK70 * 4096, tostring(p.flops.recompute))
    assert.is_true(p.flops.recompute < p.flops.model / 3)
    local ag, rs = p.comm.all_gather, p.comm.reduce_scatter
    assert.are.equal(2 * 80 + 1, ag.calls)
    assert.are.equal((2 * 80 * BLOCK70 + ROOT70) * 2, ag.bytes)
    assert.are.equal(81, rs.calls)
    assert.are.equal(N70 * 2, rs.bytes)
    assert.are.equal('inter', ag.link)                 -- 64 ranks span 8 nodes
    assert.is_nil(p.comm.all_reduce)
    -- rings at the NIC's rate: a NIC per GPU, so nothing is shared
    assert.is_true(math.abs(ag.seconds - ag.wire / 50e9) < 1e-12 * ag.seconds)
    assert.is_true(p.fits)
    assert.is_true(p.memory.peak > p.memory.persistent + p.memory.activations)
    assert.is_true(p.time.step >= p.time.compute and p.time.step >= p.time.comm)
    -- Without checkpointing 80 layers of 4096 tokens keep ~89 GiB: too much.
    local plain = fsdp.plan(llama70(), with(H100))
    assert.is_false(plain.fits)
    assert.is_true(plain.memory.activations > 80 * 2^30)
  end)

  it('moves shards, gradients and optimizer state to the host with offload', function()
    local p = fsdp.plan(llama70(), with(H100, { checkpoint = true, offload = true }))
    local q = fsdp.plan(llama70(), with(H100, { checkpoint = true }))
    assert.are.equal(q.memory.params + q.memory.grads + q.memory.optimizer, p.memory.cpu_offloaded)
    assert.are.equal(q.memory.persistent - p.memory.cpu_offloaded, p.memory.persistent)
  end)

  it('prices optimizers by their state', function()
    local m = tiny()
    local adamw = fsdp.plan(m).memory.optimizer
    assert.are.equal(adamw / 2, fsdp.plan(m, { optimizer = { name = 'sgd', momentum = 0.9 } }).memory.optimizer)
    assert.are.equal(0, fsdp.plan(m, { optimizer = 'sgd' }).memory.optimizer)
    assert.are.equal(adamw / 2, fsdp.plan(m, { optimizer = 'AnyPrecisionAdamW' }).memory.optimizer)
    assert.are.equal(adamw * 3 / 4, fsdp.plan(m, { optimizer = { name = 'anyprecision_adamw',
      use_kahan_summation = true } }).memory.optimizer)
    assert.are.equal(0, fsdp.plan(m, { optimizer = 'none' }).memory.optimizer)
  end)

  it('plans T5, DeepViT and GPT-2 by tracing them, nothing per family', function()
    local p = fsdp.plan(t5.build('t5-11b', { device = 'meta' }), { world = 32, mixed_precision = 'bf16',
      device = 'a100-80g', batch = 4, seq = 512, checkpoint = true })
    assert.are.equal(48, p.blocks) -- the encoder's 24 and the decoder's 24
    assert.is_true(p.memory.activations > 0 and p.flops.model > 0)
    assert.are.equal(0, p.memory.residual) -- the traced steps give back what they take
    -- (DeepViT-8B's width and heads, 16 of its 952 layers: a trace of all
    -- of them costs seconds of collections, benchmarks/plan_time.lua)
    local v = fsdp.plan(deepvit.build('8B', { device = 'meta', depth = 16 }), { world = 16, device = 'a100-80g',
                                                                              batch = 8 })
    assert.are.equal(16, v.blocks)
    assert.is_true(v.memory.activations > 0)
    assert.are.equal(0, v.memory.residual)
    local g = fsdp.plan(require('models.gpt2').build('tiny', { device = 'meta' }), { batch = 2, seq = 16 })
    assert.is_true(g.blocks > 0 and g.memory.peak > g.memory.persistent)
    assert.are.equal(2 * 16, g.tokens)
  end)

  -- Garbage from before a plan whose last tensor goes only after several
  -- collector cycles (finalizers that drop the next link) may be freed
  -- while the trace measures; its bytes must not move what the trace
  -- reads ([Note: frees from before a trace], core/tensor/storage.c),
  -- however long the chain and whatever garbage the suite left.
  it('plans the same whatever garbage came before it', function()
    local ffi = require 'ffi'
    local function chain(depth, t)
      local held = t
      for _ = 1, depth do
        local inner = held
        held = ffi.gc(ffi.new('char[1]'), function() return inner end)
      end
      return held
    end
    local function plan_after(depth)
      local junk = chain(depth, fsdp.empty({ 4096, 4096 }, { device = 'meta' })) -- luacheck: ignore
      junk = nil -- luacheck: ignore
      return fsdp.plan(deepvit.build('tiny', { device = 'meta' }), { batch = 8 }).memory
    end
    local clean = plan_after(0)
    assert.is_true(clean.inputs > 0 and clean.peak > clean.persistent)
    for _, depth in ipairs({ 1, 2, 3, 4, 5, 6, 40 }) do
      local m = plan_after(depth)
      for _, k in ipairs({ 'inputs', 'activations', 'peak', 'transient', 'residual' }) do
        assert.are.equal(clean[k], m[k], ('memory.%s after a chain of %d finalizers'):format(k, depth))
      end
    end
  end)

  -- (its time: benchmarks/plan_time.lua)
  it('allocates nothing for 70B', function()
    local budget = fsdp.set_collect_budget(0)
    finally(function() fsdp.set_collect_budget(budget) end)
    local m = llama70()
    fsdp.plan(m, with(H100)) -- warm
    fsdp.collect()
    local before = fsdp.memory_stats('cpu').in_use
    fsdp.plan(m, with(H100))
    assert.are.equal(before, fsdp.memory_stats('cpu').in_use)
  end)
end)

describe('fsdp.plan activation offload', function()
  -- tiny Llama (2 layers, dim 64, 4 heads of 16, 2 kv heads, ffn 176) on
  -- one H100, bf16, 128 tokens. One layer saves, per token, bf16 values
  -- 4 D + 3 Hq + 2 Hkv + 3 F = 256 + 192 + 64 + 528 = 1040 and f32 values
  -- H + 2 = 6: 128 x (1040 x 2 + 6 x 4) = 269,312 bytes; checkpointed it
  -- keeps its input, 128 x 64 x 2 = 16,384 bytes.
  local BLOCK, INPUT = 269312, 16384
  local ONE = { world = 1, mixed_precision = 'bf16', device = 'h100-80g', seq = 128 }

  it('moves the blocks\' saved activations to pinned CPU memory', function()
    local m = tiny()
    local plain = fsdp.plan(m, ONE)
    local off = fsdp.plan(m, with(ONE, { offload_activations = true }))
    assert.are.equal(0, plain.memory.pinned_activations)
    assert.are.equal(2 * BLOCK, off.memory.pinned_activations)
    -- what is on the device at the end of forward drops by both layers
    assert.are.equal(plain.memory.activations - 2 * BLOCK, off.memory.activations)
    -- The peak is in the last layer's backward, whose activations are
    -- back on the device: it drops by the other layer's, still on the host.
    assert.are.equal('backward of model.layers.1', off.memory.peak_at)
    assert.are.equal(plain.memory.peak - BLOCK, off.memory.peak)
    -- parameters, gradients and optimizer state do not move
    assert.are.equal(plain.memory.persistent, off.memory.persistent)
    assert.are.equal(0, off.memory.cpu_offloaded)
  end)

  it('prices the copies: forward ones hidden by compute up to its length, backward ones exposed', function()
    local m = tiny()
    local off = fsdp.plan(m, with(ONE, { offload_activations = true }))
    local o = off.time.offload
    assert.are.equal(2 * BLOCK, o.bytes)
    assert.near(538624 / 50e9, o.to_cpu, 1e-15)   -- 10.77 us each way at 50 GB/s
    assert.near(538624 / 50e9, o.to_device, 1e-15)
    -- the forward: a third of the model's FLOPs (99,360,768 as traced: the
    -- fused loss's scaling of dh and dW by the incoming gradient included) at
    -- 45% of 989 TFLOP/s = 74.4 ns, far shorter than the copies
    local F = off.flops.model
    assert.are.equal(99360768, F)
    local forward_s = F / 3 / (989e12 * 0.45)
    assert.near(538624 / 50e9 - forward_s + 538624 / 50e9, o.exposed, 1e-15)
    assert.near((538624 / 50e9 - forward_s) * 50e9, o.backlog, 1e-6)
    -- one rank: nothing to overlap with, the step is compute + copies + optimizer
    local t = off.time
    assert.near(t.compute + o.exposed + t.optimizer, t.step, 1e-15)
    -- A slow device whose forward (99,336,192 / 3 / 1e10 = 3.31 ms)
    -- outlasts the copies to CPU memory (0.539 ms at 1 GB/s): only the
    -- copies back are exposed.
    fsdp.devices.add({ name = 'test-slow-host', memory = 2^30, flops = { bf16 = 1e10, f32 = 1e10 },
                       utilization = 1, mem_bw = 1e11, intra_bw = 1e10, inter_bw = 1e9, pinned_bw = 1e9 })
    local slow = fsdp.plan(m, with(ONE, { device = 'test-slow-host', offload_activations = true }))
    assert.near(538624 / 1e9, slow.time.offload.exposed, 1e-15)
    assert.are.equal(0, slow.time.offload.backlog)
    -- without offload nothing is moved or charged
    local plain = fsdp.plan(m, ONE)
    assert.are.equal(0, plain.time.offload.exposed)
    assert.near(plain.time.compute + plain.time.optimizer, plain.time.step, 1e-15)
  end)

  it('composes with checkpointing: only the blocks\' inputs move', function()
    local m = tiny()
    local ck = fsdp.plan(m, with(ONE, { checkpoint = true }))
    local both = fsdp.plan(m, with(ONE, { checkpoint = true, offload_activations = true }))
    assert.are.equal(2 * INPUT, both.memory.pinned_activations)
    assert.are.equal(ck.memory.activations - 2 * INPUT, both.memory.activations)
    -- layer 0's input is on the host during layer 1's backward (the peak)
    assert.are.equal('backward of model.layers.1', both.memory.peak_at)
    assert.are.equal(ck.memory.peak - INPUT, both.memory.peak)
    assert.are.equal(ck.flops.recompute, both.flops.recompute)
    assert.near(2 * (32768 / 50e9) - ck.flops.model / 3 / (989e12 * 0.45), both.time.offload.exposed, 1e-15)
  end)

  it('changes nothing on the cpu device, and is printed', function()
    local m = tiny()
    local cpu = fsdp.plan(m, { world = 1, seq = 128, offload_activations = true })
    assert.are.equal(0, cpu.memory.pinned_activations)
    assert.are.equal(fsdp.plan(m, { world = 1, seq = 128 }).memory.peak, cpu.memory.peak)
    local text = tostring(fsdp.plan(m, with(ONE, { offload_activations = true })))
    -- 538,624 bytes in MiB (the unit of the tiny model's report)
    for _, needle in ipairs({ 'activation offload', 'activations in pinned CPU memory           0.514',
                              'each way at 50 GB/s' }) do
      assert.is_truthy(text:find(needle, 1, true), needle .. ' in:\n' .. text)
    end
  end)
end)

describe('fsdp.plan printing', function()
  it('prints a report with per-rank memory rows and the verdict', function()
    local p = fsdp.plan(llama70(), with(H100, { checkpoint = true }))
    local text = tostring(p)
    for _, needle in ipairs({ 'per-rank memory', 'parameters (f32 shards)', 'optimizer state (AdamW)',
                              'gathered units', 'activations saved', 'peak', 'FITS:', 'all_gather',
                              'reduce_scatter', 'tokens/s', 'MFU' }) do
      assert.is_truthy(text:find(needle, 1, true), needle .. ' in:\n' .. text)
    end
    assert.is_truthy(text:find(('%.3f'):format(N70 * 4 / 64 / 2^30), 1, true), text)
    assert.is_truthy(tostring(fsdp.plan(llama70(), with(H100))):find('DOES NOT FIT', 1, true))
  end)

  it('is what the REPL prints for a plan', function()
    local repl = require 'fsdp.repl'
    local p = fsdp.plan(tiny())
    assert.are.equal(tostring(p), repl.format_value(p))
  end)
end)

describe('fsdp.devices', function()
  it('has profiles as plain tables, and takes new ones', function()
    assert.are.equal(81559 * 2^20, fsdp.devices['h100-80g'].memory)
    assert.is_truthy(table.concat(fsdp.devices.names(), ' '):find('a100-80g', 1, true))
    fsdp.devices.add({ name = 'test-24g', memory = 24 * 2^30, flops = { bf16 = 100e12, f32 = 50e12 },
                       mem_bw = 1e12, intra_bw = 32e9, inter_bw = 12.5e9 })
    local p = fsdp.plan(tiny(), { device = 'test-24g', mixed_precision = 'bf16' })
    assert.are.equal('test-24g', p.options.device.name)
    assert.are.equal(100e12, p.time.peak_flops)
    fsdp.devices['test-assigned'] = { memory = 2^30, flops = { f32 = 1e12 }, mem_bw = 1e11, intra_bw = 1e10,
                                      inter_bw = 1e9 }
    assert.is_true(fsdp.plan(tiny(), { device = 'test-assigned' }).fits)
    assert.error_matches(function() fsdp.devices.add({ name = 'bad', memory = 1, flops = { f32 = 1 } }) end,
      'device profile bad: mem_bw must be a positive number')
  end)

  it('reads a profile from a JSON file, over a base profile', function()
    local path = os.tmpname() .. '.json'
    local f = assert(io.open(path, 'w'))
    f:write('{"base": "cpu", "name": "box", "inter_bw": 1.19e8, "node_inter_bw": 1.19e8, "flops": {"f32": 1e11}}')
    f:close()
    local p = fsdp.devices.get(path)
    assert.are.equal('box', p.name)
    assert.are.equal(1.19e8, p.inter_bw)
    assert.are.equal(1e11, p.flops.f32)
    assert.are.equal(fsdp.devices.cpu.intra_bw, p.intra_bw)    -- from the base
    assert.are_not.equal(1e11, fsdp.devices.cpu.flops.f32)     -- the base is left alone
    assert.are.equal('box', fsdp.plan(tiny(), { device = path }).options.device.name)
    f = assert(io.open(path, 'w'))
    f:write('{"base": "cpu", "inter_bw": "fast"}')
    f:close()
    assert.error_matches(function() fsdp.devices.get(path) end, 'inter_bw must be a positive number')
    f = assert(io.open(path, 'w'))
    f:write('[1, 2')
    f:close()
    assert.error_matches(function() fsdp.devices.get(path) end, 'is not a JSON object')
    os.remove(path)
    assert.error_matches(function() fsdp.devices.get(path) end, 'cannot read device profile')
  end)

  it('measures this machine as the cpu profile', function()
    local cpu = fsdp.devices.get('cpu')
    assert.is_true(cpu.memory > 2^28)
    assert.is_true(cpu.flops.f32 > 1e8)
  end)
end)

describe('fsdp.plan.max_batch', function()
  it('finds the largest batch that fits', function()
    fsdp.devices.add({ name = 'test-small', memory = 64 * 2^20, flops = { f32 = 1e12 }, mem_bw = 1e11,
                       intra_bw = 1e10, inter_bw = 1e9 })
    local opts = { device = 'test-small', seq = 128 }
    local b, p = fsdp.plan.max_batch(tiny(), opts)
    assert.is_true(b >= 1, tostring(b))
    assert.is_true(p.fits)
    assert.are.equal(b, p.options.batch)
    assert.is_false(fsdp.plan(tiny(), { device = 'test-small', seq = 128, batch = b + 1 }).fits)
    assert.are.equal(0, (fsdp.plan.max_batch(llama70(), { device = 'test-small' })))
  end)
end)

describe('fsdp.plan errors', function()
  it('name the option at fault', function()
    local m = tiny()
    assert.error_matches(function() fsdp.plan(m, { wrold = 2 }) end, "fsdp.plan: unknown option 'wrold'")
    assert.error_matches(function() fsdp.plan(m, { device = 'tpu-v9' }) end,
      "fsdp.plan: device: unknown device 'tpu%-v9' %(known: a100%-40g")
    assert.error_matches(function() fsdp.plan(m, { strategy = 'ZERO3' }) end, "fsdp.plan: unknown strategy 'ZERO3'")
    assert.error_matches(function() fsdp.plan(m, { batch = 0 }) end, 'fsdp.plan: batch must be a positive integer')
    assert.error_matches(function() fsdp.plan(m, { world = 6, nodes = 4 }) end,
      'fsdp.plan: world 6 is not a multiple of nodes 4')
    assert.error_matches(function() fsdp.plan(m, { mixed_precision = 'i8' }) end,
      "fsdp.plan: mixed_precision: 'i8' is not a floating%-point dtype")
    assert.error_matches(function() fsdp.plan(m, { optimizer = 'lion' }) end,
      "fsdp.plan: optimizer: unknown optimizer 'lion'")
    assert.error_matches(function() fsdp.plan(m, { policy = 42 }) end, 'fsdp.plan: policy must be')
    assert.error_matches(function() fsdp.plan(m, { offload_activations = 'yes' }) end,
      'fsdp.plan: offload_activations must be true or false, got yes')
    assert.error_matches(function() fsdp.plan(m, { checkpoint = 1 }) end,
      'fsdp.plan: checkpoint must be true or false, got 1')
    fsdp.devices.add({ name = 'test-no-cpu-link', memory = 2^30, flops = { f32 = 1e12 }, mem_bw = 1e11,
                       intra_bw = 1e10, inter_bw = 1e9 })
    assert.error_matches(function() fsdp.plan(m, { device = 'test-no-cpu-link', offload_activations = true }) end,
      'fsdp.plan: offload_activations: device profile test%-no%-cpu%-link has no pinned_bw')
    assert.error_matches(function() fsdp.devices.add({ name = 'bad-host', memory = 1, flops = { f32 = 1 },
                                                       mem_bw = 1, intra_bw = 1, inter_bw = 1, pinned_bw = 0 }) end,
      'device profile bad%-host: pinned_bw must be a positive number')
    -- host_bw, the field's old name, is still read (docs/ARCHITECTURE.md, "Names")
    fsdp.devices.add({ name = 'test-old-name', memory = 2^30, flops = { f32 = 1e12 }, mem_bw = 1e11, intra_bw = 1e10,
                       inter_bw = 1e9, host_bw = 5e9 })
    assert.are.equal(5e9, fsdp.devices['test-old-name'].pinned_bw)
    assert.error_matches(function() fsdp.devices.add({ name = 'bad-old', memory = 1, flops = { f32 = 1 },
                                                       mem_bw = 1, intra_bw = 1, inter_bw = 1, host_bw = 0 }) end,
      'device profile bad%-old: pinned_bw must be a positive number')
    assert.error_matches(function() fsdp.plan(m, { rank = 3, world = 2 }) end, 'fsdp.plan: rank must be')
    assert.error_matches(function() fsdp.plan(42) end, 'fsdp.plan: expected an nn.Module')
    local sharded = tiny()
    fsdp.shard(sharded, { device = 'meta' })
    assert.error_matches(function() fsdp.plan(sharded) end, 'already sharded')
  end)

  it('say what a model of one\'s own must give the trace', function()
    local nn = require 'fsdp.nn'
    local Bare = nn.Module:extend('TestBare')
    function Bare:__init() self.fc = nn.Linear(4, 4, { device = 'meta' }) end
    function Bare:forward(x) return self.fc(x) end
    local batch = function(b) return { n = 1, fsdp.empty({ b, 4 }, { device = 'meta' }) }, b, 1 end
    assert.error_matches(function() fsdp.plan(Bare()) end,
      'fsdp.plan: TestBare has no example_batch%(batch, seq%) method: pass example_batch')
    assert.error_matches(function() fsdp.plan(Bare(), { example_batch = batch }) end,
      'fsdp.plan: TestBare has no loss method: pass loss = function%(model, ...%)')
    local p = fsdp.plan(Bare(), { example_batch = batch, loss = function(m, x) return m(x):sum() end, batch = 3 })
    assert.are.equal(0, p.blocks)
    assert.are.equal(3, p.tokens)
    -- blocks called out of the order they are declared in
    local Rev = nn.Module:extend('TestReversed')
    function Rev:__init()
      self.layers = nn.ModuleList()
      for _ = 1, 2 do self.layers:append(nn.Linear(4, 4, { device = 'meta' })) end
    end
    function Rev:forward(x) local l = self.layers:children(); return l[1](l[2](x)) end
    function Rev:loss(x) return self(x):sum() end
    function Rev:example_batch(b) return batch(b) end
    assert.error_matches(function() fsdp.plan(Rev()) end, 'fsdp.plan: block 2 %(Linear%) ran before block 1')
    assert.error_matches(function() fsdp.plan(Rev(), { blocks = 42 }) end, 'fsdp.plan: blocks must be a function')
  end)
end)

describe('fsdp.plan: nodes and options', function()
  local m = require('models.llama').build('tiny', { device = 'meta' })
  local function fails(opts, text)
    local ok, err = pcall(fsdp.plan, m, opts)
    assert.is_false(ok)
    assert.truthy(tostring(err):find(text, 1, true), tostring(err))
    assert.is_nil(tostring(err):find('\n', 1, true))   -- one line
  end

  -- [Note: plan node size]
  it('takes the node size from the device profile (8 GPUs), not the whole world as one node, and prints it', function()
    local p = fsdp.plan(m, { world = 64, device = 'h100-80g' })
    assert.are.equal(8, p.options.nodes)
    assert.are.equal(8, p.options.ranks_per_node)
    assert.truthy(tostring(p):find('64 x h100-80g (8 nodes of 8), FULL_SHARD', 1, true), tostring(p))
    -- nodes alone: the world is nodes x the profile's node size
    p = fsdp.plan(m, { nodes = 8, device = 'h100-80g' })
    assert.are.equal(64, p.options.world)
    -- a world within one node, and an explicit node size
    p = fsdp.plan(m, { world = 4, device = 'h100-80g' })
    assert.are.equal(1, p.options.nodes)
    assert.truthy(tostring(p):find('4 x h100-80g (1 node of 4)', 1, true), tostring(p))
    p = fsdp.plan(m, { world = 16, ranks_per_node = 4, device = 'h100-80g' })
    assert.are.same({ 4, 4 }, { p.options.nodes, p.options.ranks_per_node })
    -- HYBRID_SHARD shards within the node
    p = fsdp.plan(m, { world = 16, device = 'h100-80g', strategy = 'HYBRID_SHARD' })
    assert.are.equal(8, p.units[1].G)
    -- the cpu profile is this machine: every rank on it
    p = fsdp.plan(m, { world = 2 })
    assert.are.equal(1, p.options.nodes)
    -- a profile without a node size: 8
    local dev = {}
    for k, v in pairs(fsdp.devices['a100-80g']) do dev[k] = v end
    dev.ranks_per_node, dev.name = nil, 'no-node-size'
    assert.are.equal(2, fsdp.plan(m, { world = 16, device = dev }).options.nodes)
    fails({ world = 12, device = 'h100-80g' },
      'world 12 is not a multiple of 8 ranks per node (device profile h100-80g)')
    fails({ world = 16, nodes = 2, ranks_per_node = 4 }, 'is 8 ranks per node, not ranks_per_node 4')
  end)

  it('answers a misspelt option with one line and "did you mean"', function()
    fails({ nodse = 8 }, "fsdp.plan: unknown option 'nodse' (did you mean nodes?)")
    fails({ wrold = 8 }, "(did you mean world?)")
    fails({ zzzzzz = 1 }, "unknown option 'zzzzzz' (known: backward_prefetch, batch,")
  end)
end)

describe('fsdp.plan: memory-bound ops priced by bandwidth', function()
  it('adds the bytes the step moves over mem_bw x mem_utilization to the GEMMs\' time', function()
    local base = fsdp.devices['h100-80g']
    local dev = {}
    for k, v in pairs(base) do dev[k] = v end
    dev.name, dev.utilization, dev.mem_utilization = 'h100-priced', 0.7, 0.5
    local opts = { world = 1, strategy = 'NO_SHARD', batch = 2, seq = 16 }
    opts.device = base
    local plain = fsdp.plan(tiny(), opts)
    opts.device = dev
    local priced = fsdp.plan(tiny(), opts)
    -- the bytes are the step's forward and backward as the counter sees them
    local m = tiny()
    local ids = fsdp.empty({ 2, 16 }, { dtype = 'i64', device = 'meta' })
    m:loss(ids, ids) -- (the first call makes the RoPE tables, which the plan's trace counts as caches)
    fsdp.reset_bytes_moved()
    m:loss(ids, ids):backward()
    local bytes = fsdp.bytes_moved()
    assert.equals(bytes, priced.time.bytes_moved)
    assert.equals(0, plain.time.memory_bound)
    local t = priced.time
    assert.near(bytes / (dev.mem_bw * 0.5), t.memory_bound, 1e-12)
    assert.near(priced.flops.hardware / (t.peak_flops * 0.7) + t.memory_bound, t.compute, 1e-12)
    assert.near(plain.time.optimizer * 2, t.optimizer, 1e-12)
    assert.truthy(tostring(priced):find('memory-bound ops', 1, true))
    -- checkpointing moves the blocks' forward bytes again
    opts.checkpoint = true
    assert.is_true(fsdp.plan(tiny(), opts).time.bytes_moved > bytes)
  end)

  it('refuses a mem_utilization outside (0, 1]', function()
    local dev = {}
    for k, v in pairs(fsdp.devices['h100-80g']) do dev[k] = v end
    dev.name, dev.mem_utilization = 'bad', 1.5
    local ok, err = pcall(fsdp.plan, tiny(), { world = 1, device = dev })
    assert.is_false(ok)
    assert.truthy(tostring(err):find('mem_utilization must be in (0, 1], got 1.5', 1, true), err)
  end)
end)
