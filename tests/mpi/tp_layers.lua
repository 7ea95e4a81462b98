-- tests/mpi/tp_layers.lua: tensor-parallel layers (fsdp.tp) on the world
-- as one TP group, against the same model on one rank: init values, the
-- loss and the gradients of a tiny Llama (untied and tied, with LoRA
-- adapters on colwise and rowwise layers), the same with sequence
-- parallelism (and for Gemma 2's sandwich norms and Qwen 3's per-head q/k
-- norms, on 2 ranks), the collectives a layer makes, the vocab-parallel
-- cross-entropy, the differentiable collectives, and the checks that need
-- more than one rank (sizes not divisible by the TP size).
--
--   mpirun -np 2 fsdp-lua tests/mpi/tp_layers.lua     (tests/mpi/run.sh: 2 and 4 ranks)
--
-- Tolerances (f32): init values are the same draws, so exact. Losses and
-- gradients add the same products in another order (a rowwise layer sums
-- T partial products, the vocab-parallel loss T partial sums): each sum of
-- n terms is off by at most ~n 2^-24 relative, n <= 64 here, so 1e-5
-- relative (norm-wise per tensor) bounds it with room; a wrong slice,
-- a missing all-reduce or a doubled gradient is off by O(1).
local fsdp = require 'fsdp'
local dist = fsdp.dist
local F = fsdp.F
local tp = require 'fsdp.tp'
local llama = require 'models.llama'
local lora = require 'fsdp.lora'
local T = require 'tests.mpi.tap'

local R, W = T.rank, T.world
local world = dist.world()
local TOL = 1e-5
local CFG = { dim = 32, n_layers = 2, n_heads = 4, n_kv_heads = 4, ffn_dim = 64, vocab_size = 64,
              max_seq_len = 32 }
if W == 2 then CFG.n_kv_heads = 2 end
local SEED = 5

local function rel_err(got, want)
  local g, w = got:double(), want:double()
  return (g - w):pow(2):sum():item() ^ 0.5 / math.max(w:pow(2):sum():item() ^ 0.5, 1e-30)
end

local function close(got, want, what, tol)
  T.same_shape(got, want.shape, what)
  local e = rel_err(got, want)
  T.truthy(e <= (tol or TOL), ('%s: relative error %.3g (bound %g)'):format(what, e, tol or TOL))
end

-- This rank's slice of a reference tensor, as p.tp describes it.
local function slice(full, p)
  local d = rawget(p, 'tp')
  if not d then return full end
  return tp.shard_init.slice(full, d)
end

local function build(cfg, opts)
  local m
  if opts.family then
    m = require('models.families.' .. opts.family).build('tiny', { device = 'meta' })
  else
    m = llama.CausalLM(llama.config('Llama-2-7b', cfg), { device = 'meta' })
  end
  if opts.lora then lora.apply(m, { rank = 4, alpha = 8, targets = { 'q_proj', 'o_proj', 'down_proj' } }) end
  if opts.tp then tp.parallelize(m, m:tp_plan(), { group = world, sequence_parallel = opts.sp }) end
  m:init_weights({ device = 'cpu', seed = SEED })
  if opts.lora then
    -- B starts at zero: give it values so the adapters' products count
    for name, p in pairs(m:state_dict()) do
      if name:find('lora_B') then
        local full = fsdp.randn(rawget(p, 'tp') and rawget(p, 'tp').global_shape or p.shape, { seed = 9 }) * 0.1
        fsdp.no_grad(function() p:copy_(slice(full, p)) end)
      end
    end
  end
  return m
end

local ids = fsdp.randint(0, CFG.vocab_size, { 2, 12 }, { seed = 1 })
local tg = fsdp.randint(0, CFG.vocab_size, { 2, 12 }, { seed = 2 })
fsdp.no_grad(function() tg:narrow(1, 0, 3):fill_(-100) end)

local function compare_models(cfg, opts, fused)
  local ref = build(cfg, opts)
  local m = build(cfg, { tp = true, lora = opts.lora, sp = opts.sp, family = opts.family })
  local want, got = ref:state_dict(), m:state_dict()
  local sharded = 0
  for name, p in pairs(got) do
    if rawget(p, 'tp') then sharded = sharded + 1 end
    T.eq(p, slice(want[name], p), 'init of ' .. name)
  end
  T.truthy(sharded > 0, 'no parameter is TP-sharded')
  local lr = ref:loss(ids, tg, { fused_loss = fused })
  local lt = m:loss(ids, tg, { fused_loss = fused })
  close(lt, lr, 'loss')
  lr:backward(); lt:backward()
  local n = 0
  for name, p in pairs(got) do
    if p.requires_grad then
      T.truthy(p.grad ~= nil, name .. ' has no gradient')
      close(p.grad, slice(want[name].grad, p), 'gradient of ' .. name)
      n = n + 1
    end
  end
  T.truthy(n > 0, 'no gradient compared')
  -- the unfused path gathers the logits
  fsdp.no_grad(function()
    local _, logits = m:loss(ids, tg, { fused_loss = false })
    local _, want_logits = ref:loss(ids, tg, { fused_loss = false })
    close(logits, want_logits, 'gathered logits')
  end)
end

T.test(('Llama tp %d: init, loss and gradients = one rank (fused loss)'):format(W), function()
  compare_models(CFG, {}, true)
end)

T.test(('Llama tp %d: unfused loss path'):format(W), function()
  compare_models(CFG, {}, false)
end)

T.test(('Llama tp %d, tied embeddings (embedding and head share the vocab split)'):format(W), function()
  local cfg = {}
  for k, v in pairs(CFG) do cfg[k] = v end
  cfg.tied = true
  compare_models(cfg, {}, true)
end)

T.test(('Llama tp %d with LoRA on q_proj (colwise), o_proj and down_proj (rowwise)'):format(W), function()
  compare_models(CFG, { lora = true }, true)
end)

-- [Note: TP regions] (fsdp/tp/styles.lua): per layer the rowwise outputs
-- are all-reduced in forward and the two regions' inputs in backward, as
-- Megatron-LM: what a second layer adds to a step's real collectives.
T.test(('Llama tp %d: a layer makes 2 all-reduces in forward and 2 in backward (dist.collective_counts)'):format(W),
  function()
    local function counts(layers)
      local cfg = {}
      for k, v in pairs(CFG) do cfg[k] = v end
      cfg.n_layers = layers
      local m = build(cfg, { tp = true })
      local c0 = dist.collective_counts()
      local loss = m:loss(ids, tg)
      local c1 = dist.collective_counts()
      loss:backward()
      local c2 = dist.collective_counts()
      local f, b = {}, {}
      for k, v in pairs(c2) do f[k], b[k] = c1[k] - (c0[k] or 0), v - c1[k] end
      return f, b
    end
    local f1, b1 = counts(1)
    local f2, b2 = counts(2)
    for _, k in ipairs({ 'all_reduce', 'all_gather', 'reduce_scatter', 'broadcast' }) do
      local want = k == 'all_reduce' and 2 or 0
      T.truthy(f2[k] - f1[k] == want, ('forward: a layer adds %d %s, want %d'):format(f2[k] - f1[k], k, want))
      T.truthy(b2[k] - b1[k] == want, ('backward: a layer adds %d %s, want %d'):format(b2[k] - b1[k], k, want))
    end
  end)

-- Sequence parallelism: the hidden states between the regions are this
-- rank's rows (12 / W of them), the norms' gradients all-reduced.
for _, fused in ipairs({ true, false }) do
  T.test(('Llama tp %d sequence parallel: loss and gradients = one rank (%s loss)'):format(W,
    fused and 'fused' or 'unfused'), function() compare_models(CFG, { sp = true }, fused) end)
end

T.test(('Llama tp %d sequence parallel, tied embeddings, LoRA on colwise and rowwise'):format(W), function()
  local cfg = {}
  for k, v in pairs(CFG) do cfg[k] = v end
  cfg.tied = true
  compare_models(cfg, { sp = true, lora = true }, true)
end)

if W == 2 then
  for _, fam in ipairs({ 'gemma2', 'qwen3' }) do
    for _, sp in ipairs({ false, true }) do
      T.test(('%s tiny tp 2%s (its norms): loss and gradients = one rank'):format(fam,
        sp and ' sequence parallel' or ''), function() compare_models(nil, { sp = sp, family = fam }, true) end)
    end
  end
end

T.test('sequence parallel: the hidden states are this rank\'s rows; refusals name the module', function()
  local m = build(CFG, { tp = true, sp = true })
  local seen
  m.model.layers[1].input_layernorm:register_forward_hook(function(_, args) seen = args[1] end)
  fsdp.no_grad(function() m:loss(ids, tg) end)
  T.same_shape(seen, { 2, 12 / W, CFG.dim }, 'a norm sees [B, S/T, dim]')
  local odd = fsdp.randint(0, CFG.vocab_size, { 2, 13 }, { seed = 1 })
  T.raises(function() m:loss(odd, odd) end, 'model.embed_tokens', 'sequence length 13',
    'not divisible by tp ' .. W)
  local function refused(edit, ...)
    local mm = llama.CausalLM(llama.config('Llama-2-7b', CFG), { device = 'meta' })
    local plan = {}
    for _, e in ipairs(mm:tp_plan()) do if edit(e) then plan[#plan + 1] = e end end
    T.raises(function() tp.parallelize(mm, plan, { group = world, sequence_parallel = true }) end, ...)
  end
  refused(function(e) return e.style ~= 'sequence' end, 'model.layers.0.input_layernorm', "style 'sequence'")
  refused(function(e) return e.style ~= 'region' end, 'outside a region', "'region'")
  T.raises(function()
    local mm = llama.CausalLM(llama.config('Llama-2-7b', CFG), { device = 'meta' })
    tp.parallelize(mm, mm:tp_plan(), { group = world, sequence_parallel = 'yes' })
  end, 'sequence_parallel must be true or false')
end)

T.test(('load_state_dict of the logical tensors into a tp %d model takes each rank\'s slice'):format(W), function()
  local ref = build(CFG, {})
  local m = llama.CausalLM(llama.config('Llama-2-7b', CFG), { device = 'meta' })
  tp.parallelize(m, m:tp_plan(), { group = world })
  m:init_weights({ device = 'cpu', seed = SEED + 1 })
  local want = ref:state_dict()
  m:load_state_dict(want)
  for name, p in pairs(m:state_dict()) do T.eq(p, slice(want[name], p), 'loaded ' .. name) end
end)

T.test('vocab-parallel cross-entropy = F.cross_entropy (mean, sum, none; ignored rows)', function()
  local N, V = 10, 8 * W
  local full = fsdp.randn({ N, V }, { seed = 3 }) * 3
  local t = fsdp.randint(0, V, { N }, { seed = 4 })
  fsdp.no_grad(function() t:narrow(0, 2, 2):fill_(-100) end)
  local Vl = V / W
  for _, red in ipairs({ 'mean', 'sum', 'none' }) do
    local a = full:clone():requires_grad_(true)
    local want = F.cross_entropy(a, t, { reduction = red })
    local b = full:narrow(1, R * Vl, Vl):contiguous():requires_grad_(true)
    local got = tp.cross_entropy(b, t, { group = world, vocab_start = R * Vl, reduction = red })
    close(got, want, 'loss ' .. red)
    local w = red == 'none' and fsdp.randn({ N }, { seed = 6 }) or nil
    if w then (want * w):sum():backward(); (got * w):sum():backward()
    else want:backward(); got:backward() end
    close(b.grad, a.grad:narrow(1, R * Vl, Vl), 'logits gradient ' .. red)
  end
end)

T.test('gather / split / reduce_scatter / copy_to / reduce_from: values and gradients', function()
  local C = tp.collectives
  local x = (fsdp.randn({ 3, 4 }, { seed = 10 + R }) * 1):requires_grad_(true)
  local parts = {}
  for r = 0, W - 1 do parts[r + 1] = fsdp.randn({ 3, 4 }, { seed = 10 + r }) end
  local y = C.gather(x, 1, world)
  T.eq(y, F.cat(parts, 1), 'gather on dim 1')
  local gy = fsdp.randn({ 3, 4 * W }, { seed = 20 })
  y:backward(gy)
  T.eq(x.grad, gy:narrow(1, R * 4, 4), 'gather backward = this rank\'s slice')
  local x2 = x:detach():requires_grad_(true)
  local y2 = C.gather(x2, 1, world, { backward = 'reduce_scatter' })
  y2:backward(gy)
  T.eq(x2.grad, gy:narrow(1, R * 4, 4) * W, 'gather backward by reduce-scatter (equal gradients sum)', 1e-6)
  local full = fsdp.randn({ 4 * W, 2 }, { seed = 30 }):requires_grad_(true)
  local s = C.split(full, 0, world)
  T.eq(s, full:narrow(0, R * 4, 4), 'split')
  local gs = fsdp.randn({ 4, 2 }, { seed = 40 + R })
  s:backward(gs)
  local all = {}
  for r = 0, W - 1 do all[r + 1] = fsdp.randn({ 4, 2 }, { seed = 40 + r }) end
  T.eq(full.grad, F.cat(all, 0), 'split backward = all-gather')
  local z = fsdp.full({ 2 * W, 3 }, R + 1):requires_grad_(true)
  local rs = C.reduce_scatter(z, 0, world)
  T.eq(rs, fsdp.full({ 2, 3 }, W * (W + 1) / 2), 'reduce_scatter')
  rs:backward(fsdp.full({ 2, 3 }, R + 1))
  local want_g = {}
  for r = 0, W - 1 do want_g[r + 1] = fsdp.full({ 2, 3 }, r + 1) end
  T.eq(z.grad, F.cat(want_g, 0), 'reduce_scatter backward = all-gather')
  local c = fsdp.full({ 2 }, 1):requires_grad_(true)
  local cy = C.copy_to(c, world)
  cy:backward(fsdp.full({ 2 }, R + 1))
  T.eq(c.grad, { W * (W + 1) / 2, W * (W + 1) / 2 }, 'copy_to backward = all-reduce')
  local d = fsdp.full({ 2 }, R + 1):requires_grad_(true)
  local dy = C.reduce_from(d, world)
  T.eq(dy, { W * (W + 1) / 2, W * (W + 1) / 2 }, 'reduce_from')
  T.eq(d, { R + 1, R + 1 }, 'reduce_from leaves its input alone')
  dy:backward(fsdp.full({ 2 }, 5))
  T.eq(d.grad, { 5, 5 }, 'reduce_from backward = identity')
end)

T.test('sizes not divisible by the TP size are refused naming the module', function()
  local function try(over, ...)
    local cfg = {}
    for k, v in pairs(CFG) do cfg[k] = v end
    for k, v in pairs(over) do cfg[k] = v end
    local m = llama.CausalLM(llama.config('Llama-2-7b', cfg), { device = 'meta' })
    T.raises(function() tp.parallelize(m, m:tp_plan(), { group = world }) end, ...)
    T.truthy(rawget(m.model.layers[1].self_attn.q_proj.weight, 'tp') == nil, 'a refused plan changed the model')
  end
  try({ n_heads = W + 1, n_kv_heads = 1, dim = 8 * (W + 1), ffn_dim = 64 }, 'n_heads', 'not divisible by tp')
  try({ n_kv_heads = 1 }, 'model.layers.0.self_attn', 'n_kv_heads 1 is not divisible by tp ' .. W)
  try({ ffn_dim = 64 + 1 }, 'model.layers.0.mlp.gate_proj', 'out_features 65')
  try({ vocab_size = 64 + 1 }, 'model.embed_tokens', 'vocab 65')
end)

T.done()
