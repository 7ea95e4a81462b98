-- tests/mpi/rank_error.lua: the last rank raises an error while the others
-- wait in a collective that can never complete. tests/mpi/run.sh checks
-- that the job ends within seconds, non-zero, with a message naming the
-- rank. With the argument `early` the error comes before anything
-- distributed has started (a launcher-only exit); otherwise after.
local fsdp = require 'fsdp'
local when = ...
local last = tonumber(os.getenv('OMPI_COMM_WORLD_SIZE') or os.getenv('PMI_SIZE') or 1) - 1
local me = tonumber(os.getenv('OMPI_COMM_WORLD_RANK') or os.getenv('PMI_RANK') or 0)

if when == 'early' and me == last then
  error('deliberate failure before init')
end

local dist = fsdp.dist
dist.barrier()
if dist.rank() == last then
  error('deliberate failure on the last rank')
end
-- the others would wait here forever without the abort
dist.all_reduce(fsdp.ones(10))
dist.barrier()
print('unreachable: the job should have ended')
