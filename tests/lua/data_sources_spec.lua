-- data_sources_spec.lua: the image and text-pair sources and the synthetic
-- token source share the token datasets' interface (next, batches, state,
-- load_state); raw image files and JSONL pairs are read exactly, broken
-- ones are named, and a tiny T5 learns from byte-tokenized pairs.
local fsdp = require 'fsdp'
local images = require 'fsdp.data.images'
local pairs_data = require 'fsdp.data.pairs'
local synthetic_tokens = require 'fsdp.data.synthetic_tokens'
local t5 = require 'models.t5'
local optim = require 'fsdp.optim'

local tmpdir = require('fsdp.testing').tmpdir

local function write(path, s)
  local f = assert(io.open(path, 'wb'))
  f:write(s)
  f:close()
end

-- The source's next batches after a state round trip equal the original's.
local function check_resume(make)
  local a = make()
  for _ = 1, 3 do a:next() end
  local s = a:state()
  local want = { a:next(), a:next() }
  local b = make()
  b:load_state(s)
  assert.same(want[1]:tolist(), (b:next()):tolist())
  assert.same(want[2]:tolist(), (b:next()):tolist())
end

describe('synthetic token source', function()
  it('splits batches across ranks and resumes', function()
    local one = synthetic_tokens.new(32, { batch_size = 2, seq_len = 6, rank = 0, world_size = 1 })
    local r1 = synthetic_tokens.new(32, { batch_size = 2, seq_len = 6, rank = 1, world_size = 2 })
    one:next()
    assert.same(one:next():tolist(), r1:next():tolist()) -- rank 1's first batch is the chain's batch 1
    check_resume(function() return synthetic_tokens.new(32, { batch_size = 2, seq_len = 6, rank = 0, world_size = 1 }) end)
    local v1, v2 = {}, {}
    for ids in one:batches(2) do v1[#v1 + 1] = ids:tolist() end
    for ids in one:batches(2) do v2[#v2 + 1] = ids:tolist() end
    assert.same(v1, v2)
  end)
end)

describe('image sources', function()
  it('synthetic: shaped batches, distinct per rank, resumable', function()
    local opts = { num_classes = 5, channels = 3, image_size = 8, batch_size = 4, seed = 2, rank = 0, world_size = 1 }
    local src = images.synthetic(opts)
    local x, y = src:next()
    assert.same({ 4, 3, 8, 8 }, x.shape)
    assert.same({ 4 }, y.shape)
    assert.equals('i64', y.dtype)
    check_resume(function() return images.synthetic(opts) end)
  end)

  it('raw uint8 arrays and a labels file: exact pixels, shuffled and split across ranks', function()
    local d = tmpdir()
    -- 10 images of 1x2x2; image i has every pixel = 10 * i, label i % 3
    local bytes, labels = {}, {}
    for i = 0, 9 do
      bytes[#bytes + 1] = string.char(10 * i):rep(4)
      labels[#labels + 1] = tostring(i % 3)
    end
    write(d .. '/train_images.u8', table.concat(bytes))
    write(d .. '/train_labels.txt', table.concat(labels, '\n') .. '\n')
    local function open(rank, world, bs)
      return images.open(d, { channels = 1, image_size = 2, batch_size = bs, seed = 4, num_classes = 3,
                              rank = rank, world_size = world, mean = 0, std = 1 })
    end
    local ds = open(0, 1, 4)
    assert.equals(10, ds.n)
    local x, y = ds:next()
    for b = 0, 3 do
      local i = math.floor(x:get(b, 0, 0, 0) * 255 / 10 + 0.5)
      assert.near(10 * i / 255, x:get(b, 0, 1, 1), 1e-6)
      assert.equals(i % 3, y:get(b))
    end
    -- two ranks of 2 read the batch of one rank of 4
    local whole, a, b = open(0, 1, 4), open(0, 2, 2), open(1, 2, 2)
    for _ = 1, 5 do
      local wy = select(2, whole:next()):tolist()
      local ay, by = select(2, a:next()):tolist(), select(2, b:next()):tolist()
      assert.same(wy, { ay[1], ay[2], by[1], by[2] })
    end
    check_resume(function() return open(0, 1, 3) end)
  end)

  it('name broken raw files', function()
    local d = tmpdir()
    assert.error_matches(function() images.open(d, { channels = 1, image_size = 2, batch_size = 1 }) end,
      'fsdp.data.images: .*train_images.u8: cannot open')
    write(d .. '/train_images.u8', ('x'):rep(10))
    assert.error_matches(function() images.open(d, { channels = 1, image_size = 2, batch_size = 1 }) end,
      'train_images.u8: 10 bytes is not a whole number of 1x2x2 images %(4 bytes each%)')
    write(d .. '/train_images.u8', ('x'):rep(8))
    write(d .. '/train_labels.txt', '1\n')
    assert.error_matches(function() images.open(d, { channels = 1, image_size = 2, batch_size = 1 }) end,
      'train_labels.txt has 1 labels for the 2 images')
    write(d .. '/train_labels.txt', '1\n7\n')
    assert.error_matches(function()
      images.open(d, { channels = 1, image_size = 2, batch_size = 1, num_classes = 5 })
    end, 'train_labels.txt:2: "7" is not a class id in %[0, 5%)')
  end)
end)

describe('text pairs for T5', function()
  local d = tmpdir()
  local path = d .. '/pairs.jsonl'
  local lines = {}
  local words = { 'red', 'green', 'blue', 'cat', 'dog', 'sun' }
  for i = 1, 40 do
    local w = words[(i - 1) % #words + 1]
    -- the task: copy the word, upper-cased
    lines[i] = ('{"src": "say %s", "tgt": "%s"}'):format(w, w:upper())
  end
  write(path, table.concat(lines, '\n') .. '\n')

  it('tokenize, truncate, end with EOS and pad (labels with -100)', function()
    local ds = pairs_data.open(path, { source_field = 'src', target_field = 'tgt', source_len = 6, target_len = 5,
      batch_size = 2, shuffle = false, rank = 0, world_size = 1 })
    assert.equals(40, ds.n)
    local src, lab = ds:next()
    -- "say red" truncated to 5 bytes + EOS; "RED" + EOS + -100 padding
    assert.same({ 115, 97, 121, 32, 114, 256 }, src:tolist()[1])
    assert.same({ 82, 69, 68, 256, -100 }, lab:tolist()[1])
    -- every source ("say " + a word) is cut; of the targets only GREEN (5 bytes, 7 times in 40)
    assert.same({ source = 40, target = 7 }, ds.truncated)
    -- the source mask covers the bytes and EOS, from the lengths
    local wide = pairs_data.open(path, { source_field = 'src', target_field = 'tgt', source_len = 10, target_len = 6,
      batch_size = 2, shuffle = false, rank = 0, world_size = 1 })
    local wsrc, _, wmask = wide:next()
    assert.same({ 115, 97, 121, 32, 114, 101, 100, 256, 0, 0 }, wsrc:tolist()[1])
    assert.same({ 1, 1, 1, 1, 1, 1, 1, 1, 0, 0 }, wmask:tolist()[1])
    assert.same({ source = 0, target = 0 }, wide.truncated)
    local val = pairs_data.open(path, { source_field = 'src', target_field = 'tgt', source_len = 6, target_len = 5,
      batch_size = 2, split = 'val', val_fraction = 0.25, rank = 0, world_size = 1 })
    assert.equals(10, val.n)
    check_resume(function()
      return pairs_data.open(path, { source_field = 'src', target_field = 'tgt', source_len = 6, target_len = 5,
        batch_size = 3, rank = 0, world_size = 1 })
    end)
  end)

  it('name a missing field', function()
    assert.error_matches(function()
      pairs_data.open(path, { source_len = 4, target_len = 4, batch_size = 1, rank = 0, world_size = 1 })
    end, 'pairs.jsonl:1: needs string fields "source" and "target"')
  end)

  it('train a tiny T5 whose loss falls', function()
    local ds = pairs_data.open(path, { source_field = 'src', target_field = 'tgt', source_len = 10, target_len = 6,
      batch_size = 8, seed = 1, rank = 0, world_size = 1 })
    local model = t5.build(t5.config('tiny', { vocab_size = ds.vocab_size }))
    model:init_weights({ seed = 0 })
    local opt = optim.AdamW(model:named_parameters(), { lr = 1e-2, weight_decay = 0 })
    local first, last
    for step = 1, 40 do
      local src, lab = ds:next()
      local loss = model:loss(src, lab)
      loss:backward()
      opt:step()
      opt:zero_grad()
      if step == 1 then first = loss:item() end
      last = loss:item()
    end
    assert.is_true(last < 0.5 * first, ('loss %.3f -> %.3f'):format(first, last))
  end)
end)
