-- tests/mpi/grad_accum.lua: gradient accumulation (fsdp.sharding.accumulate,
-- the recipes' --grad_accum_steps) on a sharded tiny Llama: k micro-batches
-- of b rows per rank give the parameters of one rank stepping on all k*b*W
-- rows at once, for FULL_SHARD, SHARD_GRAD_OP and NO_SHARD; and a step
-- communicates gradients once, counted with fsdp.dist.collective_counts.
--
--   mpirun -np 2 fsdp-lua tests/mpi/grad_accum.lua     (tests/mpi/run.sh)
--   fsdp-lua tests/mpi/grad_accum.lua                  one rank: no collective at all
--   FSDP_RANKS_PER_NODE=2 mpirun -np 4 fsdp-lua tests/mpi/grad_accum.lua
--                                                      2 nodes of 2: HYBRID_SHARD too
--
-- Tolerance: 1e-5 relative, norm-wise per parameter, after K AdamW steps
-- in f32, beyond the few elements AdamW may flip ([Note: comparing
-- parameters after AdamW], tests/mpi/tap.lua). The two runs compute the same sums in different orders: the
-- reference adds each weight gradient over all k*b*W rows in one matmul;
-- the accumulating run over b rows, scales by 1/k (k = 3: not exact in
-- binary), adds k of those in the unsharded buffer and averages W of those
-- in the reduce-scatter. Each order rounds at f32's eps (1.2e-7) per
-- addition, so gradients differ by ~1e-7..1e-6 relative; AdamW moves
-- parameters by about lr times that relative change per step. A real bug
-- (a micro-batch's gradient dropped or reduced twice, a missing 1/k, a
-- stale accumulation buffer) is off by 1/k or more of an update: >= 1e-4.
local fsdp = require 'fsdp'
local dist = fsdp.dist
local llama = require 'models.llama'
local optim = require 'fsdp.optim'
local nonfinite = require 'fsdp.nonfinite'
local accumulate = require 'fsdp.sharding.accumulate'
local T = require 'tests.mpi.tap'

local R, W = T.rank, T.world
local K, B, SEQ = 2, 2, 16 -- optimizer steps, rows per micro-batch and rank, tokens per row
local CFG = { dim = 32, n_layers = 3, n_heads = 4, n_kv_heads = 2, ffn_dim = 64, vocab_size = 64,
              max_seq_len = 32 }
local SEED, LR, TOL = 7, 1e-3, 1e-5
local MAXK = 3
local data_ids = fsdp.randint(0, CFG.vocab_size, { K * MAXK * B * W, SEQ }, { seed = 11 })
local data_tg = fsdp.randint(0, CFG.vocab_size, { K * MAXK * B * W, SEQ }, { seed = 12 })

local one = dist.split(R, { name = 'one rank' })
local policy = fsdp.policy.transformer { llama.DecoderLayer }

local function build(opts)
  local m = llama.CausalLM(llama.config('Llama-2-7b', CFG), { device = 'meta' })
  opts.policy, opts.seed = policy, SEED
  return fsdp.shard(m, opts)
end

local function adamw(m) return optim.AdamW(m:named_parameters(), { lr = LR, weight_decay = 0.1 }) end

local function diff(a, b)
  local c = {}
  for k, v in pairs(b) do c[k] = v - (a[k] or 0) end
  return c
end

-- Train K steps with k micro-batches per step on strategy; the reference
-- (a group of one on every rank: no communication) steps on the k*b*W rows
-- of each step at once. Returns the largest relative parameter error and
-- the collectives of each step: {fb = forward/backward's, guard = the
-- guard's step's}.
local function run(strategy, k)
  local m = build({ strategy = strategy })
  local opt = adamw(m)
  local state = { model = m, optimizer = opt }
  -- --grad_clip=0: the guard still computes the global norm (a collective)
  -- but leaves the gradients alone, as the reference's plain step does.
  local guard = nonfinite.guard({ grad_clip = 0, on_nonfinite = 'stop', max_nonfinite_skips = 0 }, state,
    'grad_accum.lua')
  local ref = build({ group = one })
  local ropt = adamw(ref)
  local counts = {}
  for step = 0, K - 1 do
    local base = step * k * B * W
    local c0 = dist.collective_counts()
    local loss = accumulate.forward_backward(m, k, function(i)
      local first = base + ((i - 1) * W + R) * B
      return m:loss(data_ids:narrow(0, first, B), data_tg:narrow(0, first, B))
    end)
    local c1 = dist.collective_counts()
    guard:step(step + 1, loss)
    local c2 = dist.collective_counts()
    counts[#counts + 1] = { fb = diff(c0, c1), guard = diff(c1, c2) }
    local rl = ref:loss(data_ids:narrow(0, base, k * B * W), data_tg:narrow(0, base, k * B * W))
    rl:backward()
    ropt:step(); ropt:zero_grad()
  end
  local got, want = fsdp.full_state_dict(m), fsdp.full_state_dict(ref)
  local worst, where = 0, nil
  for name, w in pairs(want) do
    local err, why = T.params_error(got[name], w, LR, K)
    if why then err, name = math.huge, name .. ': ' .. why end
    if err > worst then worst, where = err, name end
  end
  return worst, where, counts, #fsdp.sharding.units(m)
end

-- What one step should start, by strategy, for N units and k micro-batches
-- (W > 1; a world of one starts nothing). FULL_SHARD frees every unit but
-- the root after its forward and gathers it again for its backward;
-- SHARD_GRAD_OP keeps it gathered from forward to backward; NO_SHARD never
-- gathers. Gradients: one reduce-scatter per unit, or under NO_SHARD one
-- all-reduce per unit, whatever k. The guard: the global gradient norm and
-- the mean loss, one all-reduce each.
local function expected(strategy, N, k)
  if W == 1 then return { all_gather = 0, reduce_scatter = 0, all_reduce = 0 }, 0 end
  if strategy == 'FULL_SHARD' then return { all_gather = k * (2 * N - 1), reduce_scatter = N, all_reduce = 0 }, 2 end
  if strategy == 'SHARD_GRAD_OP' then return { all_gather = k * N, reduce_scatter = N, all_reduce = 0 }, 2 end
  -- hybrid: gathered and reduce-scattered within a node, then one
  -- all-reduce per unit over the nodes' replicas
  if strategy == 'HYBRID_SHARD' then return { all_gather = k * (2 * N - 1), reduce_scatter = N, all_reduce = N }, 2 end
  return { all_gather = 0, reduce_scatter = 0, all_reduce = N }, 2
end

local strategies = { 'FULL_SHARD', 'SHARD_GRAD_OP', 'NO_SHARD' }
if dist.nodes() > 1 and W > dist.nodes() then strategies[#strategies + 1] = 'HYBRID_SHARD' end
for _, strategy in ipairs(strategies) do
  for _, k in ipairs({ 1, MAXK }) do
    T.test(('%s: %d micro-batch%s of %d rows = one batch of %d rows, gradients reduced once'):format(
      strategy, k, k == 1 and '' or 'es', B, k * B * W), function()
      local err, where, counts, N = run(strategy, k)
      if R == 0 then print(('# %s, k = %d: largest relative parameter error %.3g (%s)'):format(strategy, k, err, where)) end
      T.truthy(err <= TOL, ('%s differs: relative error %.3g > %g'):format(tostring(where), err, TOL))
      local want, guard = expected(strategy, N, k)
      for s, c in ipairs(counts) do
        for kind, n in pairs(want) do
          T.truthy(c.fb[kind] == n, ('step %d: %d %s in forward/backward, expected %d (%d units, k = %d)'):format(
            s, c.fb[kind], kind, n, N, k))
        end
        T.truthy(c.fb.broadcast == 0 and c.fb.barrier == 0, ('step %d: a broadcast or barrier in forward/backward'):format(s))
        T.truthy(c.guard.all_reduce == guard and c.guard.all_gather == 0 and c.guard.reduce_scatter == 0,
          ('step %d: the guard started %d all-reduces, %d all-gathers, %d reduce-scatters; expected %d, 0, 0'):format(
            s, c.guard.all_reduce, c.guard.all_gather, c.guard.reduce_scatter, guard))
      end
    end)
  end
end

-- The counter itself: each collective that moves data counts once, by
-- kind; a group of one moves nothing.
T.test('fsdp.dist.collective_counts counts each collective once, by kind', function()
  local c0 = dist.collective_counts()
  local t = fsdp.ones({ 4 })
  dist.all_reduce(t)
  dist.all_gather(t)
  dist.reduce_scatter(fsdp.ones({ 2 * W }))
  dist.broadcast(t, 0)
  dist.all_reduce(t, { group = one })
  local d = diff(c0, dist.collective_counts())
  local n = W > 1 and 1 or 0
  for _, kind in ipairs({ 'all_reduce', 'all_gather', 'reduce_scatter', 'broadcast' }) do
    T.truthy(d[kind] == n, ('%s: counted %d, expected %d'):format(kind, d[kind], n))
  end
end)

T.done()
