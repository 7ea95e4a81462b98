-- tests/mpi/rank_agreement.lua: ranks compare their configuration and
-- model structure before the first collective that depends on them
-- (fsdp.dist.agree; fsdp.shard and the recipes call it).
--
--   (no argument)  TAP tests: equal values pass; differing ones raise the
--                  same error on every rank, naming each key with each
--                  rank's value; subgroups compare among their members
--   shard          the last rank builds one layer more and calls
--                  fsdp.shard: the job must end within seconds naming the
--                  differing structure (tests/mpi/run.sh checks it),
--                  instead of MPI_ERR_TRUNCATE or a hang
local fsdp = require 'fsdp'
local dist = fsdp.dist

if arg[1] == 'shard' then
  local llama = require 'models.llama'
  local last = dist.world_size() - 1
  local cfg = { dim = 32, n_layers = dist.rank() == last and 3 or 2, n_heads = 4, n_kv_heads = 4,
                ffn_dim = 64, vocab_size = 64, max_seq_len = 32 }
  local m = llama.CausalLM(llama.config('Llama-2-7b', cfg), { device = 'meta' })
  fsdp.shard(m, { policy = fsdp.policy.transformer { llama.DecoderLayer } })
  local ids = fsdp.randint(0, 64, { 2, 16 }, { seed = 1 })
  m:loss(ids, ids):backward()
  print('unreachable: the job should have ended')
  return
end

local T = require 'tests.mpi.tap'
local r, W = T.rank, T.world

T.test('equal values agree (nested tables, numbers, strings, booleans)', function()
  dist.agree('the test options', { lr = 3e-4, name = 'x\ny', flag = true, nested = { a = 1, b = { 'c' } } })
end)

T.test('a differing key fails on every rank naming it, each value and the ranks', function()
  local err = T.raises(function()
    dist.agree('the test options', { lr = r == W - 1 and 2e-4 or 1e-4, steps = 10, only_last = r == W - 1 and 1 or nil })
  end, 'the ranks disagree on the test options')
  local others = W == 2 and 'rank 0' or ('ranks 0, 1' .. (W == 4 and ', 2' or ''))
  T.truthy(err:find(('lr (%s = 0.0001; rank %d = 0.00020000000000000001)'):format(others, W - 1), 1, true), err)
  T.truthy(err:find(('only_last (%s = (not set); rank %d = 1)'):format(others, W - 1), 1, true), err)
  T.truthy(not err:find('steps', 1, true), err)
end)

T.test('agreement within a subgroup compares its members only', function()
  local g = dist.new_group({ 0, 1 })
  if g:is_member() then
    dist.agree('pair options', { x = 1 }, { group = g })
    local err = T.raises(function() dist.agree('pair options', { x = r }, { group = g }) end,
      'the ranks disagree on pair options')
    T.truthy(err:find('x (rank 0 = 0; rank 1 = 1)', 1, true), err)
  end
end)

T.test('fsdp.shard passes on identical models', function()
  local m = fsdp.nn.Sequential(fsdp.nn.Linear(8, 8, { device = 'meta' }), fsdp.nn.Linear(8, 4, { device = 'meta' }))
  fsdp.shard(m)
end)

T.done()
