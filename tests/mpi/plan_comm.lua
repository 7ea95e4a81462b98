-- tests/mpi/plan_comm.lua: the planner's communication against what the
-- collectives really moved (fsdp.dist.collective_stats, counted in
-- core/comm as the backend gets the buffers): for each strategy in f32
-- and in bf16 mixed precision, every rank plans a small Llama for itself
-- (fsdp.plan), shards the same model, trains one step as the recipes do
-- and compares, per kind, the calls and bytes of the step's all-gathers
-- and reduce-scatters (and the replicas' all-reduces of the hybrids) with
-- plan.comm: they must be equal, to the byte. The gradient-norm all-reduce
-- of clipping is the recipes' own (one f64 element), not the planner's,
-- and stays out of the step measured here.
--
-- bf16 reductions through MPI are staged in f32 by the core (MPI has no
-- bf16 sum), so their buffers count 4 bytes an element: the plan says so
-- for the host backend (fsdp.plan.cost).
local fsdp = require 'fsdp'
local dist = fsdp.dist
local llama = require 'models.llama'
local optim = require 'fsdp.optim'
local T = require 'tests.mpi.tap'

local R, W = T.rank, T.world
local CFG = { dim = 64, n_layers = 3, n_heads = 4, n_kv_heads = 2, ffn_dim = 176, vocab_size = 256,
              max_seq_len = 128 }
local B, SEQ = 2, 32
local c = llama.config('tiny', CFG)

-- One recipe step (loss, backward, AdamW step, zero_grad): the
-- collectives it started, by kind (differences of collective_stats).
local function measure(strategy, mp)
  local m = llama.CausalLM(c, { device = 'meta' })
  fsdp.shard(m, { policy = fsdp.policy.transformer { llama.DecoderLayer }, seed = 1, strategy = strategy,
                  mixed_precision = mp })
  local opt = optim.AdamW(m:named_parameters(), { lr = 1e-3 })
  local ids = fsdp.randint(0, c.vocab_size, { B, SEQ }, { seed = 10 * R + 1 })
  local targets = fsdp.randint(0, c.vocab_size, { B, SEQ }, { seed = 100 + 10 * R + 1 })
  dist.barrier()
  local before = dist.collective_stats()
  local loss = m:loss(ids, targets)
  loss:backward()
  opt:step()
  opt:zero_grad()
  local after = dist.collective_stats()
  local step = {}
  for kind, a in pairs(after) do
    step[kind] = { calls = a.calls - before[kind].calls, bytes = a.bytes - before[kind].bytes,
                   wait_s = a.wait_s - before[kind].wait_s, busy_s = a.busy_s - before[kind].busy_s }
  end
  return step
end

local cases = {}
for _, strategy in ipairs({ 'FULL_SHARD', 'SHARD_GRAD_OP', 'NO_SHARD', 'HYBRID_SHARD' }) do
  cases[#cases + 1] = { strategy, nil }
  cases[#cases + 1] = { strategy, 'bf16' }
end

for _, case in ipairs(cases) do
  local strategy, mp = case[1], case[2]
  local label = ('%s %s on %d ranks (%d node%s)'):format(strategy, mp or 'f32', W, dist.nodes(),
    dist.nodes() == 1 and '' or 's')
  T.test('planned = measured collectives, calls and bytes: ' .. label, function()
    local plan = fsdp.plan(llama.CausalLM(c, { device = 'meta' }), {
      world = W, nodes = dist.nodes(), rank = R, strategy = strategy, mixed_precision = mp,
      batch = B, seq = SEQ, device = 'cpu' })
    local step = measure(strategy, mp)
    for _, kind in ipairs({ 'all_gather', 'reduce_scatter', 'all_reduce' }) do
      local p = plan.comm[kind] or { calls = 0, bytes = 0 }
      local got = step[kind]
      if R == 0 then
        io.stdout:write(('# %s %s: %d calls, %d bytes (planned %d, %d); waited %.1f ms\n'):format(
          label, kind, got.calls, got.bytes, p.calls, p.bytes, 1e3 * got.wait_s))
      end
      T.truthy(got.calls == p.calls and got.bytes == p.bytes,
        ('rank %d %s: %d calls of %d bytes measured, %d calls of %d bytes planned'):format(
          R, kind, got.calls, got.bytes, p.calls, p.bytes))
      T.truthy(got.wait_s >= 0, kind .. ': a negative wait')
      T.truthy(got.calls == 0 or got.busy_s > 0, kind .. ': collectives ran but no busy time')
    end
  end)
end

T.test('busy time: the seconds collectives were in flight, hidden or not', function()
  local before = dist.collective_stats()
  local big = fsdp.ones({ 2^22 })
  local w = dist.all_reduce(big, { async = true })
  local m = fsdp.randn({ 256, 256 }, { seed = R })
  for _ = 1, 20 do m = m:matmul(m):div(256) end -- compute while it moves
  w:wait()
  dist.all_gather(fsdp.ones({ 2^20 }))
  local after = dist.collective_stats()
  local function d(kind, field) return after[kind][field] - before[kind][field] end
  local ar, ag, any = d('all_reduce', 'busy_s'), d('all_gather', 'busy_s'), d('any', 'busy_s')
  T.truthy(ar > 0 and ag > 0, ('busy all_reduce %g s, all_gather %g s'):format(ar, ag))
  -- any counts time with several kinds in flight once
  T.truthy(any >= math.max(ar, ag) - 1e-6 and any <= ar + ag + 1e-6,
    ('busy any %g s against all_reduce %g + all_gather %g'):format(any, ar, ag))
  -- what the host waited is part of the time the collective was in flight
  -- (give the progress thread's polling interval and post-processing 5 ms)
  T.truthy(d('all_reduce', 'wait_s') <= ar + 0.005,
    ('waited %g s for an all_reduce in flight %g s'):format(d('all_reduce', 'wait_s'), ar))
  T.truthy(d('any', 'calls') == d('all_reduce', 'calls') + d('all_gather', 'calls'), 'any sums the calls')
end)

-- The recipes' metrics carry the same numbers per step.
T.test('a recipe step record has comm, comm_bytes and comm_wait_s', function()
  local log = require('fsdp.observe.metrics').Logger({ out = io.open('/dev/null', 'w'), progress = false })
  local x = fsdp.ones({ 1000 })
  dist.all_reduce(x)
  local rec
  log._write = function(_, r) rec = r end
  log:step(1, { loss = 1.0, dt = 0.1 })
  if R == 0 then
    T.truthy(rec and rec.comm and rec.comm.all_reduce, 'no comm in the record')
    T.truthy(rec.comm.all_reduce.calls == 1 and rec.comm.all_reduce.bytes == 4000,
      ('all_reduce: %s calls, %s bytes (1 call of 4000 expected)'):format(
        tostring(rec.comm.all_reduce.calls), tostring(rec.comm.all_reduce.bytes)))
    T.truthy(rec.comm_bytes == 4000 and rec.comm_wait_s >= 0, 'comm_bytes ' .. tostring(rec.comm_bytes))
    T.truthy(rec.comm_busy_s and rec.comm_busy_s > 0, 'comm_busy_s ' .. tostring(rec.comm_busy_s))
    T.truthy(rec.comm.any == nil, 'the kinds, not their sum, in comm')
  end
end)

T.done()
