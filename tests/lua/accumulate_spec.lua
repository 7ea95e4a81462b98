-- accumulate_spec.lua: gradient accumulation (fsdp.sharding.accumulate) in
-- one process: k micro-batches give the gradients and the step of one
-- batch k times as large, sharded (a world of one: nothing communicated)
-- and plain; the mean loss is returned; bad k is refused. The multi-rank
-- equivalence and the count of collectives per step are in
-- tests/mpi/grad_accum.lua; the recipes' --grad_accum_steps with kill and
-- resume in tests/mpi/seed_args.sh.
local fsdp = require 'fsdp'
local llama = require 'models.llama'
local optim = require 'fsdp.optim'
local accumulate = require 'fsdp.sharding.accumulate'
local T = require 'fsdp.testing'

local CFG = { dim = 32, n_layers = 2, n_heads = 4, n_kv_heads = 2, ffn_dim = 64, vocab_size = 64,
              max_seq_len = 32 }
local K, B = 4, 2
local ids = fsdp.randint(0, 64, { K * B, 16 }, { seed = 1 })
local tg = fsdp.randint(0, 64, { K * B, 16 }, { seed = 2 })

local function model(sharded)
  local m = llama.CausalLM(llama.config('Llama-2-7b', CFG), { device = 'meta' })
  if sharded then return fsdp.shard(m, { policy = fsdp.policy.transformer { llama.DecoderLayer }, seed = 3 }) end
  m:init_weights({ seed = 3, device = 'cpu' })
  return m
end

local function grads(m)
  local out = {}
  for _, np in ipairs(m:named_parameters()) do out[np[1]] = np[2].grad:clone() end
  return out
end

-- The largest relative (norm-wise) difference between two sets of tensors.
local function worst(a, b)
  local w = 0
  for name, x in pairs(b) do
    local d = (a[name] - x):pow(2):sum():item() ^ 0.5 / math.max(x:pow(2):sum():item() ^ 0.5, 1e-30)
    w = math.max(w, d)
  end
  return w
end

describe('gradient accumulation', function()
  for _, sharded in ipairs({ true, false }) do
    local what = sharded and 'a sharded model' or 'a plain model'
    it(('gives %s the gradients and step of the %d-times batch (f32, 1e-5 relative)'):format(what, K), function()
      local a, b = model(sharded), model(sharded)
      local before = fsdp.dist.collective_counts()
      local seen = {}
      local mean = accumulate.forward_backward(a, K, function(i)
        seen[#seen + 1] = i
        return a:loss(ids:narrow(0, (i - 1) * B, B), tg:narrow(0, (i - 1) * B, B))
      end)
      assert.same({ 1, 2, 3, 4 }, seen)
      -- a world of one: nothing is sent
      assert.same(before, fsdp.dist.collective_counts())
      local whole = b:loss(ids, tg)
      whole:backward()
      -- mean of equal micro-batches' mean losses = the whole batch's mean
      assert.is_true(math.abs(mean - whole:item()) < 1e-5 * whole:item(), ('%g vs %g'):format(mean, whole:item()))
      local err = worst(grads(a), grads(b))
      assert.is_true(err < 1e-5, ('gradients differ by %.3g'):format(err))
      -- eps 1e-5, not AdamW's 1e-8: a first Adam step moves each element by
      -- about lr * g / (|g| + eps), so where a gradient nearly cancels to
      -- |g| ~ 1e-8 the sums' rounding (1e-10 absolute, the order of
      -- additions differs between micro-batches and one batch) moved a
      -- parameter by 1.7e-5 relative on one machine's BLAS and not on
      -- another's; what the check is for (one step, on the batch's mean
      -- gradients) it still sees.
      local oa = optim.AdamW(a:named_parameters(), { lr = 1e-2, eps = 1e-5 })
      local ob = optim.AdamW(b:named_parameters(), { lr = 1e-2, eps = 1e-5 })
      oa:step(); ob:step()
      local pa, pb = {}, {}
      for _, np in ipairs(a:named_parameters()) do pa[np[1]] = np[2] end
      for _, np in ipairs(b:named_parameters()) do pb[np[1]] = np[2] end
      err = worst(pa, pb)
      assert.is_true(err < 1e-5, ('parameters differ by %.3g'):format(err))
    end)
  end

  it('with k = 1 is one plain backward', function()
    local a, b = model(true), model(true)
    local mean = accumulate.forward_backward(a, 1, function() return a:loss(ids, tg) end)
    local l = b:loss(ids, tg)
    l:backward()
    assert.equals(l:item(), mean)
    assert.equals(0, worst(grads(a), grads(b)))
  end)

  -- token_mean ([Note: the loss of a step over its tokens]); the multi-rank
  -- cases are tests/mpi/token_mean.lua
  for _, sharded in ipairs({ true, false }) do
    it(('token_mean gives %s the loss and gradients of the whole batch with masked targets of unequal counts'):format(
      sharded and 'a sharded model' or 'a plain model'), function()
      local masked = tg:clone()
      -- micro-batch i keeps (i * 5) % 16 targets of each row: 5, 10, 15, 0
      for i = 1, K do
        local keep = (i * 5) % 20
        masked:narrow(0, (i - 1) * B, B):narrow(1, keep, 16 - keep):fill_(-100)
      end
      local a, b = model(sharded), model(sharded)
      local loss, n = accumulate.token_mean(a, K, function(i)
        return ids:narrow(0, (i - 1) * B, B), masked:narrow(0, (i - 1) * B, B)
      end, function(x, y) return a:loss(x, y) end)
      assert.equals((5 + 10 + 15) * B, n)
      local whole = b:loss(ids, masked)
      whole:backward()
      assert.is_true(math.abs(loss - whole:item()) < 1e-6 * whole:item(), ('%.9g vs %.9g'):format(loss, whole:item()))
      local err = worst(grads(a), grads(b))
      assert.is_true(err < 1e-5, ('gradients differ by %.3g'):format(err))
      -- the mean of the micro-batch means is another number: the test can fail
      local c = model(sharded)
      local mean = accumulate.forward_backward(c, K - 1, function(i)
        return c:loss(ids:narrow(0, (i - 1) * B, B), masked:narrow(0, (i - 1) * B, B))
      end)
      assert.is_true(math.abs(mean - whole:item()) > 1e-3, ('%.9g vs %.9g'):format(mean, whole:item()))
    end)
  end

  it('token_mean with unmasked targets gives forward_backward\'s bits', function()
    local a, b = model(true), model(true)
    local m1 = accumulate.forward_backward(a, K, function(i)
      return a:loss(ids:narrow(0, (i - 1) * B, B), tg:narrow(0, (i - 1) * B, B))
    end)
    local m2 = accumulate.token_mean(b, K, function(i)
      return ids:narrow(0, (i - 1) * B, B), tg:narrow(0, (i - 1) * B, B)
    end, function(x, y) return b:loss(x, y) end)
    assert.equals(m1, m2)
    assert.equals(0, worst(grads(a), grads(b)))
  end)

  it('refuses a k that is not a positive integer', function()
    local m = model(false)
    for _, k in ipairs({ 0, -1, 1.5 }) do
      assert.error_matches(function() accumulate.forward_backward(m, k, function() end) end,
        'k must be an integer >= 1, got ' .. tostring(k), nil, true)
    end
  end)

  it('is --grad_accum_steps in every training recipe', function()
    for _, case in ipairs({
      { 'recipes/llama2_7b.lua', '--num_layers=1 --hidden_width=32 --num_heads=2 --vocab_size=64 --seq_len=16 '
        .. '--batch_size=2 --max_steps=3 --warmup_steps=1 --grad_accum_steps=3', 'Batch 3 Loss: ' },
      { 'recipes/t5_3b.lua', '--num_layers=1 --d_model=32 --d_ff=64 --d_kv=8 --num_heads=4 --vocab_size=16 '
        .. '--max_steps=3 --warmup_steps=1 --batch_size=2 --grad_accum_steps=2 --eval_examples=2', 'Batch 3 Loss: ' },
      { 'recipes/deepvit_8b.lua', '--depth=1 --dim=32 --heads=2 --mlp_dim=64 --image_size=32 --num_classes=4 '
        .. '--max_steps=3 --batch_size=2 --grad_accum_steps=2', 'Batch 3 Loss: ' },
      { 'recipes/mnist.lua', '--epochs=1 --train_size=128 --test_size=64 --max_batches=4 --batch_size=16 '
        .. '--log_interval=1 --grad_accum_steps=2', 'Train Epoch: 1 [48/128' },
    }) do
      local out, rc = T.run_script(case[1], case[2])
      assert.equals(0, rc, case[1] .. ':\n' .. out)
      assert.matches(case[3], out, 1, true)
    end
  end)
end)
