-- optim_spec.lua: the optimizers of fsdp.optim over the fused C updates:
-- each optimizer for a few steps against a reference written here
-- element by element in double precision, PyTorch's defaults, parameter
-- groups chosen by name predicates, skipping parameters without gradients,
-- state dicts that resume training exactly, the learning-rate schedules at
-- their key steps, and clipping by the global gradient norm.
local fsdp = require 'fsdp'
local nn = require 'fsdp.nn'
local optim = require 'fsdp.optim'
local lr_scheduler = optim.lr_scheduler

local function error_of(fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok, 'expected an error')
  return tostring(err)
end

local function assert_mentions(err, fragment)
  assert(err:find(fragment, 1, true), ('error %q does not mention %q'):format(err, fragment))
end

local function close(a, b, rel, abs)
  return math.abs(a - b) <= (rel or 1e-5) * math.abs(b) + (abs or 1e-6)
end

local function assert_close_list(got, want, rel, abs)
  assert.equals(#want, #got)
  for i = 1, #want do
    assert(close(got[i], want[i], rel, abs), ('element %d: %.9g, reference %.9g'):format(i, got[i], want[i]))
  end
end

-- Deterministic gradients for step s of a parameter with n elements.
local function grads(n, s)
  local g = {}
  for i = 1, n do g[i] = math.sin(i * 1.7 + s * 0.3) * 0.5 end
  return g
end

local function param(values)
  return nn.Parameter(fsdp.tensor(values))
end

describe('AdamW', function()
  it('has PyTorch defaults', function()
    local opt = optim.AdamW({ param({ 1 }) })
    local g = opt.param_groups[1]
    assert.equals(1e-3, g.lr)
    assert.same({ 0.9, 0.999 }, g.betas)
    assert.equals(1e-8, g.eps)
    assert.equals(1e-2, g.weight_decay)
  end)

  it('follows the reference formula over several steps', function()
    local init = { 0.5, -1.25, 2, 0.125, -0.75 }
    local p = param(init)
    local lr, b1, b2, eps, wd = 0.01, 0.9, 0.95, 1e-8, 0.1
    local opt = optim.AdamW({ { 'w', p } }, { lr = lr, betas = { b1, b2 }, eps = eps, weight_decay = wd })
    local ref, m, v = {}, {}, {}
    for i = 1, #init do ref[i], m[i], v[i] = init[i], 0, 0 end
    for s = 1, 4 do
      local g = grads(#init, s)
      p.grad = fsdp.tensor(g)
      opt:step()
      for i = 1, #init do
        local gi = fsdp.tensor({ g[i] }):get(0) -- the f32 value the kernel sees
        ref[i] = ref[i] * (1 - lr * wd)
        m[i] = b1 * m[i] + (1 - b1) * gi
        v[i] = b2 * v[i] + (1 - b2) * gi * gi
        local mh, vh = m[i] / (1 - b1 ^ s), v[i] / (1 - b2 ^ s)
        ref[i] = ref[i] - lr * mh / (math.sqrt(vh) + eps)
      end
    end
    assert_close_list(p:tolist(), ref)
    assert.equals(4, opt.state.w.step)
    assert_close_list(opt.state.w.exp_avg:tolist(), m)
  end)

  it('puts parameters in the first group whose predicate matches', function()
    local model = nn.Sequential(nn.Linear(4, 3), nn.LayerNorm(3), nn.Linear(3, 2, { bias = false }))
    model:init_weights({ seed = 1 })
    local opt = optim.AdamW(model:named_parameters(), {
      lr = 3e-4, weight_decay = 0.1,
      groups = {
        { match = function(_, p) return p:dim() < 2 end, weight_decay = 0 },
        { match = function(name) return name:find('^2%.') end, lr = 1e-4 },
        { match = function() return false end },
      },
    })
    assert.equals(4, #opt.param_groups)
    assert.same({ '0.weight' }, opt.param_groups[1].names)
    assert.same({ '0.bias', '1.weight', '1.bias' }, opt.param_groups[2].names)
    assert.same({ '2.weight' }, opt.param_groups[3].names)
    assert.same({}, opt.param_groups[4].names)
    assert.equals(0, opt.param_groups[2].weight_decay)
    assert.equals(3e-4, opt.param_groups[2].lr)
    assert.equals(1e-4, opt.param_groups[3].lr)
    assert.equals(0.1, opt.param_groups[3].weight_decay)
    assert.same({ 3e-4, 3e-4, 1e-4, 3e-4 }, opt:get_lrs())
    -- a module is accepted as the parameter list
    local from_module = optim.AdamW(model, { groups = { { match = function(_, p) return p:dim() < 2 end } } })
    assert.same({ '0.weight', '2.weight' }, from_module.param_groups[1].names)
  end)

  it('skips parameters without gradients and zero_grad drops them all', function()
    local a, b = param({ 1, 2 }), param({ 3, 4 })
    local opt = optim.AdamW({ { 'a', a }, { 'b', b } }, { lr = 0.1 })
    a.grad = fsdp.tensor({ 1, -1 })
    opt:step()
    assert.same({ 3, 4 }, b:tolist())
    assert.is_nil(opt.state.b)
    assert.is_true(a:get(0) < 1)
    opt:zero_grad()
    assert.is_nil(a.grad)
    opt:step() -- nothing has a gradient: nothing changes
    assert.equals(1, opt.state.a.step)
  end)

  it('keeps moments in state_dtype and updates bf16 parameters', function()
    local p = nn.Parameter(fsdp.tensor({ 1, 2, 3 }, { dtype = 'bf16' }))
    local opt = optim.AdamW({ { 'p', p } }, { lr = 0.25, weight_decay = 0, state_dtype = 'f32' })
    p.grad = fsdp.tensor({ 1, -1, 1 }, { dtype = 'bf16' })
    opt:step()
    assert.equals('f32', opt.state.p.exp_avg.dtype)
    assert.same({ 0.75, 2.25, 2.75 }, p:tolist()) -- first step moves each by lr * sign(g)
  end)

  it('resumes from a state dict exactly', function()
    local function run(steps, opt_state)
      local p = param({ 0.5, -0.5, 1.5 })
      local opt = optim.AdamW({ { 'p', p } }, { lr = 0.05 })
      if opt_state then
        p:copy_(opt_state.param)
        opt:load_state_dict(opt_state.sd)
      end
      for s = 1, steps do
        p.grad = fsdp.tensor(grads(3, s + (opt_state and 2 or 0)))
        opt:step()
      end
      return p, opt
    end
    local straight = run(3)
    local p2, opt2 = run(2)
    local sd = opt2:state_dict()
    assert.equals(2, sd.state.p.step)
    assert.same({ 'p' }, sd.param_groups[1].names)
    local resumed = run(1, { param = p2, sd = sd })
    assert.same(straight:tolist(), resumed:tolist())
    local other = optim.AdamW({ { 'q', param({ 1, 2, 3 }) } })
    assert_mentions(error_of(other.load_state_dict, other, sd), 'group 1 parameter 1 is p in the state but q here')
  end)

  it('names the optimizer, option and parameter at fault', function()
    assert_mentions(error_of(optim.AdamW, { param({ 1 }) }, { betas2 = 1 }), 'AdamW: unknown option betas2')
    assert_mentions(error_of(optim.AdamW, { param({ 1 }) }, { betas = { 0.9, 1 } }),
      'AdamW: betas must be {beta1, beta2} with each in [0, 1)')
    assert_mentions(error_of(optim.AdamW, { param({ 1 }) }, { groups = { { match = function() end, lr = -1 } } }),
      'AdamW: groups[1]: lr must be >= 0, got -1')
    -- NaN passes a comparison; fsdp.validate refuses it (issue 38)
    assert_mentions(error_of(optim.AdamW, { param({ 1 }) }, { lr = 0 / 0 }), 'AdamW: lr must be a finite number, got nan')
    assert_mentions(error_of(optim.SGD, { param({ 1 }) }, { lr = 0.1, momentum = math.huge }),
      'SGD: momentum must be a finite number, got inf')
    assert_mentions(error_of(optim.Adadelta, { param({ 1 }) }, { eps = 0 / 0 }), 'Adadelta: eps must be a finite number, got nan')
    local p = param({ 1 })
    assert_mentions(error_of(optim.AdamW, { { 'x', p }, { 'y', p } }), 'parameter y is the same tensor as x')
    local d = nn.Parameter(fsdp.tensor({ 1, 2 }, { dtype = 'f64' }))
    local opt = optim.AdamW({ { 'layers.0.w', d } })
    d.grad = fsdp.tensor({ 1, 1 }, { dtype = 'f64' })
    assert_mentions(error_of(opt.step, opt), 'AdamW: parameter layers.0.w: adamw: param has dtype f64')
  end)

  -- Each class declares its ranges once (Optimizer:extend); the base check_group reads them.
  it('holds every optimizer to its declared ranges, and a refused update counts no step', function()
    local one = { param({ 1 }) }
    for _, case in ipairs({
      { optim.Adadelta, { rho = 1.5 }, 'Adadelta: rho must be <= 1, got 1.5' },
      { optim.Adadelta, { weight_decay = -1 }, 'Adadelta: weight_decay must be >= 0, got -1' },
      { optim.SGD, { dampening = -0.5 }, 'SGD: dampening must be >= 0, got -0.5' },
      { optim.SGD, { lr = 0.1, momentum = 0 / 0 }, 'SGD: momentum must be a finite number, got nan' },
      { optim.AnyPrecisionAdamW, { betas = { 0.9 } },
        'AnyPrecisionAdamW: betas must be {beta1, beta2} with each in [0, 1)' },
      { optim.AnyPrecisionAdamW, { eps = -1 }, 'AnyPrecisionAdamW: eps must be >= 0, got -1' },
      { optim.AdamW, { weight_decay = math.huge }, 'AdamW: weight_decay must be a finite number, got inf' },
    }) do
      assert_mentions(error_of(case[1], one, case[2]), case[3])
    end
    for _, cls in ipairs({ optim.AdamW, optim.AnyPrecisionAdamW, optim.SGD, optim.Adadelta }) do
      local d = nn.Parameter(fsdp.tensor({ 1, 2 }, { dtype = 'f64' }))
      local opt = cls({ { 'w', d } }, { momentum = cls == optim.SGD and 0.9 or nil })
      d.grad = fsdp.tensor({ 1, 1 }, { dtype = 'f64' })
      assert_mentions(error_of(opt.step, opt), cls.name .. ': parameter w: ')
      assert.equals(0, opt.state.w.step, cls.name)
    end
  end)
end)

-- The whole parameters of a group are updated by one fl_adamw_step_multi_
-- per (device, dtypes, step): each must end as its own fl_adamw_step_
-- leaves it, bit for bit, at every dtype mix, with tails past the vector
-- widths, misaligned views and parameters on different step counts.
describe('AdamW over many tensors at once', function()
  local ffi = require 'ffi'
  local C = require('fsdp.core').C
  local cptr = require('fsdp.tensor').cptr
  local dtype_sets = { { 'f32', 'f32', 'f32' }, { 'bf16', 'bf16', 'bf16' }, { 'bf16', 'bf16', 'f32' },
                       { 'f32', 'bf16', 'f32' }, { 'f16', 'f16', 'f16' }, { 'f32', 'f32', 'bf16' } }

  -- A view of n elements at `off` of a fresh tensor: random (seed) or zeros.
  local function view(n, off, dtype, seed)
    local base = seed and (fsdp.randn({ n + off }, { seed = seed }) * 0.5):to(dtype)
      or fsdp.zeros({ n + off }, { dtype = dtype })
    return base:narrow(0, off, n)
  end

  it('gives each tensor the update of its own call, bit for bit', function()
    local o = ffi.new('fl_adamw_options')
    o.lr, o.beta1, o.beta2, o.eps, o.weight_decay = 1e-2, 0.9, 0.95, 1e-8, 0.1
    local cases = {}
    for _, d in ipairs(dtype_sets) do
      for _, n in ipairs({ 0, 1, 8, 37, 1024, 4099, 70000 }) do
        for _, off in ipairs({ 0, 1, 4 }) do cases[#cases + 1] = { d = d, n = n, off = off } end
      end
    end
    local function make()
      local out = {}
      for i, c in ipairs(cases) do
        out[i] = { view(c.n, c.off, c.d[1], i), view(c.n, c.off, c.d[2], 500 + i), view(c.n, c.off, c.d[3]),
                   view(c.n, c.off, c.d[3]) }
      end
      return out
    end
    local single, multi = make(), make()
    local n = #cases
    local a = { ffi.new('fl_tensor *[?]', n), ffi.new('const fl_tensor *[?]', n), ffi.new('fl_tensor *[?]', n),
                ffi.new('fl_tensor *[?]', n) }
    for step = 1, 3 do
      o.step, o.beta1 = step, step == 3 and 0.3 or 0.9 -- (beta1 < 0.5: the other lerp branch)
      for i = 1, n do
        local x = single[i]
        assert(C.fl_adamw_step_(cptr(x[1]), cptr(x[2]), cptr(x[3]), cptr(x[4]), o) == 0)
        for k = 1, 4 do a[k][i - 1] = cptr(multi[i][k]) end
      end
      assert(C.fl_adamw_step_multi_(n, a[1], a[2], a[3], a[4], o) == 0, require('fsdp.core').last_error())
    end
    for i, c in ipairs(cases) do
      for k = 1, 4 do
        assert.same(single[i][k]:to('f64'):tolist(), multi[i][k]:to('f64'):tolist(),
          ('%s/%s/%s n=%d off=%d operand %d'):format(c.d[1], c.d[2], c.d[3], c.n, c.off, k))
      end
    end
    assert.equals(0, C.fl_adamw_step_multi_(0, nil, nil, nil, nil, o))
  end)

  it('steps parameters of different step counts and dtypes as one by one', function()
    local function run(multi)
      local ps = { { 'a', nn.Parameter(view(37, 0, 'f32', 1)) }, { 'b', nn.Parameter(view(4099, 0, 'bf16', 2)) },
                   { 'c', nn.Parameter(view(8, 0, 'f32', 3)) }, { 'd', nn.Parameter(view(5, 0, 'f16', 4)) } }
      local opt = optim.AdamW(ps, { lr = 1e-2, weight_decay = 0.1 })
      if not multi then -- the per-parameter path of the base class
        opt.update_many = require('fsdp.optim.optimizer').update_many
      end
      for s = 1, 3 do
        for i, np in ipairs(ps) do
          -- (c misses step 1: its step count lags the others')
          if not (s == 1 and np[1] == 'c') then np[2].grad = view(np[2]:numel(), 0, np[2].dtype, 100 * s + i) end
        end
        opt:step()
        opt:zero_grad()
      end
      return ps, opt
    end
    local p1, o1 = run(true)
    local p2, o2 = run(false)
    for i = 1, #p1 do
      assert.same(p2[i][2]:to('f64'):tolist(), p1[i][2]:to('f64'):tolist(), p1[i][1])
      assert.equals(o2.state[p1[i][1]].step, o1.state[p1[i][1]].step)
      assert.same(o2.state[p1[i][1]].exp_avg_sq:to('f64'):tolist(), o1.state[p1[i][1]].exp_avg_sq:to('f64'):tolist())
    end
    assert.equals(2, o1.state.c.step)
  end)

  it('names the tensor at fault and updates none', function()
    local o = ffi.new('fl_adamw_options')
    o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, o.step = 1e-2, 0.9, 0.95, 1e-8, 0.1, 1
    local p = { view(8, 0, 'f32', 1), view(8, 0, 'f32', 2) }
    local g = { view(8, 0, 'f32', 3), view(7, 0, 'f32', 4) }
    local m, v = { view(8, 0, 'f32'), view(8, 0, 'f32') }, { view(8, 0, 'f32'), view(8, 0, 'f32') }
    local before = p[1]:tolist()
    local function call()
      local a = { ffi.new('fl_tensor *[2]'), ffi.new('const fl_tensor *[2]'), ffi.new('fl_tensor *[2]'),
                  ffi.new('fl_tensor *[2]') }
      for i = 1, 2 do
        a[1][i - 1], a[2][i - 1], a[3][i - 1], a[4][i - 1] = cptr(p[i]), cptr(g[i]), cptr(m[i]), cptr(v[i])
      end
      return C.fl_adamw_step_multi_(2, a[1], a[2], a[3], a[4], o)
    end
    assert.is_not.equal(0, call())
    assert_mentions(require('fsdp.core').last_error(),
      'adamw: tensor 1: grad has 7 elements (shape [7]) but param has 8')
    g[2] = p[1] -- tensor 1 reads tensor 0's param as its grad
    assert.is_not.equal(0, call())
    assert_mentions(require('fsdp.core').last_error(), "adamw: tensor 0's param and tensor 1's grad share memory")
    assert.same(before, p[1]:tolist())
    -- through the optimizer: the parameter's name
    local base = fsdp.tensor({ 1, 2, 3, 4 })
    local c = nn.Parameter(fsdp.tensor({ 5, 6 }))
    local d, e = nn.Parameter(base:narrow(0, 0, 3)), nn.Parameter(base:narrow(0, 1, 3))
    local opt = optim.AdamW({ { 'c', c }, { 'd', d }, { 'e', e } })
    c.grad, d.grad, e.grad = fsdp.tensor({ 1, 1 }), fsdp.tensor({ 1, 1, 1 }), fsdp.tensor({ 1, 1, 1 })
    assert_mentions(error_of(opt.step, opt), "AdamW: adamw: parameter d's param and parameter e's param share memory")
    assert.same({ 1, 2, 3, 4 }, base:tolist())
    assert.same({ 5, 6 }, c:tolist())
  end)
end)

describe('SGD', function()
  local function reference(opts, steps)
    local init = { 1, -2, 0.5, 3 }
    local p = param(init)
    local opt = optim.SGD({ { 'p', p } }, opts)
    local ref, buf = {}, {}
    for i = 1, #init do ref[i] = init[i] end
    for s = 1, steps do
      local g = grads(#init, s)
      p.grad = fsdp.tensor(g)
      opt:step()
      for i = 1, #init do
        local gi = fsdp.tensor({ g[i] }):get(0)
        local d = gi + (opts.weight_decay or 0) * ref[i]
        local mom = opts.momentum or 0
        if mom ~= 0 then
          buf[i] = s == 1 and d or mom * buf[i] + (1 - (opts.dampening or 0)) * d
          d = opts.nesterov and d + mom * buf[i] or buf[i]
        end
        ref[i] = ref[i] - opts.lr * d
      end
    end
    assert_close_list(p:tolist(), ref)
  end

  it('follows the reference: plain, momentum with dampening, nesterov', function()
    reference({ lr = 0.1 }, 3)
    reference({ lr = 0.05, momentum = 0.9, dampening = 0.1, weight_decay = 1e-3 }, 4)
    reference({ lr = 0.05, momentum = 0.9, nesterov = true, weight_decay = 1e-2 }, 4)
    assert_mentions(error_of(optim.SGD, { param({ 1 }) }, { momentum = 0.9, dampening = 0.5, nesterov = true }),
      'SGD: nesterov momentum requires momentum > 0 and zero dampening')
  end)
end)

describe('Adadelta', function()
  it('has PyTorch defaults and follows the reference', function()
    local init = { 0.3, -0.7, 1.1 }
    local p = param(init)
    local opt = optim.Adadelta({ { 'p', p } }, { weight_decay = 0.01 })
    local g0 = opt.param_groups[1]
    assert.equals(1.0, g0.lr)
    assert.equals(0.9, g0.rho)
    assert.equals(1e-6, g0.eps)
    local ref, sq, acc = {}, {}, {}
    for i = 1, #init do ref[i], sq[i], acc[i] = init[i], 0, 0 end
    for s = 1, 5 do
      local g = grads(#init, s)
      p.grad = fsdp.tensor(g)
      opt:step()
      for i = 1, #init do
        local d = fsdp.tensor({ g[i] }):get(0) + 0.01 * ref[i]
        sq[i] = 0.9 * sq[i] + 0.1 * d * d
        local delta = math.sqrt(acc[i] + 1e-6) / math.sqrt(sq[i] + 1e-6) * d
        acc[i] = 0.9 * acc[i] + 0.1 * delta * delta
        ref[i] = ref[i] - delta
      end
    end
    assert_close_list(p:tolist(), ref)
    assert.equals(5, opt.state.p.step)
  end)
end)

describe('AnyPrecisionAdamW', function()
  it('has torchdistx defaults and keeps bf16 moments and a compensation buffer', function()
    local p = nn.Parameter(fsdp.full({ 8 }, 1, { dtype = 'bf16' }))
    local opt = optim.AnyPrecisionAdamW({ { 'p', p } }, { lr = 1e-4, use_kahan_summation = true })
    local g = opt.param_groups[1]
    assert.equals(0, g.weight_decay)
    assert.equals('bf16', g.momentum_dtype)
    for s = 1, 100 do
      p.grad = fsdp.full({ 8 }, 0.3, { dtype = 'bf16' })
      opt:step()
    end
    local st = opt.state.p
    assert.equals('bf16', st.exp_avg.dtype)
    assert.equals('bf16', st.exp_avg_sq.dtype)
    assert.equals('bf16', st.compensation.dtype)
    -- 100 steps of 1e-4, each alone below bf16's resolution at 1.0
    assert.is_true(math.abs(p:get(0) - 0.99) <= 1 / 256)
    assert.is_true(math.abs(p:get(0) + st.compensation:get(0) - 0.99) < 1e-3)
  end)

  it('matches AdamW-style math with f32 states and no compensation', function()
    local init = { 0.5, -1, 2 }
    local p = param(init)
    local lr, b1, b2, eps, wd = 0.02, 0.9, 0.99, 1e-8, 0.05
    local opt = optim.AnyPrecisionAdamW({ { 'p', p } }, { lr = lr, betas = { b1, b2 }, weight_decay = wd,
      momentum_dtype = 'f32', variance_dtype = 'f32' })
    local ref, m, v = {}, {}, {}
    for i = 1, #init do ref[i], m[i], v[i] = init[i], 0, 0 end
    for s = 1, 3 do
      local g = grads(#init, s)
      p.grad = fsdp.tensor(g)
      opt:step()
      for i = 1, #init do
        local gi = fsdp.tensor({ g[i] }):get(0)
        ref[i] = ref[i] * (1 - lr * wd)
        m[i] = m[i] * b1 + (1 - b1) * gi
        v[i] = v[i] * b2 + (1 - b2) * gi * gi
        ref[i] = ref[i] - lr / (1 - b1 ^ s) * m[i] / (math.sqrt(v[i]) / math.sqrt(1 - b2 ^ s) + eps)
      end
    end
    assert_close_list(p:tolist(), ref)
  end)
end)

describe('lr schedules', function()
  local function opt_with(lrs)
    local specs, params = {}, { { 'p0', param({ 0 }) } }
    for i = 2, #lrs do
      specs[#specs + 1] = { match = function(name) return name == 'p' .. (i - 1) end, lr = lrs[i] }
      params[#params + 1] = { 'p' .. (i - 1), param({ 0 }) }
    end
    return optim.SGD(params, { lr = lrs[1], groups = specs })
  end

  it('warm up linearly then decay by cosine to the minimum', function()
    local opt = opt_with({ 1.0, 0.5 })
    local s = lr_scheduler.WarmupDecay(opt, { warmup_steps = 4, total_steps = 14, min_lr_ratio = 0.1 })
    assert.same({ 0.2, 0.1 }, s:get_lr()) -- step 0: base * 1 / (warmup + 1)
    assert.same({ 0.2, 0.1 }, opt:get_lrs())
    for _ = 1, 3 do s:step() end
    assert_close_list(s:get_lr(), { 0.8, 0.4 }, 1e-12, 0)
    s:step()
    assert.same({ 1.0, 0.5 }, s:get_lr()) -- end of warmup: the base
    assert_close_list(s:lr_at(9), { 0.55, 0.275 }, 1e-12, 0) -- halfway: (base + min) / 2
    assert_close_list(s:lr_at(14), { 0.1, 0.05 }, 1e-12, 0)
    assert_close_list(s:lr_at(1000), { 0.1, 0.05 }, 1e-12, 0)
    assert_close_list({ s:lr_at(6)[1] }, { 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.2)) }, 1e-12, 0)
    -- the optimizer steps with the scheduled lr
    local p = opt.param_groups[1].params[1]
    p.grad = fsdp.tensor({ 1 })
    opt:step()
    assert.equals(-1.0, p:get(0))
  end)

  it('decay linearly, hold constant, and accept an absolute min_lr', function()
    local lin = lr_scheduler.WarmupDecay(opt_with({ 2.0 }), { warmup_steps = 0, total_steps = 10,
      decay = 'linear', min_lr = 0.5 })
    assert.same({ 2.0 }, lin:get_lr())
    assert_close_list(lin:lr_at(5), { 1.25 }, 1e-12, 0)
    assert.same({ 0.5 }, lin:lr_at(10))
    local const = lr_scheduler.WarmupConstant(opt_with({ 3.0 }), { warmup_steps = 2 })
    assert.same({ 1.0 }, const:lr_at(0))
    assert.same({ 3.0 }, const:lr_at(2))
    assert.same({ 3.0 }, const:lr_at(10 ^ 6))
    local cos = lr_scheduler.WarmupCosine(opt_with({ 1.0 }), { warmup_steps = 0, total_steps = 2 })
    assert_close_list(cos:lr_at(1), { 0.5 }, 1e-12, 0)
    assert_mentions(error_of(lr_scheduler.WarmupDecay, opt_with({ 1 }), { warmup_steps = 5, total_steps = 5 }),
      'WarmupDecay: cosine decay needs total_steps > warmup_steps (5), got 5')
  end)

  it('StepLR multiplies by gamma every step_size steps (MNIST: gamma 0.7 per epoch)', function()
    local opt = optim.Adadelta({ param({ 0 }) })
    local s = lr_scheduler.StepLR(opt, 1, 0.7)
    assert.same({ 1.0 }, s:get_lr())
    s:step(); s:step()
    assert_close_list(s:get_lr(), { 0.49 }, 1e-12, 0)
    local s3 = lr_scheduler.StepLR(opt_with({ 1.0 }), { step_size = 3 })
    assert.same({ 1.0 }, s3:lr_at(2))
    assert_close_list(s3:lr_at(3), { 0.1 }, 1e-12, 0)
    assert_close_list(s3:lr_at(7), { 0.01 }, 1e-12, 0)
    local l = lr_scheduler.LambdaLR(opt_with({ 2.0 }), function(t) return 1 / (t + 1) end)
    assert.same({ 0.5 }, l:lr_at(3))
    l:step()
    assert.same({ 1.0 }, l:get_lr())
    assert.same({ last_step = 1 }, l:state_dict())
  end)
end)

describe('clip_grad_norm_', function()
  it('returns the global norm and scales gradients above max_norm', function()
    local a, b, c = param({ 0, 0 }), param({ 0 }), param({ 5 })
    a.grad = fsdp.tensor({ 3, 0 })
    b.grad = fsdp.tensor({ 4 })
    local total = nn.utils.clip_grad_norm_({ a, b, c }, 1.0)
    assert.equals(5, total)
    local coef = 1 / (5 + 1e-6)
    assert_close_list(a.grad:tolist(), { 3 * coef, 0 }, 1e-6, 0)
    assert_close_list(b.grad:tolist(), { 4 * coef }, 1e-6, 0)
    assert.is_nil(c.grad)
    assert.is_true(close(optim.clip.grad_norm({ a, b }), 1, 1e-6, 0))
  end)

  it('leaves gradients under max_norm alone and takes modules and named lists', function()
    local m = nn.Linear(2, 1)
    m:init_weights({ seed = 0 })
    m.weight.grad = fsdp.tensor({ { 0.1, 0.2 } })
    m.bias.grad = fsdp.tensor({ 0.2 })
    local total = optim.clip_grad_norm_(m, 10)
    assert.is_true(close(total, 0.3, 1e-6, 0))
    assert.same(fsdp.tensor({ { 0.1, 0.2 } }):tolist(), m.weight.grad:tolist())
    assert.is_true(close(optim.clip_grad_norm_(m:named_parameters(), 10), 0.3, 1e-6, 0))
    m.bias.grad = fsdp.tensor({ 0 / 0 })
    assert_mentions(error_of(optim.clip_grad_norm_, m, 1, { error_if_nonfinite = true }),
      'clip_grad_norm_: the total norm of the gradients is')
  end)
end)
