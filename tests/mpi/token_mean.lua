-- tests/mpi/token_mean.lua: the loss of a step over its target tokens
-- (fsdp.sharding.accumulate.token_mean, [Note: the loss of a step over its
-- tokens]) on a sharded tiny Llama, with targets masked (-100) so that
-- micro-batches and ranks hold very different numbers of target tokens
-- (one micro-batch of one rank none at all, as supervised fine-tuning data
-- gives): k micro-batches per rank on W ranks give the loss and the
-- gradients of one process computing the mean over all target tokens of
-- the k*b*W rows at once. And on unmasked data token_mean gives the same
-- bits as forward_backward (what pretraining ran before).
--
--   mpirun -np 2 fsdp-lua tests/mpi/token_mean.lua     (tests/mpi/run.sh)
--   fsdp-lua tests/mpi/token_mean.lua                  one rank: accumulation alone
--   FSDP_RANKS_PER_NODE=2 mpirun -np 4 fsdp-lua tests/mpi/token_mean.lua
--                                                      2 nodes of 2: HYBRID_SHARD too
--
-- Gradients are compared through one SGD step (lr 1, no momentum: the
-- parameters move by exactly minus the gradient): per parameter, the
-- norm of the difference of the two steps relative to the norm of the
-- reference step, tolerance 1e-5 (the two runs sum in different orders
-- at f32's eps, 1.2e-7, per addition, a few hundred additions per
-- element). The control: forward_backward (mean of the micro-batch means)
-- on the same data must be off by more than 1e-2, so the comparison can
-- fail.
local fsdp = require 'fsdp'
local dist = fsdp.dist
local llama = require 'models.llama'
local optim = require 'fsdp.optim'
local accumulate = require 'fsdp.sharding.accumulate'
local T = require 'tests.mpi.tap'

local R, W = T.rank, T.world
local B, SEQ = 2, 16 -- rows per micro-batch and rank, tokens per row
local CFG = { dim = 32, n_layers = 2, n_heads = 4, n_kv_heads = 2, ffn_dim = 64, vocab_size = 64,
              max_seq_len = 32 }
local SEED, TOL = 7, 1e-5
local MAXK = 3
local ROWS = MAXK * B * W
local ids = fsdp.randint(0, CFG.vocab_size, { ROWS, SEQ }, { seed = 11 })
local full_tg = fsdp.randint(0, CFG.vocab_size, { ROWS, SEQ }, { seed = 12 })

-- The row of micro-batch i (1-based) of rank r, row b (0-based), for k.
local function row(i, r, b) return ((i - 1) * W + r) * B + b end

-- Masked targets: row g keeps its first len(g) targets, the others -100;
-- micro-batch 2 of the last rank keeps none.
local function masked(k)
  local tg = full_tg:clone()
  local lens = { 16, 3, 9, 1, 12, 5, 14, 2, 7, 11, 4, 6 }
  for i = 1, k do
    for r = 0, W - 1 do
      for b = 0, B - 1 do
        local g = row(i, r, b)
        local keep = lens[g % #lens + 1]
        if i == 2 and r == W - 1 then keep = 0 end
        if keep < SEQ then tg:select(0, g):narrow(0, keep, SEQ - keep):fill_(-100) end
      end
    end
  end
  return tg
end

local one = dist.split(R, { name = 'one rank' })
local policy = fsdp.policy.transformer { llama.DecoderLayer }

local function build(opts)
  local m = llama.CausalLM(llama.config('Llama-2-7b', CFG), { device = 'meta' })
  opts.policy, opts.seed = policy, SEED
  return fsdp.shard(m, opts)
end

-- One SGD step (lr 1) of the sharded model with k micro-batches per rank
-- (step_fn: token_mean or forward_backward), and of the reference on all
-- rows at once. Returns the worst relative step error, its parameter, the
-- step's loss (averaged over the ranks as the guard does) and the
-- reference's.
local function run(strategy, k, tg, step_fn)
  local m = build({ strategy = strategy })
  local ref = build({ group = one })
  local before = fsdp.full_state_dict(ref)
  local loss
  if step_fn == 'token_mean' then
    loss = accumulate.token_mean(m, k, function(i)
      local first = row(i, R, 0)
      return ids:narrow(0, first, B), tg:narrow(0, first, B)
    end, function(x, y) return m:loss(x, y) end)
  else
    loss = accumulate.forward_backward(m, k, function(i)
      local first = row(i, R, 0)
      return m:loss(ids:narrow(0, first, B), tg:narrow(0, first, B))
    end)
  end
  if W > 1 then loss = dist.all_reduce(fsdp.tensor({ loss }, { dtype = 'f64' }), { op = 'avg' }):get(0) end
  optim.SGD(m:named_parameters(), { lr = 1 }):step()
  local rl = ref:loss(ids:narrow(0, 0, k * B * W), tg:narrow(0, 0, k * B * W))
  rl:backward()
  optim.SGD(ref:named_parameters(), { lr = 1 }):step()
  local got, want = fsdp.full_state_dict(m), fsdp.full_state_dict(ref)
  local worst, where = 0, nil
  for name, w in pairs(want) do
    local dw = (before[name] - w):to('f64')
    local dg = (before[name] - got[name]):to('f64')
    local den = dw:square():sum():item()
    local err = math.sqrt((dg - dw):square():sum():item() / math.max(den, 1e-30))
    if err > worst then worst, where = err, name end
  end
  return worst, where, loss, rl:item()
end

local strategies = { 'FULL_SHARD', 'NO_SHARD' }
if dist.nodes() > 1 and W > dist.nodes() then strategies[#strategies + 1] = 'HYBRID_SHARD' end
for _, strategy in ipairs(strategies) do
  for _, k in ipairs({ 1, MAXK }) do
    T.test(('%s: %d micro-batch%s x %d ranks of unequal target counts = one process on the %d rows'):format(
      strategy, k, k == 1 and '' or 'es', W, k * B * W), function()
      local tg = masked(k)
      local err, where, loss, want = run(strategy, k, tg, 'token_mean')
      T.truthy(err < TOL, ('gradient off by %.3g relative at %s'):format(err, tostring(where)))
      T.truthy(math.abs(loss - want) <= 1e-6 * math.abs(want), ('loss %.9g, one process %.9g'):format(loss, want))
      if k > 1 or W > 1 then
        -- the control: a mean of micro-batch means weights them wrongly
        local bad_err = run(strategy, k, tg, 'forward_backward')
        T.truthy(bad_err > 1e-2, ('the mean of means is off by only %.3g: the data does not tell them apart'):format(
          bad_err))
      end
    end)
  end
end

T.test('unmasked targets: token_mean gives forward_backward\'s bits (loss and parameters after AdamW)', function()
  local k = MAXK
  local results = {}
  for _, fn in ipairs({ 'forward_backward', 'token_mean' }) do
    local m = build({ strategy = 'FULL_SHARD' })
    local opt = optim.AdamW(m:named_parameters(), { lr = 1e-3, weight_decay = 0.1 })
    local loss
    for _ = 1, 2 do -- the same rows each step: the data is not the point here
      local function rows(i) return ids:narrow(0, row(i, R, 0), B), full_tg:narrow(0, row(i, R, 0), B) end
      if fn == 'token_mean' then
        loss = accumulate.token_mean(m, k, rows, function(x, y) return m:loss(x, y) end)
      else
        loss = accumulate.forward_backward(m, k, function(i) return m:loss(rows(i)) end)
      end
      opt:step(); opt:zero_grad()
    end
    results[fn] = { loss = loss, params = fsdp.full_state_dict(m) }
  end
  local a, b = results.forward_backward, results.token_mean
  T.truthy(a.loss == b.loss, ('loss %.17g vs %.17g'):format(a.loss, b.loss))
  for name, p in pairs(a.params) do
    local d = (p - b.params[name]):abs():max():item()
    T.truthy(d == 0, ('%s differs by %g'):format(name, d))
  end
end)

T.test('a step with no target token on any rank is one error on every rank, before any forward', function()
  local m = build({ strategy = 'FULL_SHARD' })
  local tg = fsdp.full({ B, SEQ }, -100, { dtype = 'i64' })
  local forwards = 0
  local ok, err = pcall(accumulate.token_mean, m, 2, function() return ids:narrow(0, 0, B), tg end,
    function(x, y) forwards = forwards + 1; return m:loss(x, y) end)
  T.truthy(not ok and tostring(err):find('hold no target token', 1, true), tostring(err))
  T.truthy(forwards == 0, ('%d forwards ran'):format(forwards))
end)

T.done()
