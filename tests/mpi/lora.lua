-- tests/mpi/lora.lua: LoRA (fsdp.lora) on a sharded tiny Llama: W ranks
-- training the adapters over a frozen base give the parameters of one rank
-- training on all W ranks' rows, for FULL_SHARD, SHARD_GRAD_OP and NO_SHARD
-- and with the base kept in bf16; the frozen base never changes, has no
-- gradient and no optimizer state, and costs no gradient communication
-- (its units are gathered, never reduced).
--
--   mpirun -np 2 fsdp-lua tests/mpi/lora.lua     (tests/mpi/run.sh)
--   fsdp-lua tests/mpi/lora.lua                  one rank
--   FSDP_RANKS_PER_NODE=2 mpirun -np 4 fsdp-lua tests/mpi/lora.lua
--                                                2 nodes of 2: HYBRID_SHARD too
--
-- Tolerance: 1e-5 relative, norm-wise per parameter, after K AdamW steps
-- in f32 (the two runs add the same products in other orders, as in
-- tests/mpi/grad_accum.lua). A frozen weight freed too early in backward
-- (its pages read back as zeros) or a gradient reduced into the wrong
-- flat parameter is off by far more.
local fsdp = require 'fsdp'
local dist = fsdp.dist
local llama = require 'models.llama'
local optim = require 'fsdp.optim'
local lora = require 'fsdp.lora'
local T = require 'tests.mpi.tap'

local R, W = T.rank, T.world
local K, B, SEQ = 3, 2, 16
local CFG = { dim = 32, n_layers = 3, n_heads = 4, n_kv_heads = 2, ffn_dim = 64, vocab_size = 64,
              max_seq_len = 32 }
local SEED, LR, TOL = 7, 1e-2, 1e-5
local data_ids = fsdp.randint(0, CFG.vocab_size, { K * B * W, SEQ }, { seed = 11 })
local data_tg = fsdp.randint(0, CFG.vocab_size, { K * B * W, SEQ }, { seed = 12 })

local one = dist.split(R, { name = 'one rank' })
local policy = fsdp.policy.transformer { llama.DecoderLayer }

-- o_proj and down_proj adapted: their adapters' gradients are complete
-- before q/k/v and gate/up send theirs to the layer's input, so the frozen
-- base must outlive them. Only layer 0 adapted: layers 1 and 2 are all
-- frozen, gathered again in backward for their inputs' gradients.
local TARGETS = { 'o_proj', 'down_proj' }
local LAYER0 = { 'layers.0.self_attn.o_proj' }

local function build(opts, base_dtype, targets)
  local m = llama.CausalLM(llama.config('Llama-2-7b', CFG), { device = 'meta' })
  lora.apply(m, { rank = 4, alpha = 8, targets = targets, base_dtype = base_dtype })
  opts.policy, opts.seed = policy, SEED
  return fsdp.shard(m, opts)
end

local function adamw(m) return optim.AdamW(lora.trainable(m), { lr = LR, weight_decay = 0.1 }) end

local function diff(a, b)
  local c = {}
  for k, v in pairs(b) do c[k] = v - (a[k] or 0) end
  return c
end

local function run(strategy, base_dtype, targets)
  local m = build({ strategy = strategy }, base_dtype, targets)
  local opt = adamw(m)
  local ref = build({ group = one }, base_dtype, targets)
  local ropt = adamw(ref)
  local base0 = fsdp.full_state_dict(m)
  local counts = {}
  for step = 0, K - 1 do
    local first = step * B * W
    local c0 = dist.collective_counts()
    m:loss(data_ids:narrow(0, first + R * B, B), data_tg:narrow(0, first + R * B, B)):backward()
    counts[#counts + 1] = diff(c0, dist.collective_counts())
    opt:step(); opt:zero_grad()
    ref:loss(data_ids:narrow(0, first, B * W), data_tg:narrow(0, first, B * W)):backward()
    ropt:step(); ropt:zero_grad()
  end
  local got, want = fsdp.full_state_dict(m), fsdp.full_state_dict(ref)
  local worst, where, moved, frozen_moved = 0, nil, 0, nil
  for name, w in pairs(want) do
    local den = w:double():pow(2):sum():item() ^ 0.5
    local err = (got[name]:double() - w:double()):pow(2):sum():item() ^ 0.5 / math.max(den, 1e-12)
    if err > worst then worst, where = err, name end
    local change = (got[name]:double() - base0[name]:double()):abs():max():item()
    if name:match('lora_B') then moved = math.max(moved, change) end
    if not name:match('lora_') and change ~= 0 then frozen_moved = name end
  end
  return { err = worst, where = where, moved = moved, frozen_moved = frozen_moved, counts = counts, model = m,
           opt = opt }
end

local cases = { { 'FULL_SHARD' }, { 'SHARD_GRAD_OP' }, { 'NO_SHARD' }, { 'FULL_SHARD', 'bf16' },
                { 'FULL_SHARD', nil, LAYER0 } }
if dist.nodes() > 1 and W > dist.nodes() then cases[#cases + 1] = { 'HYBRID_SHARD', 'bf16' } end
for _, case in ipairs(cases) do
  local strategy, base_dtype, targets = case[1], case[2], case[3] or TARGETS
  local adapted = targets == LAYER0 and 1 or CFG.n_layers -- units with adapters
  T.test(('%s%s: LoRA of %s on %d ranks = one rank on all rows; the base frozen'):format(strategy,
    base_dtype and (', base in ' .. base_dtype) or '', table.concat(targets, ','), W), function()
    local r = run(strategy, base_dtype, targets)
    if R == 0 then print(('# %s: largest relative parameter error %.3g (%s)'):format(strategy, r.err, r.where)) end
    T.truthy(r.err <= TOL, ('%s differs: relative error %.3g > %g'):format(tostring(r.where), r.err, TOL))
    T.truthy(r.moved > 0, 'the adapters did not train (lora_B unchanged)')
    T.truthy(r.frozen_moved == nil, ('frozen parameter %s changed'):format(tostring(r.frozen_moved)))
    -- Frozen units: no gradient, no optimizer state; their segments are
    -- not trainable.
    local units = fsdp.sharding.units(r.model)
    local n_frozen, n_train = 0, 0
    for _, u in ipairs(units) do
      if u.frozen then
        n_frozen = n_frozen + 1
        T.truthy(u.grad == nil, ('frozen unit %s has a gradient'):format(u:label()))
        if base_dtype then T.truthy(u.master_dtype == base_dtype, ('frozen unit %s is %s'):format(u:label(), u.master_dtype)) end
        for _, p in ipairs(u.params) do
          T.truthy(not p.segment.requires_grad, ('%s requires grad'):format(p.name))
          T.truthy(r.opt.state[p.name] == nil, ('%s has optimizer state'):format(p.name))
        end
      else
        n_train = n_train + 1
      end
    end
    -- Every layer and the root have frozen parameters; the adapted layers
    -- trainable ones too.
    T.truthy(n_frozen == CFG.n_layers + 1 and n_train == adapted,
      ('%d frozen and %d trainable units, expected %d and %d'):format(n_frozen, n_train, CFG.n_layers + 1, adapted))
    -- Gradients move only for the trainable units: one reduce-scatter (or
    -- all-reduce under NO_SHARD) per layer, none for the frozen root.
    if W > 1 then
      for s, c in ipairs(r.counts) do
        local reduced = strategy == 'NO_SHARD' and c.all_reduce or c.reduce_scatter
        T.truthy(reduced == n_train, ('step %d: %d gradient reductions, expected %d'):format(s, reduced, n_train))
      end
    end
    local mem = fsdp.sharding.memory(r.model, r.opt)
    local train_numel = 0
    for _, u in ipairs(units) do if not u.frozen then train_numel = train_numel + u.shard_numel end end
    T.truthy(mem.grads == train_numel * 4, ('%d gradient bytes, expected %d (the adapters\' shards only)'):format(
      mem.grads, train_numel * 4))
  end)
end

-- Export from a sharded model: the adapters as PEFT files (rank 0 writes
-- what every rank gathered) and the merged state dict equal those of the
-- one-rank reference.
T.test(('save_peft and merged_state_dict of a model sharded over %d ranks = one rank\'s'):format(W), function()
  local r = run('FULL_SHARD', nil, TARGETS)
  local ref = build({ group = one }, nil, TARGETS)
  -- the reference trained the same way: take its values from r's model
  -- through a full state dict, loaded into the one-rank model
  ref:load_state_dict(fsdp.full_state_dict(r.model))
  local dir = dist.all_gather_strings(R == 0 and os.tmpname() or '')[1] .. '.d'
  lora.save_peft(r.model, dir)
  local merged = lora.merged_state_dict(r.model, { rank0_only = true })
  local want_merged = lora.merged_state_dict(ref)
  if R == 0 then
    local got = fsdp.load_safetensors(dir .. '/adapter_model.safetensors')
    local n = 0
    for name, t in pairs(lora.adapter_state_dict(ref)) do
      local g = got['base_model.model.' .. name]
      T.truthy(g ~= nil, name .. ' is not in the saved adapter')
      T.eq(g, t, name, 0)
      n = n + 1
    end
    T.truthy(n == 2 * 2 * CFG.n_layers, ('%d adapter tensors'):format(n))
    for name, t in pairs(want_merged) do
      T.truthy(merged[name] ~= nil, name .. ' missing from the merged state dict')
      T.eq(merged[name], t, name, 0)
    end
    for name in pairs(merged) do T.truthy(not name:match('lora_'), name) end
    require('fsdp.io.files').remove_tree(dir)
  end
end)

T.done()
