-- tests/mpi/rank_exit.lua: one rank leaves or stalls while the others
-- train a sharded model; tests/mpi/run.sh checks from the outside that the
-- job ends (exit status, time taken) with a message naming the rank.
--
--   exit N   rank 1 calls os.exit(N) inside the forward of step 2, while
--            the others gather units with it: the job ends within seconds
--            ([Note: leaving the job] in core/comm/dist.c)
--   all N    every rank calls os.exit(N) after a barrier: a clean exit
--            with status N, nothing aborted
--   spin     rank 1 spins in Lua at step 2: the others time out naming it
--            as not in any collective (the roll call)
--   stop     rank 1 stops itself (SIGSTOP) at step 2: the others time out
--            naming it as not answering
--   kill     rank 1 kills itself (SIGKILL) at step 2: mpirun ends the job
--            naming it (no exit hook runs; Open MPI notices the death).
--            Not in run.sh: once in ~15 runs under load mpirun printed
--            that it noticed and then did not exit (Open MPI 4.1.4)
local fsdp = require 'fsdp'
local dist = fsdp.dist
local llama = require 'models.llama'
local ffi = require 'ffi'
ffi.cdef [[
int raise(int sig);
]]

-- "fault at <epoch seconds>": tests/mpi/run.sh measures from here to the
-- end of the job, so a slow start on a loaded machine does not count.
local function announce(what)
  -- (fsdp.clock declares clock_gettime: a second declaration here with
  -- another struct made every call fail.)
  io.stdout:write(('fault at %.3f: rank %d %s\n'):format(require('fsdp.clock').epoch(), dist.rank(), what))
  io.stdout:flush()
end

local mode, n = arg[1], tonumber(arg[2] or '0')
if mode == 'all' then
  dist.barrier()
  os.exit(n)
end

local CFG = { dim = 32, n_layers = 4, n_heads = 4, n_kv_heads = 4, ffn_dim = 64, vocab_size = 64,
              max_seq_len = 32 }
local m = llama.CausalLM(llama.config('Llama-2-7b', CFG), { device = 'meta' })
fsdp.shard(m, { policy = fsdp.policy.transformer { llama.DecoderLayer } })
local step = 0
m.model.layers[2]:register_forward_hook(function()
  if step ~= 2 or dist.rank() ~= 1 then return nil end
  announce(mode .. ' at step 2')
  if mode == 'exit' then
    os.exit(n)
  elseif mode == 'spin' then
    local x = 0
    while true do x = x + 1 end
  elseif mode == 'stop' then
    ffi.C.raise(19) -- SIGSTOP
  elseif mode == 'kill' then
    ffi.C.raise(9) -- SIGKILL
  end
  return nil
end)
local ids = fsdp.randint(0, 64, { 2, 16 }, { seed = 1 })
for s = 1, 4 do
  step = s
  local loss = m:loss(ids, ids)
  loss:backward()
end
print('unreachable: the job should have ended')
