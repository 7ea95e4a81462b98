-- ckpt_logical_spec.lua: the piece arithmetic of checkpoints across meshes
-- (fsdp.checkpointing.logical, [Note: logical tensors in sharded
-- checkpoints]) in one process: a logical tensor is cut into the slices a
-- TP split saves (dim 0, dim 1, none) and each slice into flat FSDP
-- ranges that start and end mid-row; every range of every other split is
-- assembled from them and compared with the slice cut directly
-- (fsdp.tp.shard_init.slice). Also: what a plan reads (only the saved
-- slices holding the wanted columns, only the rows touched), the errors
-- for a missing or doubled slice, and the index entries of a TP model's
-- parts (parts.describe, parts.saved_params).
local fsdp = require 'fsdp'
local logical = require 'fsdp.checkpointing.logical'
local shard_init = require 'fsdp.tp.shard_init'
local parts = require 'fsdp.checkpointing.parts'

-- A logical tensor of distinct values: element i is i + 1.
local function logical_tensor(shape)
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  return fsdp.arange(1, n + 1, { dtype = 'f32' }):view(shape)
end

-- The flat array of `full` as `layout` holds it.
local function array_of(full, layout)
  if not layout.tp or layout.tp.size == 1 then return full:reshape(-1):contiguous() end
  return shard_init.slice(full, layout.tp):reshape(-1)
end

local function layouts(shape, splits)
  local out = {}
  for _, sp in ipairs(splits) do
    local group = {}
    if sp == 'whole' then
      group[1] = { shape = shape }
    else
      for r = 0, sp.size - 1 do
        group[#group + 1] = { shape = shape, tp = { dim = sp.dim, size = sp.size, rank = r } }
      end
    end
    out[#out + 1] = group
  end
  return out
end

local function max_diff(a, b) return (a - b):abs():max():item() end

-- Assemble ranges of `want` from the saved `group` of layouts, each saved
-- array read through flat FSDP-like pieces of `piece` elements (so reads
-- cross piece boundaries mid-row); returns the worst difference and the
-- elements read.
local function check(full, group, want, ranges, piece)
  local arrays = {}
  for i, l in ipairs(group) do arrays[i] = array_of(full, l) end
  local expect = array_of(full, want)
  local worst, read_elems = 0, 0
  for _, r in ipairs(ranges) do
    local first, n = r[1], r[2]
    local dst = fsdp.zeros({ n }, { dtype = 'f32' })
    logical.assemble(want, first, dst, group, function(i, a, m, into)
      read_elems = read_elems + m
      -- copied piece by piece, as copy_range does from FSDP shards
      local done = 0
      while done < m do
        local at = a + done
        local len = math.min(m - done, piece - at % piece)
        into:narrow(0, done, len):copy_(arrays[i]:narrow(0, at, len))
        done = done + len
      end
    end, 'spec')
    worst = math.max(worst, max_diff(dst, expect:narrow(0, first, n)))
  end
  return worst, read_elems
end

describe('checkpoint pieces across TP splits', function()
  local shape = { 8, 12 }
  local full = logical_tensor(shape)
  local splits = { 'whole', { dim = 0, size = 2 }, { dim = 0, size = 4 }, { dim = 1, size = 2 },
                   { dim = 1, size = 4 } }

  it('assembles every range of every split from every other split, mid-row FSDP ranges included', function()
    local saved_groups = layouts(shape, splits)
    local n_checked = 0
    for _, wanted in ipairs(layouts(shape, splits)) do
      for _, want in ipairs(wanted) do
        local n = logical.numel(want)
        -- the whole array, halves, and ranges starting and ending mid-row
        local h = math.floor(n / 2)
        local ranges = { { 0, n }, { 0, h }, { h, n - h }, { 5, 7 }, { 1, n - 2 }, { n - 1, 1 } }
        for _, group in ipairs(saved_groups) do
          for _, piece in ipairs({ 5, 7, 1000 }) do
            local worst = check(full, group, want, ranges, piece)
            assert.are.equal(0, worst)
            n_checked = n_checked + 1
          end
        end
      end
    end
    assert.are.equal(13 * 5 * 3, n_checked) -- 13 wanted layouts x 5 saved splits x 3 piece sizes
  end)

  it('assembles 1-d (bias) and 3-d dim-0 splits', function()
    for _, sh in ipairs({ { 12 }, { 4, 3, 2 } }) do
      local f = logical_tensor(sh)
      local groups = layouts(sh, { 'whole', { dim = 0, size = 2 }, { dim = 0, size = 4 } })
      for _, wanted in ipairs(groups) do
        for _, want in ipairs(wanted) do
          local n = logical.numel(want)
          for _, group in ipairs(groups) do
            assert.are.equal(0, (check(f, group, want, { { 0, n }, { 1, n - 1 } }, 5)))
          end
        end
      end
    end
  end)

  it('reads only the saved slices holding the wanted columns, over the rows touched', function()
    local saved = layouts(shape, { { dim = 1, size = 2 } })[1]
    -- rank 1 of a dim-1 split over 4: columns 3..5, all in saved rank 0's 0..5
    local want = { shape = shape, tp = { dim = 1, size = 4, rank = 1 } }
    local p = logical.plan(want, 0, 24, saved)
    assert.are.equal(1, #p.reads)
    assert.are.equal(1, p.reads[1].src)
    assert.are.equal(3, p.reads[1].take_col)
    -- a mid-row range of 4 elements of a dim-0 slice touches 2 rows of
    -- the dim-1 slices: 2 rows x 6 columns read from each
    local want0 = { shape = shape, tp = { dim = 0, size = 2, rank = 1 } }
    local q = logical.plan(want0, 10, 4, saved)
    assert.are.equal(2, q.rows)
    assert.are.equal(2, #q.reads)
    assert.are.equal(12, q.reads[1].n)
    assert.are.equal(4 * 6 + 0, q.reads[1].first) -- global rows 4..5 of saved rank 0
    assert.are.equal(10, q.skip)
    local _, read = check(full, saved, want0, { { 10, 4 } }, 1000)
    assert.are.equal(24, read)
  end)

  it('reads the same layout in one piece', function()
    local saved = layouts(shape, { { dim = 0, size = 2 } })[1]
    local want = { shape = shape, tp = { dim = 0, size = 2, rank = 1 } }
    assert.is_true(logical.same_layout(saved[2], want))
    assert.is_false(logical.same_layout(saved[1], want))
    local p = logical.plan(want, 3, 30, saved)
    assert.are.equal(1, #p.reads)
    assert.are.equal(2, p.reads[1].src)
  end)

  it('fails in one line on a missing or doubled slice', function()
    local saved = layouts(shape, { { dim = 1, size = 2 } })[1]
    local want = { shape = shape }
    local ok, err = pcall(logical.plan, want, 0, 96, { saved[1] }, 'parameter w')
    assert.is_false(ok)
    assert.matches('parameter w: the saved slices cover 48 of the 96 elements wanted', err, 1, true)
    ok, err = pcall(logical.plan, want, 0, 96, { saved[1], saved[2], saved[2] }, 'parameter w')
    assert.is_false(ok)
    assert.matches('cover 144 of the 96', err, 1, true)
  end)

  it('refuses a dim-1 split of a 3-d tensor', function()
    local ok, err = pcall(logical.box, { shape = { 2, 4, 2 }, tp = { dim = 1, size = 2, rank = 0 } })
    assert.is_false(ok)
    assert.matches('dim 1 of a 3%-d tensor', err)
  end)

  it('describes a TP rank\'s part against the logical tensors, and finds every slice of a saved index', function()
    -- rank 1's unit of a tp 2 model: a colwise weight [4, 8] of logical [8, 8], a replicated norm
    local part = { key = 'unit:layers.0@tp1', kind = 'unit', dtype = 'f32', numel = 40, padded_numel = 40,
                   params = { { name = 'w', shape = { 4, 8 }, offset = 0,
                                tp = { dim = 0, size = 2, rank = 1, global_shape = { 8, 8 } } },
                              { name = 'norm', shape = { 8 }, offset = 32 } } }
    local index = { path = 'spec', parts = {} }
    for t = 0, 1 do index.parts[t + 1] = parts.describe(part, t) end
    assert.are.equal('unit:layers.0@tp0', index.parts[1].key)
    assert.are.same({ 8, 8 }, { index.parts[1].params[1].shape[1], index.parts[1].params[1].shape[2] })
    assert.are.same({ dim = 0, size = 2, rank = 0 }, index.parts[1].params[1].tp)
    assert.is_nil(index.parts[2].params[2].tp)
    local saved = parts.saved_params(index)
    assert.are.equal(2, #saved.w.sources)
    assert.are.equal(1, saved.w.sources[2].layout.tp.rank)
    assert.are.equal(1, #saved.norm.sources) -- a replicated parameter: one copy serves
    -- TP rank 1's part missing: one line naming the parameter and the rank
    index.parts[2] = nil
    local ok, err = pcall(parts.saved_params, index)
    assert.is_false(ok)
    assert.matches('parameter w is split over 2 TP ranks, but 1 slices are listed', err, 1, true)
    index.parts[2] = parts.describe(part, 0)
    ok, err = pcall(parts.saved_params, index)
    assert.is_false(ok)
    assert.matches("TP rank 0's slice is listed 2 times", err, 1, true)
  end)
end)
