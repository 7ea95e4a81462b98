-- tests/mpi/tap.lua: the small harness of the multi-rank test scripts.
--
--   local T = require 'tests.mpi.tap'
--   T.test('all_gather f32', function() T.eq(got, want, 'values') end)
--   T.done()
--
-- Every rank runs each test; the verdict is agreed with an all_reduce of
-- failure flags, and rank 0 prints one TAP line ("ok - name" / "not ok -
-- name (failed on ranks 1, 3)"). A failing rank prints its own message as a
-- TAP comment ("# [rank 1] ..."), so the log says what went wrong where.
-- tests/mpi/run.sh numbers the lines and adds the rank count.
local fsdp = require 'fsdp'
local dist = fsdp.dist
local ffi = require 'ffi'

ffi.cdef 'int usleep(unsigned int usec);'

local T = {}
T.rank, T.world = dist.rank(), dist.world_size()
local failures = 0

-- Sleep without a child process (a `sleep` child would outlive a rank that
-- mpirun kills and hold the test runner's output pipe open).
function T.sleep(seconds)
  local left = seconds
  while left > 0 do
    local step = math.min(left, 0.5)
    ffi.C.usleep(math.floor(step * 1e6))
    left = left - step
  end
end

local function fail(msg) error(msg, 3) end

-- Elementwise equality (within tol, default exact) of a tensor and a Lua
-- array or another tensor.
function T.eq(got, want, what, tol)
  tol = tol or 0
  local g = got:double():contiguous():view(-1):tolist()
  local w = fsdp.is_tensor(want) and want:double():contiguous():view(-1):tolist() or want
  if #g ~= #w then fail(('%s: %d elements, expected %d'):format(what or 'tensor', #g, #w)) end
  for i = 1, #g do
    if math.abs(g[i] - w[i]) > tol then
      fail(('%s: element %d is %.9g, expected %.9g'):format(what or 'tensor', i - 1, g[i], w[i]))
    end
  end
end

function T.same_shape(t, shape, what)
  local s = t.shape
  local ok = #s == #shape
  for i = 1, #shape do ok = ok and s[i] == shape[i] end
  if not ok then
    fail(('%s: shape [%s], expected [%s]'):format(what or 'tensor', table.concat(s, ', '),
      table.concat(shape, ', ')))
  end
end

function T.truthy(v, what) if not v then fail(what or 'expected a true value') end end

-- [Note: comparing parameters after AdamW]
-- Two f32 trainings that differ only in the order of their additions
-- (sharded against one rank, micro-batches against one batch) get
-- gradients that agree to f32 rounding of their sums: with n terms each,
-- n 2^-24 relative to the terms, ~4e-6 for the 64 tokens of these tests.
-- AdamW passes that on to the parameters as it is, lr times a relative
-- change per step (norm-wise 1e-5 after K steps is a bound with room),
-- with one exception: its update m / (sqrt(v) + eps) is the gradient's
-- sign times ~lr whatever the gradient's size, so an element whose
-- gradient cancels to within its rounding error can move the other way,
-- by up to ~2 lr per step (seen: 1 element of 2048 in a Zen 3 CPU's
-- AVX2 order, 1.6e-5 off where the rest agreed to 1e-7). Such elements
-- are rare (a gradient within ~1e-6 of zero relative to its terms), so
-- params_error sets aside up to 0.1% of a tensor's elements (at least
-- one), each bounded by 2 lr per step and 4 steps' worth in all, and
-- bounds the rest norm-wise. A sharding bug (a missing unit, a stale
-- gathered buffer, a wrong shard) moves most elements, and is caught.
--
-- The relative norm-wise error of got against want (f64 tensors of one
-- parameter) beyond the elements AdamW may flip (see the Note), or an
-- error message when the flipped ones are too many or too far.
-- flip_fraction: the share of elements that may flip (default 1/1000, for
-- the few steps of most tests; a flip is a per-step chance, so longer runs
-- scale it by their steps: tests/mpi/tp_equivalence.lua).
function T.params_error(got, want, lr, steps, flip_fraction)
  local F = fsdp.F
  local g, w = got:double():contiguous():view(-1), want:double():contiguous():view(-1)
  local n = w.shape[1]
  local norm = math.max(w:pow(2):sum():item() ^ 0.5, 1e-12)
  local d = (g - w):abs()
  -- An element alone beyond 1e-6 of the tensor's norm is a candidate flip.
  local far = d:gt(norm * 1e-6):double()
  local flips = far:sum():item()
  local limit = math.max(1, math.floor(n * (flip_fraction or 1 / 1000)))
  if flips > limit then
    return math.huge, ('%d of %d elements differ by more than 1e-6 of the norm (at most %d may flip)'):format(
      flips, n, limit)
  end
  local worst = flips > 0 and F.max(d, 0):item() or 0
  if worst > 2 * lr * steps then
    return math.huge, ('an element differs by %.3g, more than AdamW moves it in %d steps of lr %g'):format(
      worst, steps, lr)
  end
  local rest = (d * (1 - far)):pow(2):sum():item() ^ 0.5 / norm
  return rest
end

-- fn must raise an error whose message contains every string given.
function T.raises(fn, ...)
  local ok, err = pcall(fn)
  if ok then fail('expected an error, none was raised') end
  err = tostring(err)
  for i = 1, select('#', ...) do
    local needle = select(i, ...)
    if not err:find(needle, 1, true) then
      fail(('error message lacks %q: %s'):format(needle, err))
    end
  end
  return err
end

-- Run fn on every rank and agree on the verdict.
function T.test(name, fn)
  local ok, err = pcall(fn)
  if not ok then
    io.stdout:write(('# [rank %d] %s: %s\n'):format(T.rank, name, tostring(err)))
    io.stdout:flush()
  end
  local flags = fsdp.zeros(T.world, { dtype = 'i32' })
  if not ok then flags:set(1, T.rank) end
  dist.all_reduce(flags)
  local bad = {}
  for r, f in ipairs(flags:tolist()) do if f ~= 0 then bad[#bad + 1] = r - 1 end end
  if T.rank == 0 then
    if #bad == 0 then
      io.stdout:write(('ok - %s\n'):format(name))
    else
      io.stdout:write(('not ok - %s (failed on ranks %s)\n'):format(name, table.concat(bad, ', ')))
    end
    io.stdout:flush()
  end
  if #bad > 0 then failures = failures + 1 end
end

-- The end of a script: a clean exit status when every test passed.
function T.done()
  dist.barrier()
  if failures > 0 then os.exit(1) end
end

return T
