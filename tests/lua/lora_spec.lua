-- lora_spec.lua: LoRA (fsdp.nn.LoRALinear, fsdp.lora): the layer's forward
-- and backward against the same math in plain ops, PEFT's init, apply by
-- names and its errors, merging, checkpoints that hold only the adapters
-- (their size, and a resume that continues bit for bit), and the PEFT
-- goldens both ways (tests/golden/make_lora_goldens.py): our adapter as
-- peft reads it, and peft's adapter loaded here, logits compared. Sharded
-- LoRA on 2 ranks: tests/mpi/lora.lua.
local fsdp = require 'fsdp'
local nn = fsdp.nn
local lora = require 'fsdp.lora'
local llama = require 'models.llama'
local hf = require 'models.hf'
local optim = require 'fsdp.optim'
local ckpt = require 'fsdp.checkpointing'
local files = require 'fsdp.io.files'
local T = require 'fsdp.testing'
local synthetic_tokens = require 'fsdp.data.synthetic_tokens'
local adapter = require 'tests.golden.lora_adapter'

local GOLDEN = 'tests/golden/hf/lora/'
local BASE_GOLDEN = fsdp.load_safetensors('tests/golden/hf/llama3_tiny_v5/golden.safetensors')
local LLAMA_BASE = adapter.CASES.llama.base

local root = os.tmpname()
os.remove(root)
files.mkdir_p(root)
teardown(function() files.remove_tree(root) end)

local function err_of(fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok)
  return tostring(err)
end

-- Logits on the inputs of a base golden (default the Llama's); T5 with
-- its padding masks.
local function logits_of(m, g)
  g = g or BASE_GOLDEN
  local masks = g.decoder_attention_mask and { attention_mask = g.attention_mask,
                                               decoder_attention_mask = g.decoder_attention_mask } or nil
  -- (under no_grad a decoder's loss returns its logits: [Note: the fused loss])
  local _, logits = fsdp.no_grad(function() return m:loss(g.input_ids, g.labels, masks) end)
  return logits
end

describe('nn.LoRALinear', function()
  local function layer()
    local lin = nn.Linear(6, 5):init_weights({ seed = 1 })
    local l = nn.LoRALinear(lin, { rank = 2, alpha = 4, seed = 2, name = 'l' })
    fsdp.autograd.no_grad(function() l.lora_B.weight:copy_(fsdp.randn({ 5, 2 }, { seed = 3 })) end)
    return l
  end

  it('computes x W^T + b + x A^T B^T alpha/r, and gradients only for the adapter', function()
    local l = layer()
    local x = fsdp.randn({ 2, 3, 6 }, { seed = 4 })
    x:requires_grad_(true)
    local y = l(x)
    -- the same with plain ops on copies
    local W, b = l.weight:detach(), l.bias:detach()
    local A, B = l.lora_A.weight:detach():clone(), l.lora_B.weight:detach():clone()
    A:requires_grad_(true); B:requires_grad_(true)
    local x2 = x:detach():clone()
    x2:requires_grad_(true)
    local want = x2:matmul(W:t()) + b + x2:matmul(A:t()):matmul(B:t()) * 2
    assert.is_true(T.max_abs_diff(y, want) < 1e-5)
    local g = fsdp.randn({ 2, 3, 5 }, { seed = 5 })
    local ly, lw = (y * g):sum(), (want * g):sum()
    ly:backward()
    lw:backward()
    assert.is_true(T.max_abs_diff(l.lora_A.weight.grad, A.grad) < 1e-5)
    assert.is_true(T.max_abs_diff(l.lora_B.weight.grad, B.grad) < 1e-5)
    assert.is_true(T.max_abs_diff(x.grad, x2.grad) < 1e-5)
    assert.is_nil(l.weight.grad)
    assert.is_false(l.weight.requires_grad)
    assert.is_false(l.bias.requires_grad)
  end)

  it("inits as PEFT: A kaiming-uniform (bound 1/sqrt(in_features)), B zeros; a fresh adapter changes nothing", function()
    local lin = nn.Linear(64, 32):init_weights({ seed = 1 })
    local l = nn.LoRALinear(lin, { rank = 8, seed = 2 })
    local A = l.lora_A.weight
    assert.same({ 8, 64 }, A.shape)
    assert.same({ 32, 8 }, l.lora_B.weight.shape)
    assert.is_true(A:abs():max():item() <= 1 / 8)
    assert.is_true(A:abs():max():item() > 0.1) -- spread over the bound
    assert.equals(0, l.lora_B.weight:abs():max():item())
    local x = fsdp.randn({ 3, 64 }, { seed = 3 })
    assert.equals(0, T.max_abs_diff(l(x), lin(x)))
  end)

  it('drops the adapter\'s input in training only (the base path never)', function()
    local lin = nn.Linear(16, 8):init_weights({ seed = 1 })
    local l = nn.LoRALinear(lin, { rank = 4, dropout = 0.5, seed = 2 })
    fsdp.autograd.no_grad(function() l.lora_B.weight:copy_(fsdp.randn({ 8, 4 }, { seed = 3 })) end)
    local x = fsdp.randn({ 4, 16 }, { seed = 4 })
    local train = l(x)
    l:eval()
    local eval = l(x)
    local want = lin(x) + x:matmul(l.lora_A.weight:t()):matmul(l.lora_B.weight:t()) * l.scaling
    assert.is_true(T.max_abs_diff(eval, want) < 1e-5)
    assert.is_true(T.max_abs_diff(train, eval) > 1e-3)
    -- with the adapter at zero, dropout changes nothing: the base is not dropped
    fsdp.autograd.no_grad(function() l.lora_B.weight:fill_(0) end)
    l:train()
    assert.equals(0, T.max_abs_diff(l(x), lin(x)))
  end)

  it('refuses what is not a Linear and bad settings', function()
    assert.matches('expects a Linear, got Embedding', err_of(nn.LoRALinear, nn.Embedding(4, 2), { rank = 2 }))
    assert.matches('LoRALinear: rank must be >= 1, got 0', err_of(nn.LoRALinear, nn.Linear(4, 2), { rank = 0 }), 1, true)
    assert.matches('LoRALinear: dropout must be < 1, got 1',
      err_of(nn.LoRALinear, nn.Linear(4, 2), { rank = 1, dropout = 1 }), 1, true)
    -- issue 38: NaN passes `alpha <= 0`, and every output was NaN
    assert.matches('LoRALinear: alpha must be a finite number, got nan',
      err_of(nn.LoRALinear, nn.Linear(4, 2), { rank = 1, alpha = 0 / 0 }), 1, true)
    assert.matches('LoRALinear: rank must be a finite number, got inf',
      err_of(nn.LoRALinear, nn.Linear(4, 2), { rank = math.huge }), 1, true)
  end)
end)

describe('fsdp.lora.apply', function()
  local CFG = { dim = 32, n_layers = 2, n_heads = 4, n_kv_heads = 2, ffn_dim = 64, vocab_size = 64, max_seq_len = 32 }
  local function meta() return llama.CausalLM(llama.config('Llama-2-7b', CFG), { device = 'meta' }) end

  it("adapts the Linears a name ends with (PEFT's rule) and freezes the rest", function()
    local m = meta()
    local names = lora.apply(m, { rank = 4, alpha = 8, targets = 'q_proj,layers.1.mlp.down_proj' })
    assert.same({ 'model.layers.0.self_attn.q_proj', 'model.layers.1.self_attn.q_proj', 'model.layers.1.mlp.down_proj' },
      names)
    local trainable = {}
    for _, np in ipairs(lora.trainable(m)) do trainable[#trainable + 1] = np[1] end
    assert.same({ 'model.layers.0.self_attn.q_proj.lora_A.weight', 'model.layers.0.self_attn.q_proj.lora_B.weight',
                  'model.layers.1.self_attn.q_proj.lora_A.weight', 'model.layers.1.self_attn.q_proj.lora_B.weight',
                  'model.layers.1.mlp.down_proj.lora_A.weight', 'model.layers.1.mlp.down_proj.lora_B.weight' }, trainable)
    local n = lora.count(m)
    assert.equals(2 * (4 * 32 + 32 * 4) + (4 * 64 + 32 * 4), n.trainable)
    assert.equals(m:num_parameters(), n.total)
    -- the base keeps its names (Hugging Face's)
    local has = {}
    for _, np in ipairs(m:named_parameters()) do has[np[1]] = true end
    assert.is_true(has['model.layers.0.self_attn.q_proj.weight'])
  end)

  it('refuses a target that matches nothing or no Linear, naming it and the Linears there are', function()
    local e = err_of(lora.apply, meta(), { rank = 2, targets = { 'q_proj', 'query' } })
    assert.matches("target 'query' matches no module of the model %(its Linears: q_proj, k_proj, v_proj, o_proj, "
      .. 'gate_proj, up_proj, down_proj, lm_head%)', e)
    assert.matches("target 'mlp' matches model.layers.0.mlp, a LlamaMLP, not a Linear",
      err_of(lora.apply, meta(), { rank = 2, targets = 'mlp' }))
    assert.matches('targets must be a non%-empty list', err_of(lora.apply, meta(), { rank = 2, targets = '' }))
    assert.matches("unknown option 'r'", err_of(lora.apply, meta(), { r = 2, targets = 'q_proj' }))
    assert.matches('rank is required', err_of(lora.apply, meta(), { targets = 'q_proj' }))
    local m = meta()
    lora.apply(m, { rank = 2, targets = 'q_proj' })
    assert.matches('has LoRA adapters already', err_of(lora.apply, m, { rank = 2, targets = 'v_proj' }))
    local s = meta()
    fsdp.shard(s, {})
    assert.matches('apply LoRA before fsdp.shard', err_of(lora.apply, s, { rank = 2, targets = 'q_proj' }))
    local live = meta():init_weights({ seed = 1, device = 'cpu' })
    assert.matches('base_dtype needs the model on the meta device',
      err_of(lora.apply, live, { rank = 2, targets = 'q_proj', base_dtype = 'bf16' }))
  end)

  it('keeps the frozen base in base_dtype, the adapters in the model dtype; sharded, the base has no gradient', function()
    local m = meta()
    lora.apply(m, { rank = 4, targets = 'q_proj', base_dtype = 'bf16' })
    for _, np in ipairs(m:named_parameters()) do
      assert.equals(np[1]:match('lora_') and 'f32' or 'bf16', np[2].dtype, np[1])
    end
    fsdp.shard(m, { policy = fsdp.policy.transformer { llama.DecoderLayer }, seed = 3 })
    local ids = fsdp.randint(0, 64, { 2, 8 }, { seed = 1 })
    m:loss(ids, ids):backward()
    local mem = fsdp.sharding.memory(m)
    assert.equals(lora.count(m).trainable * 4, mem.grads)
    local frozen_bytes = 0
    for _, u in ipairs(fsdp.sharding.units(m)) do
      if u.frozen then frozen_bytes = frozen_bytes + u:shard_bytes() end
    end
    assert.equals((lora.count(m).frozen) * 2, frozen_bytes) -- one rank holds all, in bf16
    -- summoned whole (generation does), the bf16 base comes in the model's dtype
    local a = fsdp.autograd.no_grad(function() return m(ids) end)
    local b = fsdp.summon_full_params(m, function() return fsdp.autograd.no_grad(function() return m(ids) end) end)
    assert.equals(0, T.max_abs_diff(a, b))
  end)
end)

describe('sharded LoRA backward', function()
  local CFG = { dim = 32, n_layers = 3, n_heads = 4, n_kv_heads = 2, ffn_dim = 64, vocab_size = 64, max_seq_len = 32 }
  it('frees a frozen unit once backward has passed it, not at the end of backward', function()
    -- Only layer 0 adapted: layers 1 and 2 are all frozen; by the time
    -- layer 0's gradient is reduced they are free again. (A bf16 base: a
    -- one-rank unit of the model's dtype would be its shard, never freed.)
    local m = llama.CausalLM(llama.config('Llama-2-7b', CFG), { device = 'meta' })
    lora.apply(m, { rank = 2, targets = 'layers.0.self_attn.q_proj', base_dtype = 'bf16' })
    fsdp.shard(m, { policy = fsdp.policy.transformer { llama.DecoderLayer }, seed = 1 })
    local S = fsdp.sharding.state_of(m, 'test')
    local post, seen = S.post_backward, nil
    S.post_backward = function(self, u, grads)
      if u.name == 'model.layers.0' then
        seen = {}
        for _, v in ipairs(self.units) do seen[v.name .. (v.frozen and ' frozen' or '')] = v:state() end
      end
      return post(self, u, grads)
    end
    local ids = fsdp.randint(0, 64, { 2, 8 }, { seed = 1 })
    m:loss(ids, ids):backward()
    S.post_backward = nil
    assert.equals('SHARDED', seen['model.layers.1 frozen'])
    assert.equals('SHARDED', seen['model.layers.2 frozen'])
    assert.equals('UNSHARDED', seen['model.layers.0 frozen']) -- freed with its partner, just after
    for _, u in ipairs(fsdp.sharding.units(m)) do
      if u.frozen then assert.equals('SHARDED', u:state(), u:label()) end
    end
  end)
end)

describe('sharded LoRA with activation checkpointing', function()
  local CFG = { dim = 32, n_layers = 3, n_heads = 4, n_kv_heads = 2, ffn_dim = 64, vocab_size = 64, max_seq_len = 32 }
  local function grads(ck, targets)
    local m = llama.CausalLM(llama.config('Llama-2-7b', CFG), { device = 'meta' })
    lora.apply(m, { rank = 4, targets = targets, base_dtype = 'bf16' })
    fsdp.shard(m, { policy = fsdp.policy.transformer { llama.DecoderLayer }, seed = 1 })
    if ck then fsdp.checkpoint(m, function(x) return x:is_instance_of(llama.DecoderLayer) end) end
    local ids = fsdp.randint(0, 64, { 2, 8 }, { seed = 1 })
    m:loss(ids, ids):backward()
    local out = {}
    for _, np in ipairs(lora.trainable(m)) do out[np[1]] = np[2].grad:clone() end
    for _, u in ipairs(fsdp.sharding.units(m)) do
      if u.frozen then assert.equals('SHARDED', u:state(), u:label()) end
    end
    return out
  end
  it('gives the same adapter gradients, frozen-only layers too, and frees every frozen unit', function()
    for _, targets in ipairs({ 'o_proj,down_proj', 'layers.0.self_attn.o_proj' }) do
      local want, got = grads(false, targets), grads(true, targets)
      local n = 0
      for name, g in pairs(want) do
        assert.equals(0, T.max_abs_diff(got[name], g), name)
        n = n + 1
      end
      assert.is_true(n > 0)
    end
  end)
end)

describe('sharded LoRA on cuda:0', function()
  if not fsdp.cuda.is_available() then
    pending('no GPU here (' .. fsdp.cuda.status() .. '): LoRA on cuda was not run (tests/cudasim/run.sh runs it)')
    return
  end
  local CFG = { dim = 32, n_layers = 2, n_heads = 4, n_kv_heads = 2, ffn_dim = 64, vocab_size = 64, max_seq_len = 32 }
  local function losses(device, base_dtype, mp)
    local m = llama.CausalLM(llama.config('Llama-2-7b', CFG), { device = 'meta' })
    lora.apply(m, { rank = 4, alpha = 8, targets = 'q_proj,o_proj,down_proj', base_dtype = base_dtype })
    fsdp.shard(m, { policy = fsdp.policy.transformer { llama.DecoderLayer }, seed = 2, device = device,
                    mixed_precision = mp })
    local opt = optim.AdamW(lora.trainable(m), { lr = 1e-2 })
    local ids = fsdp.randint(0, 64, { 2, 16 }, { seed = 10 }):to(device)
    local out = {}
    for step = 1, 4 do
      local loss = m:loss(ids, ids)
      loss:backward()
      opt:step()
      opt:zero_grad()
      out[step] = loss:item()
    end
    return out
  end
  for _, case in ipairs({ { nil, nil, 1e-5 }, { 'bf16', nil, 1e-5 }, { 'bf16', 'bf16', 2e-2 } }) do
    it(('trains as on the CPU: base %s, compute %s'):format(case[1] or 'f32', case[2] or 'f32'), function()
      local want, got = losses('cpu', case[1], case[2]), losses('cuda:0', case[1], case[2])
      assert.is_true(want[4] < want[1], 'the loss falls')
      for i = 1, #want do
        assert.is_true(math.abs(got[i] - want[i]) <= case[3] * math.abs(want[i]),
          ('step %d: %.8g on cuda, %.8g on cpu'):format(i, got[i], want[i]))
      end
    end)
  end
end)

describe('fsdp.plan of a LoRA model', function()
  local CFG = { dim = 64, n_layers = 4, n_heads = 4, n_kv_heads = 4, ffn_dim = 128, vocab_size = 256, max_seq_len = 32 }
  local function plan(with_lora, base_dtype)
    local m = llama.CausalLM(llama.config('Llama-2-7b', CFG), { device = 'meta' })
    if with_lora then lora.apply(m, { rank = 4, targets = 'q_proj,v_proj', base_dtype = base_dtype }) end
    return fsdp.plan(m, { world = 4, batch = 2, seq = 32 }), m
  end

  it('counts no gradient, optimizer state or reduction for the frozen base; its shards in base_dtype', function()
    local full = plan(false)
    local p, m = plan(true)
    local n = lora.count(m)
    local function shard(numel) return math.ceil(numel / 4) end
    -- every layer's adapters: 4 units of 2 x (4 x 64 + 64 x 4) elements, padded per unit
    assert.equals(CFG.n_layers * shard(2 * (4 * 64 + 64 * 4)) * 4, p.memory.grads)
    assert.equals(p.memory.grads * 2, p.memory.optimizer) -- AdamW: two f32 moments
    assert.is_true(p.memory.params >= full.memory.params) -- the same parameters, one more padding per unit
    assert.equals(CFG.n_layers, p.comm.reduce_scatter.calls)
    assert.equals(full.comm.all_gather.calls + 2 * CFG.n_layers, p.comm.all_gather.calls) -- the partners
    assert.is_true(p.flops.model < full.flops.model) -- no weight gradients for the base
    assert.matches(('%d trainable, %d frozen in f32'):format(n.trainable, n.frozen):gsub(',', ''),
      tostring(p):gsub(',', ''))
    local half = plan(true, 'bf16')
    assert.is_true(math.abs(half.memory.params - (p.memory.params - full.memory.params / 2)) < 4096)
  end)
end)

describe('merging', function()
  it('merge folds B A alpha/r into the weights: same logits, plain Linears, the state dict of the base', function()
    local m = adapter.build('llama')
    local want = logits_of(m)
    local sd = lora.merged_state_dict(m)
    lora.merge(m)
    assert.equals(0, #lora.layers(m))
    assert.is_true(T.max_abs_diff(logits_of(m), want) < 1e-5)
    -- merged_state_dict (taken before) holds what merge made, under the
    -- base model's names
    local base = hf.from_pretrained(LLAMA_BASE, { dtype = 'f32' })
    local merged = {}
    for _, np in ipairs(m:named_parameters()) do merged[np[1]] = np[2] end
    local names = 0
    for _, np in ipairs(base:named_parameters()) do
      names = names + 1
      assert.is_not_nil(sd[np[1]], np[1])
      assert.is_true(T.max_abs_diff(sd[np[1]], merged[np[1]]) < 1e-6, np[1])
    end
    for name in pairs(sd) do assert.is_nil(name:match('lora_'), name) end
    assert.is_true(names > 0)
    assert.matches('no LoRA layers', err_of(lora.merge, m))
    -- the merged model exports as any Llama and loads back with its logits
    local dir = root .. '/merged_hf'
    hf.save_pretrained(m, dir)
    assert.is_true(T.max_abs_diff(logits_of(hf.from_pretrained(dir, { dtype = 'f32' })), want) < 1e-5)
  end)
end)

describe('PEFT goldens', function()
  for _, case in ipairs({ 'llama', 'gpt2', 't5' }) do
    -- f32 tolerance relative to the logits' scale, as the HF specs': the
    -- bases alone differ from transformers' by up to ~4e-7 of it (T5)
    it(case .. ": our adapter, as peft loads it: our logits are peft's, and merged too (f32, 2e-6 of their scale)",
       function()
      local g = fsdp.load_safetensors(GOLDEN .. case .. '/golden.safetensors')
      local inputs = fsdp.load_safetensors(adapter.CASES[case].base .. '/golden.safetensors')
      local tol = 2e-6 * g.logits_peft:abs():max():item()
      local m = adapter.build(case)
      assert.is_true(T.max_abs_diff(logits_of(m, inputs), g.logits_peft) < tol)
      -- what save_peft writes is what peft read for the golden
      local dir = root .. '/ours_' .. case
      lora.save_peft(m, dir)
      local got, want = fsdp.load_safetensors(dir .. '/adapter_model.safetensors'),
                        fsdp.load_safetensors(GOLDEN .. case .. '/adapter_model.safetensors')
      local n = 0
      for name, t in pairs(want) do
        assert.is_not_nil(got[name], name)
        assert.equals(0, T.max_abs_diff(got[name], t), name)
        n = n + 1
      end
      for name in pairs(got) do assert.is_not_nil(want[name], name) end
      assert.equals(2 * #lora.layers(m), n)
      assert.equals(files.read(GOLDEN .. case .. '/adapter_config.json'), files.read(dir .. '/adapter_config.json'))
      lora.merge(m)
      assert.is_true(T.max_abs_diff(logits_of(m, inputs), g.logits_merged) < tol)
    end)
  end

  it("peft's adapter loads here (load_peft applies its config): logits equal peft's (f32, 1e-5)", function()
    local g = fsdp.load_safetensors(GOLDEN .. 'peft_llama/golden.safetensors')
    local m = hf.from_pretrained(LLAMA_BASE, { dtype = 'f32' })
    lora.load_peft(m, GOLDEN .. 'peft_llama')
    m:eval() -- lora_dropout 0.1 in the config: peft's logits are in eval mode
    assert.equals(4 * 2, #lora.layers(m))
    assert.equals(0.1, lora.layers(m)[1][2].lora_dropout.p)
    assert.is_true(T.max_abs_diff(logits_of(m), g.logits_peft) < 1e-5)
  end)

  it("peft's adapter loads into a sharded model (applied on meta, the base loaded into the shards)", function()
    local g = fsdp.load_safetensors(GOLDEN .. 'peft_llama/golden.safetensors')
    local m = hf.from_pretrained(LLAMA_BASE, { device = 'meta' })
    local cfg = require('fsdp.io.json').decode(files.read(GOLDEN .. 'peft_llama/adapter_config.json'))
    lora.apply(m, { rank = cfg.r, alpha = cfg.lora_alpha, dropout = cfg.lora_dropout, targets = cfg.target_modules })
    fsdp.shard(m, { policy = fsdp.policy.transformer { llama.DecoderLayer } })
    -- the base from the Hugging Face files: every name but the adapters'
    local _, unexpected = fsdp.safetensors.load_into(m, LLAMA_BASE, { strict = false })
    assert.same({}, unexpected)
    lora.load_peft(m, GOLDEN .. 'peft_llama')
    m:eval()
    local logits = logits_of(m)
    assert.is_true(T.max_abs_diff(logits, g.logits_peft) < 2e-6 * g.logits_peft:abs():max():item())
  end)

  it('refuses adapters it cannot honour, naming the file and the key', function()
    local dir = root .. '/dora'
    files.mkdir_p(dir)
    local text = files.read(GOLDEN .. 'peft_llama/adapter_config.json'):gsub('"use_dora": false', '"use_dora": true')
    files.write_atomic(dir .. '/adapter_config.json', text)
    assert.matches('adapter_config.json: use_dora is true', err_of(lora.load_peft,
      hf.from_pretrained(LLAMA_BASE, { dtype = 'f32' }), dir))
    -- the weights of another adapter: a rank its shapes do not have, found
    -- from the header before anything is applied
    local other = files.read(GOLDEN .. 'llama/adapter_config.json')
    files.write_atomic(dir .. '/adapter_config.json', other)
    local f = io.open(dir .. '/adapter_model.safetensors', 'wb')
    f:write(files.read(GOLDEN .. 'peft_llama/adapter_model.safetensors'))
    f:close()
    assert.matches('adapter_config.json: r is 4, but base_model.model.model.layers.0.mlp.gate_proj.lora_A.weight in '
      .. dir .. '/adapter_model.safetensors is [8, 32] (its rank 8)',
      err_of(lora.load_peft, hf.from_pretrained(LLAMA_BASE, { dtype = 'f32' }), dir), 1, true)
    -- ... or, of the same rank, names that are not the model's
    files.write_atomic(dir .. '/adapter_config.json', (other:gsub('"r": 4', '"r": 8')))
    assert.matches('adapter_model.safetensors does not fit the model: missing model.layers.0.self_attn.q_proj.lora_A.weight',
      err_of(lora.load_peft, hf.from_pretrained(LLAMA_BASE, { dtype = 'f32' }), dir))
  end)

  -- issue 38: NaN passed `> 0` checks; every logit was NaN and the run exited 0
  it('refuses non-finite numbers in adapter_config.json and non-finite adapter weights, naming the key or tensor',
    function()
    local base = files.read(GOLDEN .. 'peft_llama/adapter_config.json')
    local weights = files.read(GOLDEN .. 'peft_llama/adapter_model.safetensors')
    local function adapter(name, config, data)
      local dir = root .. '/' .. name
      files.mkdir_p(dir)
      files.write_atomic(dir .. '/adapter_config.json', config)
      local w = io.open(dir .. '/adapter_model.safetensors', 'wb')
      w:write(data or weights)
      w:close()
      return dir
    end
    for _, case in ipairs({
      { '"lora_alpha": 16', '"lora_alpha": NaN', 'lora_alpha must be a finite number, got nan' },
      { '"lora_alpha": 16', '"lora_alpha": Infinity', 'lora_alpha must be a finite number, got inf' },
      { '"lora_alpha": 16', '"lora_alpha": -16', 'lora_alpha must be > 0, got -16' },
      { '"r": 8', '"r": 1e300', 'r must be an integer of at most 2^53' },
      { '"r": 8', '"r": 2.5', 'r must be an integer, got 2.5' },
      { '"lora_dropout": 0.1', '"lora_dropout": NaN', 'lora_dropout must be a finite number, got nan' },
      { '"r": 8', '"r": {"q_proj": 8}', 'r must be a number, got {"q_proj": 8}' },
    }) do
      assert(base:find(case[1], 1, true), case[1])
      local dir = adapter('bad_number', (base:gsub(case[1]:gsub('%p', '%%%0'), case[2])))
      local m = hf.from_pretrained(LLAMA_BASE, { dtype = 'f32' })
      local err = err_of(lora.load_peft, m, dir)
      assert.matches(dir .. '/adapter_config.json: ' .. case[3], err, 1, true)
      assert.is_nil(lora.config_of(m), 'applied before the refusal')
    end
    -- a NaN in the adapter's weights: named with the element, before it loads
    local st_file = require 'fsdp.io.safetensors'
    local f = st_file.open(GOLDEN .. 'peft_llama/adapter_model.safetensors')
    local tensors, names = {}, f:names()
    for _, name in ipairs(names) do tensors[#tensors + 1] = { name, f:get(name):clone() } end
    f:close()
    local poisoned = names[2]
    for _, e in ipairs(tensors) do
      if e[1] == poisoned then e[2]:view(-1):narrow(0, 3, 1):fill_(0 / 0) end
    end
    local dir = adapter('nan_weights', base)
    st_file.save(dir .. '/adapter_model.safetensors', tensors, { format = 'pt' })
    local err = err_of(lora.load_peft, hf.from_pretrained(LLAMA_BASE, { dtype = 'f32' }), dir)
    assert.matches(dir .. '/adapter_model.safetensors: ' .. poisoned .. ' holds a NaN or infinite value (element 3)',
      err, 1, true)
    -- and save_peft never writes one
    local m = hf.from_pretrained(LLAMA_BASE, { dtype = 'f32' })
    lora.apply(m, { rank = 2, targets = 'q_proj' })
    fsdp.no_grad(function() m.model.layers[1].self_attn.q_proj.lora_B.weight:fill_(math.huge) end)
    err = err_of(lora.save_peft, m, root .. '/nan_export')
    assert.matches("tensor 'base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight' is not finite", err, 1, true)
  end)
end)

describe('LoRA checkpoints', function()
  local CFG = { dim = 64, n_layers = 2, n_heads = 4, n_kv_heads = 4, ffn_dim = 128, vocab_size = 256, max_seq_len = 32 }
  local function setup()
    local m = llama.CausalLM(llama.config('Llama-2-7b', CFG), { device = 'meta' })
    lora.apply(m, { rank = 2, alpha = 4, targets = 'q_proj,v_proj' })
    fsdp.shard(m, { policy = fsdp.policy.transformer { llama.DecoderLayer }, seed = 4 })
    local opt = optim.AdamW(lora.trainable(m), { lr = 1e-2 })
    local data = synthetic_tokens.new(CFG.vocab_size, { batch_size = 2, seq_len = 16, seed = 0 })
    return { model = m, optimizer = opt, data = data }
  end
  local function step(s)
    local ids, tg = s.data:next()
    local loss = s.model:loss(ids, tg)
    loss:backward()
    s.optimizer:step()
    s.optimizer:zero_grad()
    return loss:item()
  end

  it('hold the adapters and their optimizer state only (small), and resume bit for bit', function()
    local dir = root .. '/ckpt'
    local a = setup()
    for _ = 1, 2 do step(a) end
    local path = ckpt.save(dir, { model = a.model, optimizer = a.optimizer, data = a.data, step = 2 })
    local bytes = 0
    for _, name in ipairs(files.list(path)) do bytes = bytes + files.size(files.join(path, name)) end
    local n = lora.count(a.model)
    -- parameters + AdamW's two moments in f32, plus headers and the index
    assert.is_true(bytes >= 3 * 4 * n.trainable, bytes)
    assert.is_true(bytes < 3 * 4 * n.trainable + 64 * 1024, ('%d bytes for %d trainable parameters'):format(bytes,
      n.trainable))
    assert.is_true(bytes < 4 * n.frozen / 10) -- a tenth of the base's bytes, here ~1/25
    local index = require('fsdp.io.json').decode(files.read(path .. '/index.json'))
    for _, part in ipairs(index.parts) do
      for _, p in ipairs(part.params) do
        assert.is_true(p.name:match('lora_') ~= nil or part.kind == 'buffer', p.name)
      end
    end
    local want = {}
    for i = 1, 2 do want[i] = step(a) end
    local b = setup()
    assert.equals(2, ckpt.load(dir, b).step)
    for i = 1, 2 do assert.equals(want[i], step(b)) end
    local pa, pb = fsdp.full_state_dict(a.model), fsdp.full_state_dict(b.model)
    for name, t in pairs(pa) do assert.equals(0, T.max_abs_diff(t, pb[name]), name) end
  end)

  it('load into adapters of the same settings only: no LoRA, another alpha or targets are refused, named', function()
    local dir = root .. '/full'
    local m = llama.CausalLM(llama.config('Llama-2-7b', CFG), { device = 'meta' })
    fsdp.shard(m, { policy = fsdp.policy.transformer { llama.DecoderLayer }, seed = 4 })
    ckpt.save(dir, { model = m, step = 1 })
    assert.matches('was saved with no LoRA adapters; the model has LoRA rank 2, alpha 4 on q_proj,v_proj',
      err_of(ckpt.load, dir, { model = setup().model }))
    local a = setup()
    ckpt.save(root .. '/lora', { model = a.model, step = 1 })
    for _, other in ipairs({ { alpha = 8, targets = 'q_proj,v_proj' }, { alpha = 4, targets = 'q_proj' } }) do
      local b = llama.CausalLM(llama.config('Llama-2-7b', CFG), { device = 'meta' })
      lora.apply(b, { rank = 2, alpha = other.alpha, targets = other.targets })
      fsdp.shard(b, { policy = fsdp.policy.transformer { llama.DecoderLayer }, seed = 4 })
      assert.matches('was saved with LoRA rank 2, alpha 4 on q_proj,v_proj; the model has LoRA rank 2, alpha '
        .. other.alpha, err_of(ckpt.load, root .. '/lora', { model = b }))
    end
    assert.matches('was saved with LoRA rank 2, alpha 4 on q_proj,v_proj; the model has no LoRA adapters',
      err_of(ckpt.load, root .. '/lora', { model = m }))
  end)
end)

describe('the recipes with --lora_rank', function()
  local run = T.run_exe
  -- --device=cpu: in the cudasim build auto is cuda, whose default is bf16.
  local TINY = 'recipes/llama2_7b.lua --device=cpu --num_layers=2 --hidden_width=64 --num_heads=4 --vocab_size=128 '
    .. '--seq_len=16 --batch_size=2 --warmup_steps=0 --validation_freq=0 --lora_rank=2'

  it('train the adapters only, checkpoint them (small) and resume', function()
    local dir = root .. '/recipe_ckpt'
    local rc, out, err = run(TINY .. ' --max_steps=2 --checkpoint_freq=2 --checkpoint_dir=' .. dir)
    assert.equals(0, rc, err)
    assert.matches('lora: rank 2, alpha 16 on 4 Linears %(q_proj,v_proj%): 1024 trainable of 124224 parameters', out)
    assert.matches('sharding: FULL_SHARD over 1 rank, 5 units %(3 frozen%), compute f32, reduce f32; rank 0 holds '
      .. '0%.004 MiB of trainable shards, 0%.470 MiB frozen %(f32%)', out)
    local bytes = 0
    local step = dir .. '/step-000002'
    for _, name in ipairs(files.list(step)) do bytes = bytes + files.size(files.join(step, name)) end
    assert.is_true(bytes < 3 * 4 * 1024 + 64 * 1024, bytes) -- adapters and their AdamW moments
    rc, out, err = run(TINY .. ' --max_steps=3 --resume_from_checkpoint --checkpoint_dir=' .. dir)
    assert.equals(0, rc, err)
    assert.matches('Batch 3 ', out)
  end)

  it('refuse a target the model lacks before printing anything, naming --lora_targets', function()
    local rc, out, err = run(TINY .. ' --lora_targets=q_proj,query')
    assert.equals(2, rc)
    assert.equals('', out)
    assert.matches("^fsdp%-lua: %-%-lora_targets q_proj,query: target 'query' matches no module", err)
    rc, out, err = run('recipes/t5_3b.lua --model=tiny --lora_dropout=0.1')
    assert.equals(2, rc)
    assert.matches('%-%-lora_dropout needs %-%-lora_rank', err)
  end)

  -- issue 38: the fit check refused lm_head with the planner's "block 1
  -- did not run forward and backward once": with only the head adapted no
  -- gradient reaches a block, and none needs one
  it('adapt lm_head alone: the plan has frozen blocks no gradient reaches, and it trains', function()
    local rc, out, err = run(TINY .. ' --max_steps=2 --lora_targets=lm_head')
    assert.equals(0, rc, err)
    assert.matches('lora: rank 2, alpha 16 on 1 Linears %(lm_head%)', out)
    assert.matches('Batch 2 ', out)
  end)

  -- issue 38: LoRA options given without LoRA (or without an export) were
  -- ignored without a word
  it('refuse LoRA and export options that would be ignored, naming them', function()
    for _, case in ipairs({
      { '--export_lora=adapter', '--export_lora needs --lora_rank' },
      { '--export_lora=merged', '--export_lora needs --lora_rank' },
      { '--export_lora=adapter --lora_rank=2', '--export_lora needs --export_hf' },
      { '--lora_alpha=8', '--lora_alpha needs --lora_rank' },
    }) do
      local rc, out, err = run('recipes/llama2_7b.lua --model=tiny ' .. case[1])
      assert.equals(2, rc, err)
      assert.equals('', out)
      assert.equals('fsdp-lua: ' .. case[2] .. '\n', err)
    end
  end)
end)
