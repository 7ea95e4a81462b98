-- plan_tp_spec.lua: tensor parallelism in the planner (fsdp.plan with tp,
-- fsdp.plan.tp, fsdp.plan.search, fsdp.dist's planning groups): the TP
-- collectives of a step against the formula from the model's dimensions,
-- the local shards, sequence parallelism traced, the time, the
-- search's enumeration and ranking on a toy cluster, and the errors. The
-- planned memory against measured memory on meshes is
-- tests/mpi/plan_memory.lua (its `mesh` cases).
local fsdp = require 'fsdp'
local llama = require 'models.llama'
local T = require 'fsdp.testing'

-- a tiny Llama whose heads, kv heads, FFN and vocabulary divide by 2 and 4
local CFG = { dim = 64, n_layers = 3, n_heads = 4, n_kv_heads = 4, ffn_dim = 176, vocab_size = 256,
              max_seq_len = 128 }
local B, SEQ = 2, 32
local function tiny() return llama.CausalLM(llama.config('tiny', CFG), { device = 'meta' }) end
local BASE = { world = 8, ranks_per_node = 4, device = 'h100-80g', batch = B, seq = SEQ }
local function with(extra)
  local o = {}
  for k, v in pairs(BASE) do o[k] = v end
  for k, v in pairs(extra) do o[k] = v end
  return o
end

describe('fsdp.dist planning groups', function()
  it('record collectives on meta tensors and move nothing', function()
    local g = fsdp.dist.planning_group(4)
    assert.are.equal(4, g:size())
    assert.are.equal(0, g:rank())
    local t = fsdp.empty({ 8, 3 }, { device = 'meta' })
    fsdp.dist.all_reduce(t, { group = g })
    local out = fsdp.dist.all_gather(t, { group = g })
    assert.are.same({ 32, 3 }, out.shape)
    local rs = fsdp.dist.reduce_scatter(t, { group = g })
    assert.are.same({ 2, 3 }, rs.shape)
    assert.are.same({ { kind = 'all_reduce', bytes = 96, size = 4 }, { kind = 'all_gather', bytes = 384, size = 4 },
                      { kind = 'reduce_scatter', bytes = 96, size = 4 } }, g.log)
  end)
  it('refuse tensors with data, in one line', function()
    local g = fsdp.dist.planning_group(2)
    T.raises(function() fsdp.dist.all_reduce(fsdp.zeros({ 2 }), { group = g }) end,
      'all_reduce: the planning group planning(2) moves no data: it takes meta or fake tensors, got a cpu tensor')
    T.raises(function() fsdp.dist.planning_group(0) end, 'planning_group: size must be a positive integer, got 0')
  end)
end)

describe('fsdp.plan with tp', function()
  it('prices the TP collectives of fsdp.tp: per layer 2 all-reduces forward, 2 backward, of b x s x dim', function()
    for _, tp in ipairs({ 2, 4 }) do
      for _, mp in ipairs({ false, 'bf16' }) do
        local p = fsdp.plan(tiny(), with({ tp = tp, mixed_precision = mp or nil }))
        local elt = mp and 2 or 4
        local act = B * SEQ * CFG.dim * elt -- one activation of the residual stream
        -- forward: o_proj and down_proj reduce their outputs (rowwise);
        -- backward: the attention's and the MLP's inputs' gradients ([Note: TP regions])
        local layer = p.tp_comm.per_layer
        assert.are.equal(4, layer.calls, 'calls per layer')
        assert.are.equal(4 * act, layer.bytes, 'bytes per layer')
        assert.are.equal(4 * act * 2 * (tp - 1) / tp, layer.wire, 'wire bytes per layer')
        -- the step: 3 layers, plus the embedding's all-reduce (forward), the
        -- head's copy_to (backward) and the vocab-parallel loss's reductions
        assert.is_true(p.tp_comm.calls > 3 * 4)
        assert.are.equal(p.tp_comm.wire / p.options.device.intra_bw, p.tp_comm.seconds)
      end
    end
  end)

  it('repeats the blocks\' forward collectives when they are checkpointed', function()
    local p = fsdp.plan(tiny(), with({ tp = 2 }))
    local ck = fsdp.plan(tiny(), with({ tp = 2, checkpoint = true }))
    assert.are.equal(p.tp_comm.calls + 3 * 2, ck.tp_comm.calls)
  end)

  it('holds TP rank 0\'s shards, sharded over dp_shard, and leaves the model as it was', function()
    local m = tiny()
    local n = m:num_parameters()
    local flat = fsdp.plan(m, with({}))
    local p = fsdp.plan(m, with({ tp = 2 }))
    assert.are.equal(n, m:num_parameters())
    assert.is_nil(rawget(m, '_tp'))
    assert.are.equal(n, p.n_params)
    assert.are.same({ dp_replicate = 1, dp_shard = 4, tp = 2 }, p.options.mesh)
    -- every parameter but the norms' is split in 2, and the units shard over 4 ranks, not 8
    local norms = CFG.dim * (2 * CFG.n_layers + 1)
    local shard_elems = 0
    for _, u in ipairs(p.units) do shard_elems = shard_elems + u.shard end
    local expect = ((n - norms) / 2 + norms) / 4
    assert.is_true(math.abs(shard_elems - expect) <= #p.units * 4, ('%d vs %d'):format(shard_elems, expect))
    -- the local FLOPs are about half
    local ratio = p.flops.model / flat.flops.model
    assert.is_true(ratio > 0.45 and ratio < 0.6, tostring(ratio))
    -- and TP's time is on the critical path: in the step, not overlapped
    assert.is_true(p.time.tp_comm > 0)
    assert.are.equal(flat.time.tp_comm, 0)
    local busy = p.time.compute + p.time.tp_comm
    assert.are.equal(math.max(busy, p.time.comm) + p.time.optimizer, p.time.step)
    -- a TP group trains on one batch: tokens per second count world / tp groups
    assert.are.equal(p.tokens * 8 / 2 / p.time.step, p.time.tokens_per_s)
    local text = tostring(p)
    assert.is_truthy(text:find('mesh dp_replicate 1 x dp_shard 4 x tp 2', 1, true))
    assert.is_truthy(text:find('per layer (forward and backward): 4 calls', 1, true))
  end)

  it('traces sequence parallel: a block keeps its rows, its collectives are gathers and reduce-scatters', function()
    local m = tiny()
    for _, ck in ipairs({ false, true }) do
      local tp = fsdp.plan(m, with({ tp = 2, checkpoint = ck }))
      local sp = fsdp.plan(m, with({ tp = 2, sequence_parallel = true, checkpoint = ck }))
      assert.is_true(sp.memory.activations < tp.memory.activations)
      -- per layer, each way: the two regions gather their input, the two rowwise layers reduce-scatter
      -- (backward the reverse), and backward sums the two norms' weight gradients
      local act = B * SEQ * CFG.dim * 4
      local k = sp.tp_comm.per_layer.by_kind
      assert.are.same({ calls = 4, bytes = 4 * act, wire = 4 * act / 2 }, k.all_gather)
      assert.are.same({ calls = 4, bytes = 4 * act, wire = 4 * act / 2 }, k.reduce_scatter)
      assert.are.same({ calls = 2, bytes = 2 * CFG.dim * 4, wire = 2 * CFG.dim * 4 }, k.all_reduce)
      assert.is_nil(tp.tp_comm.per_layer.by_kind.all_gather)
    end
    -- with checkpointing a block keeps only its input: this rank's rows, 1/2 of TP's
    local tp = fsdp.plan(m, with({ tp = 2, checkpoint = true }))
    local sp = fsdp.plan(m, with({ tp = 2, checkpoint = true, sequence_parallel = true }))
    assert.is_true(sp.memory.activations_checkpointed < tp.memory.activations_checkpointed)
    T.raises(function() fsdp.plan(m, with({ tp = 2, sequence_parallel = true, seq = 33 })) end,
      'fsdp.plan: sequence_parallel: seq 33 is not divisible by tp 2')
  end)

  it('refuses what cannot be planned, in one line', function()
    T.raises(function() fsdp.plan(tiny(), with({ tp = 8 })) end,
      'fsdp.plan: tp 8 does not divide the 4 ranks per node: a tensor-parallel group must not straddle nodes')
    T.raises(function() fsdp.plan(tiny(), with({ tp = 2, mesh = { tp = 2 } })) end,
      'fsdp.plan: give mesh or tp / dp_shard / dp_replicate, not both')
    T.raises(function() fsdp.plan(tiny(), with({ tp = 2, sequence_parallel = 1 })) end,
      'fsdp.plan: sequence_parallel must be true or false, got 1')
    local odd = llama.CausalLM(llama.config('tiny', { dim = 64, n_layers = 1, n_heads = 4, n_kv_heads = 2,
                                                      ffn_dim = 176, vocab_size = 256, max_seq_len = 64 }),
                               { device = 'meta' })
    T.raises(function() fsdp.plan(odd, with({ tp = 4 })) end,
      'fsdp.plan: tp = 4: model.layers.0.self_attn: n_kv_heads 2 is not divisible by tp 4')
  end)
end)

describe('fsdp.plan.search', function()
  it('enumerates the meshes a toy cluster allows and ranks them: fits first, then tokens per second', function()
    local s = fsdp.plan.search(tiny(), { world = 8, ranks_per_node = 4, device = 'h100-80g', global_batch = 16,
                                         seq = SEQ })
    local labels = {}
    for _, row in ipairs(s.rows) do labels[row.label] = row end
    -- tp 1, 2, 4 (divisors of 4 ranks per node) x FSDP / HSDP, tp > 1 with and without SP
    for _, l in ipairs({ 'FSDP 8', 'HSDP 2 x 4', 'tp 2 x FSDP 4', 'tp 2 x FSDP 4 + SP', 'tp 2 x HSDP 2 x 2',
                         'tp 2 x HSDP 2 x 2 + SP', 'tp 4 x FSDP 2', 'tp 4 x FSDP 2 + SP', 'tp 4 x HSDP 2 x 1',
                         'tp 4 x HSDP 2 x 1 + SP' }) do
      assert.is_truthy(labels[l], l)
    end
    assert.are.equal(10, #s.rows)
    -- the global batch is split over the data-parallel ranks
    assert.are.equal(2, labels['FSDP 8'].batch)
    assert.are.equal(8, labels['tp 4 x FSDP 2'].batch)
    for i = 2, #s.rows do
      local a, b = s.rows[i - 1].plan, s.rows[i].plan
      assert.is_true(a.fits or not b.fits)
      if a.fits == b.fits then assert.is_true(a.time.tokens_per_s >= b.time.tokens_per_s) end
    end
    assert.are.equal(s.rows[1], s.best)
    local text = tostring(s)
    assert.is_truthy(text:find('recommended: ' .. s.best.label, 1, true))
  end)

  it('ranks what fits first: on a small device only the meshes that fit lead', function()
    fsdp.devices.add({ name = 'toy-2m', memory = 2.1 * 2^20, flops = { f32 = 1e12 }, mem_bw = 1e11, intra_bw = 1e10,
                       inter_bw = 1e9, ranks_per_node = 4 })
    local s = fsdp.plan.search(tiny(), { world = 8, device = 'toy-2m', global_batch = 16, seq = SEQ })
    local fit, seen_misfit = 0, false
    for _, row in ipairs(s.rows) do
      if row.plan.fits then
        assert.is_false(seen_misfit)
        fit = fit + 1
      else
        seen_misfit = true
      end
    end
    assert.is_true(fit > 0 and fit < #s.rows, ('%d of %d fit'):format(fit, #s.rows))
    assert.is_true(s.best.plan.fits)
  end)

  it('skips a tp the model does not divide, saying why; refuses the options it chooses', function()
    local odd = llama.CausalLM(llama.config('tiny', { dim = 64, n_layers = 1, n_heads = 4, n_kv_heads = 2,
                                                      ffn_dim = 176, vocab_size = 256, max_seq_len = 64 }),
                               { device = 'meta' })
    local s = fsdp.plan.search(odd, { world = 4, ranks_per_node = 4, device = 'h100-80g', batch = 1, seq = 16 })
    assert.are.equal('tp 4 x FSDP 1', s.skipped[1].label)
    assert.is_truthy(s.skipped[1].why:find('n_kv_heads 2 is not divisible by tp 4', 1, true))
    T.raises(function() fsdp.plan.search(odd, { world = 4, tp = 2 }) end,
      'fsdp.plan.search: tp is what the search chooses: leave it out')
  end)
end)
