-- tests/mpi/collective_timeout.lua: a collective that one rank never
-- joins fails on the others after FSDP_COLLECTIVE_TIMEOUT (run.sh sets 1 s)
-- with a message naming the collective and the group, and the failure ends
-- the job: no rank hangs.
local fsdp = require 'fsdp'
local dist = fsdp.dist
local ffi = require 'ffi'
ffi.cdef 'int usleep(unsigned int usec);'

dist.barrier()
if dist.rank() == 1 then
  -- never joins; stays alive long after the timeout (killed by the abort)
  for _ = 1, 60 do ffi.C.usleep(500000) end
else
  dist.all_reduce(fsdp.ones(10))
end
print('unreachable: the job should have ended')
