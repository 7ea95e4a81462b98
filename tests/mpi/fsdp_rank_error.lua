-- tests/mpi/fsdp_rank_error.lua: the last rank raises an error inside the
-- backward of its second training step, in the middle of a sharded model,
-- while the other ranks are gathering and reducing units with it.
-- tests/mpi/run.sh checks that the job ends within seconds, non-zero, with
-- a message naming the rank and the place.
local fsdp = require 'fsdp'
local dist = fsdp.dist
local llama = require 'models.llama'

local CFG = { dim = 32, n_layers = 4, n_heads = 4, n_kv_heads = 4, ffn_dim = 64, vocab_size = 64,
              max_seq_len = 32 }
local m = llama.CausalLM(llama.config('Llama-2-7b', CFG), { device = 'meta' })
fsdp.shard(m, { policy = fsdp.policy.transformer { llama.DecoderLayer } })
local last = dist.world_size() - 1
local layer = m.model.layers[3]
local step = 0
-- On the last rank, step 2: the layer's output passes through a node whose
-- backward fails.
layer:register_forward_hook(function(_, _, out)
  if step ~= 2 or dist.rank() ~= last then return nil end
  local y = out:detach()
  fsdp.autograd.attach('Failing', { out }, { y }, function() error('deliberate failure in backward') end)
  return y
end)
local ids = fsdp.randint(0, 64, { 2, 16 }, { seed = 1 })
for s = 1, 3 do
  step = s
  local loss = m:loss(ids, ids)
  loss:backward()
end
print('unreachable: the job should have ended')
