-- moe_spec.lua: the mixture-of-experts ops (core/ops/moe.c: fl_moe_route,
-- fl_moe_experts), F.load_balancing_loss and nn.MoE.
--
-- References: (1) a dense f64 formulation built from other ops (every
-- expert on every token, weighted by a dense [N, E] routing matrix that is
-- zero off the picks), differentiated by autograd: our f64 ops must match
-- it to rounding, f32 to f32 rounding, bf16 to bf16 rounding; (2) the
-- goldens tests/golden/make_moe_goldens.py made with transformers 5.25's
-- MixtralSparseMoeBlock and Qwen3MoeSparseMoeBlock in f32 (outputs, router
-- logits, aux losses, every gradient). The reference takes the ids our
-- router picked, so a near-tie that rounding resolves differently cannot
-- make the comparison fail for the wrong reason; the picks themselves are
-- checked against the f64 top-k and against transformers.
--
-- On a device with CUDA (a GPU, or the cudasim build) the same ops run on
-- cuda:0 and are compared with the CPU.
local fsdp = require 'fsdp'
local nn = require 'fsdp.nn'
local T = require 'fsdp.testing'
local F = fsdp.F

local err = T.normalised_error

local function leaf(t) return t:clone():detach():requires_grad_(true) end

-- The gradients of a scalar with respect to leaves (fresh leaves: .grad
-- holds this backward's gradient only).
local function grad(loss, leaves)
  fsdp.autograd.backward(loss)
  local out = {}
  for i, l in ipairs(leaves) do out[i] = l.grad end
  return out
end

local function onehot(ids, E)
  return ids:unsqueeze(-1):eq(fsdp.arange(E, { dtype = 'i64', device = ids.device })):to('f64')
end

-- The router's weights for given picks: p = softmax(logits) gathered at
-- ids, renormalised if asked (differentiable in the logits).
local function route_ref(logits, ids, E, normalize)
  local p = F.softmax(logits:to('f64'), -1)
  local w = (p:unsqueeze(1) * onehot(ids, E)):sum({ -1 })
  if normalize then w = w / w:sum({ -1 }, true) end
  return w
end

-- y = sum_e R[:, e] * down_e(silu(gate_e x) * up_e x), R [N, E] dense.
local function experts_ref(x, w, ids, gu, dn)
  local E, ff, h = gu.shape[1], dn.shape[3], dn.shape[2]
  local x2 = x:to('f64'):reshape({ -1, h })
  local R = (onehot(ids, E) * w:to('f64'):unsqueeze(-1)):sum({ 1 })
  local y
  for e = 0, E - 1 do
    local H = F.linear(x2, gu:to('f64'):select(0, e))
    local a = F.silu(H:narrow(1, 0, ff)) * H:narrow(1, ff, ff)
    local o = F.linear(a, dn:to('f64'):select(0, e)) * R:narrow(1, e, 1)
    y = y and y + o or o
  end
  return y:reshape(x.shape)
end

-- The whole block in f64 from f64 copies of the parameters.
local function block_ref(x, gw, gu, dn, ids, k, normalize)
  local h = gw.shape[2]
  local logits = F.linear(x:to('f64'):reshape({ -1, h }), gw:to('f64'))
  local w = route_ref(logits, ids, gw.shape[1], normalize)
  return experts_ref(x, w, ids, gu, dn), logits
end

local function params(E, h, ff, seed, dtype)
  local o = { dtype = dtype or 'f32' }
  local function r(shape, s, std)
    o.seed = seed + s
    return (fsdp.randn(shape, { seed = seed + s }) * std):to(o.dtype)
  end
  return r({ E, h }, 1, 0.5), r({ E, 2 * ff, h }, 2, 0.3), r({ E, h, ff }, 3, 0.3)
end

describe('moe_route', function()
  it('takes the top-k of the softmax, descending, renormalised or not', function()
    local logits = fsdp.randn({ 12, 8 }, { seed = 5, dtype = 'f64' })
    for _, norm in ipairs({ true, false }) do
      local w, ids = F.moe_route(logits, 3, { normalize = norm })
      assert.equals('f64', w.dtype)
      assert.equals('i64', ids.dtype)
      local p = F.softmax(logits, -1)
      for r = 0, 11 do
        -- The three largest, by a Lua sort of the row (tests only).
        local row = {}
        for e = 0, 7 do row[#row + 1] = { p:get({ r, e }), e } end
        table.sort(row, function(a, b) return a[1] > b[1] end)
        local total = row[1][1] + row[2][1] + row[3][1]
        for j = 0, 2 do
          assert.equals(row[j + 1][2], ids:get({ r, j }))
          local want = norm and row[j + 1][1] / total or row[j + 1][1]
          assert.is_true(math.abs(w:get({ r, j }) - want) < 1e-15)
        end
      end
    end
  end)

  it('resolves ties to the lower expert', function()
    local logits = fsdp.tensor({ { 1, 3, 3, 0, 3 }, { 0, 0, 0, 0, 0 }, { 2, 2, 5, 2, 2 } },
      { dtype = 'f32' })
    local w, ids = F.moe_route(logits, 2, { normalize = true })
    assert.same({ { 1, 2 }, { 0, 1 }, { 2, 0 } }, ids:tolist())
    assert.is_true(math.abs(w:get({ 0, 0 }) - 0.5) < 1e-7)
    assert.is_true(math.abs(w:get({ 1, 1 }) - 0.5) < 1e-7)
    local _, ids4 = F.moe_route(fsdp.zeros({ 2, 16 }), 4)
    assert.same({ { 0, 1, 2, 3 }, { 0, 1, 2, 3 } }, ids4:tolist())
  end)

  for _, norm in ipairs({ true, false }) do
    it('has the gradient of the dense formulation (normalize ' .. tostring(norm) .. ')', function()
      local logits = leaf(fsdp.randn({ 10, 8 }, { seed = 7, dtype = 'f64' }))
      local w, ids = F.moe_route(logits, 2, { normalize = norm })
      local r = fsdp.randn({ 10, 2 }, { seed = 8, dtype = 'f64' })
      local g = grad((w * r):sum(), { logits })[1]
      local ref_l = leaf(logits)
      local g_ref = grad((route_ref(ref_l, ids, 8, norm) * r):sum(), { ref_l })[1]
      assert.is_true(err(g, g_ref) < 1e-13, 'error ' .. err(g, g_ref))
      assert.is_true(T.gradcheck(function(l)
        return (F.moe_route(l, 2, { normalize = norm }))
      end, { logits }))
    end)
  end

  it('computes bf16 logits in f32 and returns f32 weights', function()
    local logits = fsdp.randn({ 6, 8 }, { seed = 9 }):to('bf16')
    local w = F.moe_route(logits, 2, { normalize = true })
    assert.equals('f32', w.dtype)
    local _, ids = F.moe_route(logits:to('f64'), 2)
    assert.is_true(err(w, route_ref(logits, ids, 8, true)) < 1e-6)
  end)

  it('refuses bad arguments with one line', function()
    local l = fsdp.randn({ 4, 8 })
    T.raises(function() F.moe_route(l, 9) end, 'top_k 9 must be in [1, 8]')
    T.raises(function() F.moe_route(l:reshape({ 32 }), 2) end, 'moe_route: logits must be')
  end)
end)

-- E, k, normalize; x [2, 9, 32], ff 24.
local CONFIGS = { { 8, 2, true }, { 16, 4, false } }
local H, FF = 32, 24

describe('moe_experts against the dense f64 reference', function()
  for _, c in ipairs(CONFIGS) do
    local E, k, norm = c[1], c[2], c[3]
    for _, case in ipairs({ { 'f64', 1e-12, 1e-12 }, { 'f32', 1e-5, 1e-4 }, { 'bf16', 2e-2, 3e-2 } }) do
      local dtype, tol_y, tol_g = case[1], case[2], case[3]
      it(('E=%d k=%d normalize=%s %s: output and every gradient'):format(E, k, tostring(norm), dtype),
        function()
          local gw, gu, dn = params(E, H, FF, 100 + E, dtype)
          local x = fsdp.randn({ 2, 9, H }, { seed = 11 }):to(dtype)
          local gwl, gul, dnl, xl = leaf(gw), leaf(gu), leaf(dn), leaf(x)
          local logits = F.linear(xl:reshape({ -1, H }), gwl)
          local w, ids = F.moe_route(logits, k, { normalize = norm })
          local y = F.moe_experts(xl, w:to(dtype), ids, gul, dnl)
          assert.equals(dtype, y.dtype)
          assert.same({ 2, 9, H }, y.shape)
          local r = fsdp.randn({ 2, 9, H }, { seed = 12, dtype = 'f64' })
          local grads = grad((y:to('f64') * r):sum(), { xl, gwl, gul, dnl })
          -- The reference from f64 copies of the same (rounded) values.
          local rx, rgw, rgu, rdn = leaf(x:to('f64')), leaf(gw:to('f64')), leaf(gu:to('f64')),
            leaf(dn:to('f64'))
          local yr = block_ref(rx, rgw, rgu, rdn, ids, k, norm)
          local want = grad((yr * r):sum(), { rx, rgw, rgu, rdn })
          local e = err(y, yr)
          assert.is_true(e < tol_y, ('output error %g'):format(e))
          local names = { 'x', 'gate.weight', 'gate_up_proj', 'down_proj' }
          for i = 1, 4 do
            local ge = err(grads[i], want[i])
            assert.is_true(ge < tol_g, ('%s gradient error %g'):format(names[i], ge))
          end
          if dtype == 'f64' then
            -- The picks are the f64 top-k of the reference's logits.
            local _, ids_ref = F.moe_route(F.linear(rx:reshape({ -1, H }), rgw), k)
            assert.same(ids_ref:tolist(), ids:tolist())
          end
        end)
    end
  end

  it('leaves experts without tokens at zero gradient and zero-weight picks at nothing', function()
    local E, k = 8, 2
    local _, gu, dn = params(E, H, FF, 300, 'f64')
    local x = leaf(fsdp.randn({ 1, 6, H }, { seed = 13, dtype = 'f64' }))
    -- Only experts 1 and 5 get tokens; token 2's weights are zero (routed
    -- to no expert's effect); token 4 picks expert 5 twice.
    local ids = fsdp.tensor({ { 1, 5 }, { 5, 1 }, { 1, 5 }, { 5, 1 }, { 5, 5 }, { 1, 5 } }, { dtype = 'i64' })
    local w = leaf(fsdp.tensor({ { 0.7, 0.3 }, { 0.6, 0.4 }, { 0, 0 }, { 1, 0 }, { 0.5, 0.5 }, { 0.2, 0.8 } },
      { dtype = 'f64' }))
    local gul, dnl = leaf(gu), leaf(dn)
    local y = F.moe_experts(x, w, ids, gul, dnl)
    local r = fsdp.randn({ 1, 6, H }, { seed = 14, dtype = 'f64' })
    local g = grad((y * r):sum(), { x, w, gul, dnl })
    local rx, rw, rgu, rdn = leaf(x), leaf(w), leaf(gu), leaf(dn)
    local yr = experts_ref(rx, rw, ids, rgu, rdn)
    local want = grad((yr * r):sum(), { rx, rw, rgu, rdn })
    assert.is_true(err(y, yr) < 1e-12)
    for i = 1, 4 do assert.is_true(err(g[i], want[i]) < 1e-12, 'gradient ' .. i) end
    assert.equals(0, y:select(1, 2):abs():sum():item())
    assert.equals(0, g[1]:select(1, 2):abs():sum():item())
    for e = 0, E - 1 do
      if e ~= 1 and e ~= 5 then
        assert.equals(0, g[3]:select(0, e):abs():sum():item())
        assert.equals(0, g[4]:select(0, e):abs():sum():item())
      end
    end
    local ids3 = ids:narrow(0, 0, 3):contiguous()
    assert.is_true(T.gradcheck(function(a, b, c, d) return F.moe_experts(a, b, ids3, c, d) end,
      { leaf(x:narrow(1, 0, 3)), leaf(w:narrow(0, 0, 3)), gul, dnl }))
  end)

  it('refuses bad arguments with one line', function()
    local _, gu, dn = params(4, H, FF, 400)
    local x = fsdp.randn({ 3, H })
    local w = fsdp.ones({ 3, 2 })
    T.raises(function() F.moe_experts(x, w, fsdp.tensor({ { 0, 1 }, { 2, 4 }, { 0, 0 } }, { dtype = 'i64' }), gu, dn) end,
      'expert id 4 (token 1, pick 1) is outside [0, 4)')
    T.raises(function() F.moe_experts(x, w, fsdp.zeros({ 3, 2 }, { dtype = 'i64' }), gu:to('f64'), dn) end,
      'must have the input\'s dtype')
    T.raises(function() F.moe_experts(x, w, fsdp.zeros({ 3, 2 }, { dtype = 'i64' }), dn, gu) end,
      'must be [E, 2*ff, 32] and [E, 32, ff]')
    T.raises(function() F.moe_experts(x, w, fsdp.zeros({ 2, 2 }, { dtype = 'i64' }), gu, dn) end,
      'must both be [3 tokens, top_k]')
  end)
end)

describe('nn.MoE', function()
  it('names its parameters as transformers 5 and works on meta, counting the active FLOPs', function()
    local m = nn.MoE(64, 48, 8, 2, { norm_topk_prob = true, device = 'meta' })
    local names = {}
    for _, p in ipairs(m:named_parameters()) do names[#names + 1] = p[1] .. '=' .. table.concat(p[2].shape, 'x') end
    table.sort(names)
    assert.same({ 'experts.down_proj=8x64x48', 'experts.gate_up_proj=8x96x64', 'gate.weight=8x64' }, names)
    local x = fsdp.empty({ 2, 10, 64 }, { device = 'meta' }):requires_grad_(true)
    -- (counted from zero: the process's count saturates after large meta
    -- models in other specs)
    fsdp.reset_flops()
    local y, logits = m(x)
    local flops = fsdp.flops()
    assert.same({ 2, 10, 64 }, y.shape)
    assert.same({ 20, 8 }, logits.shape)
    -- Router 2*20*64*8, the active products 3 * 2 * (20*2) * 48 * 64, and
    -- a few per element: far below the 4x of running every expert.
    local active = 2 * 20 * 64 * 8 + 6 * 40 * 48 * 64
    assert.is_true(flops >= active and flops < active * 1.1, 'flops ' .. flops)
    local aux = F.load_balancing_loss({ logits }, 8, 2)
    fsdp.autograd.backward(y:sum() + aux)
    assert.same({ 8, 96, 64 }, m.experts.gate_up_proj.grad.shape)
    assert.same({ 2, 10, 64 }, x.grad.shape)
  end)

  it('keeps the router logits of its last forward', function()
    local m = nn.MoE(16, 8, 4, 2):init_weights({ seed = 3 })
    local y, logits = m(fsdp.randn({ 1, 3, 16 }, { seed = 1 }))
    assert.equals(logits, m.router_logits)
    T.raises(function() nn.MoE(16, 8, 4, 5) end, 'top_k 5 is more than the 4 experts')
    T.raises(function() nn.MoE(16, 8, 4, 2, { activation = 'gelu' }) end, "activation must be 'silu'")
  end)
end)

describe('against transformers 5 (tests/golden/moe)', function()
  local cases = {
    mixtral = { E = 8, k = 2, ff = 24, norm = true },
    qwen3_moe = { E = 16, k = 4, ff = 12, norm = false },
  }
  for _, name in ipairs({ 'mixtral', 'qwen3_moe' }) do
    local c = cases[name]
    it(name .. ': output, router logits, aux losses and every gradient', function()
      local g = fsdp.load_safetensors('tests/golden/moe/' .. name .. '.safetensors')
      local m = nn.MoE(16, c.ff, c.E, c.k, { norm_topk_prob = c.norm }):init_weights({ seed = 1 })
      fsdp.no_grad(function()
        for _, p in ipairs(m:named_parameters()) do p[2]:copy_(g[p[1]]) end
      end)
      local x = leaf(g.x)
      local y, logits = m(x)
      local aux = F.load_balancing_loss({ logits, g.other_logits }, c.E, c.k)
      local aux_masked = F.load_balancing_loss({ logits, g.other_logits }, c.E, c.k, g.mask)
      local checks = {
        { 'y', y, g.y }, { 'router_logits', logits, g.router_logits },
        { 'aux', aux:reshape({ 1 }), g.aux }, { 'aux_masked', aux_masked:reshape({ 1 }), g.aux_masked },
      }
      for _, ch in ipairs(checks) do
        local e = err(ch[2], ch[3])
        assert.is_true(e <= 1e-5, ('%s error %g'):format(ch[1], e))
      end
      fsdp.autograd.backward((y * g.r):sum() + aux * 0.5)
      local grads = { { 'x', x.grad } }
      for _, p in ipairs(m:named_parameters()) do grads[#grads + 1] = { p[1], p[2].grad } end
      for _, gr in ipairs(grads) do
        local e = err(gr[2], g['grad_' .. gr[1]])
        assert.is_true(e <= 1e-4, ('grad %s error %g'):format(gr[1], e))
      end
    end)
  end
end)

local cuda = fsdp.cuda.device_count() > 0
describe('moe on cuda:0 against the CPU', function()
  for _, c in ipairs(CONFIGS) do
    local E, k, norm = c[1], c[2], c[3]
    for _, dtype in ipairs({ 'f32', 'bf16' }) do
      local test = cuda and it or pending
      test(('E=%d k=%d %s: route, experts and their gradients'):format(E, k, dtype), function()
        local gw, gu, dn = params(E, H, FF, 500 + E, dtype)
        local x = fsdp.randn({ 2, 9, H }, { seed = 21 }):to(dtype)
        local r = fsdp.randn({ 2, 9, H }, { seed = 22 }):to(dtype)
        local function run(device)
          local ps = { leaf(x:to(device)), leaf(gw:to(device)), leaf(gu:to(device)), leaf(dn:to(device)) }
          local logits = F.linear(ps[1]:reshape({ -1, H }), ps[2])
          local w, ids = F.moe_route(logits, k, { normalize = norm })
          local y = F.moe_experts(ps[1], w:to(dtype), ids, ps[3], ps[4])
          local grads = grad((y * r:to(device)):sum(), ps)
          return y, ids, grads
        end
        local y, ids, grads = run('cpu')
        local yc, idsc, gradsc = run('cuda:0')
        assert.same(ids:tolist(), idsc:cpu():tolist())
        local tol = dtype == 'bf16' and 2e-2 or 1e-5
        assert.is_true(err(yc, y) < tol, 'output ' .. err(yc, y))
        for i = 1, 4 do assert.is_true(err(gradsc[i], grads[i]) < tol * 10, 'gradient ' .. i) end
      end)
    end
  end
end)

describe('models.moe_keys', function()
  local moe_keys = require 'models.moe_keys'

  it('maps Mixtral and Qwen3-MoE disk names to the fused ones and back', function()
    local mx, qw = moe_keys.layout('mixtral'), moe_keys.layout('qwen3_moe')
    local f, e, p = moe_keys.fused_of(mx, 'model.layers.3.block_sparse_moe.experts.5.w1.weight')
    assert.same({ 'model.layers.3.mlp.experts.gate_up_proj', 5, 'gate' }, { f, e, p })
    assert.same({ 'model.layers.3.mlp.experts.gate_up_proj', 7, 'up' },
      { moe_keys.fused_of(mx, 'model.layers.3.block_sparse_moe.experts.7.w3.weight') })
    assert.same({ 'model.layers.0.mlp.experts.down_proj', 0, 'down' },
      { moe_keys.fused_of(mx, 'model.layers.0.block_sparse_moe.experts.0.w2.weight') })
    assert.equals('model.layers.3.mlp.gate.weight', moe_keys.fused_of(mx, 'model.layers.3.block_sparse_moe.gate.weight'))
    assert.is_nil(moe_keys.fused_of(mx, 'model.layers.3.self_attn.q_proj.weight'))
    assert.same({ 'model.layers.1.mlp.experts.gate_up_proj', 12, 'up' },
      { moe_keys.fused_of(qw, 'model.layers.1.mlp.experts.12.up_proj.weight') })
    assert.is_nil(moe_keys.fused_of(qw, 'model.layers.1.mlp.gate.weight'))
    local d = moe_keys.disk_of(mx, 'model.layers.2.mlp.experts.gate_up_proj', 2)
    assert.same({ 'model.layers.2.block_sparse_moe.experts.0.w1.weight', 'model.layers.2.block_sparse_moe.experts.0.w3.weight',
                  'model.layers.2.block_sparse_moe.experts.1.w1.weight', 'model.layers.2.block_sparse_moe.experts.1.w3.weight' },
      { d[1].name, d[2].name, d[3].name, d[4].name })
    assert.equals('model.layers.2.block_sparse_moe.gate.weight', moe_keys.disk_of(mx, 'model.layers.2.mlp.gate.weight', 8)[1].name)
    assert.equals('model.layers.2.mlp.experts.3.down_proj.weight',
      moe_keys.disk_of(qw, 'model.layers.2.mlp.experts.down_proj', 4)[4].name)
    T.raises(function() moe_keys.layout('llama') end, "no per-expert key layout for model_type 'llama'")
  end)

  it('fuses per-expert tensors as transformers does and splits them back', function()
    local g = fsdp.load_safetensors('tests/golden/moe/mixtral.safetensors')
    local L = moe_keys.layout('mixtral')
    local fused = { ['model.layers.0.mlp.gate.weight'] = g['gate.weight'],
                    ['model.layers.0.mlp.experts.gate_up_proj'] = g['experts.gate_up_proj'],
                    ['model.layers.0.mlp.experts.down_proj'] = g['experts.down_proj'],
                    ['model.norm.weight'] = fsdp.ones({ 16 }) }
    local disk = moe_keys.split(L, fused)
    local n = 0
    for _ in pairs(disk) do n = n + 1 end
    assert.equals(2 + 8 * 3, n)
    -- w1 = the gate rows, w3 = the up rows, w2 = down, as transformers' conversion concatenates.
    local w1 = disk['model.layers.0.block_sparse_moe.experts.6.w1.weight']
    local w3 = disk['model.layers.0.block_sparse_moe.experts.6.w3.weight']
    assert.same({ 24, 16 }, w1.shape)
    assert.equals(0, T.max_abs_diff(w1, g['experts.gate_up_proj']:select(0, 6):narrow(0, 0, 24)))
    assert.equals(0, T.max_abs_diff(w3, g['experts.gate_up_proj']:select(0, 6):narrow(0, 24, 24)))
    local contiguous = {}
    for k, v in pairs(disk) do contiguous[k] = v:contiguous() end
    local back = moe_keys.fuse(L, contiguous)
    for k, v in pairs(fused) do assert.equals(0, T.max_abs_diff(back[k], v), k) end
    contiguous['model.layers.0.block_sparse_moe.experts.3.w3.weight'] = nil
    T.raises(function() moe_keys.fuse(L, contiguous) end,
      'expert 3 has no up tensor (model.layers.0.block_sparse_moe.experts.3.w3.weight)')
    T.raises(function() moe_keys.copy_expert(back['model.layers.0.mlp.experts.down_proj'], 0, 'down', w1:contiguous()) end,
      'expert 0 down of shape [24, 16] does not fit [16, 24]')
  end)
end)

describe('nn.MoE inside sharded units', function()
  for _, mp in ipairs({ 'none', 'bf16' }) do
    it('trains as its own FSDP unit (mixed precision ' .. mp .. ')', function()
      local Net = nn.Module:extend('MoENet')
      function Net:__init()
        self.norm = nn.RMSNorm(32)
        self.layers = nn.ModuleList({ nn.MoE(32, 16, 8, 2, { norm_topk_prob = true }), nn.MoE(32, 16, 8, 2) })
      end
      function Net:forward(x)
        local logits = {}
        for i = 1, 2 do
          local y, l = self.layers[i](x)
          x, logits[i] = x + y, l
        end
        return self.norm(x), logits
      end
      local m = Net():init_weights({ seed = 5 })
      fsdp.shard(m, { policy = fsdp.policy.transformer { nn.MoE }, seed = 3,
                      mixed_precision = mp ~= 'none' and mp or nil })
      local opt = require('fsdp.optim').AdamW(m:named_parameters(), { lr = 1e-2 })
      local x = fsdp.randn({ 2, 6, 32 }, { seed = 1 })
      local losses = {}
      for step = 1, 4 do
        local y, logits = m(x)
        assert.equals(mp == 'none' and 'f32' or mp, logits[1].dtype)
        local loss = (y:float() ^ 2):mean() + F.load_balancing_loss(logits, 8, 2) * 0.02
        loss:backward()
        opt:step()
        opt:zero_grad()
        losses[step] = loss:item()
      end
      assert.is_true(losses[4] < losses[1], ('losses %g .. %g'):format(losses[1], losses[4]))
    end)
  end
end)
