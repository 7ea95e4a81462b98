-- tests/mpi/collective_timeout.lua: a collective that one rank never
-- joins fails on the others after FSDP_COLLECTIVE_TIMEOUT (run.sh sets 1 s)
-- with a message naming the collective and the group, and the failure ends
-- the job: no rank hangs.
--
-- With the argument `chain`: see below.
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

-- With the argument `late`: rank 0's all-gather of a sharded unit times
-- out and rank 0 catches the error; rank 1 joins that all-gather 2 s
-- later, so MPI then writes into rank 0's gathered pages, which must still
-- be mapped (they were decommitted under the pending request: SIGSEGV in
-- MPI_Test). Rank 0 then finds further collectives refused and fails with
-- that message; run.sh checks that no rank died of a signal.
if arg[1] == 'late' then
  local llama = require 'models.llama'
  local CFG = { dim = 32, n_layers = 2, n_heads = 4, n_kv_heads = 4, ffn_dim = 64, vocab_size = 64,
                max_seq_len = 32 }
  local m = llama.CausalLM(llama.config('Llama-2-7b', CFG), { device = 'meta' })
  fsdp.shard(m, { policy = fsdp.policy.transformer { llama.DecoderLayer } })
  local ids = fsdp.randint(0, 64, { 2, 16 }, { seed = 1 })
  if dist.rank() == 0 then
    dist.set_timeout(1)
    local ok, err = pcall(m.loss, m, ids, ids)
    assert(not ok and tostring(err):find('not complete after waiting 1 s', 1, true), tostring(err))
    for _ = 1, 8 do ffi.C.usleep(500000) end -- rank 1's data lands meanwhile
    dist.all_reduce(fsdp.ones(4)) -- refused: raises and ends the job
  else
    for _ = 1, 4 do ffi.C.usleep(500000) end
    pcall(m.loss, m, ids, ids) -- joins the timed-out gather, then waits on the next
    for _ = 1, 60 do ffi.C.usleep(500000) end
  end
  print('unreachable: the job should have ended')
  return
end

-- With the argument `chain` (3 ranks): rank 1 waits in an all-reduce with
-- rank 0, which waits in one with rank 2, which has stopped (SIGSTOP).
-- Rank 1 times out first, but rank 0 answers its roll call from inside a
-- collective, so rank 1 does not end the job with what it sees: it waits
-- for rank 0's own timeout, whose message names rank 2 ([Note: the rank
-- that knows] in core/comm/work.c).
if arg[1] == 'chain' then
  assert(dist.world_size() == 3, 'chain: run on 3 ranks')
  local g01, g02 = dist.new_group { 0, 1 }, dist.new_group { 0, 2 }
  dist.barrier()
  if dist.rank() == 2 then
    ffi.cdef 'int raise(int sig);'
    ffi.C.raise(19) -- SIGSTOP
    for _ = 1, 60 do ffi.C.usleep(500000) end -- continued by the abort: wait for its kill
  elseif dist.rank() == 1 then
    dist.all_reduce(fsdp.ones(4), { group = g01 })
  else
    ffi.C.usleep(500000)
    dist.all_reduce(fsdp.ones(4), { group = g02 })
  end
  print('unreachable: the job should have ended')
  return
end

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
