-- tests/mpi/collective_timeout.lua: a collective that one rank never
-- joins fails on the others after FSDP_COLLECTIVE_TIMEOUT (run.sh sets 1 s)
-- with a message naming the collective and the group, and the failure ends
-- the job: no rank hangs.
--
-- With the argument `cuda` (cudasim and GPU builds) the collective moves a
-- cuda tensor through NCCL and rank 0 waits the way training does: the
-- wait only orders the device after the collective, and the host blocks
-- later, reading a value; that read must fail naming the collective
-- rather than hang in the driver ([Note: ordered collectives]).
local fsdp = require 'fsdp'
local dist = fsdp.dist
local ffi = require 'ffi'
ffi.cdef 'int usleep(unsigned int usec);'

if arg[1] == 'cuda' then
  -- every rank: the group's first cuda collective chooses NCCL
  dist.all_reduce(fsdp.ones(10, {device = 'cuda:0'}))
  assert(dist.world():device_library() == 'nccl', 'expected the group to use nccl')
end
dist.barrier()
if dist.rank() == 1 then
  -- never joins; stays alive long after the timeout (killed by the abort)
  for _ = 1, 60 do ffi.C.usleep(500000) end
elseif arg[1] == 'cuda' then
  local t = fsdp.ones(10, {device = 'cuda:0'})
  local work = dist.all_reduce(t, {async = true})
  work:wait()
  print('sum', t:sum():item())
else
  dist.all_reduce(fsdp.ones(10))
end
print('unreachable: the job should have ended')
