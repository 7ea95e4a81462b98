-- tests/mpi/ring.lua: the MPI plugin's ring collectives ([Note: ring
-- collectives], core/comm/mpi/ring.c) against values computed locally, on
-- any number of ranks. tests/mpi/run.sh runs it on 2, 3 and 4 ranks, with
-- the rings taking every buffer (FSDP_RING_MIN_BYTES=0) and with the
-- default threshold.
--
-- Inputs depend on the rank and the position, and are integers small
-- enough to be exact in every dtype, so a block sent to the wrong rank,
-- a step's sum added twice or a block's edge off by one shows as a wrong
-- value whatever the order of the sums.
local fsdp = require 'fsdp'
local dist = fsdp.dist
local T = require 'tests.mpi.tap'
local r, W = T.rank, T.world

-- What rank k holds at position i: (i mod 97) + 3k, small integers.
local bases = {}
local function base(n)
  if not bases[n] then
    local v = {}
    for i = 1, n do v[i] = (i - 1) % 97 end
    bases[n] = fsdp.tensor(v, { dtype = 'f64' })
  end
  return bases[n]
end
local function input(n, dtype, k) return base(n):add(3 * k):to(dtype) end

-- The reduction over the ranks ks (default all) of input(n, dtype, k).
local function expected(n, dtype, op, ks)
  if not ks then
    ks = {}
    for k = 0, W - 1 do ks[#ks + 1] = k end
  end
  local sum, hi, lo = 0, -math.huge, math.huge
  for _, k in ipairs(ks) do sum, hi, lo = sum + 3 * k, math.max(hi, 3 * k), math.min(lo, 3 * k) end
  local b = base(n)
  if op == 'sum' then return b:mul(#ks):add(sum):to(dtype) end
  return b:add(op == 'max' and hi or lo):to(dtype)
end

local function same(got, want, what)
  local diff = got:double():sub(want:double()):abs():max():item()
  T.truthy(diff == 0, ('%s: max difference %g'):format(what, diff))
end

-- Sizes around the block edges: not a multiple of W, one block each,
-- a few hundred KiB (several ring steps of real size).
local SIZES = { W, W + 1, 2 * W - 1, 1000 * W + 3, 100003 }

T.test('all_reduce sum/max/min of every dtype and awkward sizes', function()
  for _, dtype in ipairs { 'f32', 'f64', 'i64', 'i32', 'i16' } do
    for _, n in ipairs(SIZES) do
      for _, op in ipairs { 'sum', 'max', 'min' } do
        local t = input(n, dtype, r)
        dist.all_reduce(t, { op = op })
        same(t, expected(n, dtype, op), ('%s %s n=%d'):format(dtype, op, n))
      end
    end
  end
end)

T.test('all_reduce avg and 16-bit reductions (staged in f32 by the core)', function()
  for _, dtype in ipairs { 'bf16', 'f16', 'f32' } do
    local n = 40001
    local t = input(n, dtype, r)
    dist.all_reduce(t, { op = 'avg' })
    same(t, expected(n, 'f64', 'sum'):div(W):to(dtype), dtype .. ' avg')
  end
end)

T.test('reduce_scatter gives rank r block r, summed', function()
  for _, dtype in ipairs { 'f32', 'f64', 'i64' } do
    for _, n in ipairs { 1, 7, 50001 } do
      local full = input(n * W, dtype, r)
      local out = dist.reduce_scatter(full)
      same(out, expected(n * W, dtype, 'sum'):narrow(0, r * n, n), ('%s n=%d'):format(dtype, n))
      -- the input is left as it was
      same(full, input(n * W, dtype, r), dtype .. ' input untouched')
    end
  end
end)

T.test('all_gather out of place and in place', function()
  for _, n in ipairs { 1, 5, 65537 } do
    local mine = input(n, 'f32', r)
    local out = dist.all_gather(mine)
    for k = 0, W - 1 do same(out:narrow(0, k * n, n), input(n, 'f32', k), ('n=%d slot %d'):format(n, k)) end
    local buf = fsdp.zeros(n * W)
    buf:narrow(0, r * n, n):copy_(mine)
    dist.all_gather(buf:narrow(0, r * n, n), { out = buf })
    for k = 0, W - 1 do same(buf:narrow(0, k * n, n), input(n, 'f32', k), ('in place n=%d slot %d'):format(n, k)) end
  end
end)

T.test('every rank ends an all_reduce with the same bits', function()
  local n = 100003
  local t = fsdp.randn({ n }, { seed = 100 + r })
  dist.all_reduce(t)
  local all = dist.all_gather(t)
  for k = 1, W - 1 do
    same(all:narrow(0, k * n, n), all:narrow(0, 0, n), 'rank ' .. k .. ' against rank 0')
  end
end)

T.test('several rings in flight on one group, waited in another order', function()
  local n = 30011
  local works, wants = {}, {}
  for i = 1, 6 do
    local t = input(n, 'f32', r + i)
    works[i] = dist.all_reduce(t, { async = true })
    local ks = {}
    for k = 0, W - 1 do ks[#ks + 1] = k + i end
    wants[i] = expected(n, 'f64', 'sum', ks)
  end
  local rs = dist.reduce_scatter(input(n * W, 'f32', r), { async = true })
  local ag = dist.all_gather(input(n, 'f32', r), { async = true })
  for i = 6, 1, -1 do same(works[i]:wait(), wants[i], 'all_reduce ' .. i) end
  local gathered = ag:wait()
  for k = 0, W - 1 do same(gathered:narrow(0, k * n, n), input(n, 'f32', k), 'all_gather slot ' .. k) end
  same(rs:wait(), expected(n * W, 'f32', 'sum'):narrow(0, r * n, n), 'reduce_scatter')
end)

T.test('groups: a ring over a subset of the ranks, and the others meanwhile', function()
  if W < 3 then return end
  local odd = {}
  for k = 1, W - 1, 2 do odd[#odd + 1] = k end
  local g = dist.new_group(odd)
  local n = 20011
  if r % 2 == 1 then
    local t = input(n, 'i64', r)
    dist.all_reduce(t, { group = g })
    same(t, expected(n, 'f64', 'sum', odd), 'odd ranks')
  end
  local t = input(n, 'f32', r)
  dist.all_reduce(t)
  same(t, expected(n, 'f32', 'sum'), 'world after the group')
end)

T.done()
