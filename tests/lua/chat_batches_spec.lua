-- chat_batches_spec.lua: fsdp.data.chat_batches's packed mode ([Note: SFT
-- batches, padded or packed]): every example lands once per epoch on
-- exactly one rank's rows, a checkpointed position resumes to the same
-- next batch, and the loss over the trained tokens of a whole set is the
-- same through a tiny Qwen3 packed as padded (f32 rounding); a position
-- saved packed is refused by padded batches. Also fsdp.data.packing's
-- examples given as targets (chat_batches' form) rather than labels.
local fsdp = require 'fsdp'
local cb = require 'fsdp.data.chat_batches'
local packing = require 'fsdp.data.packing'
local accumulate = require 'fsdp.sharding.accumulate'
local T = require 'fsdp.testing'

-- n examples of lengths 3..17: ids k*7 + t mod 200, the first third of
-- each untrained; targets as chat_tokens.targets makes them.
local function examples(n)
  local out = {}
  for k = 1, n do
    local L = 3 + (k * 5) % 15
    local ids, targets = {}, {}
    for t = 1, L do
      ids[t] = (k * 7 + t) % 200
      targets[t] = (t > L / 3 and t < L) and (k * 7 + t + 1) % 200 or -100
    end
    local e = { ids = fsdp.tensor(ids, { dtype = 'i64' }), targets = fsdp.tensor(targets, { dtype = 'i64' }) }
    e.trained = accumulate.count_tokens(e.targets)
    out[k] = e
  end
  return out
end

-- the first id of every example a batch's rows hold (segment starts)
local function starts(ids, extra, into)
  local seg, id = extra.segments, ids
  for r = 0, seg:size(0) - 1 do
    local prev
    for t = 0, seg:size(1) - 1 do
      local s = seg:get(r, t)
      if s >= 0 and s ~= prev then into[#into + 1] = id:get(r, t) end
      prev = s
    end
  end
end

describe('chat batches, packed', function()
  it('give every example once per epoch, each on one rank, and resume to the same batch', function()
    local ex = examples(40)
    local world, seen = 2, {}
    local epoch_steps
    for rank = 0, world - 1 do
      local b = cb.Batches.new(ex, { batch_size = 2, pack = 24, seed = 3, rank = rank, world = world })
      epoch_steps = b:steps_per_epoch()
      for _ = 1, epoch_steps do
        local ids, targets, extra = b:next()
        assert.same({ 2, 24 }, ids.shape)
        assert.same({ 2, 24 }, targets.shape)
        starts(ids, extra, seen)
      end
    end
    table.sort(seen)
    local want = {}
    for k, e in ipairs(ex) do want[k] = e.ids:get(0) end
    table.sort(want)
    assert.same(want, seen)
    -- a position saved mid-epoch (and one past the epoch) resumes to the same batch
    for _, at in ipairs({ 2, epoch_steps + 1 }) do
      local a = cb.Batches.new(ex, { batch_size = 2, pack = 24, seed = 3, rank = 1, world = world })
      for _ = 1, at do a:next() end
      local b = cb.Batches.new(ex, { batch_size = 2, pack = 24, seed = 3, rank = 1, world = world })
      b:load_state(a:state())
      local ia, ta, xa = a:next()
      local ib, tb, xb = b:next()
      assert.same(ia:tolist(), ib:tolist())
      assert.same(ta:tolist(), tb:tolist())
      assert.same(xa.positions:tolist(), xb.positions:tolist())
    end
    local padded = cb.Batches.new(ex, { batch_size = 2, seed = 3 })
    T.raises(function()
      padded:load_state(cb.Batches.new(ex, { batch_size = 2, pack = 24, seed = 3 }):state())
    end, "the checkpoint's batches were packed in rows of 24, these are padded")
  end)

  it('train the same loss as padded batches: the mean over the trained tokens, through a tiny Qwen3', function()
    local ex = examples(12)
    local model = require('models.families.qwen3').build('tiny', { vocab_size = 200, device = 'cpu' })
    model:init_weights({ seed = 5 })
    local function total(batches, packed)
      local sum, n = 0, 0
      for _ = 1, batches:steps_per_epoch() do
        local ids, targets, extra = batches:next()
        local k = accumulate.count_tokens(targets)
        if k > 0 then
          local opts = packed and { positions = extra.positions, segments = extra.segments } or nil
          sum, n = sum + model:loss(ids, targets, opts):item() * k, n + k
        end
      end
      return sum / n, n
    end
    local want, n1 = total(cb.Batches.new(ex, { batch_size = 12, shuffle = false, rank = 0, world = 1 }), false)
    local got, n2 = total(cb.Batches.new(ex, { batch_size = 2, pack = 32, shuffle = false, rank = 0, world = 1 }),
      true)
    assert.equals(n1, n2)
    assert.is_true(math.abs(got - want) <= 1e-6 * math.abs(want), ('packed %.9g, padded %.9g'):format(got, want))
  end)
end)

describe('fsdp.data.packing with targets', function()
  it('takes examples whose targets are already shifted, and refuses one predicting past its end', function()
    local p = packing.new({ { ids = { 5, 6, 7 }, targets = { -100, 7, -100 } } }, { seq_len = 4, batch_size = 1 })
    local b = p:next()
    assert.same({ { -100, 7, -100, -100 } }, b.targets:tolist())
    T.raises(function()
      packing.new({ { ids = { 5, 6 }, targets = { 6, 7 } } }, { seq_len = 4, batch_size = 1 }):next()
    end, 'example 1: its targets predict past its last token')
    T.raises(function()
      packing.new({ { ids = { 5, 6 }, targets = { 6, -100 }, labels = { 5, 6 } } }, { seq_len = 4, batch_size = 1 })
        :next()
    end, 'example 1 gives both labels and targets')
  end)
end)
