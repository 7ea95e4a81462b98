-- cpu_rows_spec.lua: the CPU's hand-written row loops (core/cpu/cpu_rows_gen.h:
-- max, exp-sum and exp-affine on f32 rows and on bf16 rows) at the level in
-- force, 16 lanes from avx512 and 8 at avx2 (the isa suite, tests/isa/run.sh,
-- runs this spec at every level below the machine's): softmax, log_softmax
-- and cross-entropy (forward and the logits' gradient) on dense rows of
-- every length around the vector widths, against the same ops in f64 on the
-- same values. Rows shorter than a vector, whole vectors and ragged tails
-- all reach the loops; the references never do (f64 runs the C loops).
local fsdp = require 'fsdp'
local F = require 'fsdp.functional.fused'

local level = fsdp.cpu_isa().level
local LENGTHS = { 1, 3, 7, 8, 9, 15, 16, 17, 24, 31, 33, 100, 1000 }

local function flat(t) return t:contiguous():view(-1):tolist() end

local function worst(a, b)
  assert.equals(#a, #b)
  local w = 0
  for i = 1, #a do
    local d = math.abs(a[i] - b[i])
    if d ~= d then return math.huge end
    if d > w then w = d end
  end
  return w
end

local function assert_close(expected, got, tol, what)
  local w = worst(flat(expected), flat(got))
  assert(w <= tol, ('%s at %s: max difference %g exceeds %g'):format(what, level, w, tol))
end

-- Targets for rows of n classes, one per row, spread over the row (the
-- exp-affine loops subtract at the target's lane, head, middle or tail).
local function targets(rows, n)
  local t = {}
  for r = 1, rows do t[r] = (r * 5 + 3) % n end
  return fsdp.tensor(t, { dtype = 'i64' })
end

describe('row loops at the level in force (' .. level .. ')', function()
  for _, n in ipairs(LENGTHS) do
    it('f32 softmax, log_softmax and cross-entropy over rows of ' .. n .. ' against f64', function()
      local rows = 6
      local x = fsdp.randn({ rows, n }, { seed = n }) * 4
      local x64 = x:to('f64')
      assert_close(F.softmax(x64, -1), F.softmax(x, -1), 1e-6, 'softmax')
      assert_close(F.log_softmax(x64, -1), F.log_softmax(x, -1), 4e-6, 'log_softmax')
      local tg = targets(rows, n)
      local xg, xg64 = x:detach():requires_grad_(), x64:detach():requires_grad_()
      local loss, loss64 = F.cross_entropy(xg, tg), F.cross_entropy(xg64, tg)
      assert(math.abs(loss:item() - loss64:item()) <= 4e-6 * math.max(1, math.abs(loss64:item())),
             ('cross-entropy at %s: %g vs %g'):format(level, loss:item(), loss64:item()))
      loss:backward()
      loss64:backward()
      assert_close(xg64.grad, xg.grad, 1e-7, 'cross-entropy gradient')
    end)

    it('bf16 cross-entropy over dense rows of ' .. n .. ' against f64 on the same values', function()
      local rows = 6
      local xb = (fsdp.randn({ rows, n }, { seed = 100 + n }) * 4):to('bf16')
      local x64 = xb:to('f64')
      local tg = targets(rows, n)
      local xg, xg64 = xb:detach():requires_grad_(), x64:detach():requires_grad_()
      local loss, loss64 = F.cross_entropy(xg, tg), F.cross_entropy(xg64, tg)
      -- the loss is an f32 computation on the exact values, rounded to bf16 once
      local want = loss64:item()
      assert(math.abs(loss:item() - want) <= 2 ^ -8 * math.abs(want) + 1e-6,
             ('bf16 cross-entropy at %s: %g vs %g'):format(level, loss:item(), want))
      loss:backward()
      loss64:backward()
      -- each gradient element f32 arithmetic, then one bf16 rounding
      local g, g64 = flat(xg.grad:to('f64')), flat(xg64.grad)
      for i = 1, #g do
        assert(math.abs(g[i] - g64[i]) <= 2 ^ -8 * math.abs(g64[i]) + 1e-7,
               ('bf16 cross-entropy gradient %d at %s: %g vs %g'):format(i, level, g[i], g64[i]))
      end
    end)
  end

  it('large and non-finite logits: exp clamps as the C loops do', function()
    local v = { 100, -100, 0, -math.huge, 87, -87.5, 3, 1 }
    local x = fsdp.tensor({ v, v }, { dtype = 'f32' })
    assert_close(F.softmax(x:to('f64'), -1), F.softmax(x, -1), 1e-6, 'softmax of extremes')
    local n = fsdp.tensor({ { 1, 0 / 0, 2, 3, 4, 5, 6, 7, 8 } }, { dtype = 'f32' })
    local s = flat(F.softmax(n, -1))
    for i = 1, #s do assert(s[i] ~= s[i], 'a nan in the row makes every softmax value nan') end
  end)
end)
