-- packing_spec.lua: fsdp.data.packing (several examples per training
-- sequence) and packed batches through the decoder models: the packer's
-- batches (ids, targets shifted within each example, positions restarting
-- per example, segments, padding), its strategies (ffd, greedy, pad) and
-- overflow rules; then a tiny Llama and a tiny Qwen3: each example's loss
-- (the sum of its token losses) packed equals the example run alone, and
-- the gradients of a packed batch equal the sum over the examples alone.
local fsdp = require 'fsdp'
local F = fsdp.F
local packing = require 'fsdp.data.packing'

-- Examples of the given lengths: ids k*100 + t (so each token says where it
-- came from), labels -100 on the first `prompt` tokens.
local function examples(lengths, prompt)
  local out = {}
  for k, n in ipairs(lengths) do
    local ids, labels = {}, {}
    for t = 1, n do
      ids[t] = (k * 100 + t) % 256
      labels[t] = t <= (prompt or 0) and -100 or ids[t]
    end
    out[k] = { ids = ids, labels = labels }
  end
  return out
end

local function row(t, r) return t:select(0, r):tolist() end

describe('fsdp.data.packing', function()
  it('packs first-fit decreasing: positions restart, segments number the examples, targets stay inside', function()
    local ex = examples({ 5, 3, 6, 2 }, 1)
    local p = packing.new(ex, { seq_len = 8, batch_size = 2 })
    local b = p:next()
    -- longest first: 6 -> row 0, 5 -> row 1, 3 -> row 1 (5 + 3 = 8), 2 -> row 0
    assert.same({ 0, 0, 0, 0, 0, 0, 1, 1 }, row(b.segments, 0))
    assert.same({ 0, 1, 2, 3, 4, 5, 0, 1 }, row(b.positions, 0))
    assert.same({ 0, 0, 0, 0, 0, 1, 1, 1 }, row(b.segments, 1))
    assert.same({ 0, 1, 2, 3, 4, 0, 1, 2 }, row(b.positions, 1))
    -- row 0: example 3 (ids 301..306, label of its first token -100), then example 4
    assert.same({ 45, 46, 47, 48, 49, 50, 145, 146 }, row(b.ids, 0))
    assert.same({ 46, 47, 48, 49, 50, -100, 146, -100 }, row(b.targets, 0))
    -- example 1 (prompt 1: its label at t = 1 is -100, the target of token 0)
    assert.same({ 102, 103, 104, 105, -100 }, { unpack(row(b.targets, 1), 1, 5) })
    assert.equals(4, b.n_examples)
    assert.equals(16, b.tokens)
    assert.equals(1, b.fraction)
    assert.is_nil(p:next())
    local s = p:stats()
    assert.equals(4, s.examples)
    assert.equals(1, s.batches)
    assert.equals(1, s.fraction)
  end)

  it('greedy keeps the order; pad puts one example per row; the rest waits for the next batch', function()
    local g = packing.new(examples({ 5, 3, 6, 2 }), { seq_len = 8, batch_size = 2, strategy = 'greedy' })
    local b = g:next()
    assert.same({ 0, 0, 0, 0, 0, 1, 1, 1 }, row(b.segments, 0))
    assert.same({ 0, 0, 0, 0, 0, 0, 1, 1 }, row(b.segments, 1))
    assert.is_nil(g:next())
    local pad = packing.new(examples({ 5, 3, 6 }), { seq_len = 8, batch_size = 2, strategy = 'pad', pad_id = 7 })
    local b1, b2 = pad:next(), pad:next()
    assert.same({ 0, 0, 0, 0, 0, -1, -1, -1 }, row(b1.segments, 0))
    assert.same({ 0, 0, 0, -1, -1, -1, -1, -1 }, row(b1.segments, 1))
    assert.same({ 7, 7, 7 }, { unpack(row(b1.ids, 0), 6, 8) })
    assert.same({ -100, -100, -100, -100 }, { unpack(row(b1.targets, 0), 5, 8) })
    -- the last batch: one example, a row of padding
    assert.same({ -1, -1, -1, -1, -1, -1, -1, -1 }, row(b2.segments, 1))
    assert.equals(6 / 16, b2.fraction)
    assert.is_nil(pad:next())
    assert.equals(14 / 32, pad:stats().fraction)
  end)

  it('truncates, splits or refuses an example longer than seq_len; reads a function source', function()
    local long = examples({ 11 })
    local t = packing.new(long, { seq_len = 4, batch_size = 1 })
    local b = t:next()
    assert.same({ 102, 103, 104, 105 }, row(b.targets, 0)) -- the last keeps its next token's label
    assert.is_nil(t:next())
    assert.equals(1, t:stats().truncated)
    assert.equals(7, t:stats().dropped_tokens)
    local i = 0
    local s = packing.new(function() i = i + 1; return long[i] end,
      { seq_len = 4, batch_size = 2, overflow = 'split', strategy = 'greedy' })
    local b1, b2 = s:next(), s:next()
    assert.same({ 0, 1, 2, 3 }, row(b1.positions, 1))
    assert.same({ 105, 106, 107, 108 }, row(b1.ids, 1))
    assert.same({ 109, 110, 111, 0 }, row(b2.ids, 0))
    assert.same({ 110, 111, -100, -100 }, row(b2.targets, 0))
    assert.is_nil(s:next())
    assert.equals(3, s:stats().pieces)
    local ok, e = pcall(function() packing.new(long, { seq_len = 4, batch_size = 1, overflow = 'error' }):next() end)
    assert.is_false(ok)
    assert.truthy(tostring(e):find('fsdp.data.packing: example 1 has 11 tokens, more than seq_len 4', 1, true))
  end)

  it('refuses bad options and examples in one line', function()
    local function err(f)
      local ok, e = pcall(f)
      assert.is_false(ok)
      return tostring(e)
    end
    assert.truthy(err(function() packing.new({}, { batch_size = 2 }) end):find('seq_len must be a positive integer'))
    assert.truthy(err(function() packing.new({}, { seq_len = 4, batch_size = 2, strategy = 'best' }) end)
      :find("strategy must be 'ffd', 'greedy' or 'pad'"))
    assert.truthy(err(function() packing.new({ { ids = {} } }, { seq_len = 4, batch_size = 2 }):next() end)
      :find('example 1: ids is empty', 1, true))
    local mismatch = { { ids = { 1, 2 }, labels = { 1 } } }
    assert.truthy(err(function() packing.new(mismatch, { seq_len = 4, batch_size = 2 }):next() end)
      :find('example 1: 1 labels for 2 ids', 1, true))
  end)
end)

-- Per-example losses and gradients, packed and alone, for a family.
local function model_check(family, name, overrides)
  local m = require('models.families.' .. family).build('tiny', overrides)
  m:init_weights({ seed = 3 })
  local lengths = { 17, 1, 40, 9, 64, 30, 2, 25 }
  local ex = examples(lengths, 3)
  local T = 96
  local p = packing.new(ex, { seq_len = T, batch_size = 2 })
  local b = p:next()
  assert.is_nil(p:next())
  -- packed: per-token losses, summed per (row, segment)
  local logits = m(b.ids, { positions = b.positions, segments = b.segments })
  local tok = F.cross_entropy(logits:view(-1, 256), b.targets:view(-1), { reduction = 'none' }):view(2, T)
  local seg = b.segments:tolist()
  local sums = tok:tolist()
  local packed = {}
  for r = 1, 2 do
    local start = 1
    for t = 1, T + 1 do
      if t == T + 1 or seg[r][t] ~= seg[r][start] then
        if seg[r][start] >= 0 then
          local s, ids = 0, {}
          for u = start, t - 1 do s = s + sums[r][u]; ids[#ids + 1] = b.ids:select(0, r - 1):tolist()[u] end
          packed[#packed + 1] = { len = t - start, loss = s, first = ids[1] }
        end
        start = t
      end
    end
  end
  assert.equals(#lengths, #packed)
  -- alone: each example its own batch of one
  local alone = {}
  for k, e in ipairs(ex) do
    local n = #e.ids
    local ids = fsdp.tensor({ e.ids }, { dtype = 'i64' })
    local tg = {}
    for t = 1, n do tg[t] = t < n and e.labels[t + 1] or -100 end
    local l = F.cross_entropy(m(ids):view(-1, 256), fsdp.tensor(tg, { dtype = 'i64' }), { reduction = 'sum' })
    alone[e.ids[1] .. '/' .. n] = l:item()
  end
  local worst = 0
  for _, d in ipairs(packed) do
    local want = alone[d.first .. '/' .. d.len]
    assert(want, 'a packed document matches no example')
    worst = math.max(worst, math.abs(d.loss - want) / math.max(1, math.abs(want)))
  end
  assert(worst < 2e-5, ('%s: per-example losses packed and alone differ by %g (relative)'):format(name, worst))

  -- gradients: the packed batch's summed loss against the sum over the examples
  local params = m:parameters()
  m:zero_grad()
  local lp = F.cross_entropy(m(b.ids, { positions = b.positions, segments = b.segments }):view(-1, 256),
    b.targets:view(-1), { reduction = 'sum' })
  lp:backward()
  local gp = {}
  for i, q in ipairs(params) do gp[i] = q.grad:clone() end
  m:zero_grad()
  for _, e in ipairs(ex) do
    local n = #e.ids
    local tg = {}
    for t = 1, n do tg[t] = t < n and e.labels[t + 1] or -100 end
    local l = m:loss(fsdp.tensor({ e.ids }, { dtype = 'i64' }), fsdp.tensor({ tg }, { dtype = 'i64' }))
    -- (mean over its trained tokens) times their count: the example's sum
    local count = 0
    for t = 1, n do if tg[t] ~= -100 then count = count + 1 end end
    if count > 0 then (l * count):backward() end
  end
  local gerr = 0
  for i, q in ipairs(params) do
    local d = (gp[i] - q.grad):abs():max():item() / math.max(q.grad:abs():max():item(), 1e-3)
    gerr = math.max(gerr, d)
  end
  assert(gerr < 1e-4, ('%s: gradients packed and summed over the examples differ by %g (relative)'):format(name, gerr))
  return worst, gerr
end

describe('packed batches through the decoder models', function()
  it('tiny Llama: per-example losses and gradients packed equal alone', function()
    model_check('llama', 'llama')
  end)
  it('tiny Qwen3: per-example losses and gradients packed equal alone', function()
    model_check('qwen3', 'qwen3')
  end)
  it('tiny Mistral with a sliding window of 8: the same', function()
    model_check('mistral', 'mistral', { sliding_window = 8 })
  end)
end)
