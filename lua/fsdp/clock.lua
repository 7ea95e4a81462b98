-- fsdp.clock: wall-clock time in seconds with sub-microsecond resolution
-- (os.clock is CPU time summed over threads, wrong for OpenMP code).
local ffi = require 'ffi'

ffi.cdef [[
  struct fl_timespec { long tv_sec; long tv_nsec; };
  int clock_gettime(int clk_id, struct fl_timespec *tp);
]]

local CLOCK_REALTIME, CLOCK_MONOTONIC = 0, 1
local ts = ffi.new('struct fl_timespec')

local M = {}

function M.now()
  ffi.C.clock_gettime(CLOCK_MONOTONIC, ts)
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

-- Seconds since the Unix epoch (the wall clock: it can jump; for stamps
-- that other processes and tools compare, not for durations).
function M.epoch()
  ffi.C.clock_gettime(CLOCK_REALTIME, ts)
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

return M
