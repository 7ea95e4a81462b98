-- fsdp.random: keys for the core's counter-based random numbers.
--
-- A random tensor is a pure function of (seed, stream, offset): element i
-- takes the generator's value at index offset + i under (seed, stream). So
-- the same call gives the same values, and a slice can be generated alone
-- (offset = its first element's position) equal to the slice of the whole,
-- which is what sharded parameter init relies on.
--
-- Calls that give no seed draw from a global generator: its seed (0 until
-- fsdp.manual_seed) and a stream counter that advances per call, so
-- successive unseeded calls differ and a script is reproducible run to run.
local ffi = require 'ffi'
local core = require 'fsdp.core'
local validate = require 'fsdp.validate'

local M = {}

local global_seed = 0
local next_stream = 0

-- Streams of the global generator start far from small explicit streams so
-- that `{seed=s, stream=k}` and unseeded calls do not collide by accident.
local GLOBAL_STREAM_BASE = 2^40

-- fsdp.manual_seed(seed): seed the global generator (a non-negative
-- integer) that random factories without a `seed` option draw from.
function M.manual_seed(seed)
  assert(not validate.problem(seed, validate.INDEX), 'manual_seed expects a non-negative integer')
  global_seed = seed
  next_stream = 0
end

-- The global generator's seed (0 unless fsdp.manual_seed set it).
function M.initial_seed()
  return global_seed
end

-- The global generator's position, to replay random calls (activation
-- checkpointing re-runs a forward with the same dropout masks).
function M.get_state()
  return { seed = global_seed, next_stream = next_stream }
end

function M.set_state(s)
  global_seed, next_stream = s.seed, s.next_stream
end

local function uint64(x, name)
  if type(x) == 'cdata' then return ffi.cast('uint64_t', x) end
  if validate.problem(x, validate.INDEX) then
    core.fail(('random option %s must be a non-negative integer, got %s'):format(name, validate.show(x)))
  end
  return x
end

-- (seed, stream, offset) for a random call with options {seed=, stream=,
-- offset=}. With a seed, the stream defaults to 0; without one, the global
-- generator supplies both.
function M.key(opts)
  opts = opts or {}
  local offset = uint64(opts.offset or 0, 'offset')
  if opts.seed ~= nil then
    return uint64(opts.seed, 'seed'), uint64(opts.stream or 0, 'stream'), offset
  end
  local stream = opts.stream
  if stream == nil then
    stream = GLOBAL_STREAM_BASE + next_stream
    next_stream = next_stream + 1
  end
  return global_seed, uint64(stream, 'stream'), offset
end

return M
