-- tests/mpi/collectives.lua: every collective against values computed
-- locally, on any number of ranks (run under mpirun -np 2 and -np 4).
--
-- Each rank fills its inputs with values that depend on its rank, so a
-- result that mixed up ranks, chunks or orders shows as a wrong value.
-- bf16 and f16 reductions are checked to accumulate in f32 (rounded once)
-- with inputs whose sum a 16-bit accumulator would get wrong.
local fsdp = require 'fsdp'
local dist = fsdp.dist
local T = require 'tests.mpi.tap'
local r, W = T.rank, T.world

-- Rounding of a value to a dtype, done by the core's own conversion.
local function round_to(v, dtype)
  return fsdp.tensor({ v }, { dtype = 'f64' }):to(dtype):double():item()
end

T.test('world: backend, rank, size, node of one machine', function()
  T.truthy(dist.transport() == 'mpi', 'transport is ' .. dist.transport())
  T.truthy(W >= 2 and r >= 0 and r < W, 'rank/size')
  T.truthy(dist.launcher_rank() == r, 'launcher rank agrees with MPI')
  -- all ranks on this machine share memory: one node (no override here)
  T.truthy(dist.nodes() == 1 and dist.node() == 0, 'one node')
  T.truthy(dist.local_size() == W and dist.local_rank() == r, 'local rank')
  local g = dist.world()
  T.truthy(g:size() == W and g:rank() == r and g:is_member(), tostring(g))
end)

T.test('all_gather f32 (1-d and 2-d) concatenates in rank order', function()
  local x = fsdp.arange(5):add(100 * r)
  local want = {}
  for k = 0, W - 1 do for i = 0, 4 do want[#want + 1] = 100 * k + i end end
  local out = dist.all_gather(x)
  T.same_shape(out, { 5 * W })
  T.eq(out, want, '1-d')
  local y = fsdp.arange(6):add(100 * r):view(2, 3)
  local out2 = dist.all_gather(y)
  T.same_shape(out2, { 2 * W, 3 })
  want = {}
  for k = 0, W - 1 do for i = 0, 5 do want[#want + 1] = 100 * k + i end end
  T.eq(out2, want, '2-d')
end)

T.test('all_gather moves bf16, f16, f64, i64, bool values bit for bit', function()
  for _, dtype in ipairs { 'bf16', 'f16', 'f64', 'i64', 'bool', 'u8', 'i32' } do
    local x = fsdp.full({ 3 }, (r + 1) % 2, { dtype = dtype })
    if dtype ~= 'bool' then x = fsdp.arange(3, { dtype = dtype }):add(r * 3) end
    local out = dist.all_gather(x)
    T.truthy(out.dtype == dtype, 'dtype ' .. out.dtype)
    local want = {}
    for k = 0, W - 1 do
      for i = 0, 2 do want[#want + 1] = dtype == 'bool' and (k + 1) % 2 or k * 3 + i end
    end
    T.eq(out, want, dtype)
  end
end)

T.test('all_gather in place (input is this rank\'s slot of the output)', function()
  local n = 7
  local out = fsdp.zeros(n * W)
  local slot = out:narrow(0, r * n, n)
  slot:copy_(fsdp.arange(n):add(10 * r))
  dist.all_gather(slot, { out = out })
  local want = {}
  for k = 0, W - 1 do for i = 0, n - 1 do want[#want + 1] = 10 * k + i end end
  T.eq(out, want, 'in place')
end)

-- in[j] = (r + 1) * (j + 1): chunk c of rank k holds (k + 1) * (c*n + i + 1)
local function rs_input(n, dtype)
  return fsdp.arange(1, n * W + 1, { dtype = 'f64' }):mul(r + 1):to(dtype)
end
local S = W * (W + 1) / 2

T.test('reduce_scatter sum, avg, max, min in f32 and f64', function()
  local n = 6
  for _, dtype in ipairs { 'f32', 'f64' } do
    local base = {}
    for i = 0, n - 1 do base[#base + 1] = r * n + i + 1 end
    local function scaled(f)
      local t = {}
      for i, v in ipairs(base) do t[i] = f * v end
      return t
    end
    local out = dist.reduce_scatter(rs_input(n, dtype))
    T.same_shape(out, { n })
    T.eq(out, scaled(S), dtype .. ' sum')
    T.eq(dist.reduce_scatter(rs_input(n, dtype), { op = 'avg' }), scaled(S / W), dtype .. ' avg', 1e-6)
    T.eq(dist.reduce_scatter(rs_input(n, dtype), { op = 'max' }), scaled(W), dtype .. ' max')
    T.eq(dist.reduce_scatter(rs_input(n, dtype), { op = 'min' }), scaled(1), dtype .. ' min')
  end
  -- 2-d input splits along dim 0
  local x = fsdp.ones(2 * W, 3)
  T.same_shape(dist.reduce_scatter(x), { 2, 3 })
  -- integers sum exactly
  local xi = fsdp.full({ W * 2 }, r + 1, { dtype = 'i64' })
  T.eq(dist.reduce_scatter(xi), { S, S }, 'i64 sum')
end)

-- Rank 0 contributes 256 and every other rank 1: a 16-bit running sum
-- stays at 256 (256 + 1 rounds back to 256), an f32 sum is 256 + W - 1
-- rounded once.
local function sixteen_bit_input(dtype, n)
  return fsdp.full({ n }, r == 0 and 256 or 1, { dtype = dtype })
end

T.test('bf16 and f16 reductions accumulate in f32 and round once', function()
  for _, dtype in ipairs { 'bf16', 'f16' } do
    local want = round_to(256 + (W - 1), dtype)
    local t = dist.all_reduce(sixteen_bit_input(dtype, 5))
    T.truthy(t.dtype == dtype, 'dtype kept')
    T.eq(t, { want, want, want, want, want }, dtype .. ' all_reduce sum')
    local out = dist.reduce_scatter(sixteen_bit_input(dtype, 2 * W))
    T.eq(out, { want, want }, dtype .. ' reduce_scatter sum')
    local avg = dist.reduce_scatter(sixteen_bit_input(dtype, 2 * W), { op = 'avg' })
    local want_avg = round_to((256 + W - 1) / W, dtype)
    T.eq(avg, { want_avg, want_avg }, dtype .. ' reduce_scatter avg')
    local mx = dist.all_reduce(sixteen_bit_input(dtype, 3), { op = 'max' })
    T.eq(mx, { 256, 256, 256 }, dtype .. ' max')
  end
end)

T.test('all_reduce sum, avg, max, min over dtypes', function()
  local function filled(dtype) return fsdp.full({ 4 }, r + 1, { dtype = dtype }) end
  for _, dtype in ipairs { 'f32', 'f64', 'bf16' } do
    T.eq(dist.all_reduce(filled(dtype)), { S, S, S, S }, dtype .. ' sum')
    local a = (W + 1) / 2
    T.eq(dist.all_reduce(filled(dtype), { op = 'avg' }), { a, a, a, a }, dtype .. ' avg')
    T.eq(dist.all_reduce(filled(dtype), { op = 'max' }), { W, W, W, W }, dtype .. ' max')
    T.eq(dist.all_reduce(filled(dtype), { op = 'min' }), { 1, 1, 1, 1 }, dtype .. ' min')
  end
  T.eq(dist.all_reduce(filled('i64')), { S, S, S, S }, 'i64 sum')
  T.eq(dist.all_reduce(filled('i32'), { op = 'max' }), { W, W, W, W }, 'i32 max')
  -- bool: max is "any rank", min is "every rank"
  local flag = fsdp.full({ 1 }, r == W - 1 and 1 or 0, { dtype = 'bool' })
  T.eq(dist.all_reduce(flag:clone(), { op = 'max' }), { 1 }, 'bool any')
  T.eq(dist.all_reduce(flag:clone(), { op = 'min' }), { 0 }, 'bool all')
  -- a larger tensor: many transport fragments, OpenMP in the averaging
  local big = fsdp.full({ 2^20 }, r + 1)
  dist.all_reduce(big, { op = 'avg' })
  T.truthy(big:min():item() == (W + 1) / 2 and big:max():item() == (W + 1) / 2, 'big avg')
end)

T.test('broadcast from every root, several dtypes', function()
  for root = 0, W - 1 do
    for _, dtype in ipairs { 'f32', 'bf16', 'i64', 'f64' } do
      local t = fsdp.arange(5, { dtype = dtype }):add(10 * r)
      local got = dist.broadcast(t, root)
      T.truthy(rawequal(got, t), 'returns its argument')
      T.eq(t, { 10 * root, 10 * root + 1, 10 * root + 2, 10 * root + 3, 10 * root + 4 },
        ('%s from %d'):format(dtype, root))
    end
  end
end)

T.test('barrier and monitored barrier when every rank arrives', function()
  dist.barrier()
  dist.monitored_barrier({ timeout = 20 })
  dist.monitored_barrier({ timeout = 20 })
end)

T.test('async: several collectives in flight while computing, then waited', function()
  local n = 2^18
  local x = fsdp.full({ n }, r + 1)
  local g = fsdp.full({ n * W }, r + 1, { dtype = 'bf16' })
  local a = fsdp.full({ n }, r + 1, { dtype = 'f64' })
  local w1 = dist.all_gather(x, { async = true })
  local w2 = dist.reduce_scatter(g, { op = 'avg', async = true })
  local w3 = dist.all_reduce(a, { op = 'sum', async = true })
  T.truthy(tostring(w1):find('all_gather_into', 1, true), tostring(w1))
  -- compute while the data moves
  local m = fsdp.randn({ 256, 256 }, { seed = r })
  for _ = 1, 10 do m = m:matmul(m):div(256) end
  -- wait in another order than started
  T.eq(w3:wait(), fsdp.full({ n }, S, { dtype = 'f64' }), 'all_reduce result')
  local rs = w2:wait()
  T.truthy(rs.dtype == 'bf16' and rs:numel() == n, 'reduce_scatter shape')
  T.truthy(rs:float():min():item() == (W + 1) / 2 and rs:float():max():item() == (W + 1) / 2,
    'reduce_scatter avg')
  while not w1:test() do end
  T.truthy(w1:is_completed(), 'test() saw completion')
  local full = w1:wait()
  for k = 0, W - 1 do
    local part = full:narrow(0, k * n, n)
    T.truthy(part:min():item() == k + 1 and part:max():item() == k + 1, 'slot ' .. k)
  end
end)

T.test('a dropped async collective completes without its handle', function()
  local t = fsdp.full({ 1000 }, r + 1)
  local w = dist.all_reduce(t, { async = true })
  w = nil -- luacheck: ignore (the handle goes to the collector)
  collectgarbage()
  collectgarbage()
  -- later collectives progress it; it must not disturb them
  local after = dist.all_reduce(fsdp.full({ 3 }, 1))
  T.eq(after, { W, W, W }, 'next collective')
  dist.barrier()
end)

T.test('meta tensors: shapes checked, nothing moved', function()
  local x = fsdp.empty({ 4, 3 }, { device = 'meta' })
  local out = dist.all_gather(x)
  T.truthy(out:is_meta(), 'meta output')
  T.same_shape(out, { 4 * W, 3 })
  T.same_shape(dist.reduce_scatter(fsdp.empty({ 2 * W }, { device = 'meta' })), { 2 })
  dist.all_reduce(x)
end)

T.test('misuse is refused on every rank before anything is sent', function()
  local x = fsdp.ones(4)
  T.raises(function() dist.all_gather(x, { out = fsdp.ones(4 * W + 1) }) end,
    'all_gather_into on group world', ('rank %d of %d'):format(r, W), 'expected ' .. W .. ' ranks x 4')
  T.raises(function() dist.all_gather(x, { out = fsdp.ones(4 * W, { dtype = 'f64' }) }) end,
    'dtypes must match')
  T.raises(function() dist.reduce_scatter(fsdp.ones(W, { dtype = 'i64' }), { op = 'avg' }) end,
    'avg needs a float dtype')
  T.raises(function() dist.all_reduce(x, { op = 'prod' }) end, "unknown op 'prod'")
  T.raises(function() dist.broadcast(x, W) end, 'root ' .. W .. ' is not a rank of the group')
  T.raises(function() dist.all_reduce(fsdp.ones(3, 4):t()) end, 'not contiguous')
  T.raises(function() dist.reduce_scatter(x, { out = x:narrow(0, 0, 4 / W) }) end, 'overlap')
  -- and the world still works afterwards
  T.eq(dist.all_reduce(fsdp.ones(2)), { W, W }, 'after errors')
end)

T.done()
