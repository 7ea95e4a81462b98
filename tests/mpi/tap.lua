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
