-- tests/mpi/nproc.lua: run by `fsdp-lua --nproc N tests/mpi/nproc.lua a b`;
-- each rank reports what it sees, so run.sh can check that every rank got
-- the arguments and that the ranks form one world.
local fsdp = require 'fsdp'
local dist = fsdp.dist
local total = dist.all_reduce(fsdp.ones(1)):item()
dist.print(('transport=%s size=%d sum=%d args=%s'):format(
  dist.transport(), dist.world_size(), total, table.concat({ ... }, ',')))
