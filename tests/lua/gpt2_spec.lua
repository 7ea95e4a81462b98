-- gpt2_spec.lua: models/gpt2.lua against Hugging Face's facts (exact
-- parameter counts of the four released sizes on meta, GPT2LMHeadModel's
-- names and shapes, the tied head, nanoGPT's init), against a reference
-- GPT-2 written here from plain ops in float64 (logits, loss and every
-- gradient), Hugging Face checkpoint layout (Conv1D weights transposed),
-- and a tiny GPT-2 that learns synthetic data. Also the shared blocks it is
-- built from, nn.Attention (fused and separate projections, masks,
-- cross-attention, the dropout path) and nn.GatedMLP / nn.MLP, against
-- the same plain ops.
local fsdp = require 'fsdp'
local nn = require 'fsdp.nn'
local F = require 'fsdp.functional'
local gpt2 = require 'models.gpt2'
local T = require 'fsdp.testing'

-- max |a - b| within tol, the difference in the message.
local function assert_close(a, b, tol, what)
  local diff = T.max_abs_diff(a, b)
  assert(diff <= tol, ('%s: max difference %g > %g'):format(what or 'tensors', diff, tol))
end

-- plain-op references --------------------------------------------------------------------

local function ref_layer_norm(x, w, b, eps)
  local mu = x:mean(-1, true)
  local xc = x - mu
  local var = (xc * xc):mean(-1, true)
  return xc / F.sqrt(var + eps) * w + b
end

local function ref_gelu_tanh(x)
  return x * 0.5 * (F.tanh((x + x * x * x * 0.044715) * math.sqrt(2 / math.pi)) + 1)
end

local function ref_softmax(s)
  local e = F.exp(s - (s:max(-1, true)))
  return e / e:sum(-1, true)
end

-- softmax(q k^T * scale + bias, causal) v for q [B, H, T, hd], k and v
-- [B, H, S, hd] (heads already matched), from matmul and exp.
local function ref_attention(q, k, v, causal, bias, scale)
  local Tq, S = q:size(2), k:size(2)
  local s = F.matmul(q, k:transpose(2, 3)) * (scale or 1 / math.sqrt(q:size(3)))
  if bias then s = s + bias end
  if causal then
    local rows = fsdp.arange(Tq, { dtype = 'i64' }):view(Tq, 1)
    local cols = fsdp.arange(S, { dtype = 'i64' }):view(1, S)
    s = F.masked_fill(s, F.gt(cols, rows), -math.huge)
  end
  return F.matmul(ref_softmax(s), v)
end

local function heads(t, B, T_, H, hd) return t:reshape(B, T_, H, hd):transpose(1, 2) end

-- GPT-2 from its parameters by name, no module called: x W^T as matmul,
-- LayerNorm from means, the tanh GELU and softmax from tanh and exp, the
-- loss from a one-hot sum.
local function ref_gpt2(model, ids, targets)
  local c = model.config
  local P = {}
  for _, np in ipairs(model:named_parameters()) do P[np[1]] = np[2] end
  local B, Tn, d, H, hd = ids:size(0), ids:size(1), c.dim, c.n_heads, c.head_dim
  local function lin(x, name) return F.matmul(x, P[name .. '.weight']:t()) + P[name .. '.bias'] end
  local pos = fsdp.arange(Tn, { dtype = 'i64' })
  local x = F.embedding(ids, P['transformer.wte.weight']) + F.embedding(pos, P['transformer.wpe.weight'])
  for l = 0, c.n_layers - 1 do
    local pre = 'transformer.h.' .. l .. '.'
    local h = ref_layer_norm(x, P[pre .. 'ln_1.weight'], P[pre .. 'ln_1.bias'], c.norm_eps)
    local qkv = lin(h, pre .. 'attn.c_attn')
    local q = heads(qkv:narrow(2, 0, d), B, Tn, H, hd)
    local k = heads(qkv:narrow(2, d, d), B, Tn, H, hd)
    local v = heads(qkv:narrow(2, 2 * d, d), B, Tn, H, hd)
    local o = ref_attention(q, k, v, true):transpose(1, 2):reshape(B, Tn, d)
    x = x + lin(o, pre .. 'attn.c_proj')
    h = ref_layer_norm(x, P[pre .. 'ln_2.weight'], P[pre .. 'ln_2.bias'], c.norm_eps)
    x = x + lin(ref_gelu_tanh(lin(h, pre .. 'mlp.c_fc')), pre .. 'mlp.c_proj')
  end
  x = ref_layer_norm(x, P['transformer.ln_f.weight'], P['transformer.ln_f.bias'], c.norm_eps)
  local logits = F.matmul(x, P['transformer.wte.weight']:t())
  local z = logits - logits:max(-1, true)
  local logp = z - F.log(F.exp(z):sum(-1, true))
  local V = c.vocab_size
  local onehot = F.eq(targets:view(B, Tn, 1), fsdp.arange(V, { dtype = 'i64' }):view(1, 1, V)):to('f64')
  return (logp * onehot):sum() * (-1 / (B * Tn)), logits
end

local function grads_of(model)
  local g = {}
  for _, np in ipairs(model:named_parameters()) do
    g[np[1]] = np[2].grad:clone()
    np[2].grad = nil
  end
  return g
end

-- configs and structure ----------------------------------------------------------------------

describe('GPT-2 configs', function()
  local expected = {
    ['gpt2'] = 124439808, ['gpt2-medium'] = 354823168,
    ['gpt2-large'] = 774030080, ['gpt2-xl'] = 1557611200,
  }
  for name, count in pairs(expected) do
    it(name .. ' has ' .. count .. ' parameters on meta (head tied), allocating nothing', function()
      fsdp.collect()
      local before = fsdp.memory_stats('cpu').in_use
      local m = gpt2.build(name, { device = 'meta' })
      assert.equals(count, m:num_parameters())
      assert.equals(count, gpt2.closed_form_parameters(m.config))
      assert.equals(before, fsdp.memory_stats('cpu').in_use)
    end)
  end

  it('uses GPT2LMHeadModel names and shapes, Linear layout [out, in], lm_head tied to wte', function()
    local m = gpt2.build('gpt2', { device = 'meta' })
    local names, shapes = {}, {}
    for _, np in ipairs(m:named_parameters()) do
      names[#names + 1] = np[1]
      shapes[np[1]] = table.concat(np[2].shape, 'x')
    end
    assert.equals(4 + 12 * 12, #names)
    assert.same({ 'transformer.wte.weight', 'transformer.wpe.weight', 'transformer.h.0.ln_1.weight',
                  'transformer.h.0.ln_1.bias', 'transformer.h.0.attn.c_attn.weight',
                  'transformer.h.0.attn.c_attn.bias', 'transformer.h.0.attn.c_proj.weight',
                  'transformer.h.0.attn.c_proj.bias', 'transformer.h.0.ln_2.weight',
                  'transformer.h.0.ln_2.bias', 'transformer.h.0.mlp.c_fc.weight',
                  'transformer.h.0.mlp.c_fc.bias', 'transformer.h.0.mlp.c_proj.weight',
                  'transformer.h.0.mlp.c_proj.bias' }, { unpack(names, 1, 14) })
    assert.equals('transformer.ln_f.bias', names[#names])
    assert.equals('50257x768', shapes['transformer.wte.weight'])
    assert.equals('1024x768', shapes['transformer.wpe.weight'])
    assert.equals('2304x768', shapes['transformer.h.11.attn.c_attn.weight'])
    assert.equals('3072x768', shapes['transformer.h.11.mlp.c_fc.weight'])
    assert.equals('768x3072', shapes['transformer.h.11.mlp.c_proj.weight'])
    assert.equals(m.transformer.wte.weight, m.lm_head.weight)
    local sd = m:state_dict()
    assert.equals(sd['transformer.wte.weight'], sd['lm_head.weight'])
    local printed = tostring(m)
    assert.truthy(printed:find('(0-11): 12 x GPT2Block(', 1, true))
    assert.truthy(printed:find('(attn): GPT2Attention(', 1, true))
    assert.truthy(printed:find('(mlp): GPT2MLP(', 1, true))
    assert.truthy(printed:find('(c_attn): Linear(in_features=768, out_features=2304, bias=True)', 1, true))
  end)

  it('accepts Hugging Face config names and rejects inconsistent configs', function()
    local c = gpt2.config('gpt2', { n_layer = 2, n_embd = 128, n_head = 4, n_positions = 64 })
    assert.same({ 2, 128, 4, 32, 512, 64 }, { c.n_layers, c.dim, c.n_heads, c.head_dim, c.ffn_dim, c.max_seq_len })
    assert.error_matches(function() gpt2.build('gpt2', { device = 'meta', n_heads = 7 }) end,
      'dim 768 is not a multiple of n_heads 7')
    assert.error_matches(function() gpt2.build('gpt3', { device = 'meta' }) end, "unknown config 'gpt3'")
  end)

  it('counts FLOPs as 6N + 12 L H hd T with N excluding the position table (nanoGPT)', function()
    local c = gpt2.config('gpt2')
    local n = 124439808 - 1024 * 768
    assert.equals(6 * n + 12 * 12 * 768 * 1024, gpt2.flops_per_token(c, 1024))
    assert.equals(gpt2.flops_per_token(c, 64), gpt2.flops_per_token(c, 64, 124439808))
  end)

  it('initialises as GPT-2 / nanoGPT: N(0, 0.02), residual projections 0.02 / sqrt(2 L), zero biases', function()
    local m = gpt2.build('tiny', { dim = 128, n_heads = 4, n_layers = 8 }):init_weights({ seed = 1 })
    local b = m.transformer.h[1]
    local function std(t) return t:std():item() end
    local scaled = 0.02 / math.sqrt(16)
    for _, case in ipairs({
      { m.transformer.wte.weight, 0.02 }, { m.transformer.wpe.weight, 0.02 },
      { b.attn.c_attn.weight, 0.02 }, { b.mlp.c_fc.weight, 0.02 },
      { b.attn.c_proj.weight, scaled }, { b.mlp.c_proj.weight, scaled },
    }) do
      assert.is_true(math.abs(std(case[1]) / case[2] - 1) < 0.05, ('std %g, expected %g'):format(std(case[1]), case[2]))
    end
    assert.equals(0, b.attn.c_attn.bias:abs():max():item())
    assert.equals(0, b.mlp.c_proj.bias:abs():max():item())
    assert.equals(1, b.ln_1.weight:min():item())
    assert.equals(0, m.transformer.ln_f.bias:abs():max():item())
  end)
end)

-- numerics ------------------------------------------------------------------------------------

describe('GPT-2 numerics', function()
  local function tiny_f64()
    local m = gpt2.build('tiny', { dtype = 'f64', dim = 32, n_heads = 4, vocab_size = 64, max_seq_len = 16 })
    m:init_weights({ seed = 7 })
    -- Larger than the init so attention and the MLP do more than pass the
    -- residual through.
    fsdp.no_grad(function()
      for _, p in ipairs(m:parameters()) do p:add_scaled_(fsdp.randn(p.shape, { seed = 9, dtype = 'f64' }), 0.2) end
    end)
    return m
  end

  it('logits, loss and every gradient equal a plain-op reference in float64', function()
    local m = tiny_f64()
    local ids = fsdp.randint(0, 64, { 2, 11 }, { seed = 1 })
    local targets = fsdp.randint(0, 64, { 2, 11 }, { seed = 2 })
    local loss, logits = m:loss(ids, targets)
    loss:backward()
    local got = grads_of(m)
    local ref_loss, ref_logits = ref_gpt2(m, ids, targets)
    assert_close(logits, ref_logits, 1e-10, 'logits')
    assert.is_true(math.abs(loss:item() - ref_loss:item()) < 1e-12, 'loss differs')
    ref_loss:backward()
    local want = grads_of(m)
    for name, g in pairs(want) do
      assert_close(got[name], g, 1e-10, 'gradient of ' .. name)
    end
  end)

  it('reads and writes Hugging Face checkpoints (Conv1D weights [in, out])', function()
    local m = tiny_f64()
    local hf = gpt2.to_hf_state_dict(m)
    assert.same({ 32, 96 }, hf['transformer.h.0.attn.c_attn.weight'].shape)
    assert.same({ 128, 32 }, hf['transformer.h.1.mlp.c_proj.weight'].shape)
    assert.same({ 64, 32 }, hf['lm_head.weight'].shape)
    -- The hub's bare GPT2Model layout: no 'transformer.' prefix, with the
    -- causal-mask buffers of old checkpoints.
    local bare = {}
    for name, t in pairs(hf) do
      if name ~= 'lm_head.weight' then bare[name:gsub('^transformer%.', '')] = t end
    end
    bare['h.0.attn.bias'] = fsdp.ones({ 1, 1, 16, 16 })
    bare['h.0.attn.masked_bias'] = fsdp.tensor(-1e4)
    local fresh = gpt2.build('tiny', { dtype = 'f64', dim = 32, n_heads = 4, vocab_size = 64, max_seq_len = 16 })
    fresh:load_state_dict(gpt2.from_hf_state_dict(bare), { strict = true })
    local ids = fsdp.randint(0, 64, { 1, 16 }, { seed = 3 })
    assert.equals(0, T.max_abs_diff(m(ids), fresh(ids)))
  end)

  it('rejects a sequence longer than n_positions with a clear message', function()
    local m = gpt2.build('tiny', { max_seq_len = 8 }):init_weights({ seed = 0 })
    m(fsdp.randint(0, 256, { 1, 8 }, { seed = 1 }))
    assert.error_matches(function() m(fsdp.randint(0, 256, { 1, 9 }, { seed = 1 })) end,
      'sequence length 9 exceeds n_positions 8', 1, true)
  end)

  it('applies dropout in training mode only', function()
    local m = gpt2.build('tiny', { dropout = 0.1 }):init_weights({ seed = 0 })
    local ids = fsdp.randint(0, 256, { 2, 16 }, { seed = 1 })
    local a, b = m(ids), m(ids)
    assert.is_true(T.max_abs_diff(a, b) > 1e-3)
    m:eval()
    local plain = gpt2.build('tiny'):init_weights({ seed = 0 })
    assert.equals(0, T.max_abs_diff(m(ids), plain(ids)))
  end)
end)

describe('training a tiny GPT-2', function()
  local synthetic = require 'fsdp.data.synthetic'
  local optim = require 'fsdp.optim'

  local function train(steps)
    local model = gpt2.build('tiny', { dim = 32, n_heads = 4, vocab_size = 64, max_seq_len = 32 })
    model:init_weights({ seed = 3 })
    local opt = optim.AdamW(model:named_parameters(), { lr = 1e-2, weight_decay = 0 })
    local data = synthetic.Markov(64, { seed = 3, noise = 0.05 })
    local losses = {}
    for step = 1, steps do
      local ids, targets = data:batch(step - 1, 8, 32)
      local loss = model:loss(ids, targets)
      loss:backward()
      optim.clip_grad_norm_(model:parameters(), 1.0)
      opt:step()
      opt:zero_grad()
      losses[step] = loss:item()
    end
    return losses, math.log(64)
  end

  it('starts near ln(vocab) and learns, the same way every time', function()
    local losses, uniform = train(50)
    local last = (losses[48] + losses[49] + losses[50]) / 3
    assert.is_true(math.abs(losses[1] - uniform) < 0.1, ('first loss %.3f vs ln(V) %.3f'):format(losses[1], uniform))
    assert.is_true(last < uniform / 2, ('final loss %.3f vs ln(V) %.3f'):format(last, uniform))
    local again = train(3)
    for i = 1, 3 do assert.equals(losses[i], again[i]) end
  end)
end)

-- the shared blocks ---------------------------------------------------------------------------

describe('nn.Attention', function()
  local B, Tn, dim = 2, 7, 24

  local function x_of(seed, n) return fsdp.randn({ B, n or Tn, dim }, { seed = seed, dtype = 'f64' }) end

  local function build(opts)
    opts.dtype = 'f64'
    return nn.Attention(dim, opts.n_heads or 6, opts):init_weights({ seed = 5 })
  end

  -- The separate projections' output from plain ops, kv heads repeated.
  local function reference(a, x, opts)
    opts = opts or {}
    local H, KV, hd = a.n_heads, a.n_kv_heads, a.head_dim
    local ctx = opts.context or x
    local S = ctx:size(1)
    local q = heads(F.matmul(x, a.q_proj.weight:t()), B, Tn, H, hd)
    local function kv(w)
      local t = heads(F.matmul(ctx, w:t()), B, S, KV, hd)
      return t:unsqueeze(2):expand(B, KV, H / KV, S, hd):reshape(B, H, S, hd)
    end
    local o = ref_attention(q, kv(a.k_proj.weight), kv(a.v_proj.weight), a.causal, opts.bias)
    return F.matmul(o:transpose(1, 2):reshape(B, Tn, H * hd), a.o_proj.weight:t())
  end

  it('computes grouped-query attention as plain ops, with q_proj, k_proj, v_proj, o_proj', function()
    local a = build({ n_kv_heads = 2 })
    assert.same({ 'q_proj.weight', 'k_proj.weight', 'v_proj.weight', 'o_proj.weight' },
      (function() local n = {} for _, p in ipairs(a:named_parameters()) do n[#n + 1] = p[1] end return n end)())
    assert.same({ 8, 24 }, a.k_proj.weight.shape)
    local x = x_of(1)
    assert_close(a(x), reference(a, x), 1e-12)
  end)

  it('a fused qkv projection equals separate ones holding its rows', function()
    local fused = build({ fused_qkv = true, bias = true, n_kv_heads = 3,
                          names = { qkv = 'c_attn', o = 'c_proj' } })
    local sep = build({ bias = true, n_kv_heads = 3 })
    local w, b = fused.c_attn.weight, fused.c_attn.bias
    sep:load_state_dict({
      ['q_proj.weight'] = w:narrow(0, 0, 24), ['q_proj.bias'] = b:narrow(0, 0, 24),
      ['k_proj.weight'] = w:narrow(0, 24, 12), ['k_proj.bias'] = b:narrow(0, 24, 12),
      ['v_proj.weight'] = w:narrow(0, 36, 12), ['v_proj.bias'] = b:narrow(0, 36, 12),
      ['o_proj.weight'] = fused.c_proj.weight, ['o_proj.bias'] = fused.c_proj.bias,
    })
    local x = x_of(2)
    assert_close(fused(x), sep(x), 1e-12)
    assert.error_matches(function() fused(x, { context = x }) end, 'cannot attend to a context')
  end)

  it('takes a boolean mask (true attends) and an additive bias', function()
    local a = build({ causal = false })
    local x = x_of(3)
    local rows = fsdp.arange(Tn, { dtype = 'i64' }):view(Tn, 1)
    local cols = fsdp.arange(Tn, { dtype = 'i64' }):view(1, Tn)
    local causal = build({ causal = true })
    assert_close(a(x, { mask = F.le(cols, rows) }), causal(x), 1e-12)
    local bias = fsdp.randn({ 1, 6, Tn, Tn }, { seed = 4, dtype = 'f64' })
    assert_close(a(x, { bias = bias }), reference(a, x, { bias = bias }), 1e-12)
  end)

  it('attends to a context (cross-attention)', function()
    local a = build({ causal = false, n_kv_heads = 3 })
    local x, ctx = x_of(5), x_of(6, 4)
    assert_close(a(x, { context = ctx }), reference(a, x, { context = ctx }), 1e-12)
  end)

  it('drops attention probabilities in training only, through the materialised scores', function()
    -- p so small that no element is dropped: the explicit path must then
    -- give the fused kernel's numbers, grouped heads and causal mask included.
    local a = build({ n_kv_heads = 2, dropout = 1e-12 })
    local x = x_of(7)
    a:eval()
    local fused = a(x)
    a:train()
    assert_close(a(x), fused, 1e-10)
    local heavy = build({ n_kv_heads = 2, dropout = 0.5 })
    assert.is_true(T.max_abs_diff(heavy(x), fused) > 1e-3)
  end)
end)

describe('nn.GatedMLP and nn.MLP', function()
  local x = fsdp.randn({ 2, 5, 16 }, { seed = 1, dtype = 'f64' })
  local function lin(x_, l) return F.matmul(x_, l.weight:t()) + (l.bias or 0) end

  it('GatedMLP is down(act(gate(x)) * up(x)) for silu and gelu_tanh', function()
    local swiglu = nn.GatedMLP(16, 40, { dtype = 'f64' }):init_weights({ seed = 2 })
    local g = lin(x, swiglu.gate_proj)
    local want = lin(g * F.sigmoid(g) * lin(x, swiglu.up_proj), swiglu.down_proj)
    assert_close(swiglu(x), want, 1e-12)
    assert.is_nil(swiglu.gate_proj.bias)
    local geglu = nn.GatedMLP(16, 40, { activation = 'gelu_new', names = { 'wi_0', 'wi_1', 'wo' }, dtype = 'f64' })
    geglu:init_weights({ seed = 2 })
    want = lin(ref_gelu_tanh(lin(x, geglu.wi_0)) * lin(x, geglu.wi_1), geglu.wo)
    assert_close(geglu(x), want, 1e-12)
  end)

  it('MLP is fc2(act(fc1(x))) with biases, names configurable', function()
    local m = nn.MLP(16, 64, { dtype = 'f64' }):init_weights({ seed = 3 })
    assert.is_not_nil(m.fc1.bias)
    assert_close(m(x), lin(ref_gelu_tanh(lin(x, m.fc1)), m.fc2), 1e-12)
    local r = nn.MLP(16, 64, { activation = 'relu', bias = false, names = { 'wi', 'wo' }, dtype = 'f64' })
    r:init_weights({ seed = 3 })
    assert_close(r(x), lin(F.relu(lin(x, r.wi)), r.wo), 1e-12)
    assert.error_matches(function() nn.MLP(16, 64, { activation = 'tanh' }) end, 'unknown activation tanh')
  end)
end)
