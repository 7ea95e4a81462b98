-- tests/mpi/ckpt_full_state_dict.lua: the streamed full state dict
-- (fsdp.save_full_state_dict) of a sharded Llama equals
-- fsdp.full_state_dict bit for bit, under the model's (Hugging Face)
-- names, loads back into shards through fsdp.load_safetensors_into, and
-- never holds more than about one unit whole: the peak of rank 0's CPU
-- memory during the save stays within the largest gathered unit, while
-- gathering the whole dict costs the whole model.
--
--   mpirun -np N fsdp-lua tests/mpi/ckpt_full_state_dict.lua
local fsdp = require 'fsdp'
local dist = fsdp.dist
local llama = require 'models.llama'
local optim = require 'fsdp.optim'
local T = require 'tests.mpi.tap'

local R, W = T.rank, T.world
local CFG = { dim = 64, n_layers = 4, n_heads = 4, n_kv_heads = 2, ffn_dim = 128, vocab_size = 256,
              max_seq_len = 32 }

local function build(seed)
  local m = llama.CausalLM(llama.config('Llama-2-7b', CFG), { device = 'meta' })
  return fsdp.shard(m, { policy = fsdp.policy.transformer { llama.DecoderLayer }, seed = seed })
end

local m = build(3)
-- One step, so the values are not just the init rules'.
local opt = optim.AdamW(m:named_parameters(), { lr = 1e-2 })
local ids = fsdp.randint(0, CFG.vocab_size, { 2, 16 }, { seed = 100 + R })
m:loss(ids, ids):backward()
opt:step()
opt:zero_grad()

-- The work directory: rank 0 makes it, everyone learns its name.
local dir = dist.all_gather_strings(R == 0 and os.tmpname() .. '.d' or '')[1]
if R == 0 then os.execute('mkdir -p ' .. dir) end
dist.barrier()
local path = dir .. '/model.safetensors'

-- Exact peaks: collect dead tensors before every allocation.
fsdp.set_collect_budget(0)
collectgarbage()
local function peak_during(fn)
  collectgarbage()
  fsdp.reset_memory_stats('cpu')
  local base = fsdp.memory_stats('cpu').in_use
  local r = fn()
  return fsdp.memory_stats('cpu').peak - base, r
end

local largest, total = 0, 0
for _, u in ipairs(fsdp.sharding.units(m)) do
  largest = math.max(largest, u.padded_numel * 4)
  total = total + u.numel * 4
end

local streamed = peak_during(function() fsdp.save_full_state_dict(path, m) end)
local gathered, full = peak_during(function() return fsdp.full_state_dict(m, { rank0_only = true }) end)

T.test(('the streamed file equals full_state_dict bit for bit, HF names (%d ranks)'):format(W), function()
  if R ~= 0 then return end
  local f = fsdp.load_safetensors(path)
  local n = 0
  for _, np in ipairs(m:named_parameters()) do
    local name = np[1]
    T.truthy(f[name] ~= nil, 'the file lacks ' .. name)
    T.same_shape(f[name], full[name].shape, name)
    T.truthy((f[name] - full[name]):abs():max():item() == 0, name .. ' differs')
    n = n + 1
  end
  local in_file = 0
  for _ in pairs(f) do in_file = in_file + 1 end
  T.truthy(in_file == n, ('%d tensors in the file, %d parameters'):format(in_file, n))
  T.truthy(f['model.layers.3.mlp.down_proj.weight'] ~= nil and f['lm_head.weight'] ~= nil, 'Hugging Face names')
end)

T.test(('rank 0 peaks at about one unit while streaming, the whole model when gathering (%d ranks)'):format(W), function()
  if R ~= 0 then return end
  print(('# streamed save: peak +%d bytes; full_state_dict: +%d; largest unit %d, model %d'):format(
    streamed, gathered, largest, total))
  T.truthy(streamed <= largest + 4096, ('streamed peak %d > largest unit %d'):format(streamed, largest))
  T.truthy(gathered >= total, ('gathering everything peaked at only %d of %d bytes'):format(gathered, total))
  T.truthy(streamed * 2 < total, 'the model is several units')
end)
full = nil

T.test(('the file loads back into a sharded model (load_safetensors_into, %d ranks)'):format(W), function()
  local m2 = build(99)
  fsdp.load_safetensors_into(m2, path)
  local a, b = fsdp.full_state_dict(m), fsdp.full_state_dict(m2)
  for name, t in pairs(a) do
    T.truthy((b[name] - t):abs():max():item() == 0, name .. ' differs after loading')
  end
end)

T.test(('dtype = bf16 exports every tensor as bf16 (%d ranks)'):format(W), function()
  fsdp.save_full_state_dict(dir .. '/bf16.safetensors', m, { dtype = 'bf16' })
  if R ~= 0 then return end
  local f = fsdp.safetensors.open(dir .. '/bf16.safetensors')
  for _, name in ipairs(f:names()) do T.truthy(f:info(name).dtype == 'bf16', name) end
  f:close()
end)

dist.barrier()
if R == 0 then os.execute('rm -rf ' .. dir) end
T.done()
