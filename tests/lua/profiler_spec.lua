-- profiler_spec.lua: --profile_steps on the Llama recipe (one rank, a tiny
-- model): the trace is Chrome trace JSON (metadata naming the rank's
-- track, complete events with numeric times on it, a memory counter),
-- covers exactly the asked steps, with module forwards, unit backwards,
-- the optimizer and data loading inside them; tools/trace_summary.lua
-- reads it; forward and backward ops are spans with their FLOPs, each a
-- sample of the memory counter;
-- fsdp.profiler.call is transparent on and off, and stopping leaves
-- fsdp.functional and the engine as they were.
local cjson = require 'cjson'
local fsdp = require 'fsdp'
local files = require 'fsdp.io.files'
local profiler = require 'fsdp.observe.profiler'
local T = require 'fsdp.testing'

local TINY = '--device=cpu --num_layers=2 --hidden_width=32 --num_heads=4 --vocab_size=64 --seq_len=8 --batch_size=2 '
  .. '--warmup_steps=1 --validation_freq=0 '

describe('fsdp.observe.profiler', function()
  it('--profile_steps=2:3 writes a Chrome trace of steps 2 and 3', function()
    local dir = T.tmpdir()
    local out, rc = T.run_script('recipes/llama2_7b.lua', TINY .. '--max_steps=4 --profile_steps=2:3 --profile_dir='
      .. T.quote(dir .. '/p'), 120)
    assert.equals(0, rc, out)
    assert.matches('profile: wrote ' .. dir .. '/p/trace-rank0.json (steps 2-3, ', out, 1, true)
    local trace = cjson.decode(files.read(dir .. '/p/trace-rank0.json'))
    local steps, cats, track, counters = {}, {}, nil, 0
    local lo, hi = math.huge, -math.huge
    for _, e in ipairs(trace.traceEvents) do
      if e.ph == 'M' and e.name == 'process_name' then track = e.args.name end
      if e.ph == 'C' and e.name == 'memory cpu' then
        counters = counters + 1
        assert.is_number(e.args.in_use_mib)
      end
      if e.ph == 'X' then
        assert.is_number(e.ts)
        assert.is_true(e.dur >= 0, e.name)
        -- the host's track; ops' device time on a second one (cuda)
        assert.same({ 0, e.cat == 'device' and 1 or 0 }, { e.pid, e.tid })
        cats[e.cat] = true
        if e.cat == 'step' then
          steps[#steps + 1] = e.name
          lo, hi = math.min(lo, e.ts), math.max(hi, e.ts + e.dur)
        end
      end
    end
    assert.equals('rank 0', track)
    assert.same({ 'step 2', 'step 3' }, steps)
    for _, c in ipairs({ 'forward', 'backward', 'optim', 'data' }) do assert.is_true(cats[c], c) end
    assert.is_true(counters > 0)
    for _, e in ipairs(trace.traceEvents) do
      if e.ph == 'X' then assert.is_true(e.ts >= lo and e.ts + e.dur <= hi + 1, e.name) end
    end
    local names = {}
    for _, e in ipairs(trace.traceEvents) do names[e.name] = true end
    assert.is_true(names['model.layers.1.self_attn'] and names['backward model.layers.0'] and names.optimizer)
    -- ops, forward (fsdp.functional) and backward (the engine's nodes), with
    -- their FLOPs and what they made: 2 layers x 7 linears, twice
    local ops = {}
    for _, e in ipairs(trace.traceEvents) do
      if e.ph == 'X' and e.cat == 'op' then
        ops[e.name] = (ops[e.name] or 0) + 1
        assert.is_number(e.args.flops)
        if e.name == 'F.linear' or e.name == 'LinearBackward' then
          assert.is_true(e.args.flops > 0 and e.args.bytes > 0, e.name)
          assert.matches('^%d+x', e.args.shape)
          assert.equals('f32', e.args.dtype)
        end
      end
    end
    -- (the head and loss: one fused op, [Note: the fused loss] in models/decoder.lua)
    assert.equals(2 * 14, ops['F.linear'])
    assert.equals(2 * 14, ops.LinearBackward)
    assert.equals(2, ops['F.linear_cross_entropy'])
    assert.equals(2, ops.LinearCrossEntropyBackward)
    assert.is_true(ops['F.scaled_dot_product_attention'] == 4 and ops.ScaledDotProductAttentionBackward == 4)
    -- tensor methods and operators outside fsdp.functional: the residual
    -- adds (2 per layer: the one after attention fused with the norm after
    -- it, [Note: the layer's add and norm fused] in models/decoder.lua), the
    -- heads' transposes; nothing for size or numel
    assert.equals(2 * 2, ops['Tensor.__add'])
    assert.equals(2 * 2, ops['F.add_rms_norm'])
    assert.is_true((ops['Tensor.transpose'] or 0) > 0)
    assert.is_nil(ops['Tensor.size'] or ops['Tensor.numel'] or ops['Tensor.item'])
    -- every op samples the memory counter as it ends: a timeline at op grain
    local n_ops = 0
    for _, n in pairs(ops) do n_ops = n_ops + n end
    assert.is_true(counters >= n_ops, ('%d memory samples for %d ops'):format(counters, n_ops))
    -- each sample split by owner, as fsdp.plan names them, summing to it
    local in_use_at, split = {}, 0
    for _, e in ipairs(trace.traceEvents) do
      if e.ph == 'C' and e.args.in_use_mib then in_use_at[e.ts] = e.args.in_use_mib end
    end
    for _, e in ipairs(trace.traceEvents) do
      if e.ph == 'C' and e.name == 'memory cpu by owner' then
        split = split + 1
        local sum = e.args.persistent + e.args['gathered units'] + e.args['activations and transients']
        assert.is_true(math.abs(sum - in_use_at[e.ts]) < 1e-9 or e.args['activations and transients'] == 0)
      end
    end
    assert.equals(counters, split)
    out, rc = T.run_script('tools/trace_summary.lua', T.quote(dir .. '/p/trace-rank0.json') .. ' --top=3', 60)
    assert.equals(0, rc, out)
    assert.matches('rank 0: 2 steps traced, [%d.]+ ms', out)
    assert.matches('exposed communication: [%d.]+ ms waiting on collectives', out)
    assert.matches('peak cpu in use: [%d.]+ MiB %(persistent [%d.]+, gathered units [%d.]+, activations and '
      .. 'transients [%d.]+%), at the end of step [23] > ', out)
    files.remove_tree(dir)
  end)

  it('leaves fsdp.functional and the engine as they were when it stops', function()
    local F = require 'fsdp.functional'
    local linear = F.linear
    local Tensor = getmetatable(fsdp.ones({}))
    local matmul, add = Tensor.methods.matmul, Tensor.__add
    profiler.start({})
    assert.are_not.equal(linear, F.linear) -- timed while recording
    assert.are_not.equal(matmul, Tensor.methods.matmul)
    assert.are_not.equal(add, Tensor.__add)
    local x = fsdp.randn({ 2, 3 }):requires_grad_()
    F.linear(x, fsdp.randn({ 4, 3 })):sum():backward()
    local path = os.tmpname()
    profiler.stop(path)
    os.remove(path)
    assert.equals(linear, F.linear)
    assert.equals(matmul, Tensor.methods.matmul)
    assert.equals(add, Tensor.__add)
    -- the engine records nothing once stopped
    F.linear(x, fsdp.randn({ 4, 3 })):sum():backward()
    local ffi = require 'ffi'
    assert.equals(0, require('fsdp.core').C.fl_engine_take_spans(ffi.new('fl_node_span[1]'), 1, nil))
  end)

  it('times ops on the device too, on a track of its own (cuda)', function()
    if not fsdp.cuda.is_available() then
      pending('no GPU here (' .. fsdp.cuda.status() .. '): device time of ops was not recorded')
      return
    end
    local F = require 'fsdp.functional'
    profiler.start({ device = 'cuda:0' })
    local t0 = profiler.now()
    local x = fsdp.randn({ 16, 32 }, { device = 'cuda:0' }):requires_grad_()
    local w = fsdp.randn({ 24, 32 }, { device = 'cuda:0' }):requires_grad_()
    F.gelu(F.linear(x, w)):sum():backward()
    local path = os.tmpname()
    profiler.stop(path)
    local t1 = profiler.now()
    local trace = cjson.decode(files.read(path))
    os.remove(path)
    local host, device, track = {}, {}, nil
    for _, e in ipairs(trace.traceEvents) do
      if e.ph == 'M' and e.name == 'thread_name' and e.tid == 1 then track = e.args.name end
      if e.ph == 'X' and e.cat == 'op' then host[e.name] = (host[e.name] or 0) + 1 end
      if e.ph == 'X' and e.cat == 'device' then
        device[e.name] = (device[e.name] or 0) + 1
        assert.equals(1, e.tid)
        assert.is_true(e.dur >= 0, e.name)
        -- on the host's clock, within the recording (1 ms for the reference's lag)
        assert.is_true(e.ts >= t0 - 1000 and e.ts + e.dur <= t1 + 1000, e.name)
      end
    end
    assert.equals('cuda:0 (device time)', track)
    -- forward ops through the wrapper, backward nodes through the engine
    for _, name in ipairs({ 'F.linear', 'F.gelu', 'LinearBackward', 'GeluBackward' }) do
      assert.is_true(host[name] == 1 and device[name] == 1, name)
    end
  end)

  it('call returns fn\'s results, on and off; a span lands in the trace', function()
    assert.same({ 1, 2 }, { profiler.call('x', 'data', function(a) return a, 2 end, 1) })
    profiler.start({})
    assert.same({ 3, nil, 5 }, { profiler.call('x', 'data', function() return 3, nil, 5 end) })
    local path = os.tmpname()
    assert.equals(3 + 3, profiler.stop(path)) -- metadata, the span, its memory samples (in use, by owner)
    assert.is_false(profiler.on)
    local t = cjson.decode(files.read(path))
    os.remove(path)
    assert.equals('x', t.traceEvents[4].name)
  end)
end)
