-- tests/mpi/fsdp_api.lua: sharding features across ranks beyond the
-- strategy grid of fsdp_equivalence.lua: units whose size does not divide
-- by the world (padding), per-unit overrides from a policy, module states
-- synchronised from rank 0, summon with writeback, rank-0-only state dicts.
local fsdp = require 'fsdp'
local dist = fsdp.dist
local llama = require 'models.llama'
local optim = require 'fsdp.optim'
local T = require 'tests.mpi.tap'

local R, W = T.rank, T.world
-- Sizes whose unit counts are 2 mod 4 (blocks 16,086, root 5,166), so 4
-- ranks pad every unit. (Every Llama parameter count is a multiple of the
-- width, which rotary embeddings make even, so 2 ranks never pad.)
local CFG = { dim = 42, n_layers = 2, n_heads = 3, n_kv_heads = 3, ffn_dim = 71, vocab_size = 61,
              max_seq_len = 32 }
local G, K = 4, 2
local ids = fsdp.randint(0, CFG.vocab_size, { K * G, 12 }, { seed = 5 })
local tg = fsdp.randint(0, CFG.vocab_size, { K * G, 12 }, { seed = 6 })
local one = dist.split(R, { name = 'one rank' })
local blocks = fsdp.policy.transformer { llama.DecoderLayer }

local function meta() return llama.CausalLM(llama.config('Llama-2-7b', CFG), { device = 'meta' }) end

local function train(m, first, rows)
  local opt = optim.AdamW(m:named_parameters(), { lr = 1e-3 })
  for step = 0, K - 1 do
    local loss = m:loss(ids:narrow(0, step * G + first, rows), tg:narrow(0, step * G + first, rows))
    loss:backward()
    opt:step()
    opt:zero_grad()
  end
  return fsdp.full_state_dict(m)
end

local function close(a, b, tol, what)
  for name, w in pairs(b) do
    T.truthy(a[name] ~= nil, what .. ': missing ' .. name)
    local err = (a[name]:double() - w:double()):pow(2):sum():item() ^ 0.5
        / math.max(w:double():pow(2):sum():item() ^ 0.5, 1e-12)
    T.truthy(err <= tol, ('%s: %s differs, relative error %.3g'):format(what, name, err))
  end
end

T.test('units padded to the world size train like one rank', function()
  local m = fsdp.shard(meta(), { policy = blocks, seed = 2 })
  local padded = 0
  for _, u in ipairs(fsdp.sharding.units(m)) do
    T.truthy(u.padded_numel % W == 0 and u.padded_numel - u.numel < W, 'padding of ' .. u:label())
    padded = padded + u.padded_numel - u.numel
  end
  T.truthy(W ~= 4 or padded > 0, 'expected padding on 4 ranks')
  local ref = train(fsdp.shard(meta(), { policy = blocks, seed = 2, group = one }), 0, G)
  close(train(m, R * G / W, G / W), ref, 1e-5, 'padded')
end)

T.test('per-unit overrides: a NO_SHARD bf16 head in a FULL_SHARD f32 model', function()
  local function policy(m, name)
    if name == 'lm_head' then return { strategy = 'NO_SHARD', mixed_precision = { param = 'bf16', reduce = 'f32' } } end
    return blocks(m)
  end
  local m = fsdp.shard(meta(), { policy = policy, seed = 3 })
  local units = fsdp.sharding.units(m)
  T.truthy(units[#units - 1].name == 'lm_head' and units[#units - 1].shard_size == 1, 'lm_head unit')
  local ref = train(fsdp.shard(meta(), { policy = policy, seed = 3, group = one }), 0, G)
  close(train(m, R * G / W, G / W), ref, 2e-2, 'overrides')
end)

T.test('sync_module_states takes rank 0 values', function()
  local m = meta()
  m:init_weights({ seed = 100 + R, device = 'cpu' }) -- every rank different
  local want = meta()
  want:init_weights({ seed = 100, device = 'cpu' })   -- rank 0's
  fsdp.shard(m, { policy = blocks, sync_module_states = true })
  local full = fsdp.full_state_dict(m)
  for _, np in ipairs(want:named_parameters()) do
    T.eq(full[np[1]], np[2], np[1])
  end
end)

T.test('summon_full_params with writeback; full_state_dict on rank 0 only', function()
  local m = fsdp.shard(meta(), { policy = blocks, seed = 4 })
  fsdp.summon_full_params(m, function()
    T.same_shape(m.lm_head.weight, { 61, 42 }, 'summoned lm_head')
    m.lm_head.weight:fill_(0.125)
    m.model.layers[1].mlp.down_proj.weight:fill_(-1) -- layers[1] is the first (layers.0)
  end, { writeback = true })
  local sd = fsdp.full_state_dict(m, { rank0_only = true })
  if R == 0 then
    T.truthy(sd['lm_head.weight']:sum():item() == 0.125 * 61 * 42, 'lm_head written back')
    T.truthy(sd['model.layers.0.mlp.down_proj.weight']:sum():item() == -42 * 71, 'down_proj written back')
  else
    T.truthy(next(sd) == nil, 'rank0_only: other ranks get nothing')
  end
end)

T.test('a Hugging Face checkpoint loads straight into shards', function()
  -- A file of this run's own, named by rank 0 (os.tmpname makes it): two
  -- runs at once shared the fixed name this had, each removing it under
  -- the other.
  local stem = dist.all_gather_strings(R == 0 and os.tmpname() or '')[1]
  local path = stem .. '.safetensors'
  local whole = meta()
  whole:init_weights({ seed = 21, device = 'cpu' })
  if R == 0 then
    local sd = {}
    for _, np in ipairs(whole:named_parameters()) do sd[np[1]] = np[2] end
    fsdp.save_safetensors(path, sd)
  end
  dist.barrier()
  local m = fsdp.shard(meta(), { policy = blocks, seed = 0 })
  local before = fsdp.memory_stats('cpu').in_use
  fsdp.load_safetensors_into(m, path)
  T.truthy(fsdp.memory_stats('cpu').in_use - before < 64 * 1024, 'loading allocated memory')
  local full = fsdp.full_state_dict(m)
  for _, np in ipairs(whole:named_parameters()) do T.eq(full[np[1]], np[2], np[1]) end
  dist.barrier()
  if R == 0 then os.remove(path); os.remove(stem) end
end)

T.done()
