-- tests/mpi/ckpt_nonfinite.lua: a checkpoint is never written from
-- non-finite state, whichever rank holds it. A NaN in the last rank's
-- shard only makes the save fail on every rank (no rank waits alone in a
-- collective), naming the step, the rank and the tensor; the step's
-- directory gets no COMPLETE and the previous checkpoint is kept.
--
--   mpirun -np 2 fsdp-lua tests/mpi/ckpt_nonfinite.lua
local fsdp = require 'fsdp'
local llama = require 'models.llama'
local ckpt = require 'fsdp.checkpointing'
local files = require 'fsdp.io.files'
local T = require 'tests.mpi.tap'

local CFG = { dim = 32, n_layers = 2, n_heads = 4, n_kv_heads = 2, ffn_dim = 64, vocab_size = 64,
              max_seq_len = 32 }
local m = llama.CausalLM(llama.config('Llama-2-7b', CFG), { device = 'meta' })
fsdp.shard(m, { policy = fsdp.policy.transformer { llama.DecoderLayer }, seed = 3 })

-- A directory of this run's own, named by rank 0 after a unique file
-- (os.tmpname): the time and math.random named it before, but LuaJIT's
-- unseeded math.random draws the same number in every process, so two runs
-- in the same second shared one.
local stem = fsdp.dist.all_gather_strings(T.rank == 0 and os.tmpname() or '')[1]
local dir = stem .. '.d'
local last = T.world - 1

T.test('a finite save succeeds', function()
  ckpt.save(dir, { model = m, step = 1, keep = 1 })
  T.truthy(ckpt.directory.is_complete(dir .. '/step-000001'), 'step 1 is complete')
end)

T.test('NaN in the last rank\'s shard fails the save on every rank, naming step, rank and tensor', function()
  local unit = rawget(m, '_fsdp').units[1]
  if T.rank == last then unit.shard:narrow(0, 0, 1):fill_(0 / 0) end
  local ok, err = pcall(ckpt.save, dir, { model = m, step = 2, keep = 1 })
  T.truthy(not ok, 'the save failed')
  local want = ("checkpointing.save: step 2 not saved (rank %d failed): "):format(last)
  T.truthy(tostring(err):find(want, 1, true) ~= nil and tostring(err):find("tensor 'unit:", 1, true) ~= nil,
    'the error names step, rank and tensor: ' .. tostring(err))
  T.truthy(files.lmode(dir .. '/step-000002/COMPLETE') == nil, 'step 2 has no COMPLETE')
  T.truthy(ckpt.directory.is_complete(dir .. '/step-000001'), 'step 1 is kept')
end)

fsdp.dist.barrier()
if T.rank == 0 then files.remove_tree(dir); os.remove(stem) end
T.done()
